//! The plain-HTTP server layer: every HTTP request (axum, hyper, any tower
//! HTTP service) runs inside a [`Scope`], as a gRPC request does under
//! [`ServerDeadlineLayer`](crate::ServerDeadlineLayer).
//!
//! For each request the layer
//! 1. reads the deadline headers it accepts (by default all of
//!    [`DeadlineHeader::ALL`]: `grpc-timeout`, `connect-timeout-ms`,
//!    `x-envoy-expected-rq-timeout-ms`, `request-timeout`); when several are
//!    present **the tightest wins**. A malformed or duplicated one is
//!    answered `400 Bad Request` with a text naming the header, before the
//!    handler runs;
//! 2. applies the configured default (for requests without a deadline) and
//!    maximum;
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
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use axum::{Router, routing::get};
//! use tonic_deadline::{Scope, http_server::HttpDeadlineLayer};
//!
//! async fn handler() -> String {
//!     format!("{:?} left", Scope::current().remaining())
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let app = Router::new().route("/", get(handler)).layer(
//!     HttpDeadlineLayer::new()
//!         .default_timeout(Duration::from_millis(900))
//!         .max_timeout(Duration::from_secs(30)),
//! );
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```

mod body;
mod future;
mod layer;

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tower_service::Service;

use crate::deadline_headers::{self, DeadlineHeader};
use crate::scope::{CURRENT, Cause, Scope};

pub use body::HttpBody;
pub use future::ResponseFuture;
pub use layer::HttpDeadlineLayer;

#[derive(Debug, Clone)]
struct Config {
    limits: crate::server::Config,
    accepted: Vec<DeadlineHeader>,
}

/// The service produced by [`HttpDeadlineLayer`]. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct HttpDeadline<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> HttpDeadline<S> {
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

impl<S, B, RB> Service<Request<B>> for HttpDeadline<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    RB: http_body::Body,
{
    type Response = Response<HttpBody<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let requested = match deadline_headers::read(request.headers(), &self.config.accepted) {
            Ok(requested) => requested,
            Err(malformed) => {
                tracing::debug!(path = %request.uri().path(), %malformed, "refused before the handler");
                return ResponseFuture::answer(StatusCode::BAD_REQUEST, malformed.to_string());
            }
        };
        let budget = self.config.limits.budget(requested);
        if budget == Some(Duration::ZERO) {
            tracing::debug!(path = %request.uri().path(), "refused as already expired");
            return ResponseFuture::answer(
                StatusCode::GATEWAY_TIMEOUT,
                Cause::DeadlineExceeded.to_string(),
            );
        }
        let deadline = budget.and_then(|b| Instant::now().checked_add(b));
        let scope =
            Scope::root_attached(deadline, self.config.limits.attachment(request.headers()));
        request.extensions_mut().insert(scope.clone());
        let inner = CURRENT.sync_scope(scope.clone(), || self.inner.call(request));
        ResponseFuture::running(CURRENT.scope(scope.clone(), inner), scope, deadline)
    }
}

#[cfg(test)]
mod tests;
