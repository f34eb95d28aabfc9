use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Response, StatusCode};
use pin_project_lite::pin_project;
use tokio::task::futures::TaskLocalFuture;
use tokio::time::Instant;

use super::body::HttpBody;
use crate::scope::{Cause, Scope};
use crate::server::{EndGuard, LazyTimer};

pin_project! {
    /// The response future of [`HttpDeadline`](super::HttpDeadline).
    ///
    /// # Cancellation safety
    ///
    /// Dropping it before it completes means the request was abandoned —
    /// hyper drops it when the client disconnects or resets the stream, and
    /// so does an outer layer that gives up: the request's scope ends with
    /// [`Cause::Abandoned`] either way.
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Answer { status: StatusCode, text: Option<String> },
        Running {
            // Declared first so it is dropped first: the scope ends before
            // the handler's future is dropped.
            guard: Option<EndGuard>,
            scope: Option<Scope>,
            timer: Option<LazyTimer>,
            #[pin]
            inner: TaskLocalFuture<Scope, F>,
        },
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn answer(status: StatusCode, text: String) -> Self {
        Self {
            state: State::Answer {
                status,
                text: Some(text),
            },
        }
    }

    pub(super) fn running(
        inner: TaskLocalFuture<Scope, F>,
        scope: Scope,
        deadline: Option<Instant>,
    ) -> Self {
        Self {
            state: State::Running {
                inner,
                guard: Some(EndGuard::new(scope.clone(), None)),
                scope: Some(scope),
                timer: deadline.map(LazyTimer::new),
            },
        }
    }
}

/// An answer the layer gives itself: a status and a plain-text reason.
pub(super) fn plain<B>(status: StatusCode, text: String) -> Response<HttpBody<B>> {
    let mut response = Response::new(HttpBody::answer(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: http_body::Body,
{
    type Output = Result<Response<HttpBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Answer { status, text } => {
                let text = text.take().expect("ResponseFuture polled after completion");
                Poll::Ready(Ok(plain(*status, text)))
            }
            StateProj::Running {
                inner,
                scope,
                timer,
                guard,
            } => {
                let expired = timer.as_ref().is_some_and(LazyTimer::passed);
                let polled = if expired {
                    Poll::Pending
                } else {
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
                        return Poll::Ready(Ok(plain(
                            StatusCode::GATEWAY_TIMEOUT,
                            Cause::DeadlineExceeded.to_string(),
                        )));
                    }
                    return Poll::Pending;
                };
                let guard = guard
                    .take()
                    .expect("ResponseFuture polled after completion");
                Poll::Ready(match result {
                    Ok(response) => {
                        let scope = scope.take().expect("set while running");
                        Ok(response.map(|body| HttpBody::new(body, scope, guard, timer.take())))
                    }
                    Err(err) => {
                        guard.finish(Cause::Completed);
                        Err(err)
                    }
                })
            }
        }
    }
}
