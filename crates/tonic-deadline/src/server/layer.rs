use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::observer::Observer;
use super::protocol::{Grpc, Protocol};
use super::{Config, ServerDeadline};
#[cfg(feature = "http")]
use {super::protocol::Http, crate::deadline_headers::DeadlineHeader};

/// Installs a deadline scope around every handler of a server: a tonic
/// server ([`new`](ServerDeadlineLayer::new)), or, with the `http`
/// feature, any plain HTTP service — axum, hyper
/// (`ServerDeadlineLayer::http`).
///
/// Both safety limits are off by default: a request without a deadline
/// runs without one (as in grpc-go), and any budget is accepted.
///
/// ```
/// use std::time::Duration;
/// use tonic_deadline::ServerDeadlineLayer;
///
/// let layer = ServerDeadlineLayer::new()
///     .default_timeout(Duration::from_millis(500))
///     .max_timeout(Duration::from_secs(60))
///     .forward_metadata("x-trace-id");
/// # let _ = layer;
/// ```
#[derive(Debug, Clone)]
pub struct ServerDeadlineLayer<P = Grpc> {
    config: Config<P>,
}

impl Default for ServerDeadlineLayer<Grpc> {
    fn default() -> Self {
        Self {
            config: Config::default(),
        }
    }
}

impl ServerDeadlineLayer<Grpc> {
    /// A gRPC layer reading `grpc-timeout`, with no default and no maximum
    /// deadline, forwarding nothing.
    pub fn new() -> Self {
        Self::default()
    }
}

#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
impl ServerDeadlineLayer<Http> {
    /// A plain-HTTP layer (axum, hyper, any tower HTTP service), accepting
    /// every [`DeadlineHeader`], with no default and no maximum, forwarding
    /// nothing. See [the module docs](crate::server#plain-http) for what it
    /// does with each request, and [`Http`] for how its metrics label them.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use axum::{Router, routing::get};
    /// use tonic_deadline::{Scope, ServerDeadlineLayer};
    ///
    /// async fn handler() -> String {
    ///     format!("{:?} left", Scope::current().remaining())
    /// }
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let app = Router::new().route("/", get(handler)).layer(
    ///     ServerDeadlineLayer::http()
    ///         .default_timeout(Duration::from_millis(900))
    ///         .max_timeout(Duration::from_secs(30)),
    /// );
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
    /// axum::serve(listener, app).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn http() -> Self {
        Self {
            config: Config::default(),
        }
    }

    /// The deadline headers read (and so trusted); others are ignored. An
    /// empty list gives every request the default budget.
    ///
    /// ```
    /// use tonic_deadline::ServerDeadlineLayer;
    /// use tonic_deadline::deadline_headers::DeadlineHeader;
    ///
    /// let layer = ServerDeadlineLayer::http()
    ///     .accept(&[DeadlineHeader::EnvoyExpectedTimeoutMs, DeadlineHeader::GrpcTimeout]);
    /// # let _ = layer;
    /// ```
    pub fn accept(mut self, headers: &[DeadlineHeader]) -> Self {
        self.config.protocol.accept(headers);
        self
    }
}

impl<P: Protocol> ServerDeadlineLayer<P> {
    /// The budget given to requests that arrive without a deadline.
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

    /// Keeps `reserve` of every budget for the answer's way back: the
    /// request's scope — the handler and every call it makes — ends
    /// `reserve` before the deadline the caller gave, and the layer
    /// answers `DEADLINE_EXCEEDED` then. The answer, and the ledger of
    /// where the time went (`tonic_deadline::ledger`), then reach the
    /// caller before its own timer gives up on them. At most a twentieth
    /// of a budget is kept, so that a short call (a 20 ms cache lookup)
    /// keeps most of its own. Unset, it is
    /// [`default_reply_reserve`](super::default_reply_reserve): with the
    /// `ledger` feature a twentieth of the budget, at most 10 ms
    /// (`experiment ledger`, its defaults rows); without it none (an
    /// answer at the deadline then races the caller's timer, which usually
    /// wins; gRPC gives the handler the whole budget). Plain HTTP
    /// (`ServerDeadlineLayer::http`) carries no ledger and keeps nothing
    /// unless set. `Duration::ZERO` keeps nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tonic_deadline::ServerDeadlineLayer;
    ///
    /// let layer = ServerDeadlineLayer::new().reply_reserve(Duration::from_millis(5));
    /// # let _ = layer;
    /// ```
    pub fn reply_reserve(mut self, reserve: Duration) -> Self {
        self.config.reply_reserve = Some(reserve);
        self
    }

    /// Copies the incoming metadata (header) `key` to every outbound gRPC
    /// call made under the request's scope (for example a trace or request
    /// id). Only listed keys travel, so hop-by-hop and auth headers do not
    /// leak. `grpc-*` keys are reserved to the protocol — the deadline
    /// travels as the remaining budget, never as copied metadata — and are
    /// ignored here.
    ///
    /// # Panics
    ///
    /// If `key` is not a valid lowercase header name.
    pub fn forward_metadata(mut self, key: &str) -> Self {
        self.config.forward(key);
        self
    }

    /// The layer's observer, if it has one.
    pub(crate) fn observer(&self) -> Option<&dyn Observer> {
        self.config.observer.as_deref()
    }

    /// The layer with `observer` observing its requests, in place of any
    /// it had (`observe` builds it: see `metrics` and `trace_spans`).
    pub(crate) fn observed_by(mut self, observer: Arc<dyn Observer>) -> Self {
        self.config.observer = Some(observer);
        self
    }
}

impl<S, P: Protocol> Layer<S> for ServerDeadlineLayer<P> {
    type Service = ServerDeadline<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        ServerDeadline {
            inner,
            config: Arc::new(self.config.clone()),
        }
    }
}
