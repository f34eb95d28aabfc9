use std::time::Duration;

use tower_layer::Layer;

use super::ClientDeadline;

/// Makes every call through a tonic `Channel` (or any gRPC service) carry and
/// obey the current scope's deadline.
///
/// ```
/// use tonic_deadline::ClientDeadlineLayer;
/// # fn wrap(channel: tonic::transport::Channel) {
/// let channel = tower::ServiceBuilder::new()
///     .layer(ClientDeadlineLayer::new())
///     .service(channel);
/// # let _ = channel;
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientDeadlineLayer {
    transit_allowance: Duration,
}

impl ClientDeadlineLayer {
    /// The layer. The deadline comes from the scope.
    pub const fn new() -> Self {
        Self {
            transit_allowance: Duration::ZERO,
        }
    }

    /// Opt-in transit compensation: tell the server `allowance` less than
    /// what is left, to pay for the trip the request is about to make.
    ///
    /// `grpc-timeout` is relative, so no clock sync is needed, but the server
    /// starts counting only when the headers arrive: without compensation it
    /// believes it has the one-way transit time more than the caller really
    /// has (`deadline-lab experiment drift`). Set this to the one-way latency
    /// of the path (half the round-trip time on a symmetric network). Our
    /// own timer still waits for the full budget. A call with no more than
    /// `allowance` left fails locally with `DEADLINE_EXCEEDED`: it could not
    /// arrive in time.
    ///
    /// ```
    /// use std::time::Duration;
    /// let layer = tonic_deadline::ClientDeadlineLayer::new()
    ///     .transit_allowance(Duration::from_millis(2)); // a cross-zone hop
    /// # let _ = layer;
    /// ```
    pub const fn transit_allowance(mut self, allowance: Duration) -> Self {
        self.transit_allowance = allowance;
        self
    }
}

impl<S> Layer<S> for ClientDeadlineLayer {
    type Service = ClientDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ClientDeadline::new(inner).with_transit_allowance(self.transit_allowance)
    }
}
