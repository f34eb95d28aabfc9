use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::BoxError;
use crate::scope::Ended;
use crate::scope::{CURRENT, Cause, Scope};
use crate::server::{EndGuard, LazyTimer};

pin_project! {
    /// The response body of [`HttpDeadline`](super::HttpDeadline): the
    /// handler's body, polled inside the request's scope and cut off at the
    /// deadline with an error (hyper then resets the stream, or closes an
    /// HTTP/1 connection, so the client cannot mistake it for a whole
    /// answer) — or the layer's own short plain-text answer.
    pub struct HttpBody<B> {
        // Declared first so it is dropped first (see the server layer's body).
        guard: Option<EndGuard>,
        answer: Option<Bytes>,
        scope: Option<Scope>,
        timer: Option<LazyTimer>,
        #[pin]
        inner: Option<B>,
    }
}

impl<B> std::fmt::Debug for HttpBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpBody").finish_non_exhaustive()
    }
}

impl<B> HttpBody<B> {
    pub(super) fn answer(text: String) -> Self {
        Self {
            inner: None,
            answer: Some(Bytes::from(text)),
            scope: None,
            timer: None,
            guard: None,
        }
    }
}

impl<B: Body> HttpBody<B> {
    pub(super) fn new(inner: B, scope: Scope, guard: EndGuard, timer: Option<LazyTimer>) -> Self {
        if inner.is_end_stream() {
            // Nothing left to send: the answer is complete.
            guard.finish(Cause::Completed);
            return Self {
                inner: Some(inner),
                answer: None,
                scope: None,
                timer: None,
                guard: None,
            };
        }
        Self {
            inner: Some(inner),
            answer: None,
            scope: Some(scope),
            timer,
            guard: Some(guard),
        }
    }
}

fn finish(guard: &mut Option<EndGuard>, timer: &mut Option<LazyTimer>) {
    *timer = None;
    if let Some(guard) = guard.take() {
        guard.finish(Cause::Completed);
    }
}

impl<B> Body for HttpBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        if let Some(text) = this.answer.take() {
            return Poll::Ready(Some(Ok(Frame::data(text))));
        }
        let Some(mut inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(None);
        };
        let (Some(scope), true) = (this.scope.as_ref(), this.guard.is_some()) else {
            // Finished: the body has ended (or was cut at the deadline).
            return Poll::Ready(None);
        };
        let expired = this.timer.as_ref().is_some_and(LazyTimer::passed);
        let polled = if expired {
            Poll::Pending
        } else {
            CURRENT.sync_scope(scope.clone(), || inner.as_mut().poll_frame(cx))
        };
        if polled.is_pending() {
            if expired
                || this
                    .timer
                    .as_mut()
                    .is_some_and(|t| t.poll_pending(cx).is_ready())
            {
                *this.timer = None;
                if let Some(guard) = this.guard.take() {
                    guard.finish(Cause::DeadlineExceeded);
                }
                return Poll::Ready(Some(Err(Box::new(Ended::new(Cause::DeadlineExceeded)))));
            }
            return Poll::Pending;
        }
        match &polled {
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => finish(this.guard, this.timer),
            Poll::Ready(Some(Ok(frame))) if frame.is_trailers() => finish(this.guard, this.timer),
            Poll::Ready(Some(Ok(_))) if inner.is_end_stream() => finish(this.guard, this.timer),
            _ => {}
        }
        polled.map(|frame| frame.map(|frame| frame.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        if self.answer.is_some() {
            return false;
        }
        match &self.inner {
            None => true,
            Some(inner) => self.guard.is_none() || inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.answer, &self.inner) {
            (Some(text), _) => SizeHint::with_exact(text.len() as u64),
            (None, Some(inner)) => inner.size_hint(),
            (None, None) => SizeHint::with_exact(0),
        }
    }
}
