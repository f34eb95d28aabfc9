//! Retries inside the caller's deadline: gRPC's `retryPolicy`, as a tower
//! layer above [`ClientDeadlineLayer`](crate::ClientDeadlineLayer).
//!
//! Each attempt is a call of its own through the client layer, made in a
//! child of the caller's [`Scope`](crate::Scope): it carries what is left of the *one*
//! deadline at its own send time (a later attempt tells the server less),
//! and it ends when the caller's scope does. Per call the layer
//! 1. reads the request body once (unary and server-streaming requests are
//!    complete at once) into a replay buffer of 256 KiB, and replays it for
//!    every attempt; a body still streaming, or larger, commits the call to
//!    a single attempt;
//! 2. commits to an attempt as soon as its response headers arrive: only a
//!    trailers-only answer or a local failure can be retried;
//! 3. retries a status the policy lists — `DEADLINE_EXCEEDED` and
//!    `CANCELLED` (outcome unknown: the server may have done the work) only
//!    for methods declared idempotent;
//! 4. backs off `random(0, min(initialBackoff × multiplier^(n−1),
//!    maxBackoff))`, or exactly what the server's `grpc-retry-pushback-ms`
//!    asks (and starts the sequence afresh); a negative or malformed
//!    pushback stops retrying. The sleep ends with the caller's scope;
//! 5. starts no attempt that what is left cannot fit. Before each retry it
//!    compares what the caller's scope has left with the backoff plus the
//!    time an attempt of the method takes to be answered: the median
//!    ([`RetryLayer::attempt_time_quantile`]) of the last 128 attempts the
//!    *server answered* — with response headers or with a status of its
//!    own, from the first such attempt on — and never less than
//!    [`RetryLayer::min_attempt_time`] (1 ms; the only bound before any
//!    answer). Failures made on this side (no connection, a local timeout)
//!    say nothing of the server and are not counted. When the attempt
//!    cannot fit, the call answers `DEADLINE_EXCEEDED` at once instead of
//!    sending it, and [`Metrics::attempts_refused_for_time`](crate::observe::Metrics::attempts_refused_for_time)
//!    counts it;
//! 6. sends `grpc-previous-rpc-attempts` with every attempt after the first;
//! 7. stops retrying while the server fails too much: gRPC's
//!    `retryThrottling` token bucket, or a [`RetryBudget`] instead.
//!
//! The first attempt is always sent (the client layer alone refuses an
//! expired call), and a method without a `retryPolicy` is sent once. A
//! method's `timeout` and `waitForReady` hold whatever its policy: the call
//! runs under the earlier of the caller's deadline and `timeout` from the
//! call, and waits for the channel to connect (see
//! [`WaitForReady`](crate::client::WaitForReady)).
//!
//! How it differs from `tower::retry`: that one retries a cloned request
//! with a policy of your own and knows no deadline, so every retry gets a
//! fresh timeout and the backoff can outlive the caller. grpc-go and
//! grpc-java implement the same service-config policy, bounded by the call
//! deadline too; neither learns how long an attempt needs.
//!
//! Throttling (or the budget) and the learned latencies belong to the
//! layer: every service it builds — one per connection to the same server,
//! and their clones — shares them. Use one layer per target server.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use tonic_deadline::client::ReadyChannel;
//! use tonic_deadline::retry::RetryLayer;
//! use tonic_deadline::{ClientDeadlineLayer, Scope};
//! use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let retry = RetryLayer::from_service_config(r#"{"methodConfig": [{
//!     "name": [{"service": "grpc.health.v1.Health"}],
//!     "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.05s", "maxBackoff": "0.5s",
//!                     "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#)?;
//! let endpoint = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051");
//! let channel = tower::ServiceBuilder::new()
//!     .layer(retry) // above: each attempt goes through the client layer
//!     .layer(ClientDeadlineLayer::new())
//!     .service(ReadyChannel::connect(&endpoint).await?);
//! let mut client = HealthClient::new(channel);
//! let scope = Scope::background().with_timeout(Duration::from_millis(300));
//! let reply = scope.enter(client.check(HealthCheckRequest::default())).await?;
//! # let _ = reply;
//! # Ok(())
//! # }
//! ```
//!
//! # What remains
//!
//! A client-streaming or bidi call whose request stream is still open when
//! the call is made is sent once, without retries: replaying a live stream
//! would mean holding every message back until the call commits. gRPC's
//! transparent retries (of attempts that never left the client) are not
//! made; such failures count as `UNAVAILABLE` attempts.

pub(crate) mod core;
mod future;
mod layer;
mod limiter;

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::BoxError;
use crate::service_config::Policy;

pub use future::ResponseFuture;
pub use layer::RetryLayer;
pub use limiter::RetryBudget;

/// The service [`RetryLayer`] produces. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct Retry<S> {
    inner: S,
    core: Arc<core::Core>,
}

impl<S> Retry<S> {
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

impl<S, RB> Service<Request<tonic::body::Body>> for Retry<S>
where
    S: Service<Request<tonic::body::Body>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = ResponseFuture<S>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: Request<tonic::body::Body>) -> Self::Future {
        let resolved = self.core.config.resolve(request.uri().path());
        let Some(Policy::Retry(policy)) = resolved.policy else {
            let request = core::pass_through(request, &resolved);
            return ResponseFuture::passthrough(self.inner.call(request));
        };
        let policy = policy.clone();
        let idempotent = resolved.idempotent;
        let scope = core::policy_scope(&mut request, &resolved);
        // The service that was made ready goes with the call; this one is
        // readied again before the next call.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::new(ready, self.core.clone(), policy, idempotent, scope, request)
    }
}

#[cfg(test)]
pub(crate) mod tests;
