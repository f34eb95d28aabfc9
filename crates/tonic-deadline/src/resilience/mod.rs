//! Retries and hedging inside the caller's deadline: gRPC's `retryPolicy`
//! and `hedgingPolicy`, as one tower layer above
//! [`ClientDeadlineLayer`](crate::ClientDeadlineLayer).
//!
//! A gRPC service config gives each method at most one of the two
//! policies (a `methodConfig` holds one or the other) and the whole
//! channel one `retryThrottling`. [`ResilienceLayer`] reads the config the
//! same way: per call, the method's most specific `methodConfig` says
//! whether the call is retried, hedged or sent once, and one throttle
//! serves every method of the channel.
//!
//! Each attempt is a call of its own through the client layer, made in a
//! child of the caller's [`Scope`](crate::Scope): it carries what is left
//! of the *one* deadline at its own send time (a later attempt tells the
//! server less), and it ends when the caller's scope does. For a retried
//! or hedged call the layer
//! 1. reads the request body once (unary and server-streaming requests are
//!    complete at once) into a replay buffer of 256 KiB, and replays it for
//!    every attempt; a body still streaming, or larger, commits the call to
//!    a single attempt;
//! 2. sends `grpc-previous-rpc-attempts` with every attempt after the
//!    first;
//! 3. sends no attempt after the first that what is left cannot fit (see
//!    [below](#whether-another-attempt-fits)), and none while throttling
//!    or the [`RetryBudget`] says no;
//! 4. reads the server's `grpc-retry-pushback-ms`: the next attempt waits
//!    exactly that long; a negative or malformed one sends no more;
//! 5. answers a failure the policy would retry but the layer no longer
//!    does (`maxAttempts`, a pushback, the throttle, no time left) with
//!    `grpc-retry-pushback-ms: -1`, so that the hop above, handed the
//!    status by its handler, does not retry it again: one retry budget
//!    for the whole chain ([`ResilienceLayer::chain_budget`]);
//! 6. over a balancer that says which replica answered, sends a retry to
//!    another replica than the one that failed, and retries a failure the
//!    hop below marked as spent once, on another replica (see
//!    [below](#behind-replicas)).
//!
//! A method without a policy is sent once, as it comes. Whatever its
//! policy, a method's `timeout` and `waitForReady` hold: the call runs
//! under the earlier of the caller's deadline and `timeout` from the call,
//! and waits for the channel to connect (see
//! [`WaitForReady`](crate::client::WaitForReady)).
//!
//! # Retries
//!
//! Attempts one after another. The call
//! 1. commits to an attempt as soon as its response headers arrive: only a
//!    trailers-only answer or a local failure can be retried;
//! 2. retries a status the policy lists — `DEADLINE_EXCEEDED` and
//!    `CANCELLED` (outcome unknown: the server may have done the work) only
//!    for methods declared idempotent — up to `maxAttempts`;
//! 3. backs off `random(0, min(initialBackoff × multiplier^(n−1),
//!    maxBackoff))` before retry `n`, or exactly what the server's pushback
//!    asks (and starts the sequence afresh). The sleep ends with the
//!    caller's scope;
//! 4. sends no retry that what is left cannot fit: the call ends at once
//!    with the last attempt's status — not `DEADLINE_EXCEEDED`, a deadline
//!    that has not passed and an outcome the caller could not know — its
//!    message ending "no further attempt fitted before the deadline"
//!    (counted in
//!    [`Metrics::attempts_refused_for_time`](crate::observe::Metrics::attempts_refused_for_time)).
//!
//! # Hedging
//!
//! Attempts racing. The first attempt goes at once; while no answer has
//! come, another follows every `hedgingDelay`, up to `maxAttempts`. The
//! call
//! 1. takes the first *acceptable* answer: response headers, an OK, or a
//!    status not listed in `nonFatalStatusCodes`;
//! 2. drops the other attempts the moment one wins: the client layer resets
//!    their streams (RST_STREAM CANCEL), the servers' scopes end, and the
//!    losers are counted ([`Metrics::hedge_losers_cancelled`]);
//! 3. after a non-fatal status sends the next attempt at once (or after the
//!    server's pushback);
//! 4. sends no more attempts once one cannot fit; those in flight run on,
//!    and when every one failed the last non-fatal answer is the call's;
//! 5. optionally hedges after a learned delay:
//!    [`ResilienceLayer::adaptive_hedging_delay`] waits for a quantile of
//!    the method's recent answer latency (p95, as "The Tail at Scale"
//!    advises) instead of the fixed `hedgingDelay`. The learned delay
//!    replaces `hedgingDelay` only once eight attempts of the method were
//!    answered, a rule of its own: whether an attempt fits needs one.
//!
//! A hedge sends the same request more than once, and a loser may have done
//! its work before its reset arrived: configure a `hedgingPolicy` only for
//! methods for which that is harmless, as every gRPC stack asks.
//!
//! # Whether another attempt fits
//!
//! Before each retry, and before each attempt of a hedged call after the
//! first, the layer sends the attempt only if
//!
//! ```text
//! left ≥ wait + need
//! ```
//!
//! - `left` is what the caller's scope (under the method's `timeout`) has
//!   left at that moment: for a retry, when the failed attempt's answer is
//!   read, before the backoff; for a hedge, when it is due. A call without
//!   a deadline always fits.
//! - `wait` is the backoff just drawn, or the server's pushback, for a
//!   retry; zero for a hedge.
//! - `need` is the larger of [`ResilienceLayer::min_attempt_time`]
//!   (default 1 ms) and the *learned attempt time* of the method.
//! - The learned attempt time is the
//!   [`ResilienceLayer::attempt_time_quantile`] (default 0.5, the median)
//!   of the last 128 attempts of the method (its full path) that the
//!   *server answered*, through any service the layer built: the time from
//!   handing the attempt to the service below to its response headers, or
//!   to the status of a trailers-only answer, in whole microseconds. Of the
//!   `n` times, sorted, it is the one at index `round((n − 1) × q)` (halves
//!   round up). One answered attempt is enough, so from the
//!   first answered attempt of the method on — the failed attempt that
//!   prompts a retry included — no attempt starts that this time says
//!   cannot fit; before any, `need` is the floor alone. Failures made on
//!   this side (no connection, a local or per-attempt timeout) say nothing
//!   of the server and are not counted.
//!
//! The first attempt is always sent (the client layer alone refuses an
//! expired call). An attempt that does not fit is counted in
//! [`Metrics::attempts_refused_for_time`](crate::observe::Metrics::attempts_refused_for_time)
//! and asks nothing of the throttle or budget; one that fits is sent only
//! if they allow it.
//!
//! # Behind replicas
//!
//! A failure marked as spent for the chain (`grpc-retry-pushback-ms: -1`)
//! says that the hop below spent its retries at the replica that answered.
//! When the balancer under this layer says which replica that was (a
//! [`Replica`](crate::client::Replica) in the response's extensions, or a
//! [`ReplicaFailed`](crate::client::ReplicaFailed) around a local failure,
//! as [`Balanced`](crate::client::Balanced) does), the layer
//! 1. retries the marked failure once, on another replica — never the same
//!    one — if one is at hand that is not resting, `maxAttempts` allows it,
//!    the throttle or budget does, and the deadline fits the attempt; the
//!    next attempt's request carries an [`Avoid`](crate::client::Avoid)
//!    naming the replicas it must not go to;
//! 2. sends every other retry to another replica too, when one is at hand
//!    (a retry that fails marked at its own replica is in turn retried once
//!    elsewhere: a call tries each replica at most once this way, within
//!    `maxAttempts`; a server's own `grpc-retry-pushback-ms: -1` reads the
//!    same, and is treated the same);
//! 3. lets a replica whose attempt failed with a status the policy retries
//!    rest for [`ResilienceLayer::replica_rest`] (1 s; each failure starts
//!    it again, an answer ends it): the first attempts of calls go to the
//!    others while any is not resting, and no retry goes to it. When every
//!    replica rests, a marked failure is retried by nobody: a failure of
//!    the whole service costs the failing hop `maxAttempts` per call, as
//!    with one replica.
//!
//! A balancer that names no replica (tonic's `Channel::balance_list`, or
//! `tower::balance::p2c`) leaves the layer as it is without one: a marked
//! failure is not retried, and retries go where the balancer sends them.
//! A balancer must name its replicas only if it honours [`Avoid`]: the
//! layer relies on it to keep a retry off the replica that failed.
//!
//! A marked `DEADLINE_EXCEEDED` answered when under a quarter of the
//! attempt's own [`per_attempt_timeout`](ResilienceLayer::per_attempt_timeout)
//! is left, the caller's deadline still ahead, is read as that timeout: the
//! hops below ran out of the time this attempt gave them (each ending its
//! handler a little early, by the server layer's reply reserve), not of
//! the call's, and the call retries it as it retries its own timeout.
//!
//! All of this is part of the chain budget: with
//! [`chain_budget(false)`](ResilienceLayer::chain_budget) retries go
//! wherever the balancer sends them. Hedged calls do not use it.
//!
//! [`Avoid`]: crate::client::Avoid
//!
//! # One throttle per channel
//!
//! Throttling (or the budget) and the learned attempt times belong to the
//! layer: every service it builds — one per connection to the same server,
//! and their clones — shares them, retried and hedged methods alike. Use
//! one layer per channel — over a balanced channel, one over the balancer,
//! not one per replica: only there can a retry go to another replica, and
//! the throttle then speaks for the whole service. With `retryThrottling`, an attempt of a retried
//! or hedged call that ends with a status its policy lists
//! (`retryableStatusCodes`, `nonFatalStatusCodes`) takes a token, one that
//! commits gives `tokenRatio` back, and no retry or hedge is sent while
//! half the tokens or fewer are left. A [`RetryBudget`] instead lets
//! retries and hedges together add at most a share of the calls.
//!
//! # How it differs
//!
//! `tower::retry` retries a cloned request with a policy of your own and
//! knows no deadline, so every retry gets a fresh timeout and the backoff
//! can outlive the caller. `tower::hedge` hedges after a latency percentile
//! too, but knows no deadline either, sends at most one hedge and has no
//! notion of a status that should end the call. grpc-java implements both
//! policies from the same config, bounded by the call's deadline; grpc-go
//! retries the same way and does not hedge; neither learns how long an
//! attempt needs.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use tonic_deadline::client::ReadyChannel;
//! use tonic_deadline::resilience::ResilienceLayer;
//! use tonic_deadline::{ClientDeadlineLayer, Scope};
//! use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let resilience = ResilienceLayer::from_service_config(r#"{"methodConfig": [{
//!     "name": [{"service": "grpc.health.v1.Health"}],
//!     "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.05s", "maxBackoff": "0.5s",
//!                     "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}],
//!   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#)?;
//! let endpoint = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051");
//! let channel = tower::ServiceBuilder::new()
//!     .layer(resilience) // above: each attempt goes through the client layer
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
//! the call is made is sent once, neither retried nor hedged: replaying a
//! live stream would mean holding every message back until the call
//! commits. gRPC's transparent retries (of attempts that never left the
//! client) are not made; such failures count as `UNAVAILABLE` attempts.
//!
//! [`Metrics::hedge_losers_cancelled`]: crate::observe::Metrics::hedge_losers_cancelled

mod call;
mod future;
mod hedge;
mod layer;
mod limiter;
pub(crate) mod observer;
mod retry;
mod shared;

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::BoxError;
use crate::service_config::Policy;

pub use future::ResponseFuture;
pub use layer::ResilienceLayer;
pub use limiter::RetryBudget;

/// The service [`ResilienceLayer`] produces. See the [module docs](self).
///
/// ```
/// use tonic_deadline::ClientDeadlineLayer;
/// use tonic_deadline::resilience::{Resilience, ResilienceLayer};
/// use tower::Layer;
///
/// let layer = ResilienceLayer::from_service_config(r#"{"methodConfig": []}"#)?;
/// let inner = ClientDeadlineLayer::new().layer(tower::service_fn(
///     |_: http::Request<tonic::body::Body>| async {
///         Ok::<_, tonic::Status>(http::Response::new(tonic::body::Body::empty()))
///     },
/// ));
/// let service: Resilience<_> = layer.layer(inner);
/// # let _ = service.get_ref();
/// # Ok::<(), tonic_deadline::service_config::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Resilience<S> {
    inner: S,
    core: Arc<shared::Core>,
}

impl<S> Resilience<S> {
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

impl<S, RB> Service<Request<tonic::body::Body>> for Resilience<S>
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
        let plan = match resolved.policy {
            None => {
                let request = shared::pass_through(request, &resolved);
                return ResponseFuture::once(self.inner.call(request));
            }
            Some(Policy::Retry(policy)) => Plan::Retry(policy.clone(), resolved.idempotent),
            Some(Policy::Hedge(policy)) => {
                let delay = self.core.hedging_delay(path, policy);
                Plan::Hedge(policy.clone(), delay)
            }
        };
        let scope = shared::policy_scope(&mut request, &resolved);
        // The service that was made ready goes with the call; this one is
        // readied again before the next call.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        let call = call::Call::new(ready, self.core.clone(), scope, request);
        match plan {
            Plan::Retry(policy, idempotent) => {
                ResponseFuture::retry(retry::Retrying::new(call, policy, idempotent))
            }
            Plan::Hedge(policy, delay) => {
                ResponseFuture::hedge(hedge::Hedging::new(call, policy, delay))
            }
        }
    }
}

/// A call's policy, read from the config before the request is taken apart.
enum Plan {
    Retry(crate::service_config::RetryPolicy, bool),
    Hedge(crate::service_config::HedgingPolicy, std::time::Duration),
}

#[cfg(test)]
mod tests;
