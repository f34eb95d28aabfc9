use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use tokio::time::Instant;

use super::abandon::Abandoned;
use super::deadline_race::{BoxedWaits, Race, error_code};
use super::transport::MessageCursor;
use super::unscoped::Config;
use crate::BoxError;

pin_project! {
    /// The response body of [`ClientDeadline`](super::ClientDeadline): the
    /// deadline covers the whole call, including every streamed message.
    ///
    /// When the deadline passes or the scope ends, the next poll yields a
    /// `DEADLINE_EXCEEDED` / `CANCELLED` status as the body error and the
    /// stream is reset at once, even if the caller keeps the body (or its
    /// request stream) around. Dropping the body before its end resets the
    /// stream too.
    ///
    /// ```
    /// use tonic_deadline::BoxError;
    /// use tonic_deadline::client::{ClientBody, ClientDeadline};
    /// use tower_service::Service;
    ///
    /// // The body of a response through the client layer.
    /// async fn body_of<S>(
    ///     client: &mut ClientDeadline<S>,
    ///     request: http::Request<tonic::body::Body>,
    /// ) -> Result<ClientBody<tonic::body::Body>, BoxError>
    /// where
    ///     S: Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>>,
    ///     S::Error: Into<BoxError>,
    /// {
    ///     Ok(client.call(request).await?.into_body())
    /// }
    /// ```
    pub struct ClientBody<B> {
        #[pin]
        inner: Option<B>,
        #[pin]
        race: Race<BoxedWaits>,
        done: bool,
        // Where the body is in gRPC's message framing, to tell a connection
        // lost between messages from one that cut a message.
        cursor: MessageCursor,
    }
}

impl<B> ClientBody<B> {
    pub(super) fn new(inner: B, race: Race<BoxedWaits>) -> Self {
        Self {
            inner: Some(inner),
            race,
            done: false,
            cursor: MessageCursor::default(),
        }
    }
}

/// An empty body that races nothing: what tonic's `InterceptedService`
/// answers with when an interceptor refuses a call, so that a generated
/// client's `with_interceptor` takes a channel under the client layer.
///
/// ```
/// use tonic_deadline::client::ClientBody;
/// let body = ClientBody::<tonic::body::Body>::default();
/// assert!(http_body::Body::is_end_stream(&body));
/// ```
impl<B: Default> Default for ClientBody<B> {
    fn default() -> Self {
        let mut race = std::pin::pin!(Race::new(None, None, None, None, None, None));
        Self::new(B::default(), race.as_mut().for_body())
    }
}

impl<B> std::fmt::Debug for ClientBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBody").finish_non_exhaustive()
    }
}

impl<B> Body for ClientBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        if let Poll::Ready(status) = this.race.as_mut().poll_lost(cx) {
            *this.done = true;
            // Let go of the stream now rather than when the caller drops the
            // body: the server must learn the call is over.
            this.inner.set(None);
            this.race.as_mut().settle(status.code());
            this.race.as_mut().abandon();
            return Poll::Ready(Some(Err(Box::new(status))));
        }
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            return Poll::Ready(None);
        };
        match inner.poll_frame(cx) {
            Poll::Pending => {
                if let Poll::Ready(status) = this.race.as_mut().arm(cx) {
                    *this.done = true;
                    this.inner.set(None);
                    this.race.as_mut().settle(status.code());
                    this.race.as_mut().abandon();
                    return Poll::Ready(Some(Err(Box::new(status))));
                }
                Poll::Pending
            }
            Poll::Ready(None) => {
                *this.done = true;
                // Ended without trailers (trailers settle the record first).
                this.race.settle(tonic::Code::Unknown);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(err))) => {
                *this.done = true;
                let err = this
                    .race
                    .map_error(err.into(), this.cursor.is_mid_message());
                this.race.settle(error_code(&err));
                Poll::Ready(Some(Err(err)))
            }
            Poll::Ready(Some(Ok(mut frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.cursor.feed(data);
                }
                if let Some(trailers) = frame.trailers_mut() {
                    this.race.as_mut().settle_answer(trailers);
                }
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.as_ref().is_none_or(B::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.as_ref().map(B::size_hint).unwrap_or_default()
    }
}

pin_project! {
    /// The request body of a call: the caller's body until the call is
    /// abandoned, then an error that makes hyper reset the stream with
    /// `CANCEL`.
    ///
    /// Without it a client- or bidi-streaming call whose deadline passed (or
    /// whose scope was cancelled) would keep its stream open for as long as
    /// the caller holds its request stream: hyper only resets a stream whose
    /// request body is done or failed.
    pub(crate) struct RequestBody<B> {
        #[pin]
        inner: B,
        abandoned: Abandoned,
        // A call with a budget on the wire: when its header was written, and
        // where to report how much later the request left (its body's first
        // poll).
        watch: Option<Departure>,
    }
}

/// What a call with a budget on the wire needs to tell, when its request
/// leaves, whether the server was told more than the caller has.
pub(super) struct Departure {
    written: Instant,
    granted: Duration,
    config: Arc<Config>,
    /// For the report; a generated client's path is static, so this is no
    /// copy.
    method: http::uri::PathAndQuery,
}

impl Departure {
    pub(super) fn new(
        written: Instant,
        granted: Duration,
        config: &Arc<Config>,
        method: Option<&http::uri::PathAndQuery>,
    ) -> Self {
        Self {
            written,
            granted,
            config: config.clone(),
            method: method
                .cloned()
                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
        }
    }

    /// The request leaves now: one clock read; a report only when late.
    fn left(&self) {
        let late = self.written.elapsed();
        if super::unscoped::left_late(self.granted, late) {
            self.config.departed(self.method.path(), self.granted, late);
        }
    }
}

impl<B> RequestBody<B> {
    pub(super) fn new(inner: B, abandoned: Abandoned, watch: Option<Departure>) -> Self {
        Self {
            inner,
            abandoned,
            watch,
        }
    }
}

impl<B> Body for RequestBody<B>
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
        if let Some(watch) = this.watch.take() {
            // The transport polls the body once the request's headers are
            // on their way.
            watch.left();
        }
        // Registered for a wake-up only when the body waits: a unary
        // request, ready at once, never registers.
        if this.abandoned.is_given_up() {
            return Poll::Ready(Some(Err(reset())));
        }
        match this.inner.poll_frame(cx) {
            Poll::Pending if this.abandoned.poll(cx).is_ready() => Poll::Ready(Some(Err(reset()))),
            polled => polled.map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The error that makes hyper reset the stream with `CANCEL` (it resets with
/// the h2 reason found in the error).
fn reset() -> BoxError {
    Box::new(h2::Error::from(h2::Reason::CANCEL))
}
