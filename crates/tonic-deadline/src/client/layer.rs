use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::observer::Observer;
use super::{ClientDeadline, Config, Unscoped};

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
///
/// Configure it, then build services from it: every service it makes (and
/// every clone of those) shares one frozen configuration.
///
/// The header is written when the call is handed to the service below. If
/// that service holds the request — a plain tonic `Channel` connecting, a
/// call queued behind the server's `max_concurrent_streams`, a queue in a
/// middleware — the server is told that wait more than the caller has. The
/// layer watches every call with a deadline (one clock read when its
/// request leaves): one whose request leaves more than 10 ms — and more
/// than 5 % of its budget — after its header is counted
/// ([`Metrics::budgets_left_late`](crate::observe::Metrics::budgets_left_late))
/// and warned about (rate-limited), whatever the service below is. Put the
/// layer over a [`ReadyChannel`](crate::client::ReadyChannel), which waits
/// for its connection, and for a free stream, before the header is
/// written.
///
/// A call that asks to wait for ready
/// ([`WaitForReady`](crate::client::WaitForReady), a service config's
/// `"waitForReady": true`) but is failed at once for want of a connection
/// by a service below that does not wait (a plain tonic `Channel`) answers
/// `UNAVAILABLE` naming `ReadyChannel`, and is counted
/// ([`Metrics::waits_for_ready_ignored`](crate::observe::Metrics::waits_for_ready_ignored))
/// and warned about.
#[derive(Debug, Clone, Default)]
pub struct ClientDeadlineLayer {
    pub(super) transit_allowance: Duration,
    #[cfg(feature = "channel")]
    pub(super) transit_from: Option<super::RoundTrip>,
    pub(super) unscoped: Unscoped,
    /// Who observes the calls (metrics, spans); none by default.
    pub(super) observer: Option<Arc<dyn Observer>>,
}

impl ClientDeadlineLayer {
    /// The layer. The deadline comes from the scope; a call that finds no
    /// scope is reported ([`Unscoped::Warn`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Opt-in transit compensation: tell the server `allowance` less than
    /// what is left, to pay for the trip the request is about to make.
    ///
    /// `grpc-timeout` is relative, so no clock sync is needed, but the server
    /// starts counting only when the headers arrive: without compensation it
    /// believes it has the one-way transit time more than the caller really
    /// has. Set this to the one-way latency
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
    pub fn transit_allowance(mut self, allowance: Duration) -> Self {
        self.transit_allowance = allowance;
        self
    }

    /// Opt-in transit compensation from a measured round trip: tell the
    /// server half of `round_trip` (plus any fixed
    /// [`transit_allowance`](Self::transit_allowance)) less than what is
    /// left. Until the first PING has come back nothing is deducted.
    ///
    /// Half the round trip is the one-way transit on a symmetric path; a
    /// path much slower one way than the other is over- or under-paid.
    /// See [`ReadyChannelBuilder::measure_round_trip`](super::ReadyChannelBuilder::measure_round_trip).
    #[cfg(feature = "channel")]
    pub fn transit_from(mut self, round_trip: super::RoundTrip) -> Self {
        self.transit_from = Some(round_trip);
        self
    }

    /// What to do with a call that finds no scope (default:
    /// [`Unscoped::Warn`]).
    pub fn unscoped(mut self, policy: Unscoped) -> Self {
        self.unscoped = policy;
        self
    }

    /// The layer's observer, if it has one.
    pub(crate) fn observer(&self) -> Option<&dyn Observer> {
        self.observer.as_deref()
    }

    /// The layer with `observer` observing its calls, in place of any it
    /// had (`observe` builds it: see `metrics` and `trace_spans`).
    pub(crate) fn observed_by(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    pub(super) fn wrap<S>(&self, inner: S) -> ClientDeadline<S> {
        let config = Config::new(self);
        ClientDeadline::with_config(inner, Arc::new(config))
    }
}

impl<S> Layer<S> for ClientDeadlineLayer {
    type Service = ClientDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        self.wrap(inner)
    }
}
