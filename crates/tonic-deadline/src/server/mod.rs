//! The server layer: reads `grpc-timeout`, enforces the deadline with its own
//! timer, and runs every handler inside its [`Scope`].
//!
//! For each request the layer
//! 1. decodes `grpc-timeout` strictly; a malformed value is answered with
//!    `INTERNAL` naming the header, before the handler runs;
//! 2. applies the configured default (for requests without a deadline) and
//!    maximum (so a caller cannot pin resources for 100 hours);
//! 3. answers `DEADLINE_EXCEEDED` at once if the budget is already zero;
//! 4. installs a root scope as the task-local current scope and as a request
//!    extension, with the allow-listed metadata to forward;
//! 5. races the handler and the response body against its own timer: at the
//!    deadline the client gets `DEADLINE_EXCEEDED` (trailers-only, or in the
//!    trailers of a stream already under way) and the scope is cancelled,
//!    whether or not the handler looks at it;
//! 6. cancels the scope with [`Cause::Abandoned`] when the client resets
//!    the stream (hyper drops the handler), and with [`Cause::Completed`] once
//!    the response is complete, so tasks spawned under it stop too.
//!
//! How it differs from tonic's `Server::timeout`: that timer answers
//! `CANCELLED`, ignores malformed headers, covers only the response head and
//! cancels nothing but the handler future.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use tonic_deadline::ServerDeadlineLayer;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let (_, health) = tonic_health::server::health_reporter();
//! tonic::transport::Server::builder()
//!     .layer(
//!         ServerDeadlineLayer::new()
//!             .default_timeout(Duration::from_millis(500))
//!             .max_timeout(Duration::from_secs(30))
//!             .forward_metadata("x-trace-id"),
//!     )
//!     .add_service(health)
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! Inside a handler, `Scope::current()` (or `request.extensions().get::<Scope>()`)
//! is the request's scope.

mod body;
mod future;
#[cfg(feature = "server")]
mod guards;
mod layer;
mod timer;

use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderName, Request, Response};
use tokio::time::Instant;
use tower_service::Service;

use crate::observe::{Metrics, ServerCall, ServerObserved, Stage, spans};
use crate::scope::{Attachment, CURRENT, Cause, Scope};
use crate::status::status_for;
use crate::wire::timeout_header;

pub use body::ServerBody;
pub use future::ResponseFuture;
#[cfg(feature = "server")]
pub use guards::{LOCAL_ERROR_RESETS, PENDING_ACCEPT_RESETS, reset_guards};
pub use layer::ServerDeadlineLayer;
// Shared with the plain-HTTP server layer.
#[cfg(feature = "http")]
pub(crate) use body::EndGuard;
#[cfg(feature = "http")]
pub(crate) use timer::LazyTimer;

/// How early the server's timer fires before the deadline.
///
/// tonic's `Server` wraps every layer in its own `grpc-timeout` timer, which
/// answers `CANCELLED`. It reads the same header a few microseconds before we
/// do, so with equal budgets it could win a millisecond tick and report the
/// wrong code. Firing one tick early makes ours always first; the client's
/// own timer, not ours, decides when it gives up.
const TONIC_TIMER_LEAD: Duration = Duration::from_millis(1);

/// The limits and forwarding rules of a server layer (shared with the
/// plain-HTTP server layer).
#[derive(Debug, Clone, Default)]
pub(crate) struct Config {
    pub(crate) default_timeout: Option<Duration>,
    pub(crate) max_timeout: Option<Duration>,
    pub(crate) forward: Vec<HeaderName>,
    pub(crate) metrics: Option<Metrics>,
    /// Open a `grpc.server` span per request ([`ServerDeadlineLayer::trace_spans`]).
    pub(crate) spans: bool,
    /// The attachment of every request that forwards no metadata, made
    /// once per layer.
    shared: OnceLock<Option<Arc<dyn Attachment>>>,
}

/// What the server layer attaches to each request's scope: the metadata
/// its outbound calls forward, and where work that outlives the request is
/// reported.
#[derive(Debug)]
pub(crate) struct Attached {
    forwarded: Option<HeaderMap>,
    metrics: Option<Metrics>,
    spans: bool,
}

impl Attached {
    #[cfg(test)]
    pub(crate) fn new(forwarded: Option<HeaderMap>, metrics: Option<Metrics>) -> Self {
        Self {
            forwarded,
            metrics,
            spans: false,
        }
    }

    /// Incoming metadata the layer was told to forward.
    pub(crate) fn forwarded(&self) -> Option<&HeaderMap> {
        self.forwarded.as_ref()
    }
}

impl Attachment for Attached {
    fn outlived(&self, _what: &'static str, by: Option<Duration>) {
        if let Some(metrics) = &self.metrics {
            metrics.outlived_scope(by);
        }
    }

    fn blocking_span(&self) -> Option<tracing::Span> {
        self.spans.then(spans::blocking)
    }

    fn blocking_returned(&self, span: &tracing::Span, scope: &Scope) {
        spans::blocking_ended(span, scope);
    }
}

impl Config {
    pub(crate) fn budget(&self, requested: Option<Duration>) -> Option<Duration> {
        let budget = requested.or(self.default_timeout);
        match (budget, self.max_timeout) {
            (Some(b), Some(max)) => Some(b.min(max)),
            (None, max) => max,
            (b, None) => b,
        }
    }

    /// Adds `key` to the forwarded metadata; `grpc-*` keys are reserved to
    /// the protocol and ignored.
    ///
    /// # Panics
    ///
    /// If `key` is not a valid lowercase header name.
    pub(crate) fn forward(&mut self, key: &str) {
        let name =
            HeaderName::from_bytes(key.as_bytes()).expect("metadata key must be a header name");
        if !name.as_str().starts_with("grpc-") {
            self.forward.push(name);
        }
    }

    /// The allow-listed incoming metadata, `None` when there is none.
    fn forwarded(&self, headers: &HeaderMap) -> Option<HeaderMap> {
        if self.forward.is_empty() {
            return None;
        }
        let mut out = HeaderMap::new();
        for name in &self.forward {
            for value in headers.get_all(name) {
                out.append(name.clone(), value.clone());
            }
        }
        (!out.is_empty()).then_some(out)
    }

    /// What a request's scope carries: nothing for a layer that forwards,
    /// counts and traces nothing; one value shared by every request that
    /// forwards nothing; a value of its own for a request that does.
    pub(crate) fn attachment(&self, headers: &HeaderMap) -> Option<Arc<dyn Attachment>> {
        let attached = |forwarded| Attached {
            forwarded,
            metrics: self.metrics.clone(),
            spans: self.spans,
        };
        match self.forwarded(headers) {
            Some(forwarded) => Some(Arc::new(attached(Some(forwarded)))),
            None => self
                .shared
                .get_or_init(|| {
                    (self.metrics.is_some() || self.spans)
                        .then(|| Arc::new(attached(None)) as Arc<dyn Attachment>)
                })
                .clone(),
        }
    }
}

/// The service produced by [`ServerDeadlineLayer`]. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct ServerDeadline<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> ServerDeadline<S> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B, RB> Service<Request<B>> for ServerDeadline<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    RB: http_body::Body,
{
    type Response = Response<ServerBody<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let requested = timeout_header::from_headers(request.headers());
        // Reported only to a layer given a handle, which then reads the
        // clock here (and the deadline is counted from the same reading).
        let mut start = None;
        let report = self.config.metrics.as_ref().map(|metrics| {
            let requested = requested.as_ref().ok().copied().flatten();
            let local_cap = self.config.budget(requested) != requested;
            let now = *start.insert(Instant::now());
            ServerCall::start(metrics, request.uri().path(), now, requested, local_cap)
        });
        let requested = match requested {
            Ok(requested) => requested,
            Err(malformed) => {
                tracing::debug!(path = %request.uri().path(), %malformed, "refused before the handler");
                if let Some(report) = report {
                    report.answered(tonic::Code::Internal);
                }
                return ResponseFuture::answer(tonic::Status::from(malformed));
            }
        };
        let budget = self.config.budget(requested);
        let span = self
            .config
            .spans
            .then(|| spans::server(request.uri().path(), request.headers(), requested, budget));
        if budget == Some(Duration::ZERO) {
            tracing::debug!(path = %request.uri().path(), cause = %Cause::DeadlineExceeded, "refused as already expired");
            if let Some(span) = &span {
                spans::server_ended(span, &Scope::root(None), Cause::DeadlineExceeded);
            }
            if let (Some(report), Some(metrics)) = (report, &self.config.metrics) {
                metrics.refused(Stage::Arrival);
                report.answered(tonic::Code::DeadlineExceeded);
            }
            return ResponseFuture::answer(status_for(Cause::DeadlineExceeded));
        }
        let deadline = budget.and_then(|b| start.unwrap_or_else(Instant::now).checked_add(b));
        let scope = Scope::root_attached(deadline, self.config.attachment(request.headers()));
        request.extensions_mut().insert(scope.clone());
        let timer = deadline.map(|d| d.checked_sub(TONIC_TIMER_LEAD).unwrap_or(d));
        let inner = {
            let _entered = span.as_ref().map(tracing::Span::enter);
            CURRENT.sync_scope(scope.clone(), || self.inner.call(request))
        };
        ResponseFuture::running(
            CURRENT.scope(scope.clone(), inner),
            scope,
            timer,
            ServerObserved::new(report, span),
        )
    }
}

#[cfg(test)]
mod tests;
