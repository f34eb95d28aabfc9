use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::{Config, ServerDeadline};
use crate::observe::Metrics;

/// Installs a deadline scope around every handler of a tonic server.
///
/// Both safety limits are off by default: a request without `grpc-timeout`
/// runs without a deadline (as in grpc-go), and any budget is accepted.
///
/// ```
/// use std::time::Duration;
/// use tonic_deadline::ServerDeadlineLayer;
///
/// let layer = ServerDeadlineLayer::new()
///     .default_timeout(Duration::from_millis(500)) // the IM seed's logic service
///     .max_timeout(Duration::from_secs(60))
///     .forward_metadata("x-trace-id");
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, Default)]
pub struct ServerDeadlineLayer {
    config: Config,
}

impl ServerDeadlineLayer {
    /// A layer with no default and no maximum deadline, forwarding nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The budget given to requests that arrive without `grpc-timeout`.
    pub fn default_timeout(mut self, timeout: Duration) -> Self {
        self.config.default_timeout = Some(timeout);
        self
    }

    /// The largest budget accepted; longer ones are cut to it, and requests
    /// without a deadline get it too.
    pub fn max_timeout(mut self, timeout: Duration) -> Self {
        self.config.max_timeout = Some(timeout);
        self
    }

    /// Copies the incoming metadata `key` to every outbound call made under
    /// the request's scope (for example a trace id). Only listed keys travel,
    /// so hop-by-hop and auth headers do not leak. `grpc-*` keys are reserved
    /// to the protocol — the deadline travels as the remaining budget, never
    /// as copied metadata — and are ignored here.
    ///
    /// # Panics
    ///
    /// If `key` is not a valid lowercase header name.
    pub fn forward_metadata(mut self, key: &str) -> Self {
        self.config.forward(key);
        self
    }

    /// Reports every call into `metrics`: gRPC's server call metrics, the
    /// budget each request brought, how its scope ended, and the requests
    /// refused on arrival as already expired. Without it the layer records
    /// nothing.
    ///
    /// ```
    /// use tonic_deadline::{ServerDeadlineLayer, observe::Metrics};
    /// let metrics = Metrics::new();
    /// let layer = ServerDeadlineLayer::new().metrics(&metrics);
    /// # let _ = layer;
    /// ```
    pub fn metrics(mut self, metrics: &Metrics) -> Self {
        self.config.metrics = Some(metrics.clone());
        self
    }

    /// Opens a `grpc.server` span per request, with the budget as fields
    /// (see [`observe::spans`](crate::observe::spans)); with the
    /// `opentelemetry` feature it is parented on the caller's `traceparent`.
    /// Off by default: a request then pays for no span at all.
    ///
    /// ```
    /// let layer = tonic_deadline::ServerDeadlineLayer::new().trace_spans();
    /// # let _ = layer;
    /// ```
    pub fn trace_spans(mut self) -> Self {
        self.config.spans = true;
        self
    }
}

impl<S> Layer<S> for ServerDeadlineLayer {
    type Service = ServerDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ServerDeadline {
            inner,
            config: Arc::new(self.config.clone()),
        }
    }
}
