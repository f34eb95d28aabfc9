//! The request body a gRPC handler reads behind the server layer: an input
//! its caller abandoned never reads as complete.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::BoxError;
use crate::scope::{Cause, Scope};
use crate::status::chain;

pin_project! {
    /// The request body of a gRPC call behind
    /// [`ServerDeadline`](super::ServerDeadline): the body hyper gave,
    /// except that an input its caller abandoned never reads as complete.
    ///
    /// tonic reads a request stream that the client reset with `CANCEL`
    /// as a clean end of input (`Ok(None)` from `Streaming::message`), on
    /// purpose: a handler written the usual way — read until `None`, then
    /// commit — would commit an upload its client gave up on. Behind the
    /// layer it cannot:
    ///
    /// - when the client resets the stream, the request's scope ends
    ///   ([`Cause::Abandoned`]) *first*, and the handler then reads an error,
    ///   [`Truncated`] (tonic answers it as `ABORTED`: a `CANCELLED` status
    ///   here would be read as the end again);
    /// - a stream that ends after the request's scope ended (its deadline
    ///   passed, or the call was abandoned) reads [`Truncated`] too, with
    ///   that cause (`DEADLINE_EXCEEDED` for the deadline), not its end.
    ///
    /// Any other error of the body passes unchanged; frames are not
    /// touched.
    ///
    /// ```
    /// use http_body::Body;
    /// use tonic_deadline::server::RequestBody;
    ///
    /// // The type a handler's service receives behind the layer (tonic's
    /// // generated servers accept any body).
    /// fn handles(_: &http::Request<RequestBody<tonic::body::Body>>) {}
    /// ```
    pub struct RequestBody<B> {
        #[pin]
        inner: B,
        scope: Scope,
    }
}

impl<B> RequestBody<B> {
    pub(super) fn new(inner: B, scope: Scope) -> Self {
        Self { inner, scope }
    }

    /// The body hyper gave.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// The body hyper gave, mutably.
    pub fn get_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// Unwraps the body hyper gave.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B> fmt::Debug for RequestBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestBody").finish_non_exhaustive()
    }
}

impl<B> Body for RequestBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(Some(Err(err))) => Poll::Ready(Some(Err(failed(err.into(), this.scope)))),
            Poll::Ready(None) => Poll::Ready(ended(this.scope).map(Err)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        // An input that ended after its scope did still has an error to
        // read.
        self.inner.is_end_stream() && !self.scope.is_cancelled()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The body failed: a reset by the client (`CANCEL`) ends the scope as
/// abandoned and reads as [`Truncated`]; anything else passes.
#[cold]
fn failed(err: BoxError, scope: &Scope) -> BoxError {
    if !cancelled_by_peer(&*err) {
        return err;
    }
    scope.end(Cause::Abandoned);
    tracing::debug!(error = %err, "the client reset its request stream before its end");
    Box::new(Truncated {
        cause: scope.cause().unwrap_or(Cause::Abandoned),
    })
}

/// The body ended: an error instead if the request's scope ended first
/// (the answer is complete: the end passes).
#[inline]
fn ended(scope: &Scope) -> Option<BoxError> {
    if !scope.is_cancelled() {
        return None;
    }
    match scope.cause() {
        None | Some(Cause::Completed) => None,
        Some(cause) => Some(Box::new(Truncated { cause })),
    }
}

/// Whether `err` is the client's reset with `CANCEL`: tonic's status of it
/// (`CANCELLED`, what `tonic::body::Body` makes of hyper's error), or h2's
/// own error.
fn cancelled_by_peer(err: &(dyn std::error::Error + 'static)) -> bool {
    chain(err).any(|err| {
        err.downcast_ref::<tonic::Status>()
            .is_some_and(|s| s.code() == tonic::Code::Cancelled)
            || err
                .downcast_ref::<h2::Error>()
                .is_some_and(|e| e.reason() == Some(h2::Reason::CANCEL))
    })
}

/// The error a handler reads from a request stream that ended without its
/// end: its client reset it (the call was abandoned), or it ended after
/// the request's scope did. The input is incomplete; nothing read from it
/// should be committed as whole.
///
/// It names its status as its source, so tonic's decoder hands the handler
/// `DEADLINE_EXCEEDED` for a deadline and `ABORTED` otherwise — never
/// `CANCELLED`, which tonic would read as the end of the input.
///
/// ```
/// use tonic_deadline::Cause;
/// use tonic_deadline::server::Truncated;
///
/// fn abandoned(status: &tonic::Status) -> bool {
///     // What a handler can test, should it want to tell this from other
///     // errors: the scope says why, too.
///     status.code() == tonic::Code::Aborted
/// }
/// # let _ = abandoned;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated {
    cause: Cause,
}

impl Truncated {
    /// Why the request's scope ended: [`Cause::Abandoned`] for a reset.
    pub fn cause(&self) -> Cause {
        self.cause
    }

    /// The status a handler reads.
    fn status(&self) -> &'static tonic::Status {
        use std::sync::LazyLock;
        static ABORTED: LazyLock<tonic::Status> = LazyLock::new(|| {
            tonic::Status::aborted("request stream cut off: the caller abandoned the call")
        });
        match self.cause {
            Cause::DeadlineExceeded => crate::status::cause_status(Cause::DeadlineExceeded),
            _ => &ABORTED,
        }
    }
}

impl fmt::Display for Truncated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request stream cut off before its end ({}): the input is incomplete",
            self.cause
        )
    }
}

impl std::error::Error for Truncated {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.status())
    }
}
