//! The client layer: every outbound call carries the remaining budget of the
//! current scope, and ends when that scope does.
//!
//! For each request the layer
//! 1. takes the deadline as `min(current scope, per-request timeout)` — the
//!    per-request timeout being whatever `tonic::Request::set_timeout` wrote;
//! 2. fails locally, sending **no** HTTP/2 frame, when the scope has already
//!    ended: `DEADLINE_EXCEEDED` if it expired, `CANCELLED` if cancelled;
//! 3. writes `grpc-timeout` = deadline − now at the last moment before the
//!    request is handed to the connection (no deadline ⇒ no header);
//! 4. copies the metadata the server layer was told to forward;
//! 5. races the response *and its body* against the deadline and the scope:
//!    at the deadline the call returns `DEADLINE_EXCEEDED` and the stream is
//!    reset (RST_STREAM CANCEL); on cancel it returns `CANCELLED` and resets
//!    too — at once, even while the caller still holds a response stream or
//!    a request stream of its own (the request body is ended with the reset);
//! 6. reports a `CANCELLED` from the server that arrives after our deadline
//!    as `DEADLINE_EXCEEDED`, as the gRPC spec asks.
//!
//! A connection lost under a call is `UNAVAILABLE` (tonic alone says
//! `UNKNOWN`), and `INTERNAL` when it broke off a response message; other
//! transport errors (a refused connection, a stream reset) pass through for
//! tonic to classify.
//!
//! How it differs from `tower::timeout` and tonic's `Endpoint::timeout`:
//! those time one call from a fixed duration, stop at the response head and
//! answer `CANCELLED`; this one follows the request's scope across the whole
//! call and tells the server how much time is left.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use tonic::transport::Channel;
//! use tonic_deadline::{ClientDeadlineLayer, Scope};
//! use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let channel = Channel::from_static("http://127.0.0.1:50051").connect().await?;
//! let channel = tower::ServiceBuilder::new()
//!     .layer(ClientDeadlineLayer::new())
//!     .service(channel);
//! let mut client = HealthClient::new(channel);
//!
//! // Inside a handler the server layer has installed the scope already;
//! // here we make one: the call carries `grpc-timeout: 999…u`.
//! let scope = Scope::background().with_timeout(Duration::from_secs(1));
//! let reply = scope.enter(client.check(HealthCheckRequest::default())).await?;
//! # let _ = reply;
//! # Ok(())
//! # }
//! ```

mod abandon;
mod balance;
mod body;
#[cfg(feature = "channel")]
mod channel;
mod deadline_race;
mod future;
mod layer;
pub(crate) mod observer;
pub(crate) mod replica;
#[cfg(feature = "channel")]
mod round_trip;
#[cfg(feature = "channel")]
mod streams;
mod transport;
mod unscoped;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::BoxError;
use crate::forwarded::Attached;
use crate::scope::{Cause, Scope};
use crate::status::status_for;
use crate::wire::timeout_header::{self, GRPC_TIMEOUT};

pub use balance::{Balanced, BalancedFuture};
pub use body::ClientBody;
use body::RequestBody;
#[cfg(feature = "channel")]
pub use channel::{REMEMBERED_RESETS, ReadyBody, ReadyChannel, ReadyChannelBuilder, ReadyFuture};
pub use future::ResponseFuture;
pub use layer::ClientDeadlineLayer;
use observer::Sent;
pub use replica::{Avoid, Replica, ReplicaFailed};
#[cfg(feature = "channel")]
pub use round_trip::RoundTrip;
use unscoped::Config;
pub use unscoped::{Unscoped, capture_scope};

/// Marks a call as *wait for ready*: when the channel cannot connect, the
/// call waits for it — dialling again, bounded by its deadline — instead of
/// failing at once with `UNAVAILABLE`. A [`ReadyChannel`] honours it (a
/// plain tonic `Channel` always fails fast); the retry and hedging layers
/// put it on the methods whose service config says `"waitForReady": true`.
///
/// ```
/// use tonic_deadline::client::WaitForReady;
/// let mut request = tonic::Request::new(());
/// request.extensions_mut().insert(WaitForReady);
/// # let _ = request;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitForReady;

/// Put beside a [`WaitForReady`] by the client layer; set by a channel that
/// honours it ([`ReadyChannel`]), so that a call failed at once for want of
/// a connection tells a channel that waited in vain from one that does not
/// wait at all.
#[derive(Debug, Clone, Default)]
pub(crate) struct WaitHonoured(Arc<std::sync::atomic::AtomicBool>);

impl WaitHonoured {
    #[cfg_attr(
        not(feature = "channel"),
        allow(dead_code, reason = "ReadyChannel honours it")
    )]
    pub(crate) fn honour(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn is_honoured(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A call that asked to wait for ready, checked when it fails.
#[derive(Debug)]
pub(crate) struct WaitCheck {
    honoured: WaitHonoured,
    config: Arc<Config>,
    method: http::uri::PathAndQuery,
}

impl WaitCheck {
    /// `err`, or — when it is a failed connect that no channel below waited
    /// out — an `UNAVAILABLE` naming the fix, counted and warned about.
    pub(crate) fn map_error(&self, err: BoxError) -> BoxError {
        let connect_failed = crate::status::chain(&*err).any(|e| e.is::<tonic::ConnectError>());
        if !connect_failed || self.honoured.is_honoured() {
            return err;
        }
        self.config.wait_for_ready_ignored(self.method.path());
        let mut status = tonic::Status::unavailable(unscoped::WAIT_FOR_READY_IGNORED);
        status.set_source(Arc::from(err));
        Box::new(status)
    }
}

/// The service produced by [`ClientDeadlineLayer`]. See the [module docs](self).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use tonic_deadline::ClientDeadlineLayer;
/// use tonic_deadline::client::ClientDeadline;
/// use tower_layer::Layer;
/// let channel = tonic::transport::Endpoint::from_static("http://[::1]:50051").connect_lazy();
/// let client: ClientDeadline<_> = ClientDeadlineLayer::new().layer(channel);
/// // Hand `client` to a generated client: `GreeterClient::new(client)`.
/// # let _ = client;
/// # }
/// ```
#[derive(Debug)]
pub struct ClientDeadline<S> {
    inner: S,
    /// Bounds the wait for a ready connection by the caller's deadline.
    ready_timer: Option<Pin<Box<Sleep>>>,
    /// The deadline passed while waiting for readiness: the next call fails
    /// without reaching the inner service.
    ready_expired: bool,
    config: Arc<Config>,
}

impl<S: Clone> Clone for ClientDeadline<S> {
    fn clone(&self) -> Self {
        Self::with_config(self.inner.clone(), self.config.clone())
    }
}

impl<S> ClientDeadline<S> {
    /// Wraps `inner` with the defaults of [`ClientDeadlineLayer::new`].
    pub fn new(inner: S) -> Self {
        ClientDeadlineLayer::new().wrap(inner)
    }

    fn with_config(inner: S, config: Arc<Config>) -> Self {
        Self {
            inner,
            ready_timer: None,
            ready_expired: false,
            config,
        }
    }

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

/// The request body is handed on as a [`tonic::body::Body`], the type a tonic
/// `Channel` takes, wrapped so that the call can reset its stream.
impl<S, B, RB> Service<Request<B>> for ClientDeadline<S>
where
    S: Service<Request<tonic::body::Body>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ClientBody<RB>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let scope = Scope::try_current();
        // No clock read here: an expired deadline is `call`'s to find (it
        // reads the clock anyway), or the ready timer's, which fires on its
        // first poll when the deadline has passed.
        if scope.as_ref().is_some_and(Scope::is_cancelled) {
            // `call` will fail locally; no need to wait for a connection.
            self.ready_expired = true;
            return Poll::Ready(Ok(()));
        }
        match self.inner.poll_ready(cx) {
            Poll::Ready(ready) => {
                self.ready_timer = None;
                Poll::Ready(ready.map_err(Into::into))
            }
            Poll::Pending => {
                let Some(deadline) = scope.and_then(|s| s.deadline()) else {
                    return Poll::Pending;
                };
                let timer = self
                    .ready_timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.as_mut().poll(cx).is_ready() {
                    self.ready_timer = None;
                    self.ready_expired = true;
                    return Poll::Ready(Ok(()));
                }
                Poll::Pending
            }
        }
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        // A scope the request carries wins: it was captured where the call
        // was made, which may be another task than this one (a `Buffer`
        // above this layer runs `call` on its worker).
        let scope = match request.extensions().get::<Scope>() {
            Some(scope) => Some(scope.clone()),
            None => Scope::try_current(),
        };
        let observer = self.config.observer.as_deref();
        let span = observer.and_then(|o| o.open(request.uri().path()));
        let failed = |span, status: tonic::Status| {
            if let Some(observer) = observer {
                observer.failed(span, status.code());
            }
            ResponseFuture::failed(status)
        };
        if scope.is_none()
            && let Err(refused) = self.config.unscoped_call(request.uri().path())
        {
            return failed(span, refused);
        }
        if std::mem::take(&mut self.ready_expired) {
            let cause = scope
                .as_ref()
                .and_then(Scope::cause)
                .unwrap_or(Cause::DeadlineExceeded);
            self.count_refused(cause);
            return failed(span, status_for(cause));
        }
        let requested = match timeout_header::from_headers(request.headers()) {
            Ok(requested) => requested,
            Err(malformed) => {
                return failed(span, tonic::Status::internal(malformed.to_string()));
            }
        };
        if let Some(scope) = &scope {
            // Cancelled: refused here. Expired: refused below, from the one
            // clock reading the call makes.
            if scope.is_cancelled()
                && let Some(cause) = scope.cause()
            {
                self.count_refused(cause);
                return failed(span, status_for(cause));
            }
            if let Some(forwarded) = Attached::of(scope) {
                let headers = request.headers_mut();
                // Decide per key, not per value: a key may carry several values.
                for name in forwarded.keys() {
                    if !headers.contains_key(name) {
                        for value in forwarded.get_all(name) {
                            headers.append(name.clone(), value.clone());
                        }
                    }
                }
            }
        }
        // One clock read, as late as possible: the next step hands the
        // request over.
        let now = Instant::now();
        let deadline = match (
            requested.and_then(|t| now.checked_add(t)),
            scope.as_ref().and_then(Scope::deadline),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut granted = None;
        match deadline {
            Some(deadline) => {
                let on_arrival = deadline
                    .saturating_duration_since(now)
                    .saturating_sub(self.config.transit());
                if on_arrival.is_zero() {
                    self.count_refused(Cause::DeadlineExceeded);
                    return failed(span, status_for(Cause::DeadlineExceeded));
                }
                granted = Some(on_arrival);
                let mut wire = [0; timeout_header::ENCODED_MAX];
                let len = timeout_header::encode_into(on_arrival, &mut wire);
                // Digits and a unit letter are always a valid header value.
                if let Ok(value) = HeaderValue::from_bytes(&wire[..len]) {
                    request.headers_mut().insert(GRPC_TIMEOUT, value);
                }
            }
            None => {
                request.headers_mut().remove(GRPC_TIMEOUT);
            }
        }
        let (mut parts, body) = request.into_parts();
        let observed = observer.map(|o| {
            let sent = Sent {
                path: parts.uri.path(),
                now,
                deadline,
                scope: scope.as_ref(),
                granted,
            };
            o.sent(&sent, span, &mut parts.headers)
        });
        let (abandon, abandoned) = abandon::pair();
        // Every call with a budget on the wire is watched: if its request
        // leaves much later than now, something below held it, and the
        // server was told too much.
        let watch = granted.map(|granted| {
            body::Departure::new(now, granted, &self.config, parts.uri.path_and_query())
        });
        // A call that asks to wait for ready: a channel that honours it says
        // so, and one that fails it at once for want of a connection is
        // named (a plain tonic Channel never waits).
        let waits = parts
            .extensions
            .get::<WaitForReady>()
            .is_some()
            .then(|| self.wait_check(&mut parts));
        // A call under a scope with a deadline is kept for the ledger of
        // the request it serves, should it fail.
        #[cfg(feature = "ledger")]
        let note = scope
            .as_ref()
            .zip(granted)
            .zip(parts.uri.path_and_query())
            .map(|((_, granted), path)| deadline_race::CallNote::new(path, granted));
        #[cfg(not(feature = "ledger"))]
        let note = None;
        let body = tonic::body::Body::new(RequestBody::new(body, abandoned, watch));
        let inner = {
            let _entered = observed.as_ref().map(|o| o.span().enter());
            self.inner.call(Request::from_parts(parts, body))
        };
        let told = granted.and_then(|g| now.checked_add(g));
        let race = deadline_race::Race::new(deadline, scope, Some(abandon), observed, note, told);
        ResponseFuture::running(inner, race, waits)
    }
}

impl<S> ClientDeadline<S> {
    #[cold]
    #[inline(never)]
    fn wait_check(&self, parts: &mut http::request::Parts) -> Box<WaitCheck> {
        let honoured = WaitHonoured::default();
        parts.extensions.insert(honoured.clone());
        Box::new(WaitCheck {
            honoured,
            config: self.config.clone(),
            method: parts
                .uri
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
        })
    }

    /// Counts a call failed locally, sending nothing, because its scope
    /// ended, as refused if it had expired.
    fn count_refused(&self, cause: Cause) {
        if cause == Cause::DeadlineExceeded
            && let Some(observer) = &self.config.observer
        {
            observer.refused_expired();
        }
    }
}

#[cfg(test)]
mod tests;
