//! A retried call: attempts one after another, a backoff between them.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response};
use tokio::time::{Instant, Sleep};
use tonic::Code;
use tower_service::Service;

use super::call::Call;
use super::shared::{self, Core, Outcome, Permit, Pushback};
use crate::BoxError;
use crate::client::Avoid;
use crate::scope::{Cancelled, Cause};
use crate::service_config::RetryPolicy;
use crate::status::status_for;

/// What a retried call keeps between attempts.
pub(super) struct Retrying<S> {
    pub(super) call: Call<S>,
    policy: RetryPolicy,
    idempotent: bool,
    phase: Phase,
    /// Retries since the backoff sequence last started.
    backoffs: u32,
    attempt_started: Instant,
    backoff_started: Instant,
    backoff: Option<Pin<Box<Sleep>>>,
    /// Time spent backing off.
    delay: Duration,
    /// The replicas the next retry must not go to.
    avoid: Option<Avoid>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Reading,
    /// The service is ready for the next attempt (the first one's
    /// readiness came with the call).
    Ready,
    /// The service must be readied first.
    Readying,
    Running,
    /// Committed to its one attempt: its outcome is the call's.
    Committed,
    BackingOff,
}

impl<S> Retrying<S>
where
    S: Service<Request<tonic::body::Body>>,
{
    pub(super) fn new(call: Call<S>, policy: RetryPolicy, idempotent: bool) -> Self {
        let now = Instant::now();
        Self {
            call,
            policy,
            idempotent,
            phase: Phase::Reading,
            backoffs: 0,
            attempt_started: now,
            backoff_started: now,
            backoff: None,
            delay: Duration::ZERO,
            avoid: None,
        }
    }

    fn finish<T>(&self, result: T) -> Poll<T> {
        self.call.finish(false, self.delay, result)
    }

    /// Drives the call; `attempt` holds the attempt in flight, `cancelled`
    /// the end of the caller's scope.
    pub(super) fn poll<RB>(
        &mut self,
        mut attempt: Pin<&mut Option<S::Future>>,
        mut cancelled: Pin<&mut Option<Cancelled>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<RB>, BoxError>>
    where
        S: Service<Request<tonic::body::Body>, Response = Response<RB>>,
        S::Error: Into<BoxError>,
    {
        loop {
            match self.phase {
                Phase::Reading => match ready!(self.call.poll_read(cx)) {
                    Err(err) => return self.finish(Err(err)),
                    Ok(None) => self.phase = Phase::Ready,
                    Ok(Some(live)) => {
                        attempt.set(Some(live));
                        self.phase = Phase::Committed;
                    }
                },
                Phase::Readying => {
                    if let Err(err) = ready!(self.call.service.poll_ready(cx)) {
                        return self.finish(Err(err.into()));
                    }
                    self.phase = Phase::Ready;
                }
                Phase::Ready => {
                    if let Some(status) = self.call.ended() {
                        return self.finish(Err(Box::new(status)));
                    }
                    // A first attempt leaves out the replicas that rest; a
                    // retry, those chosen when it was decided on.
                    let avoid = match self.call.attempts {
                        0 => self.call.core.avoid(None),
                        _ => self.avoid.take(),
                    };
                    self.attempt_started = Instant::now();
                    attempt.set(Some(self.call.send(avoid)));
                    self.phase = Phase::Running;
                }
                Phase::Committed => {
                    let running = attempt.as_mut().as_pin_mut().expect("an attempt runs");
                    let result = ready!(running.poll(cx)).map_err(Into::into);
                    attempt.set(None);
                    return self.finish(result);
                }
                Phase::Running => {
                    let running = attempt.as_mut().as_pin_mut().expect("an attempt runs");
                    let result = ready!(running.poll(cx)).map_err(Into::into);
                    attempt.set(None);
                    let took = self.attempt_started.elapsed();
                    let (path, retryable) = (self.call.path(), self.policy.retryable);
                    let (code, pushback, replica, result) =
                        match self.call.core.settle(path, took, result, retryable) {
                            Outcome::Committed(response) => return self.finish(Ok(response)),
                            Outcome::Failed {
                                code,
                                pushback,
                                replica,
                                result,
                                ..
                            } => (code, pushback, replica, result),
                        };
                    let repeatable = shared::may_repeat(retryable, code, self.idempotent);
                    self.call.core.note_replica(replica, repeatable);
                    if let Some(status) = self.call.ended() {
                        // The caller's scope ended: its cause is the answer.
                        return self.finish(Err(Box::new(status)));
                    }
                    if !repeatable {
                        return self.finish(result);
                    }
                    // From here on a failure the policy would retry: one
                    // this call does not retry is spent for the chain.
                    let (core, scope) = (&self.call.core, self.call.scope.as_ref());
                    if self.call.attempts >= self.policy.max_attempts {
                        return self.finish(core.spent(scope, result));
                    }
                    // The retry goes to none of the replicas that failed,
                    // when another is at hand.
                    self.avoid = core.avoid(replica);
                    let pushback = match pushback {
                        // The hops below ran out of the time this attempt's
                        // own timeout gave them, not of the call's.
                        Pushback::Stop
                            if code == Code::DeadlineExceeded && self.call.ran_out_of_its_cap() =>
                        {
                            Pushback::None
                        }
                        // Spent for the chain at that replica, not at
                        // another: tried once more, elsewhere.
                        Pushback::Stop if replica.is_some() && self.avoid.is_some() => {
                            Pushback::None
                        }
                        pushback => pushback,
                    };
                    let delay = match pushback {
                        Pushback::Stop => {
                            if let Some(o) = core.observer() {
                                o.pushback_stop();
                            }
                            return self.finish(core.spent(scope, result));
                        }
                        Pushback::Delay(delay) => {
                            self.backoffs = 0;
                            delay
                        }
                        Pushback::None => {
                            self.backoffs += 1;
                            backoff(&self.call.core, &self.policy, self.backoffs)
                        }
                    };
                    match core.permit(scope, self.call.path(), delay) {
                        Permit::Send => {}
                        // The answer is the attempt's, not a deadline that
                        // has not passed: its code tells what is known.
                        Permit::NoTime => {
                            return self.finish(core.spent(scope, shared::no_time_left(result)));
                        }
                        Permit::Throttled => return self.finish(core.spent(scope, result)),
                    }
                    self.backoff_started = Instant::now();
                    shared::arm(&mut self.backoff, scope, delay);
                    self.phase = Phase::BackingOff;
                }
                Phase::BackingOff => {
                    if let Some(watch) = cancelled.as_mut().as_pin_mut()
                        && watch.poll(cx).is_ready()
                    {
                        self.delay += self.backoff_started.elapsed();
                        let status = self
                            .call
                            .ended()
                            .unwrap_or_else(|| status_for(Cause::Cancelled));
                        return self.finish(Err(Box::new(status)));
                    }
                    let sleep = self.backoff.as_mut().expect("a backoff is set");
                    ready!(sleep.as_mut().poll(cx));
                    self.delay += self.backoff_started.elapsed();
                    if let Some(status) = self.call.ended() {
                        return self.finish(Err(Box::new(status)));
                    }
                    self.phase = Phase::Readying;
                }
            }
        }
    }
}

/// gRPC's backoff before retry `n` (1-based):
/// `random(0, min(initialBackoff × multiplier^(n−1), maxBackoff))`.
pub(super) fn backoff(core: &Core, policy: &RetryPolicy, n: u32) -> Duration {
    let exponent = i32::try_from(n.saturating_sub(1)).unwrap_or(i32::MAX);
    let bound = policy.initial_backoff.as_secs_f64() * policy.backoff_multiplier.powi(exponent);
    let bound = bound.min(policy.max_backoff.as_secs_f64());
    let bound = if bound.is_finite() {
        bound.max(0.0)
    } else {
        policy.max_backoff.as_secs_f64()
    };
    Duration::from_secs_f64(bound * core.random())
}
