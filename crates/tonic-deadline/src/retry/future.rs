use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::BytesMut;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::core::{self, Buffered, Core, Outcome, Pushback, Replay, Template};
use crate::BoxError;
use crate::observe::CallReport;
use crate::scope::{Cancelled, Cause, Scope};
use crate::service_config::RetryPolicy;
use crate::status::status_for;

pin_project! {
    /// The response future of [`Retry`](super::Retry): the attempts of one
    /// call, one after another.
    ///
    /// # Cancellation safety
    ///
    /// Dropping it drops the attempt in flight, which resets its stream.
    pub struct ResponseFuture<S>
    where
        S: Service<Request<tonic::body::Body>>,
    {
        #[pin]
        attempt: Option<S::Future>,
        #[pin]
        cancelled: Option<Cancelled>,
        backoff: Option<Pin<Box<Sleep>>>,
        call: Option<Call<S>>,
    }
}

impl<S> std::fmt::Debug for ResponseFuture<S>
where
    S: Service<Request<tonic::body::Body>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("in_flight", &self.attempt.is_some())
            .field("backing_off", &self.backoff.is_some())
            .field("attempts", &self.call.as_ref().map(|c| c.attempts))
            .finish_non_exhaustive()
    }
}

/// Everything a retried call keeps between attempts.
struct Call<S> {
    service: S,
    core: Arc<Core>,
    policy: RetryPolicy,
    idempotent: bool,
    scope: Option<Scope>,
    template: Template,
    phase: Phase,
    /// The body while it is read; the replay once read.
    body: Option<tonic::body::Body>,
    read: BytesMut,
    replay: Option<Replay>,
    attempts: u32,
    /// Retries since the backoff sequence last started.
    backoffs: u32,
    attempt_started: Instant,
    backoff_started: Instant,
    delay: Duration,
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

impl<S> ResponseFuture<S>
where
    S: Service<Request<tonic::body::Body>>,
{
    pub(super) fn passthrough(future: S::Future) -> Self {
        Self {
            attempt: Some(future),
            cancelled: None,
            backoff: None,
            call: None,
        }
    }

    pub(super) fn new(
        service: S,
        core: Arc<Core>,
        policy: RetryPolicy,
        idempotent: bool,
        scope: Option<Scope>,
        request: Request<tonic::body::Body>,
    ) -> Self {
        core.limiter.on_call();
        let (parts, body) = request.into_parts();
        let now = Instant::now();
        Self {
            attempt: None,
            cancelled: scope.as_ref().map(|s| s.cancelled()),
            backoff: None,
            call: Some(Call {
                service,
                core,
                policy,
                idempotent,
                scope,
                template: Template::new(parts),
                phase: Phase::Reading,
                body: Some(body),
                read: BytesMut::new(),
                replay: None,
                attempts: 0,
                backoffs: 0,
                attempt_started: now,
                backoff_started: now,
                delay: Duration::ZERO,
            }),
        }
    }
}

impl<S> Call<S> {
    fn report(&self) {
        if let Some(metrics) = self.core.metrics() {
            metrics.resilient_call(
                self.template.path(),
                CallReport {
                    attempts: self.attempts,
                    hedged: false,
                    delay: self.delay,
                },
            );
        }
    }

    /// The status for a caller's scope that ended.
    fn ended(&self) -> Option<tonic::Status> {
        self.scope.as_ref().and_then(Scope::cause).map(status_for)
    }
}

impl<S, RB> Future for ResponseFuture<S>
where
    S: Service<Request<tonic::body::Body>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(call) = this.call.as_mut() else {
            let attempt = this
                .attempt
                .as_pin_mut()
                .expect("ResponseFuture polled after completion");
            return attempt.poll(cx).map_err(Into::into);
        };
        loop {
            match call.phase {
                Phase::Reading => {
                    let limit = call.core.settings.replay_buffer;
                    let read = ready!(core::poll_buffer(&mut call.body, &mut call.read, limit, cx));
                    match read {
                        Err(err) => {
                            call.report();
                            return Poll::Ready(Err(err));
                        }
                        Ok(Buffered::Replayable(replay)) => {
                            call.replay = Some(replay);
                            call.phase = Phase::Ready;
                        }
                        Ok(Buffered::Live(body)) => {
                            if let Some(metrics) = call.core.metrics() {
                                metrics.committed_unreplayable_call();
                            }
                            let scope = call.scope.as_ref().map(|s| call.core.attempt_scope(s));
                            let request = call.template.attempt(1, body, scope);
                            call.attempts = 1;
                            this.attempt.set(Some(call.service.call(request)));
                            call.phase = Phase::Committed;
                        }
                    }
                }
                Phase::Readying => {
                    if let Err(err) = ready!(call.service.poll_ready(cx)) {
                        call.report();
                        return Poll::Ready(Err(err.into()));
                    }
                    call.phase = Phase::Ready;
                }
                Phase::Ready => {
                    if let Some(status) = call.ended() {
                        call.report();
                        return Poll::Ready(Err(Box::new(status)));
                    }
                    let replay = call.replay.as_ref().expect("read before the first attempt");
                    let scope = call.scope.as_ref().map(|s| call.core.attempt_scope(s));
                    call.attempts += 1;
                    let request = call.template.attempt(call.attempts, replay.body(), scope);
                    call.attempt_started = Instant::now();
                    this.attempt.set(Some(call.service.call(request)));
                    call.phase = Phase::Running;
                }
                Phase::Committed => {
                    let attempt = this.attempt.as_mut().as_pin_mut().expect("an attempt runs");
                    let result = ready!(attempt.poll(cx)).map_err(Into::into);
                    this.attempt.set(None);
                    call.report();
                    return Poll::Ready(result);
                }
                Phase::Running => {
                    let attempt = this.attempt.as_mut().as_pin_mut().expect("an attempt runs");
                    let result = ready!(attempt.poll(cx)).map_err(Into::into);
                    this.attempt.set(None);
                    let took = call.attempt_started.elapsed();
                    let (code, pushback, result) = match core::classify(result) {
                        Outcome::Committed(response) => {
                            call.core.limiter.on_attempt(false);
                            call.core.record_latency(call.template.path(), took);
                            call.report();
                            return Poll::Ready(Ok(response));
                        }
                        Outcome::Failed {
                            code,
                            pushback,
                            answered,
                            result,
                        } => {
                            if answered {
                                call.core.record_latency(call.template.path(), took);
                            }
                            (code, pushback, result)
                        }
                    };
                    let listed = call.policy.retryable.contains(code);
                    call.core.limiter.on_attempt(listed);
                    let give_up = |call: &Call<S>, result: Result<Response<RB>, BoxError>| {
                        call.report();
                        Poll::Ready(result)
                    };
                    if let Some(status) = call.ended() {
                        // The caller's scope ended: its cause is the answer.
                        return give_up(call, Err(Box::new(status) as BoxError));
                    }
                    if !core::may_repeat(call.policy.retryable, code, call.idempotent)
                        || call.attempts >= call.policy.max_attempts
                    {
                        return give_up(call, result);
                    }
                    let delay = match pushback {
                        Pushback::Stop => {
                            if let Some(m) = call.core.metrics() {
                                m.pushback_stop();
                            }
                            return give_up(call, result);
                        }
                        Pushback::Delay(delay) => {
                            call.backoffs = 0;
                            delay
                        }
                        Pushback::None => {
                            call.backoffs += 1;
                            backoff(&call.core, &call.policy, call.backoffs)
                        }
                    };
                    if !call
                        .core
                        .fits(call.scope.as_ref(), call.template.path(), delay)
                    {
                        if let Some(m) = call.core.metrics() {
                            m.attempt_refused_for_time();
                        }
                        let status = status_for(Cause::DeadlineExceeded);
                        return give_up(call, Err(Box::new(status) as BoxError));
                    }
                    if !call.core.limiter.allow_retry() {
                        if let Some(m) = call.core.metrics() {
                            m.retry_throttled();
                        }
                        return give_up(call, result);
                    }
                    call.backoff_started = Instant::now();
                    let until =
                        core::deadline_or(call.scope.as_ref(), call.backoff_started + delay);
                    match this.backoff.as_mut() {
                        Some(sleep) => sleep.as_mut().reset(until),
                        None => *this.backoff = Some(Box::pin(tokio::time::sleep_until(until))),
                    }
                    call.phase = Phase::BackingOff;
                }
                Phase::BackingOff => {
                    if let Some(cancelled) = this.cancelled.as_mut().as_pin_mut()
                        && cancelled.poll(cx).is_ready()
                    {
                        call.delay += call.backoff_started.elapsed();
                        let status = call.ended().unwrap_or_else(|| status_for(Cause::Cancelled));
                        call.report();
                        return Poll::Ready(Err(Box::new(status)));
                    }
                    let sleep = this.backoff.as_mut().expect("a backoff is set");
                    ready!(sleep.as_mut().poll(cx));
                    call.delay += call.backoff_started.elapsed();
                    if let Some(status) = call.ended() {
                        call.report();
                        return Poll::Ready(Err(Box::new(status)));
                    }
                    call.phase = Phase::Readying;
                }
            }
        }
    }
}

/// gRPC's backoff before retry `n` (1-based):
/// `random(0, min(initialBackoff × multiplier^(n−1), maxBackoff))`.
pub(crate) fn backoff(core: &Core, policy: &RetryPolicy, n: u32) -> Duration {
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
