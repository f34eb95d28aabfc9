//! Hedged calls inside the caller's deadline: gRPC's `hedgingPolicy`, as a
//! tower layer above [`ClientDeadlineLayer`](crate::ClientDeadlineLayer).
//!
//! The first attempt goes at once; while no answer has come, another one
//! follows every `hedgingDelay`, up to `maxAttempts`. Every attempt is a
//! call of its own through the client layer, in a child of the caller's
//! [`Scope`](crate::Scope), so each carries what is left of the one deadline when it is
//! sent. Per call the layer
//! 1. takes the first *acceptable* answer: response headers, an OK, or a
//!    status not listed in `nonFatalStatusCodes`;
//! 2. drops the other attempts the moment one wins: the client layer resets
//!    their streams (RST_STREAM CANCEL), the servers' scopes end, and the
//!    losers are counted ([`Metrics::hedge_losers_cancelled`]);
//! 3. on a non-fatal status sends the next hedge at once — or after the
//!    server's `grpc-retry-pushback-ms`, and none at all after a negative
//!    or malformed one;
//! 4. sends no hedge the deadline cannot fit (learned from the answered
//!    attempts, as the retry layer does) and none while throttling or the
//!    [`RetryBudget`](crate::retry::RetryBudget) says no;
//! 5. optionally learns the delay: [`HedgeLayer::adaptive_delay`] waits for
//!    a quantile of the recent answer latency (p95, as "The Tail at Scale"
//!    advises) instead of the fixed `hedgingDelay`.
//!
//! A hedge sends the same request more than once, and a loser may have done
//! its work before its reset arrived: configure a `hedgingPolicy` only for
//! methods for which that is harmless, as every gRPC stack asks.
//!
//! How it differs from `tower::hedge`: that one hedges after a latency
//! percentile too, but knows no deadline (a hedge may be sent with no time
//! left, and its timeout, if any, starts afresh), sends at most one hedge
//! and has no notion of a status that should end the call. grpc-java
//! implements this same policy; grpc-go does not hedge.
//!
//! # Example
//!
//! ```no_run
//! use tonic_deadline::client::ReadyChannel;
//! use tonic_deadline::hedge::HedgeLayer;
//! use tonic_deadline::observe::Metrics;
//! use tonic_deadline::ClientDeadlineLayer;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let metrics = Metrics::new();
//! let hedge = HedgeLayer::from_service_config(r#"{"methodConfig": [{
//!     "name": [{"service": "kv.v1.Store", "method": "Get"}], "idempotent": true,
//!     "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.02s",
//!                       "nonFatalStatusCodes": ["UNAVAILABLE"]}}]}"#)?
//!     .metrics(&metrics);
//! let endpoint = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051");
//! let channel = tower::ServiceBuilder::new()
//!     .layer(hedge)
//!     .layer(ClientDeadlineLayer::new())
//!     .service(ReadyChannel::connect(&endpoint).await?);
//! # let _ = channel;
//! # Ok(())
//! # }
//! ```
//!
//! [`Metrics::hedge_losers_cancelled`]: crate::observe::Metrics::hedge_losers_cancelled

mod future;
mod layer;

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::BoxError;
use crate::retry::core::{self, Core};
use crate::service_config::Policy;

pub use future::ResponseFuture;
pub use layer::HedgeLayer;

/// The service [`HedgeLayer`] produces. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct Hedge<S> {
    inner: S,
    core: Arc<Core>,
    adaptive: Option<f64>,
}

impl<S> Hedge<S> {
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

impl<S, RB> Service<Request<tonic::body::Body>> for Hedge<S>
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
        let path = request.uri().path();
        let resolved = self.core.config.resolve(path);
        let Some(Policy::Hedge(policy)) = resolved.policy else {
            let request = core::pass_through(request, &resolved);
            return ResponseFuture::passthrough(self.inner.call(request));
        };
        let policy = policy.clone();
        let delay = self
            .adaptive
            .and_then(|q| self.core.latency_quantile(path, q))
            .unwrap_or(policy.hedging_delay);
        let scope = core::policy_scope(&mut request, &resolved);
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::new(ready, self.core.clone(), policy, delay, scope, request)
    }
}

#[cfg(test)]
mod tests;
