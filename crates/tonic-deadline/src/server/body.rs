use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::timer::LazyTimer;
use crate::observe::ServerObserved;
use crate::scope::{CURRENT, Cause, Scope};
use crate::status::status_for;

/// Ends the request's scope when dropped: with the cause given to
/// [`finish`](EndGuard::finish), or [`Cause::Abandoned`] if it is dropped
/// unfinished (the client reset the stream or the connection closed).
///
/// A layer given metrics or spans also hands it what the call reports
/// ([`ServerObserved`]); one given neither pays for a null pointer.
#[derive(Debug)]
pub(crate) struct EndGuard {
    scope: Scope,
    done: bool,
    observed: Option<Box<ServerObserved>>,
}

impl EndGuard {
    pub(crate) fn new(scope: Scope, observed: Option<Box<ServerObserved>>) -> Self {
        Self {
            scope,
            done: false,
            observed,
        }
    }

    /// The request's span, to enter while the handler runs.
    pub(crate) fn span(&self) -> Option<&tracing::Span> {
        self.observed.as_deref().map(ServerObserved::span)
    }

    /// Notes the `grpc-status` of response headers or trailers.
    pub(crate) fn saw_status(&mut self, headers: &HeaderMap) {
        if let Some(observed) = &mut self.observed {
            observed.saw_status(headers);
        }
    }

    /// Notes a failure that carries no status (the handler's error).
    pub(crate) fn failed(&mut self) {
        if let Some(observed) = &mut self.observed {
            observed.failed();
        }
    }

    pub(crate) fn finish(mut self, cause: Cause) {
        self.done = true;
        self.end(cause);
    }

    fn end(&mut self, cause: Cause) {
        if cause != Cause::Completed {
            // An expected end, not a fault: named, at DEBUG.
            tracing::debug!(%cause, "request scope ended before its answer was complete");
        }
        self.scope.end(cause);
        if let Some(observed) = self.observed.take() {
            observed.ended(&self.scope, cause);
        }
    }
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        if !self.done {
            self.end(Cause::Abandoned);
        }
    }
}

pin_project! {
    /// The response body of [`ServerDeadline`](super::ServerDeadline): the
    /// handler's body, polled inside the request's scope and cut off at the
    /// deadline with `DEADLINE_EXCEEDED` in the trailers.
    ///
    /// The default value is an empty body, used for answers the layer gives
    /// itself (trailers-only responses).
    pub struct ServerBody<B> {
        // Declared first so it is dropped first: a body dropped before its
        // end (the stream was reset) ends the scope before the handler's
        // stream is dropped.
        guard: Option<EndGuard>,
        timer: Option<LazyTimer>,
        // Ready polls since the clock was last read.
        unchecked: u8,
        #[pin]
        inner: Option<B>,
    }
}

impl<B> Default for ServerBody<B> {
    fn default() -> Self {
        Self {
            inner: None,
            timer: None,
            unchecked: 0,
            guard: None,
        }
    }
}

impl<B: Body> ServerBody<B> {
    pub(super) fn new(inner: B, guard: EndGuard, timer: Option<LazyTimer>) -> Self {
        if inner.is_end_stream() {
            // Trailers-only answers (handler errors) have nothing left to send.
            guard.finish(Cause::Completed);
            return Self {
                inner: Some(inner),
                timer: None,
                unchecked: 0,
                guard: None,
            };
        }
        Self {
            inner: Some(inner),
            timer,
            unchecked: 0,
            guard: Some(guard),
        }
    }
}

impl<B> std::fmt::Debug for ServerBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerBody").finish_non_exhaustive()
    }
}

impl<B> Body for ServerBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        let Some(mut inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(None);
        };
        let Some(guard) = this.guard.as_ref() else {
            // Finished: the stream has ended (or was cut at the deadline).
            return Poll::Ready(None);
        };
        // The clock is read on the first poll, after the body was pending,
        // and every sixteenth poll of a body that is always ready; a body
        // that is pending is woken by the timer itself. A unary answer
        // (data, trailers, end) reads it once instead of three times.
        let check = *this.unchecked == 0;
        *this.unchecked = (*this.unchecked + 1) % CHECK_EVERY;
        let expired = check && this.timer.as_ref().is_some_and(LazyTimer::passed);
        let polled = if expired {
            Poll::Pending
        } else {
            let scope = guard.scope.clone();
            let _entered = guard.span().map(tracing::Span::enter);
            CURRENT.sync_scope(scope, || inner.as_mut().poll_frame(cx))
        };
        if polled.is_pending() {
            *this.unchecked = 0;
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
                return Poll::Ready(Some(Ok(Frame::trailers(deadline_trailers()))));
            }
            return Poll::Pending;
        }
        match &polled {
            Poll::Ready(None) => finish(this.guard, this.timer),
            Poll::Ready(Some(Err(_))) => {
                if let Some(guard) = this.guard.as_mut() {
                    guard.failed();
                }
                finish(this.guard, this.timer)
            }
            Poll::Ready(Some(Ok(frame))) if frame.is_trailers() => {
                if let (Some(guard), Some(trailers)) = (this.guard.as_mut(), frame.trailers_ref()) {
                    guard.saw_status(trailers);
                }
                finish(this.guard, this.timer)
            }
            // hyper sends a frame after which the body reports its end as the
            // last one and never polls again: the answer is complete.
            Poll::Ready(Some(Ok(_))) if inner.is_end_stream() => finish(this.guard, this.timer),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            None => true,
            Some(inner) => self.guard.is_none() || inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.as_ref().map(B::size_hint).unwrap_or_default()
    }
}

/// How many ready polls of a response body may pass between two reads of
/// the clock.
const CHECK_EVERY: u8 = 16;

fn finish(guard: &mut Option<EndGuard>, timer: &mut Option<LazyTimer>) {
    *timer = None;
    if let Some(guard) = guard.take() {
        guard.finish(Cause::Completed);
    }
}

fn deadline_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::new();
    // `add_header` only fails on a message that cannot be percent-encoded;
    // ours is a fixed ASCII text.
    let _ = status_for(Cause::DeadlineExceeded).add_header(&mut trailers);
    trailers
}
