use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::end_guard::EndGuard;
use super::ledger_entry::Entry;
use super::protocol::{Grpc, Protocol};
use super::timer::LazyTimer;
use crate::scope::{Cause, Scope};
use crate::status::status_for;

pin_project! {
    /// The response body of [`ServerDeadline`](super::ServerDeadline): the
    /// handler's body, polled inside the request's scope and cut off at the
    /// deadline — for gRPC with `DEADLINE_EXCEEDED` in the trailers; for
    /// plain HTTP with an error (hyper then resets the stream, or closes an
    /// HTTP/1 connection, so the client cannot mistake it for a whole
    /// answer) — or the short answer the layer gives itself.
    ///
    /// The default value is an empty body.
    ///
    /// ```
    /// use http_body::Body;
    /// use tonic_deadline::server::ServerBody;
    ///
    /// let body = ServerBody::<tonic::body::Body>::default();
    /// assert!(body.is_end_stream());
    /// ```
    pub struct ServerBody<B, P = Grpc> {
        // Declared first so it is dropped first: a body dropped before its
        // end (the stream was reset) ends the scope before the handler's
        // stream is dropped.
        guard: Option<EndGuard>,
        timer: Option<LazyTimer>,
        // Ready polls since the clock was last read.
        unchecked: u8,
        // How the answer carries its trailers.
        web: Web,
        // This hop for the ledger, should the stream end
        // `DEADLINE_EXCEEDED`.
        entry: Option<Entry>,
        #[pin]
        inner: Inner<B>,
        protocol: PhantomData<fn() -> P>,
    }
}

pin_project! {
    #[project = InnerProj]
    enum Inner<B> {
        // An answer of the layer's own: its text, until sent.
        Answer { text: Option<Bytes> },
        Handler { #[pin] body: B },
    }
}

impl<B, P> Default for ServerBody<B, P> {
    fn default() -> Self {
        Self::answer(None)
    }
}

impl<B, P> ServerBody<B, P> {
    /// An answer of the layer's own, with `text` as its body.
    pub(crate) fn answer(text: Option<Bytes>) -> Self {
        Self {
            inner: Inner::Answer { text },
            timer: None,
            unchecked: 0,
            web: Web::No,
            entry: None,
            guard: None,
            protocol: PhantomData,
        }
    }
}

/// Whether an answer is gRPC-Web, whose trailers travel in the body: a
/// server layer in front of `tonic_web::GrpcWebLayer` sees the translated
/// answer, and HTTP trailers it adds would never reach the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Web {
    /// gRPC, or HTTP: trailers are trailers.
    No,
    /// `application/grpc-web`: a trailer frame (flag `0x80`) in the body.
    Binary,
    /// `application/grpc-web-text`: that frame, in base64.
    Text,
}

impl Web {
    /// What an answer with these headers is.
    pub(super) fn of(headers: &HeaderMap) -> Self {
        let Some(kind) = headers.get(http::header::CONTENT_TYPE) else {
            return Self::No;
        };
        let kind = kind.as_bytes();
        if !kind.starts_with(b"application/grpc-web") {
            Self::No
        } else if kind.starts_with(b"application/grpc-web-text") {
            Self::Text
        } else {
            Self::Binary
        }
    }
}

impl<B: Body, P> ServerBody<B, P> {
    pub(super) fn new(
        body: B,
        guard: EndGuard,
        timer: Option<LazyTimer>,
        web: Web,
        entry: Option<Entry>,
    ) -> Self {
        if body.is_end_stream() {
            // Nothing left to send (a gRPC trailers-only answer, an empty
            // HTTP body): the answer is complete.
            guard.finish(Cause::Completed);
            return Self {
                inner: Inner::Handler { body },
                timer: None,
                unchecked: 0,
                web,
                entry: None,
                guard: None,
                protocol: PhantomData,
            };
        }
        Self {
            inner: Inner::Handler { body },
            timer,
            unchecked: 0,
            web,
            entry,
            guard: Some(guard),
            protocol: PhantomData,
        }
    }
}

impl<B, P> std::fmt::Debug for ServerBody<B, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerBody").finish_non_exhaustive()
    }
}

/// What a poll of the handler's body gave, before the protocol says how
/// the deadline is told.
enum Polled<T> {
    Frame(Poll<T>),
    /// The deadline passed: with the trailers to send, if the layer made
    /// them (with the ledger), or the protocol's own.
    Deadline(Option<HeaderMap>),
}

impl<B, P> ServerBody<B, P>
where
    B: Body<Data = Bytes>,
    P: Protocol,
{
    /// Polls the handler's body inside the request's scope, racing the
    /// timer; the protocol's `Body` impl tells the deadline its own way.
    #[inline]
    fn poll_inner(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Polled<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        let mut inner = match this.inner.as_mut().project() {
            InnerProj::Handler { body } => body,
            InnerProj::Answer { text } => {
                return Polled::Frame(Poll::Ready(text.take().map(|t| Ok(Frame::data(t)))));
            }
        };
        let Some(guard) = this.guard.as_ref() else {
            // Finished: the stream has ended (or was cut at the deadline).
            return Polled::Frame(Poll::Ready(None));
        };
        // The clock is read on the first poll, after the body was pending,
        // and every sixteenth poll of a body that is always ready; a body
        // that is pending is woken by the timer itself. A unary answer
        // (data, trailers, end) reads it once instead of three times.
        let check = *this.unchecked == 0;
        *this.unchecked = (*this.unchecked + 1) % CHECK_EVERY;
        let expired = check && this.timer.as_mut().is_some_and(LazyTimer::passed);
        let polled = if expired {
            Poll::Pending
        } else {
            let _entered = guard.span().map(tracing::Span::enter);
            guard.scope().enter_sync(|| inner.as_mut().poll_frame(cx))
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
                let ledger = this.entry.take().filter(|_| !P::HTTP_STATUS);
                // Kept past the guard's end only for the ledger's line.
                let scope = ledger
                    .as_ref()
                    .and(this.guard.as_ref())
                    .map(|g| g.scope().clone());
                if let Some(guard) = this.guard.take() {
                    guard.finish(Cause::DeadlineExceeded);
                }
                // The handler's stream goes now, after its scope ended:
                // nothing more of it is sent, and the calls it still waits
                // for end (noted, as unanswered, for this hop's ledger).
                this.inner.set(Inner::Answer { text: None });
                return Polled::Deadline(ledger_trailers(ledger, scope));
            }
            return Polled::Frame(Poll::Pending);
        }
        let mut polled = polled;
        match &mut polled {
            Poll::Ready(None) => finish(this.guard, this.timer),
            Poll::Ready(Some(Err(_))) => {
                if let Some(guard) = this.guard.as_mut() {
                    guard.failed();
                }
                finish(this.guard, this.timer)
            }
            Poll::Ready(Some(Ok(frame))) if frame.is_trailers() => {
                // Plain HTTP trailers carry no status.
                if let (false, Some(guard), Some(trailers)) =
                    (P::HTTP_STATUS, this.guard.as_mut(), frame.trailers_mut())
                {
                    Entry::answer_handler(this.entry, trailers, guard.scope());
                    guard.saw_status(trailers);
                }
                finish(this.guard, this.timer)
            }
            // hyper sends a frame after which the body reports its end as the
            // last one and never polls again: the answer is complete.
            Poll::Ready(Some(Ok(_))) if inner.is_end_stream() => finish(this.guard, this.timer),
            _ => {}
        }
        Polled::Frame(polled)
    }

    fn end_stream(&self) -> bool {
        match &self.inner {
            Inner::Answer { text } => text.is_none(),
            Inner::Handler { body } => self.guard.is_none() || body.is_end_stream(),
        }
    }

    fn hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Answer { text } => {
                SizeHint::with_exact(text.as_ref().map_or(0, |t| t.len() as u64))
            }
            Inner::Handler { body } => body.size_hint(),
        }
    }
}

/// gRPC: the handler's errors pass unchanged; the deadline arrives as
/// `DEADLINE_EXCEEDED` in the trailers (for gRPC-Web, in the trailer frame
/// that ends the body).
impl<B> Body for ServerBody<B, Grpc>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let web = self.web;
        match self.poll_inner(cx) {
            Polled::Frame(polled) => polled,
            Polled::Deadline(trailers) => {
                let trailers = trailers.unwrap_or_else(deadline_trailers);
                Poll::Ready(Some(Ok(if web == Web::No {
                    Frame::trailers(trailers)
                } else {
                    Frame::data(web_trailers(&trailers, web))
                })))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.hint()
    }
}

/// Plain HTTP: the deadline ends the body with an [`Ended`](crate::Ended)
/// error, boxed like the handler's own errors.
#[cfg(feature = "http")]
impl<B> Body for ServerBody<B, super::Http>
where
    B: Body<Data = Bytes>,
    B::Error: Into<crate::BoxError>,
{
    type Data = Bytes;
    type Error = crate::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.poll_inner(cx) {
            Polled::Frame(polled) => polled.map(|frame| frame.map(|f| f.map_err(Into::into))),
            Polled::Deadline(_) => Poll::Ready(Some(Err(Box::new(crate::Ended::new(
                Cause::DeadlineExceeded,
            ))))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.hint()
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

/// `trailers` as gRPC-Web carries them: a frame flagged `0x80` whose
/// payload is the trailers as HTTP/1 header lines, in base64 for
/// `grpc-web-text`.
fn web_trailers(trailers: &HeaderMap, web: Web) -> Bytes {
    let mut lines = Vec::new();
    for (name, value) in trailers {
        lines.extend_from_slice(name.as_str().as_bytes());
        lines.push(b':');
        lines.extend_from_slice(value.as_bytes());
        lines.extend_from_slice(b"\r\n");
    }
    let mut frame = Vec::with_capacity(5 + lines.len());
    frame.push(0x80);
    // A few fixed trailers: far below u32::MAX.
    frame.extend_from_slice(&u32::try_from(lines.len()).unwrap_or(u32::MAX).to_be_bytes());
    frame.extend_from_slice(&lines);
    match web {
        Web::Text => {
            use base64::Engine as _;
            Bytes::from(base64::engine::general_purpose::STANDARD.encode(frame))
        }
        _ => Bytes::from(frame),
    }
}

/// The deadline's trailers with this hop's ledger; `None` without an
/// entry.
#[cfg(feature = "ledger")]
fn ledger_trailers(entry: Option<Entry>, scope: Option<Scope>) -> Option<HeaderMap> {
    let (entry, scope) = entry.zip(scope)?;
    let mut trailers = deadline_trailers();
    entry.answer(&mut trailers, &scope);
    Some(trailers)
}

/// Without the ledger, the protocol's own trailers.
#[cfg(not(feature = "ledger"))]
fn ledger_trailers(entry: Option<Entry>, _: Option<Scope>) -> Option<HeaderMap> {
    entry.map(|entry| match entry {})
}

fn deadline_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::new();
    // `add_header` only fails on a message that cannot be percent-encoded;
    // ours is a fixed ASCII text.
    let _ = status_for(Cause::DeadlineExceeded).add_header(&mut trailers);
    trailers
}
