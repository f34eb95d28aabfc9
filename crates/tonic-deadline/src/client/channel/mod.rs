//! A tonic `Channel` that is ready only once its connection is.
//!
//! `grpc-timeout` must be what is left when the request leaves. A tonic
//! `Channel` connects lazily — on its first call, and again after every
//! lost connection — *inside* itself, after the call has been handed over,
//! so the client layer writes the header before the connection exists and
//! the server is told the connect time more than the caller has. tonic does
//! not let a layer in between its queue and its connection, but it does let
//! us give it the connector. [`ReadyChannel`] does that: its connector
//! dials on request and keeps the connection until tonic asks for one, and
//! its `poll_ready` waits for that dial. The client layer waits for
//! readiness (bounded by the caller's deadline) before it writes the
//! header, so the header counts the connect time.
//!
//! A call fails fast by default: when the dial fails, tonic reports it as
//! `UNAVAILABLE`. A call that waits for ready (a [`WaitForReady`] in its
//! extensions, which a service config's `"waitForReady": true` puts there,
//! or every call of a channel built with
//! [`ReadyChannelBuilder::wait_for_ready`]) dials again instead, with a
//! jittered exponential backoff from 10 ms up to 1 s, until it connects or
//! the client layer ends it at the deadline (`DEADLINE_EXCEEDED`). Its
//! `grpc-timeout` was written before that wait: the channel takes the time
//! it waited off the header before the request leaves.
//!
//! A server may take only so many streams at once on a connection (its
//! `SETTINGS_MAX_CONCURRENT_STREAMS`). h2 would queue a call beyond that
//! inside the connection, its header already written; the channel keeps
//! that queue itself instead: it reads the limit from the server's SETTINGS
//! frames, counts its calls until their response bodies end or are
//! dropped, and is not ready while they fill the limit. So the header also
//! counts the wait for a free stream.
//!
//! Deadlines reset streams: every call that outlives its deadline or is
//! cancelled ends with an `RST_STREAM`, and the server's answer may still
//! be on its way. h2 remembers a stream it reset — 50 of them, for 1 s, by
//! default — and ignores frames on it; but it charges each small DATA
//! frame it ignores there, for good, to the connection's budget for small
//! DATA frames, and closes the connection once that runs out
//! (`GOAWAY ENHANCE_YOUR_CALM`, "too_many_data_frames"). A frame on a
//! stream it has forgotten it answers with a reset of its own instead,
//! which costs no budget but counts toward another bound (1 024 in the
//! connection's life). So a channel remembers no reset streams
//! ([`REMEMBERED_RESETS`], [`ReadyChannelBuilder::remembered_resets`]) and
//! lifts that bound: a late answer costs one small frame back. h2 also
//! charges a frame that arrives while a stream it reset is still held; so
//! the connection's stream follows the `RST_STREAM`s the client writes and
//! marks a DATA frame read on such a stream as the stream's last, which h2
//! ignores just the same and does not charge. And an answer can cross its
//! reset: h2 writes the reset of a dropped call only once it has read all
//! there is to read, so an answer already on the socket would be read
//! before it, and charged. A call dropped before its answer ended makes the
//! connection's stream hold its next read back once, so that h2 writes the
//! reset first. (Both guards defend a server from clients; a server that
//! makes its client answer with resets gains nothing.)
//!
//! What remains: the hop through tonic's own queue (tens of microseconds),
//! and a TLS handshake, which tonic performs after our connector returns
//! (give the channel a connector that does TLS itself to count it; a
//! channel whose connection tonic encrypts cannot read the server's
//! SETTINGS, and leaves a stream limit to h2's queue).
//!
//! # Layout
//!
//! This file holds the channel as a service: its readiness, its calls and
//! their bodies. Beside it: `builder` (how a channel is made), `connect`
//! (TCP or a Unix socket), `dial` (the connection's state, the dialer and
//! its backoff) and `connection_io` (the connection's stream, which reads the
//! server's stream limit and meters the round trip). Each part takes what
//! it shares from here (`use super::*`); none imports a sibling that
//! imports it back.

use std::collections::VecDeque;
use std::fmt;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::{Request, Response, Uri};
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::HttpConnector;
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};
use tower_service::Service;

use pin_project_lite::pin_project;

use super::WaitForReady;
use super::round_trip::{Meter, RoundTrip};
use super::streams::{Limit, Resets, SettingsScan, Slot, Streams, Ticket};
use crate::BoxError;
use crate::wire::timeout_header::{self, GRPC_TIMEOUT};

mod builder;
mod connect;
mod connection_io;
mod dial;

pub use builder::ReadyChannelBuilder;
use connect::{
    Transport, UNIX_PATH_UNKNOWN, UnixConnector, UnixPathUnknown, is_unix_placeholder,
    tcp_connector,
};
use connection_io::{LinkedIo, Metered, Scanned};
use dial::{Backoff, Connected, Dial, Dialer, Link, Linked};

/// A tonic [`Channel`] whose readiness means "connected": put it under a
/// [`ClientDeadlineLayer`](crate::ClientDeadlineLayer) and the budget on the
/// wire counts the time spent connecting, on the first call and after every
/// reconnect.
///
/// ```no_run
/// use tonic::transport::Endpoint;
/// use tonic_deadline::{ClientDeadlineLayer, client::ReadyChannel};
///
/// # fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let endpoint = Endpoint::from_shared("http://127.0.0.1:50051")?.tcp_nodelay(true);
/// let channel = tower::ServiceBuilder::new()
///     .layer(ClientDeadlineLayer::new())
///     .service(ReadyChannel::lazy(&endpoint)); // connects on first use
/// # let _ = channel;
/// # Ok(())
/// # }
/// ```
///
/// Clones share the connection, as tonic's do. Each call holds a stream of
/// the connection from readiness until its response body ends or is
/// dropped; a clone that got ready holds one for its next call (as a
/// tower `ConcurrencyLimit` holds a permit), so drop clones you no longer
/// call rather than keep them ready.
pub struct ReadyChannel {
    channel: Channel,
    link: Arc<Link>,
    dial: Arc<dyn Dial>,
    round_trip: Option<RoundTrip>,
    wait_for_ready: bool,
    streams: Arc<Streams>,
    /// The stream this clone got ready with, for its next call.
    slot: Option<Slot>,
    /// This clone's place in the queue for a stream.
    waiting: Option<Ticket>,
}

impl Clone for ReadyChannel {
    fn clone(&self) -> Self {
        Self {
            channel: self.channel.clone(),
            link: self.link.clone(),
            dial: self.dial.clone(),
            round_trip: self.round_trip.clone(),
            wait_for_ready: self.wait_for_ready,
            streams: self.streams.clone(),
            slot: None,
            waiting: None,
        }
    }
}

/// How many reset streams a [`ReadyChannel`]'s connection remembers (for
/// h2's 1 s) unless set otherwise: none (h2's own default is 50). See
/// [`ReadyChannelBuilder::remembered_resets`].
///
/// ```
/// assert_eq!(tonic_deadline::client::REMEMBERED_RESETS, 0);
/// ```
pub const REMEMBERED_RESETS: usize = 0;

/// Ready once connected and a stream is free on the connection.
impl Service<Request<Body>> for ReadyChannel {
    type Response = Response<ReadyBody>;
    type Error = tonic::transport::Error;
    type Future = ReadyFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        std::task::ready!(self.poll_dialled(cx));
        if self.slot.is_none() {
            let slot = std::task::ready!(self.streams.poll_acquire(cx, &mut self.waiting));
            self.slot = Some(slot);
        }
        self.channel.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let mut slot = match self.slot.take() {
            Some(slot) => slot,
            None => self.streams.admit(),
        };
        slot.sent();
        let asked = request.extensions().get::<WaitForReady>().is_some();
        if asked && let Some(honoured) = request.extensions().get::<super::WaitHonoured>() {
            honoured.honour();
        }
        let waits = self.wait_for_ready || asked;
        let state = if waits && self.dial.failed() {
            ReadyState::Waiting {
                wait: Box::pin(wait_then_send(self.clone(), request)),
            }
        } else {
            ReadyState::Sent {
                inner: self.channel.call(request),
            }
        };
        ReadyFuture {
            state,
            slot: Some(slot),
        }
    }
}

type Answer = Result<Response<Body>, tonic::transport::Error>;

pin_project! {
    /// The response future of [`ReadyChannel`]: tonic's, or — for a call
    /// that waits for ready while the channel cannot connect — the wait
    /// for a connection first.
    ///
    /// # Cancellation safety
    ///
    /// Dropping it drops the call (tonic resets its stream) or ends the
    /// wait; a connection being dialled is kept for the next call.
    ///
    /// ```
    /// use tonic_deadline::client::{ReadyChannel, ReadyFuture};
    /// use tower_service::Service;
    ///
    /// // The future of one call on a ready channel.
    /// fn future_of(
    ///     channel: &mut ReadyChannel,
    ///     request: http::Request<tonic::body::Body>,
    /// ) -> ReadyFuture {
    ///     channel.call(request)
    /// }
    /// ```
    pub struct ReadyFuture {
        #[pin]
        state: ReadyState,
        // The call's stream, handed on to the response body; dropped after
        // the call, as in `ReadyBody`.
        slot: Option<Slot>,
    }
}

pin_project! {
    #[project = ReadyStateProj]
    enum ReadyState {
        Sent {
            #[pin]
            inner: <Channel as Service<Request<Body>>>::Future,
        },
        Waiting {
            wait: Pin<Box<dyn Future<Output = Answer> + Send>>,
        },
    }
}

impl Future for ReadyFuture {
    type Output = Result<Response<ReadyBody>, tonic::transport::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer = std::task::ready!(match this.state.project() {
            ReadyStateProj::Sent { inner } => inner.poll(cx),
            ReadyStateProj::Waiting { wait } => wait.as_mut().poll(cx),
        });
        let slot = this.slot.take();
        Poll::Ready(answer.map(|response| response.map(|inner| ReadyBody { inner, slot })))
    }
}

pin_project! {
    /// The response body of [`ReadyChannel`]: tonic's, holding the call's
    /// stream on the connection until it ends or is dropped.
    ///
    /// ```
    /// use http_body::Body as _;
    /// fn is_http_body<B: http_body::Body>() {}
    /// is_http_body::<tonic_deadline::client::ReadyBody>();
    /// ```
    pub struct ReadyBody {
        #[pin]
        inner: Body,
        // Dropped after the body, so that h2 has scheduled the stream's
        // reset by the time the slot says one is due.
        slot: Option<Slot>,
    }
}

/// An empty body holding no stream: what tonic's `InterceptedService`
/// answers with when an interceptor refuses a call, so that a generated
/// client's `with_interceptor` takes a `ReadyChannel`.
///
/// ```
/// let body = tonic_deadline::client::ReadyBody::default();
/// assert!(http_body::Body::is_end_stream(&body));
/// ```
impl Default for ReadyBody {
    fn default() -> Self {
        Self {
            inner: Body::default(),
            slot: None,
        }
    }
}

impl http_body::Body for ReadyBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = std::task::ready!(this.inner.poll_frame(cx));
        // The stream is free once it ended: an error, the end, or trailers
        // (always the last frame).
        if !matches!(&polled, Some(Ok(frame)) if frame.is_data())
            && let Some(slot) = this.slot.take()
        {
            slot.ended();
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl fmt::Debug for ReadyBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadyBody")
            .field("holds_stream", &self.slot.is_some())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for ReadyFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadyFuture").finish_non_exhaustive()
    }
}

/// Dials until a connection is made, then sends `request` with its
/// `grpc-timeout` less the time it waited. Without a deadline it waits as
/// long as it takes; with one, the client layer above ends it there.
async fn wait_then_send(mut channel: ReadyChannel, mut request: Request<Body>) -> Answer {
    let started = tokio::time::Instant::now();
    let mut backoff = Backoff::default();
    while channel.dial.failed() {
        // Forget the failure (the call waits instead of reporting it),
        // pause, and wait for a new dial.
        channel.dial.forget_failure();
        tokio::time::sleep(backoff.next_pause()).await;
        poll_fn(|cx| channel.poll_dialled(cx)).await;
    }
    if !spend(request.headers_mut(), started.elapsed()) {
        // Nothing left to tell the server: the client layer answers
        // DEADLINE_EXCEEDED at the deadline, an instant from now.
        std::future::pending::<()>().await;
    }
    poll_fn(|cx| channel.channel.poll_ready(cx)).await?;
    channel.channel.call(request).await
}

/// Takes `waited` off the request's `grpc-timeout`; false when nothing is
/// left. A request without one (no deadline) is left as it is.
fn spend(headers: &mut http::HeaderMap, waited: Duration) -> bool {
    let Ok(Some(budget)) = timeout_header::from_headers(headers) else {
        return true;
    };
    let left = budget.saturating_sub(waited);
    if left.is_zero() {
        return false;
    }
    if let Ok(value) = http::HeaderValue::from_str(&timeout_header::encode(left)) {
        headers.insert(GRPC_TIMEOUT, value);
    }
    true
}

impl fmt::Debug for ReadyChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadyChannel")
            .field("connected", &self.is_connected())
            .field("streams", &self.streams)
            .finish_non_exhaustive()
    }
}
