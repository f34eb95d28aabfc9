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

use crate::BoxError;
use crate::observe::CallReport;
use crate::retry::core::{self, Buffered, Core, Outcome, Pushback, Replay, Template};
use crate::scope::Scope;
use crate::service_config::HedgingPolicy;
use crate::status::status_for;

pin_project! {
    /// The response future of [`Hedge`](super::Hedge): the attempts of one
    /// call, racing.
    ///
    /// # Cancellation safety
    ///
    /// Dropping it drops every attempt in flight, which resets their streams.
    pub struct ResponseFuture<S>
    where
        S: Service<Request<tonic::body::Body>>,
    {
        #[pin]
        passthrough: Option<S::Future>,
        call: Option<Call<S>>,
    }
}

impl<S> std::fmt::Debug for ResponseFuture<S>
where
    S: Service<Request<tonic::body::Body>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("in_flight", &self.call.as_ref().map(|c| c.in_flight.len()))
            .field("sent", &self.call.as_ref().map(|c| c.sent))
            .finish_non_exhaustive()
    }
}

/// One attempt in flight. Attempts are boxed so that the set can grow and
/// shrink while each stays pinned; the future of the call itself is not.
struct Attempt<F> {
    started: Instant,
    future: Pin<Box<F>>,
}

struct Call<S: Service<Request<tonic::body::Body>>> {
    service: S,
    core: Arc<Core>,
    policy: HedgingPolicy,
    delay: Duration,
    scope: Option<Scope>,
    template: Template,
    body: Option<tonic::body::Body>,
    read: BytesMut,
    replay: Option<Replay>,
    in_flight: Vec<Attempt<S::Future>>,
    sent: u32,
    /// When the next hedge is due, while more may be sent.
    next: Option<Pin<Box<Sleep>>>,
    /// Send the next one without waiting (a non-fatal answer came).
    now: bool,
    /// No more hedges: pushback said stop, throttled, or no time left.
    stopped: bool,
    /// The first attempt's readiness came with the call.
    ready: bool,
    /// The request body could not be replayed: one attempt only.
    single: bool,
    last_failure: Option<Result<S::Response, BoxError>>,
}

impl<S> ResponseFuture<S>
where
    S: Service<Request<tonic::body::Body>>,
{
    pub(super) fn passthrough(future: S::Future) -> Self {
        Self {
            passthrough: Some(future),
            call: None,
        }
    }

    pub(super) fn new(
        service: S,
        core: Arc<Core>,
        policy: HedgingPolicy,
        delay: Duration,
        scope: Option<Scope>,
        request: Request<tonic::body::Body>,
    ) -> Self {
        core.limiter.on_call();
        let (parts, body) = request.into_parts();
        Self {
            passthrough: None,
            call: Some(Call {
                service,
                core,
                policy,
                delay,
                scope,
                template: Template::new(parts),
                body: Some(body),
                read: BytesMut::new(),
                replay: None,
                in_flight: Vec::new(),
                sent: 0,
                next: None,
                now: true,
                stopped: false,
                ready: true,
                single: false,
                last_failure: None,
            }),
        }
    }
}

impl<S: Service<Request<tonic::body::Body>>> Call<S> {
    fn report(&self) {
        if let Some(metrics) = self.core.metrics() {
            metrics.resilient_call(
                self.template.path(),
                CallReport {
                    attempts: self.sent,
                    hedged: true,
                    delay: Duration::ZERO,
                },
            );
        }
    }

    /// Drops every attempt still in flight (their streams are reset) and
    /// counts them as cancelled losers.
    fn drop_losers(&mut self) {
        let losers = self.in_flight.len() as u64;
        self.in_flight.clear();
        if losers > 0
            && let Some(metrics) = self.core.metrics()
        {
            metrics.hedge_losers(losers);
        }
    }

    fn may_send_more(&self) -> bool {
        !self.single && !self.stopped && self.sent < self.policy.max_attempts
    }

    fn stop(&mut self) {
        self.stopped = true;
        self.next = None;
    }

    /// (Re)arms the hedge timer `after` from now.
    fn arm(&mut self, after: Duration) {
        let at = core::deadline_or(self.scope.as_ref(), Instant::now() + after);
        match self.next.as_mut() {
            Some(sleep) => sleep.as_mut().reset(at),
            None => self.next = Some(Box::pin(tokio::time::sleep_until(at))),
        }
    }
}

impl<S, RB> Future for ResponseFuture<S>
where
    S: Service<Request<tonic::body::Body>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(call) = this.call.as_mut() else {
            let future = this
                .passthrough
                .as_pin_mut()
                .expect("ResponseFuture polled after completion");
            return future.poll(cx).map_err(Into::into);
        };
        if call.replay.is_none() && !call.single {
            let limit = call.core.settings.replay_buffer;
            match ready!(core::poll_buffer(&mut call.body, &mut call.read, limit, cx)) {
                Err(err) => return Poll::Ready(Err(err)),
                Ok(Buffered::Replayable(replay)) => call.replay = Some(replay),
                Ok(Buffered::Live(body)) => {
                    if let Some(metrics) = call.core.metrics() {
                        metrics.committed_unreplayable_call();
                    }
                    call.single = true;
                    let scope = call.scope.as_ref().map(|s| call.core.attempt_scope(s));
                    let request = call.template.attempt(1, body, scope);
                    call.sent = 1;
                    call.in_flight.push(Attempt {
                        started: Instant::now(),
                        future: Box::pin(call.service.call(request)),
                    });
                }
            }
        }
        loop {
            // 1. Send the next attempt if one is due.
            if call.may_send_more() && call.now {
                if call.sent > 0 {
                    if let Some(status) = call.scope.as_ref().and_then(Scope::cause) {
                        call.report();
                        call.in_flight.clear();
                        return Poll::Ready(Err(Box::new(status_for(status))));
                    }
                    if !call
                        .core
                        .fits(call.scope.as_ref(), call.template.path(), Duration::ZERO)
                    {
                        if let Some(m) = call.core.metrics() {
                            m.attempt_refused_for_time();
                        }
                        call.stop();
                    } else if !call.core.limiter.allow_retry() {
                        if let Some(m) = call.core.metrics() {
                            m.retry_throttled();
                        }
                        call.stop();
                    }
                }
                if call.may_send_more() {
                    let ready = if call.ready {
                        Poll::Ready(Ok(()))
                    } else {
                        call.service.poll_ready(cx)
                    };
                    match ready {
                        Poll::Pending => {}
                        Poll::Ready(Err(err)) => {
                            if call.in_flight.is_empty() {
                                call.report();
                                return Poll::Ready(Err(err.into()));
                            }
                            call.stop();
                        }
                        Poll::Ready(Ok(())) => {
                            call.ready = false;
                            call.now = false;
                            let replay =
                                call.replay.as_ref().expect("read before the first attempt");
                            let scope = call.scope.as_ref().map(|s| call.core.attempt_scope(s));
                            call.sent += 1;
                            let request = call.template.attempt(call.sent, replay.body(), scope);
                            call.in_flight.push(Attempt {
                                started: Instant::now(),
                                future: Box::pin(call.service.call(request)),
                            });
                            if call.may_send_more() {
                                let delay = call.delay;
                                call.arm(delay);
                            } else {
                                call.next = None;
                            }
                        }
                    }
                }
            }

            // 2. Poll the attempts in flight.
            let mut i = 0;
            let mut progressed = false;
            while i < call.in_flight.len() {
                let Poll::Ready(result) = call.in_flight[i].future.as_mut().poll(cx) else {
                    i += 1;
                    continue;
                };
                let done = call.in_flight.swap_remove(i);
                progressed = true;
                let took = done.started.elapsed();
                match core::classify(result.map_err(Into::into)) {
                    Outcome::Committed(response) => {
                        call.core.limiter.on_attempt(false);
                        call.core.record_latency(call.template.path(), took);
                        call.drop_losers();
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
                        let non_fatal = call.policy.non_fatal.contains(code);
                        call.core.limiter.on_attempt(non_fatal);
                        if let Some(cause) = call.scope.as_ref().and_then(Scope::cause) {
                            call.in_flight.clear();
                            call.report();
                            return Poll::Ready(Err(Box::new(status_for(cause))));
                        }
                        if !non_fatal {
                            call.drop_losers();
                            call.report();
                            return Poll::Ready(result);
                        }
                        call.last_failure = Some(result);
                        match pushback {
                            Pushback::Stop => {
                                if let Some(m) = call.core.metrics() {
                                    m.pushback_stop();
                                }
                                call.stop();
                            }
                            Pushback::Delay(after) => {
                                call.now = false;
                                if call.may_send_more() {
                                    call.arm(after);
                                }
                            }
                            Pushback::None => call.now = true,
                        }
                    }
                }
            }

            // 3. Nothing in flight and nothing more to send: the last
            //    non-fatal answer is the call's.
            if call.in_flight.is_empty() && !call.may_send_more() {
                call.report();
                let last = call.last_failure.take();
                return Poll::Ready(last.unwrap_or_else(|| {
                    let status = call
                        .scope
                        .as_ref()
                        .and_then(Scope::cause)
                        .map_or_else(|| status_for(crate::Cause::DeadlineExceeded), status_for);
                    Err(Box::new(status))
                }));
            }

            // 4. The hedge timer.
            if call.may_send_more()
                && !call.now
                && let Some(next) = call.next.as_mut()
                && next.as_mut().poll(cx).is_ready()
            {
                call.next = None;
                call.now = true;
                continue;
            }
            // Every source of progress (attempts, timer, readiness) has
            // registered the waker; go round again only if something moved.
            if !progressed {
                return Poll::Pending;
            }
        }
    }
}
