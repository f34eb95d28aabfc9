use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use pin_project_lite::pin_project;
use tokio::task::futures::TaskLocalFuture;
use tokio::time::Instant;

use super::body::{EndGuard, ServerBody};
use super::timer::LazyTimer;
use crate::observe::ServerObserved;
use crate::scope::{Cause, Scope};
use crate::status::status_for;

pin_project! {
    /// The response future of [`ServerDeadline`](super::ServerDeadline).
    ///
    /// # Cancellation safety
    ///
    /// Dropping it before it completes means the request was abandoned (hyper
    /// drops the handler on RST_STREAM, or an outer layer gave up): the
    /// request's scope is ended with [`Cause::Abandoned`] *first*, and only
    /// then is the handler's future dropped — so drop guards inside the
    /// handler already see the scope ended, with its cause.
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Answer { status: Option<tonic::Status> },
        Running {
            // Declared first so it is dropped first: the scope ends before
            // the handler's future is dropped.
            guard: Option<EndGuard>,
            timer: Option<LazyTimer>,
            #[pin]
            inner: TaskLocalFuture<Scope, F>,
        },
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn answer(status: tonic::Status) -> Self {
        Self {
            state: State::Answer {
                status: Some(status),
            },
        }
    }

    pub(super) fn running(
        inner: TaskLocalFuture<Scope, F>,
        scope: Scope,
        timer: Option<Instant>,
        observed: Option<Box<ServerObserved>>,
    ) -> Self {
        Self {
            state: State::Running {
                inner,
                timer: timer.map(LazyTimer::new),
                guard: Some(EndGuard::new(scope, observed)),
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: http_body::Body,
{
    type Output = Result<Response<ServerBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Answer { status } => {
                let status = status
                    .take()
                    .expect("ResponseFuture polled after completion");
                Poll::Ready(Ok(status.into_http()))
            }
            StateProj::Running {
                inner,
                timer,
                guard,
            } => {
                let expired = timer.as_ref().is_some_and(LazyTimer::passed);
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
                        if let Some(guard) = guard.take() {
                            guard.finish(Cause::DeadlineExceeded);
                        }
                        return Poll::Ready(Ok(status_for(Cause::DeadlineExceeded).into_http()));
                    }
                    return Poll::Pending;
                };
                let mut guard = guard
                    .take()
                    .expect("ResponseFuture polled after completion");
                Poll::Ready(match result {
                    Ok(response) => {
                        guard.saw_status(response.headers());
                        Ok(response.map(|body| ServerBody::new(body, guard, timer.take())))
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
