//! The server layer: reads the caller's deadline, enforces it with its own
//! timer, and runs every handler inside its [`Scope`] — for a tonic server,
//! or (with the `http` feature) for any plain HTTP service.
//!
//! For each gRPC request the layer
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
//!    the response is complete, so tasks spawned under it stop too;
//! 7. hands the handler its request body as a [`RequestBody`]: an input
//!    its client abandoned never reads as complete. tonic reads a request
//!    stream reset with `CANCEL` as its clean end (`Ok(None)`); behind the
//!    layer the scope ends first and the handler reads an error,
//!    [`Truncated`] (`ABORTED`), so a handler that commits at the end of its
//!    input commits nothing its client gave up on.
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
//!
//! # Plain HTTP
//!
//! `ServerDeadlineLayer::http()` (the `http` feature) is the same layer for
//! axum, hyper or any tower HTTP service; only where the deadline comes
//! from and how the layer answers differ. For each request it
//! 1. reads the deadline headers it accepts (by default all of
//!    `DeadlineHeader::ALL`: `grpc-timeout`, `connect-timeout-ms`,
//!    `x-envoy-expected-rq-timeout-ms`, `request-timeout`); when several are
//!    present **the tightest wins**. A malformed or duplicated one is
//!    answered `400 Bad Request` with a text naming the header, before the
//!    handler runs;
//! 2. applies the configured default and maximum;
//! 3. answers `504 Gateway Timeout` at once if the budget is already zero;
//! 4. installs a root scope as the task-local current scope and as a request
//!    extension (axum: `Extension<Scope>`), with the allow-listed headers to
//!    forward to outbound gRPC calls;
//! 5. races the handler and the response body against its own timer: at
//!    the deadline the client gets `504 Gateway Timeout` (or, once the
//!    response has started, the body ends with an error, so hyper resets
//!    the stream or closes the connection) and the scope ends with
//!    [`Cause::DeadlineExceeded`], whether or not the handler looks at it;
//! 6. ends the scope with [`Cause::Abandoned`] when hyper drops the
//!    request — the client disconnected or reset its stream — and with
//!    [`Cause::Completed`] once the response is complete.
//!
//! A gRPC call made from the handler through
//! [`ClientDeadlineLayer`](crate::ClientDeadlineLayer) carries what is left.
//! Metrics and spans are those of the gRPC layer; `Http` says how its
//! requests are labelled.
//!
//! On a drop the layer cannot tell *why* the request future went away: a
//! client disconnecting and an outer layer giving up (a `tower::timeout`
//! outside this one, a load shedder) look the same, so both end the scope
//! as [`Cause::Abandoned`]. Put this layer outermost to keep the
//! cause exact.
//!
//! How it differs from `tower_http::timeout::TimeoutLayer`: that one answers
//! at a fixed duration and only drops the handler future; this one reads the
//! caller's deadline, caps it, and ends a scope that everything done for the
//! request — gRPC calls, queries, spawned tasks — obeys.

mod body;
mod end_guard;
mod future;
mod layer;
mod ledger_entry;
pub(crate) mod observer;
mod protocol;
mod request_body;
/// The reset guard: the crate `tonic-deadline-guard`, re-exported (see
/// [`ResetGuard`]).
#[cfg(feature = "reset-guard")]
#[cfg_attr(docsrs, doc(cfg(feature = "reset-guard")))]
pub use tonic_deadline_guard as reset_guard;
mod timer;

use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderName, Request, Response};
use tokio::time::Instant;
use tower_service::Service;

use crate::forwarded::Attached;
use crate::scope::{Attachment, Cause, Scope};
use observer::{Arrival, Observer};

pub use body::ServerBody;
pub use future::ResponseFuture;
pub use layer::ServerDeadlineLayer;
#[cfg(feature = "http")]
pub use protocol::Http;
pub use protocol::{Grpc, Protocol};
pub use request_body::{RequestBody, Truncated};
#[cfg(feature = "reset-guard")]
pub use tonic_deadline_guard::{
    Guarded, GuardedIncoming, GuardedRouter, GuardedServer, LOCAL_ERROR_RESETS,
    PENDING_ACCEPT_RESETS, PeerAddress, ResetGuard, ServeError,
};
#[cfg(feature = "tls")]
pub use tonic_deadline_guard::{ServerTls, TlsError, TlsIncoming};

/// What [`ServerDeadlineLayer`] keeps of a gRPC `budget` for the answer's
/// way back when [`reply_reserve`](ServerDeadlineLayer::reply_reserve) is
/// not set. With the `ledger` feature: a twentieth of the budget, at most
/// 10 ms, so that a `DEADLINE_EXCEEDED` and the ledger of where the time
/// went reach the caller before its own timer gives up on them, on a loaded
/// host too (`experiment ledger`: 2 ms, or a hundredth of the budget, lost
/// a tenth to a third of the ledgers on a 2-core host under load; 10 ms lost
/// none). The handler's scope ends that much before the caller's deadline:
/// 10 ms of a second (1 %), 5 ms of 100 ms (5 %). Without the feature:
/// nothing, as gRPC gives the handler the whole budget.
///
/// ```
/// use std::time::Duration;
/// use tonic_deadline::server::default_reply_reserve;
///
/// // At most a twentieth of what a call has, and never over 10 ms.
/// assert!(default_reply_reserve(Duration::from_millis(20)) <= Duration::from_millis(1));
/// assert!(default_reply_reserve(Duration::from_secs(30)) <= Duration::from_millis(10));
/// ```
///
/// A handler that must have the whole budget, ledger or not:
///
/// ```
/// use std::time::Duration;
/// use tonic_deadline::ServerDeadlineLayer;
/// let layer = ServerDeadlineLayer::new().reply_reserve(Duration::ZERO);
/// # let _ = layer;
/// ```
pub fn default_reply_reserve(budget: Duration) -> Duration {
    if cfg!(feature = "ledger") {
        (budget / 20).min(Duration::from_millis(10))
    } else {
        Duration::ZERO
    }
}

/// The limits, forwarding rules and protocol of a server layer.
#[derive(Debug, Clone, Default)]
pub(crate) struct Config<P = Grpc> {
    /// Where the deadline comes from and how the layer answers.
    pub(crate) protocol: P,
    pub(crate) default_timeout: Option<Duration>,
    pub(crate) max_timeout: Option<Duration>,
    /// Kept of every budget for the answer's way back: the request's scope
    /// ends this much before its deadline (`None`: [`default_reply_reserve`]
    /// for gRPC, none for plain HTTP, which carries no ledger).
    pub(crate) reply_reserve: Option<Duration>,
    pub(crate) forward: Vec<HeaderName>,
    /// Who observes the requests (metrics, spans); none by default.
    pub(crate) observer: Option<Arc<dyn Observer>>,
    /// The attachment of every request that forwards no metadata, made
    /// once per layer.
    shared: OnceLock<Option<Arc<dyn Attachment>>>,
}

impl<P: Protocol> Config<P> {
    /// What is kept of `budget` for the answer's way back: at most a
    /// twentieth of it.
    fn reserve(&self, budget: Duration) -> Duration {
        match self.reply_reserve {
            Some(reserve) => reserve.min(budget / 20),
            None if P::HTTP_STATUS => Duration::ZERO,
            None => default_reply_reserve(budget),
        }
    }
}

impl<P> Config<P> {
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
        let attached = |forwarded| {
            let reports = self.observer.clone().map(|o| o as Arc<dyn Attachment>);
            Attached::new(forwarded, reports)
        };
        match self.forwarded(headers) {
            Some(forwarded) => Some(Arc::new(attached(Some(forwarded)))),
            None => self
                .shared
                .get_or_init(|| {
                    self.observer
                        .is_some()
                        .then(|| Arc::new(attached(None)) as Arc<dyn Attachment>)
                })
                .clone(),
        }
    }
}

/// The service produced by [`ServerDeadlineLayer`]. See the [module docs](self).
///
/// ```
/// use tonic_deadline::ServerDeadlineLayer;
/// use tonic_deadline::server::ServerDeadline;
/// use tower_layer::Layer;
///
/// let (_, health) = tonic_health::server::health_reporter();
/// let service: ServerDeadline<_> = ServerDeadlineLayer::new().layer(health);
/// # let _ = service.get_ref();
/// ```
#[derive(Debug, Clone)]
pub struct ServerDeadline<S, P = Grpc> {
    inner: S,
    config: Arc<Config<P>>,
}

impl<S, P> ServerDeadline<S, P> {
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

impl<S, B, RB, P> Service<Request<B>> for ServerDeadline<S, P>
where
    S: Service<Request<P::RequestBody<B>>, Response = Response<RB>>,
    RB: http_body::Body,
    P: Protocol,
{
    type Response = Response<ServerBody<RB, P>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, P>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let observer = self.config.observer.as_deref();
        let arrival = |requested, budget| Arrival {
            http: P::HTTP_STATUS,
            method: request.method(),
            path: request.uri().path(),
            headers: request.headers(),
            requested,
            budget,
        };
        let requested = match self.config.protocol.requested(request.headers()) {
            Ok(requested) => requested,
            Err(malformed) => {
                tracing::debug!(path = %request.uri().path(), %malformed, "refused before the handler");
                let (answer, code) = P::malformed(malformed);
                if let Some(observer) = observer {
                    observer.malformed(&arrival(None, self.config.budget(None)), code);
                }
                return ResponseFuture::answer(answer);
            }
        };
        let budget = self.config.budget(requested);
        if budget == Some(Duration::ZERO) {
            tracing::debug!(path = %request.uri().path(), cause = %Cause::DeadlineExceeded, "refused as already expired");
            let answer = P::deadline_exceeded();
            if let Some(observer) = observer {
                observer.expired(&arrival(requested, budget), answer.status());
            }
            return ResponseFuture::answer(answer);
        }
        // One clock reading, for the deadline and what observes it.
        let now = budget.map(|_| Instant::now());
        let observed = observer.map(|o| o.arrived(&arrival(requested, budget), now));
        let deadline = budget
            .zip(now)
            .and_then(|(b, now)| now.checked_add(b - self.config.reserve(b)));
        #[cfg(feature = "ledger")]
        let entry = budget.zip(now).zip(request.uri().path_and_query()).map(
            |((budget, arrived), method)| ledger_entry::Entry {
                method: method.clone(),
                arrived,
                budget,
            },
        );
        #[cfg(not(feature = "ledger"))]
        let entry = None;
        let scope = Scope::root_attached(deadline, self.config.attachment(request.headers()));
        request.extensions_mut().insert(scope.clone());
        let request = request.map(|body| P::request_body(body, &scope));
        let timer = deadline
            .zip(now)
            .map(|(d, now)| (d.checked_sub(P::TIMER_LEAD).unwrap_or(d), now));
        let inner = {
            let _entered = observed.as_ref().map(|o| o.span().enter());
            scope.enter_sync(|| self.inner.call(request))
        };
        ResponseFuture::running(scope.enter(inner), scope, timer, observed, entry)
    }
}

#[cfg(test)]
mod tests;
