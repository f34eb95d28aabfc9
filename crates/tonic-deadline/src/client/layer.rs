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
    _private: (),
}

impl ClientDeadlineLayer {
    /// The layer. It has no settings: the deadline comes from the scope.
    pub const fn new() -> Self {
        Self { _private: () }
    }
}

impl<S> Layer<S> for ClientDeadlineLayer {
    type Service = ClientDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ClientDeadline::new(inner)
    }
}
