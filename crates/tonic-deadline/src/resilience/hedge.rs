//! A hedged call: attempts racing, a new one every hedging delay until one
//! answers.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::call::Call;
use super::shared::{self, Outcome, Permit, Pushback};
use crate::BoxError;
use crate::scope::{Cancelled, Cause};
use crate::service_config::HedgingPolicy;
use crate::status::status_for;

/// One attempt in flight. Attempts are boxed so that the set can grow and
/// shrink while each stays pinned; the future of the call itself is not.
struct Attempt<F> {
    started: Instant,
    future: Pin<Box<F>>,
}

/// What a hedged call keeps while its attempts race.
pub(super) struct Hedging<S: Service<Request<tonic::body::Body>>> {
    pub(super) call: Call<S>,
    policy: HedgingPolicy,
    delay: Duration,
    in_flight: Vec<Attempt<S::Future>>,
    /// When the next hedge is due, while more may be sent.
    next: Option<Pin<Box<Sleep>>>,
    /// Send the next one without waiting (a non-fatal answer came).
    now: bool,
    /// No more hedges: pushback said stop, throttled, or no time left.
    stopped: bool,
    /// Stopped because no further attempt fitted in what was left.
    no_time: bool,
    /// The first attempt's readiness came with the call.
    ready: bool,
    /// The request body could not be replayed: one attempt only.
    single: bool,
    last_failure: Option<Result<S::Response, BoxError>>,
}

impl<S> Hedging<S>
where
    S: Service<Request<tonic::body::Body>>,
{
    /// A hedged call that sends its next attempt `delay` after the last.
    pub(super) fn new(call: Call<S>, policy: HedgingPolicy, delay: Duration) -> Self {
        Self {
            call,
            policy,
            delay,
            in_flight: Vec::new(),
            next: None,
            now: true,
            stopped: false,
            no_time: false,
            ready: true,
            single: false,
            last_failure: None,
        }
    }

    fn finish<T>(&self, result: T) -> Poll<T> {
        self.call.finish(true, Duration::ZERO, result)
    }

    /// Ends the call with `status` (the caller's scope ended), dropping
    /// every attempt (their streams are reset).
    fn end(&mut self, status: tonic::Status) -> Poll<Result<S::Response, BoxError>> {
        self.in_flight.clear();
        self.finish(Err(Box::new(status)))
    }

    /// Drops every attempt still in flight (their streams are reset) and
    /// counts them as cancelled losers.
    fn drop_losers(&mut self) {
        let losers = self.in_flight.len() as u64;
        self.in_flight.clear();
        if losers > 0
            && let Some(observer) = self.call.core.observer()
        {
            observer.hedge_losers(losers);
        }
    }

    fn may_send_more(&self) -> bool {
        !self.single && !self.stopped && self.call.attempts < self.policy.max_attempts
    }

    fn stop(&mut self) {
        self.stopped = true;
        self.next = None;
    }

    fn push(&mut self, future: S::Future) {
        self.in_flight.push(Attempt {
            started: Instant::now(),
            future: Box::pin(future),
        });
    }

    /// Drives the call; `cancelled` is the end of the caller's scope.
    pub(super) fn poll<RB>(
        &mut self,
        mut cancelled: Pin<&mut Option<Cancelled>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<RB>, BoxError>>
    where
        S: Service<Request<tonic::body::Body>, Response = Response<RB>>,
        S::Error: Into<BoxError>,
    {
        if !self.single {
            match ready!(self.call.poll_read(cx)) {
                Err(err) => return self.finish(Err(err)),
                Ok(None) => {}
                Ok(Some(live)) => {
                    self.single = true;
                    self.push(live);
                }
            }
        }
        loop {
            // 1. Send the next attempt if one is due.
            if self.may_send_more() && self.now {
                if self.call.attempts > 0 {
                    if let Some(status) = self.call.ended() {
                        return self.end(status);
                    }
                    let scope = self.call.scope.as_ref();
                    let permit = self
                        .call
                        .core
                        .permit(scope, self.call.path(), Duration::ZERO);
                    if permit != Permit::Send {
                        self.no_time = permit == Permit::NoTime;
                        self.stop();
                    }
                }
                if self.may_send_more() {
                    let ready = if self.ready {
                        Poll::Ready(Ok(()))
                    } else {
                        self.call.service.poll_ready(cx)
                    };
                    match ready {
                        Poll::Pending => {}
                        Poll::Ready(Err(err)) => {
                            if self.in_flight.is_empty() {
                                return self.finish(Err(err.into()));
                            }
                            self.stop();
                        }
                        Poll::Ready(Ok(())) => {
                            self.ready = false;
                            self.now = false;
                            let attempt = self.call.send(None);
                            self.push(attempt);
                            if self.may_send_more() {
                                shared::arm(&mut self.next, self.call.scope.as_ref(), self.delay);
                            } else {
                                self.next = None;
                            }
                        }
                    }
                }
            }

            // 2. Poll the attempts in flight.
            let mut i = 0;
            let mut progressed = false;
            while i < self.in_flight.len() {
                let Poll::Ready(result) = self.in_flight[i].future.as_mut().poll(cx) else {
                    i += 1;
                    continue;
                };
                let done = self.in_flight.swap_remove(i);
                progressed = true;
                let took = done.started.elapsed();
                let (path, non_fatal) = (self.call.path(), self.policy.non_fatal);
                match self
                    .call
                    .core
                    .settle(path, took, result.map_err(Into::into), non_fatal)
                {
                    Outcome::Committed(response) => {
                        self.drop_losers();
                        return self.finish(Ok(response));
                    }
                    Outcome::Failed {
                        code,
                        pushback,
                        result,
                        ..
                    } => {
                        if let Some(status) = self.call.ended() {
                            return self.end(status);
                        }
                        if !non_fatal.contains(code) {
                            self.drop_losers();
                            return self.finish(result);
                        }
                        self.last_failure = Some(result);
                        match pushback {
                            Pushback::Stop => {
                                if let Some(o) = self.call.core.observer() {
                                    o.pushback_stop();
                                }
                                self.stop();
                            }
                            Pushback::Delay(after) => {
                                self.now = false;
                                if self.may_send_more() {
                                    shared::arm(&mut self.next, self.call.scope.as_ref(), after);
                                }
                            }
                            Pushback::None => self.now = true,
                        }
                    }
                }
            }

            // 3. Nothing in flight and nothing more to send: the last
            //    non-fatal answer is the call's.
            if self.in_flight.is_empty() && !self.may_send_more() {
                // Every attempt failed as the policy allows: spent for
                // the chain.
                let spent = |last| self.call.core.spent(self.call.scope.as_ref(), last);
                let last = match self.last_failure.take() {
                    Some(last) if self.no_time => spent(shared::no_time_left(last)),
                    Some(last) => spent(last),
                    None => {
                        let status = self
                            .call
                            .ended()
                            .unwrap_or_else(|| status_for(Cause::DeadlineExceeded));
                        Err(Box::new(status) as BoxError)
                    }
                };
                return self.finish(last);
            }

            // 4. The hedge timer.
            if self.may_send_more()
                && !self.now
                && let Some(next) = self.next.as_mut()
                && next.as_mut().poll(cx).is_ready()
            {
                self.next = None;
                self.now = true;
                continue;
            }
            // Every source of progress (attempts, timer, readiness) has
            // registered the waker; go round again only if something moved.
            if !progressed {
                break;
            }
        }
        // 5. The caller's scope ending while no attempt is in flight to see
        //    it (a pushback or a readiness wait): the call ends at once.
        if self.in_flight.is_empty()
            && let Some(watch) = cancelled.as_mut().as_pin_mut()
            && watch.poll(cx).is_ready()
        {
            let status = self
                .call
                .ended()
                .unwrap_or_else(|| status_for(Cause::Cancelled));
            return self.end(status);
        }
        Poll::Pending
    }
}
