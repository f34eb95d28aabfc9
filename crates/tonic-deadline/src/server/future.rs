use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use pin_project_lite::pin_project;
use tokio::time::Instant;

use super::body::{ServerBody, Web};
use super::end_guard::EndGuard;
use super::ledger_entry::Entry;
use super::observer::Observation;
use super::protocol::{Answer, Grpc, Protocol};
use super::timer::LazyTimer;
use crate::scope::{Cause, Entered, Scope};
use crate::wire;

pin_project! {
    /// The response future of [`ServerDeadline`](super::ServerDeadline).
    ///
    /// # Cancellation safety
    ///
    /// Dropping it before it completes means the request was abandoned —
    /// hyper drops it when the client resets the stream or disconnects,
    /// and so does an outer layer that gives up: the request's scope is
    /// ended with [`Cause::Abandoned`] *first*, and only then is the
    /// handler's future dropped — so drop guards inside the handler already
    /// see the scope ended, with its cause.
    ///
    /// ```
    /// use tonic_deadline::server::{RequestBody, ResponseFuture, ServerDeadline};
    /// use tower_service::Service;
    ///
    /// // The future a tonic server polls for each request; the handler's
    /// // service receives the request's body as a `RequestBody`.
    /// fn future_of<S>(service: &mut ServerDeadline<S>, request: http::Request<tonic::body::Body>)
    ///     -> ResponseFuture<S::Future>
    /// where
    ///     S: Service<
    ///         http::Request<RequestBody<tonic::body::Body>>,
    ///         Response = http::Response<tonic::body::Body>,
    ///     >,
    /// {
    ///     service.call(request)
    /// }
    /// ```
    pub struct ResponseFuture<F, P = Grpc> {
        #[pin]
        state: State<F>,
        protocol: PhantomData<fn() -> P>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Answer { answer: Option<Answer> },
        Running {
            // Declared first so it is dropped first: the scope ends before
            // the handler's future is dropped.
            guard: Option<EndGuard>,
            timer: Option<LazyTimer>,
            // What the ledger says of this hop, should the call end
            // `DEADLINE_EXCEEDED`.
            entry: Option<Entry>,
            #[pin]
            inner: Entered<F>,
        },
    }
}

impl<F, P> std::fmt::Debug for ResponseFuture<F, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, P> ResponseFuture<F, P> {
    pub(super) fn answer(answer: Answer) -> Self {
        Self {
            state: State::Answer {
                answer: Some(answer),
            },
            protocol: PhantomData,
        }
    }

    pub(super) fn running(
        inner: Entered<F>,
        scope: Scope,
        timer: Option<(Instant, Instant)>,
        observed: Option<Box<dyn Observation>>,
        entry: Option<Entry>,
    ) -> Self {
        Self {
            state: State::Running {
                inner,
                timer: timer.map(|(at, now)| LazyTimer::new(at, now)),
                guard: Some(EndGuard::new(scope, observed)),
                entry,
            },
            protocol: PhantomData,
        }
    }
}

impl<F, B, E, P> Future for ResponseFuture<F, P>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: http_body::Body,
    P: Protocol,
{
    type Output = Result<Response<ServerBody<B, P>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        match state.as_mut().project() {
            StateProj::Answer { answer } => {
                let answer = answer
                    .take()
                    .expect("ResponseFuture polled after completion");
                Poll::Ready(Ok(answer.map(ServerBody::answer)))
            }
            StateProj::Running {
                inner,
                timer,
                guard,
                entry,
            } => {
                let expired = timer.as_mut().is_some_and(LazyTimer::passed);
                let polled = if expired {
                    Poll::Pending
                } else {
                    let _entered = guard
                        .as_ref()
                        .and_then(EndGuard::span)
                        .map(tracing::Span::enter);
                    inner.poll(cx)
                };
                let Poll::Ready(result) = polled else {
                    if expired
                        || timer
                            .as_mut()
                            .is_some_and(|t| t.poll_pending(cx).is_ready())
                    {
                        #[cfg_attr(not(feature = "ledger"), allow(unused_mut))]
                        let mut answer = P::deadline_exceeded();
                        #[cfg(feature = "ledger")]
                        let ledger = entry
                            .take()
                            .filter(|_| !P::HTTP_STATUS)
                            .zip(guard.as_ref().map(|g| g.scope().clone()));
                        if let Some(mut guard) = guard.take() {
                            if P::HTTP_STATUS {
                                guard.saw_http_status(answer.status());
                            }
                            guard.finish(Cause::DeadlineExceeded);
                        }
                        #[cfg(feature = "ledger")]
                        if let Some((entry, scope)) = ledger {
                            // The handler goes now, not when the answer is
                            // taken: the calls it still waits for are
                            // noted, as unanswered, for this hop's line.
                            state.set(State::Answer { answer: None });
                            entry.answer(answer.headers_mut(), &scope);
                        }
                        return Poll::Ready(Ok(answer.map(ServerBody::answer)));
                    }
                    return Poll::Pending;
                };
                let mut guard = guard
                    .take()
                    .expect("ResponseFuture polled after completion");
                Poll::Ready(match result {
                    Ok(mut response) => {
                        let web = if P::HTTP_STATUS {
                            guard.saw_http_status(response.status());
                            Web::No
                        } else {
                            // A call the handler made spent its retries:
                            // a failure the handler made of it (a new
                            // status, another code) still tells the caller
                            // not to retry.
                            if guard.scope().retries_spent() {
                                wire::mark_do_not_retry(response.headers_mut());
                            }
                            // The handler failed at the deadline (or after
                            // a call under it ran out) once something was
                            // noted under it: the ledger.
                            Entry::answer_handler(entry, response.headers_mut(), guard.scope());
                            guard.saw_status(response.headers());
                            // Only an answer the timer can cut needs to
                            // know how its trailers travel.
                            if timer.is_some() {
                                Web::of(response.headers())
                            } else {
                                Web::No
                            }
                        };
                        let entry = entry.take();
                        Ok(response
                            .map(|body| ServerBody::new(body, guard, timer.take(), web, entry)))
                    }
                    Err(err) => {
                        guard.failed();
                        guard.finish(Cause::Completed);
                        Err(err)
                    }
                })
            }
        }
    }
}
