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

/// Builds a [`ReadyChannel`] with options; the shortcuts on `ReadyChannel`
/// build one with none.
///
/// ```no_run
/// use std::time::Duration;
/// use tonic::transport::Endpoint;
/// use tonic_deadline::{ClientDeadlineLayer, client::ReadyChannel};
///
/// # fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let endpoint = Endpoint::from_shared("http://10.0.0.7:50051")?;
/// let channel = ReadyChannel::builder(&endpoint)
///     .measure_round_trip(Duration::from_secs(1))
///     .lazy();
/// // Tell the server half the measured round trip less than what is left.
/// let layer = ClientDeadlineLayer::new().transit_from(channel.round_trip().expect("measured"));
/// # let _ = (layer, channel);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ReadyChannelBuilder {
    endpoint: Endpoint,
    ping_every: Option<Duration>,
    wait_for_ready: bool,
    remembered_resets: usize,
    #[cfg(unix)]
    unix_socket: Option<std::path::PathBuf>,
}

impl ReadyChannelBuilder {
    /// How many streams it reset each connection remembers, for h2's 1 s;
    /// none ([`REMEMBERED_RESETS`]) by default. It replaces the endpoint's
    /// `http2_max_concurrent_reset_streams`; the channel also replaces the
    /// endpoint's `http2_max_local_error_reset_streams` with no bound.
    ///
    /// Every call that ends before its answer — at its deadline, cancelled —
    /// resets its stream, and the server's answer may still arrive. On a
    /// remembered stream h2 ignores it, but charges each small DATA frame to
    /// the connection's budget for them, for good: under deadline storms a
    /// connection that remembers resets is closed in the end
    /// (`UNAVAILABLE`, naming "too_many_data_frames"). On a forgotten
    /// stream h2 answers with a reset, one small frame back. Remember
    /// streams only for a server that must not see those answers.
    ///
    /// ```no_run
    /// use tonic::transport::Endpoint;
    /// use tonic_deadline::client::ReadyChannel;
    /// let endpoint = Endpoint::from_static("http://127.0.0.1:50051");
    /// // h2's own default.
    /// let channel = ReadyChannel::builder(&endpoint).remembered_resets(50).lazy();
    /// # let _ = channel;
    /// ```
    pub fn remembered_resets(mut self, streams: usize) -> Self {
        self.remembered_resets = streams;
        self
    }

    /// Measures the connection's round trip with an HTTP/2 PING right after
    /// each connect and then every `every`, into the channel's
    /// [`RoundTrip`]. Off by default.
    pub fn measure_round_trip(mut self, every: Duration) -> Self {
        self.ping_every = Some(every);
        self
    }

    /// Every call waits for the channel to connect, bounded by its
    /// deadline, instead of failing at once with `UNAVAILABLE` when a dial
    /// fails: gRPC's wait-for-ready, for code without a service config.
    /// Off by default (fail fast), as in every gRPC stack.
    ///
    /// ```no_run
    /// use tonic::transport::Endpoint;
    /// use tonic_deadline::client::ReadyChannel;
    /// let endpoint = Endpoint::from_static("http://127.0.0.1:50051");
    /// // A server that is still starting: calls wait for it, until their deadline.
    /// let channel = ReadyChannel::builder(&endpoint).wait_for_ready().lazy();
    /// # let _ = channel;
    /// ```
    pub fn wait_for_ready(mut self) -> Self {
        self.wait_for_ready = true;
        self
    }

    /// Connects to the Unix socket at `path` instead of the endpoint's
    /// address; the endpoint's other settings still apply.
    ///
    /// tonic's `Endpoint` made from a `unix:` address keeps the socket's
    /// path to itself (its `uri()` answers the placeholder `http://tonic`),
    /// so the channel must be told the path. A channel given such an
    /// endpoint without it dials nothing: every call fails with
    /// `UNAVAILABLE`, naming this method.
    ///
    /// ```no_run
    /// use tonic::transport::Endpoint;
    /// use tonic_deadline::client::ReadyChannel;
    ///
    /// # fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let endpoint = Endpoint::from_static("unix:/run/app/grpc.sock");
    /// let channel = ReadyChannel::builder(&endpoint)
    ///     .unix_socket("/run/app/grpc.sock")
    ///     .lazy();
    /// # let _ = channel;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(unix)]
    pub fn unix_socket(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.unix_socket = Some(path.into());
        self
    }

    /// The channel, over TCP (or the Unix socket given to
    /// [`unix_socket`](Self::unix_socket)), connecting on first use.
    pub fn lazy(self) -> ReadyChannel {
        match self.transport() {
            Transport::Tcp(tcp) => self.lazy_with_connector(tcp),
            #[cfg(unix)]
            Transport::Unix(unix) => self.lazy_with_connector(unix),
            Transport::UnixPathUnknown(refused) => self.lazy_with_connector(refused),
        }
    }

    /// The channel, over TCP (or the Unix socket given to
    /// [`unix_socket`](Self::unix_socket)), connected before it is
    /// returned.
    ///
    /// # Errors
    ///
    /// When the connection cannot be made.
    pub async fn connect(self) -> Result<ReadyChannel, tonic::transport::Error> {
        match self.transport() {
            Transport::Tcp(tcp) => self.connect_with_connector(tcp).await,
            #[cfg(unix)]
            Transport::Unix(unix) => self.connect_with_connector(unix).await,
            Transport::UnixPathUnknown(refused) => self.connect_with_connector(refused).await,
        }
    }

    /// How [`lazy`](Self::lazy) and [`connect`](Self::connect) reach the
    /// server.
    fn transport(&self) -> Transport {
        #[cfg(unix)]
        if let Some(path) = &self.unix_socket {
            return Transport::Unix(UnixConnector(Arc::from(path.as_path())));
        }
        if is_unix_placeholder(self.endpoint.uri()) {
            tracing::warn!("{UNIX_PATH_UNKNOWN}");
            return Transport::UnixPathUnknown(UnixPathUnknown);
        }
        Transport::Tcp(tcp_connector(&self.endpoint))
    }

    /// The channel, through `connector`, connecting on first use.
    pub fn lazy_with_connector<C>(self, connector: C) -> ReadyChannel
    where
        C: Service<Uri> + Send + 'static,
        C::Response: Read + Write + Unpin + Send + 'static,
        C::Future: Send + 'static,
        C::Error: Into<BoxError>,
    {
        let (parts, linked) = self.parts(connector);
        parts.with(self.endpoint().connect_with_connector_lazy(linked))
    }

    /// The channel, through `connector`, connected before it is returned.
    ///
    /// # Errors
    ///
    /// When the connection cannot be made.
    pub async fn connect_with_connector<C>(
        self,
        connector: C,
    ) -> Result<ReadyChannel, tonic::transport::Error>
    where
        C: Service<Uri> + Send + 'static,
        C::Response: Read + Write + Unpin + Send + 'static,
        C::Future: Send + 'static,
        C::Error: Into<BoxError>,
    {
        let (parts, linked) = self.parts(connector);
        Ok(parts.with(self.endpoint().connect_with_connector(linked).await?))
    }

    /// The endpoint as tonic is given it.
    fn endpoint(&self) -> Endpoint {
        self.endpoint
            .clone()
            .http2_max_concurrent_reset_streams(self.remembered_resets)
            .http2_max_local_error_reset_streams(None)
    }

    fn parts<C>(&self, connector: C) -> (Parts, Linked<C>)
    where
        C: Service<Uri> + Send + 'static,
        C::Response: Read + Write + Unpin + Send + 'static,
        C::Future: Send + 'static,
        C::Error: Into<BoxError>,
    {
        let link = Arc::new(Link::default());
        let streams = Arc::new(Streams::default());
        let round_trip = self.ping_every.map(|every| (RoundTrip::new(), every));
        let dialer = Arc::new(Dialer {
            uri: self.endpoint.uri().clone(),
            connector: Mutex::new(connector),
            link: link.clone(),
            stash: Mutex::new(None),
            round_trip: round_trip.clone(),
            streams: streams.clone(),
        });
        let linked = Linked {
            dialer: dialer.clone(),
        };
        let parts = Parts {
            link,
            dial: dialer,
            round_trip: round_trip.map(|(r, _)| r),
            wait_for_ready: self.wait_for_ready,
            streams,
        };
        (parts, linked)
    }
}

struct Parts {
    link: Arc<Link>,
    dial: Arc<dyn Dial>,
    round_trip: Option<RoundTrip>,
    wait_for_ready: bool,
    streams: Arc<Streams>,
}

impl Parts {
    fn with(self, channel: Channel) -> ReadyChannel {
        ReadyChannel {
            channel,
            link: self.link,
            dial: self.dial,
            round_trip: self.round_trip,
            wait_for_ready: self.wait_for_ready,
            streams: self.streams,
            slot: None,
            waiting: None,
        }
    }
}

impl ReadyChannel {
    /// A builder for a channel to `endpoint` with options.
    pub fn builder(endpoint: &Endpoint) -> ReadyChannelBuilder {
        ReadyChannelBuilder {
            endpoint: endpoint.clone(),
            ping_every: None,
            wait_for_ready: false,
            remembered_resets: REMEMBERED_RESETS,
            #[cfg(unix)]
            unix_socket: None,
        }
    }

    /// The connection's measured round trip, when the channel was built to
    /// measure it ([`ReadyChannelBuilder::measure_round_trip`]).
    pub fn round_trip(&self) -> Option<RoundTrip> {
        self.round_trip.clone()
    }

    /// A channel to `endpoint` over TCP (with the endpoint's `tcp_nodelay`,
    /// keepalive and connect timeout) that connects on first use.
    pub fn lazy(endpoint: &Endpoint) -> Self {
        Self::builder(endpoint).lazy()
    }

    /// A channel to `endpoint` over TCP, connected before it is returned.
    ///
    /// # Errors
    ///
    /// When the connection cannot be made.
    pub async fn connect(endpoint: &Endpoint) -> Result<Self, tonic::transport::Error> {
        Self::builder(endpoint).connect().await
    }

    /// A channel that connects through `connector` (a `Service<Uri>` giving
    /// a connected stream, as for tonic's `Endpoint::connect_with_connector`)
    /// on first use. The connector is called once per dial and need not be
    /// `Clone`: tonic's one-shot connectors (a stream made in advance,
    /// handed out once) work as they do with tonic.
    pub fn lazy_with_connector<C>(endpoint: &Endpoint, connector: C) -> Self
    where
        C: Service<Uri> + Send + 'static,
        C::Response: Read + Write + Unpin + Send + 'static,
        C::Future: Send + 'static,
        C::Error: Into<BoxError>,
    {
        Self::builder(endpoint).lazy_with_connector(connector)
    }

    /// A channel that connects through `connector`, connected before it is
    /// returned.
    ///
    /// # Errors
    ///
    /// When the connection cannot be made.
    pub async fn connect_with_connector<C>(
        endpoint: &Endpoint,
        connector: C,
    ) -> Result<Self, tonic::transport::Error>
    where
        C: Service<Uri> + Send + 'static,
        C::Response: Read + Write + Unpin + Send + 'static,
        C::Future: Send + 'static,
        C::Error: Into<BoxError>,
    {
        Self::builder(endpoint)
            .connect_with_connector(connector)
            .await
    }

    /// Whether the channel has a connection now (or one waiting to be used).
    pub fn is_connected(&self) -> bool {
        self.link.ready.load(Ordering::Acquire)
    }

    /// Ready once a connection is in use or a dial has ended (its stream
    /// or its error stashed); starts the dial when none runs.
    fn poll_dialled(&self, cx: &mut Context<'_>) -> Poll<()> {
        match self.link.poll_connected(cx) {
            Connected::Yes => Poll::Ready(()),
            Connected::Waiting => Poll::Pending,
            Connected::DialNow => {
                self.dial.clone().start();
                Poll::Pending
            }
        }
    }
}

/// What [`ReadyChannelBuilder::lazy`] and [`ReadyChannelBuilder::connect`]
/// dial with.
enum Transport {
    Tcp(HttpConnector),
    #[cfg(unix)]
    Unix(UnixConnector),
    UnixPathUnknown(UnixPathUnknown),
}

/// What a channel whose endpoint came from a `unix:` address, with no path
/// given, says: at build time, and as the error of every dial.
const UNIX_PATH_UNKNOWN: &str = "ReadyChannel: this tonic Endpoint was made from a `unix:` \
     address, whose socket path tonic keeps to itself (its uri() is the placeholder \
     http://tonic); give the path with ReadyChannelBuilder::unix_socket(path). (A TCP server \
     named `tonic` on port 80: write the port, http://tonic:80.)";

/// Whether `uri` is what tonic's `Endpoint::uri()` answers for an endpoint
/// made from a `unix:` address: `http://tonic`, with no port.
fn is_unix_placeholder(uri: &Uri) -> bool {
    uri.scheme_str() == Some("http") && uri.authority().is_some_and(|a| a.as_str() == "tonic")
}

/// Refuses every dial: the socket's path is unknown. Dialling `tonic:80`
/// over TCP instead would fail on DNS, or reach whatever answers there.
#[derive(Debug, Clone, Copy)]
struct UnixPathUnknown;

impl Service<Uri> for UnixPathUnknown {
    type Response = hyper_util::rt::TokioIo<tokio::net::TcpStream>;
    type Error = io::Error;
    type Future = std::future::Ready<io::Result<Self::Response>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        std::future::ready(Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            UNIX_PATH_UNKNOWN,
        )))
    }
}

/// Dials a Unix socket.
#[cfg(unix)]
#[derive(Debug, Clone)]
struct UnixConnector(Arc<std::path::Path>);

#[cfg(unix)]
impl Service<Uri> for UnixConnector {
    type Response = hyper_util::rt::TokioIo<tokio::net::UnixStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move {
            let stream = tokio::net::UnixStream::connect(&*path).await?;
            Ok(hyper_util::rt::TokioIo::new(stream))
        })
    }
}

fn tcp_connector(endpoint: &Endpoint) -> HttpConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(endpoint.get_tcp_nodelay());
    http.set_keepalive(endpoint.get_tcp_keepalive());
    http.set_keepalive_interval(endpoint.get_tcp_keepalive_interval());
    http.set_keepalive_retries(endpoint.get_tcp_keepalive_retries());
    http.set_connect_timeout(endpoint.get_connect_timeout());
    http
}

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

/// The pauses between dials of a call that waits for ready: 10 ms, growing
/// by 1.6 up to 1 s, each ±20 % at random (gRPC's connection backoff
/// shape, with a start that suits a server coming up within a deadline).
struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: Duration::from_millis(10),
        }
    }
}

impl Backoff {
    fn next_pause(&mut self) -> Duration {
        use std::hash::BuildHasher;
        let pause = self.next;
        self.next = self.next.mul_f64(1.6).min(Duration::from_secs(1));
        let random = std::hash::RandomState::new().hash_one(0_u8) as f64 / u64::MAX as f64;
        pause.mul_f64(0.8 + 0.4 * random)
    }
}

impl fmt::Debug for ReadyChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadyChannel")
            .field("connected", &self.is_connected())
            .field("streams", &self.streams)
            .finish_non_exhaustive()
    }
}

/// The connection's state, shared by the channel, its connector and the
/// connection's stream.
///
/// # Invariants
///
/// 1. `ready` is true exactly when a connection is in use by tonic or
///    waits in the stash — or the last dial failed and its error waits
///    there, so that tonic reports it (`UNAVAILABLE`) instead of waiting.
/// 2. At most one dial started by the channel runs at a time.
/// 3. A stream that closes ends readiness only if it is still the one in
///    use (`live == its generation`), so an old stream closing late cannot
///    undo a new connection.
#[derive(Default)]
struct Link {
    ready: AtomicBool,
    state: Mutex<LinkState>,
}

#[derive(Default)]
struct LinkState {
    dialing: bool,
    waiters: Vec<Waker>,
    /// Generation of the stream tonic uses now; 0 for none.
    live: u64,
    generations: u64,
}

enum Connected {
    Yes,
    Waiting,
    DialNow,
}

impl Link {
    fn poll_connected(&self, cx: &mut Context<'_>) -> Connected {
        if self.ready.load(Ordering::Acquire) {
            return Connected::Yes;
        }
        let mut state = self.lock();
        if self.ready.load(Ordering::Acquire) {
            return Connected::Yes;
        }
        if !state.waiters.iter().any(|w| w.will_wake(cx.waker())) {
            state.waiters.push(cx.waker().clone());
        }
        if state.dialing {
            return Connected::Waiting;
        }
        state.dialing = true;
        Connected::DialNow
    }

    /// A dial finished (its stream or error is in the stash): wake waiters.
    fn dialed(&self) {
        let waiters = {
            let mut state = self.lock();
            state.dialing = false;
            self.ready.store(true, Ordering::Release);
            std::mem::take(&mut state.waiters)
        };
        for waiter in waiters {
            waiter.wake();
        }
    }

    /// tonic took a stream; returns its generation.
    fn in_use(&self) -> u64 {
        let mut state = self.lock();
        state.generations += 1;
        state.live = state.generations;
        self.ready.store(true, Ordering::Release);
        state.live
    }

    /// A dial's error was handed to tonic: not ready until the next dial.
    fn failed(&self) {
        let state = self.lock();
        if state.live == 0 && !state.dialing {
            self.ready.store(false, Ordering::Release);
        }
    }

    /// The stream of `generation` closed.
    fn closed(&self, generation: u64, stash_empty: bool) {
        let mut state = self.lock();
        if state.live == generation {
            state.live = 0;
            if stash_empty {
                self.ready.store(false, Ordering::Release);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LinkState> {
        // The state stays consistent under a panic (plain fields, no
        // invariant spans two of them), so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Starts a dial in the background.
trait Dial: Send + Sync {
    fn start(self: Arc<Self>);
    /// Whether the last dial failed and its error waits to be reported.
    fn failed(&self) -> bool;
    /// Drops the error of a failed dial, unreported: a call that waits for
    /// ready dials again instead.
    fn forget_failure(&self);
}

type Stashed<T> = Result<T, BoxError>;

struct Dialer<C: Service<Uri>> {
    uri: Uri,
    /// Behind a lock so that the dialer is `Sync`, and so that a dial
    /// readies and calls it in one go.
    connector: Mutex<C>,
    link: Arc<Link>,
    /// A stream dialed ahead of tonic asking for it, or the dial's error.
    stash: Mutex<Option<Stashed<C::Response>>>,
    /// Where to measure each connection's round trip, and how often.
    round_trip: Option<(RoundTrip, Duration)>,
    /// Told the limit each connection's server sets.
    streams: Arc<Streams>,
}

impl<C> Dialer<C>
where
    C: Service<Uri>,
    C::Error: Into<BoxError>,
{
    async fn dial(&self) -> Stashed<C::Response> {
        // Readied and called under one lock, as tower asks; the dial itself
        // runs outside it. Not cloned: a connector may be one-shot (a
        // stream made in advance, handed out once).
        let dialing = poll_fn(|cx| {
            let mut connector = self
                .connector
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let ready = std::task::ready!(connector.poll_ready(cx));
            Poll::Ready(ready.map(|()| connector.call(self.uri.clone())))
        })
        .await
        .map_err(Into::into)?;
        dialing.await.map_err(Into::into)
    }

    fn take_stash(&self) -> Option<Stashed<C::Response>> {
        self.stash
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    fn stash_is_empty(&self) -> bool {
        self.stash
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_none()
    }
}

impl<C> Dial for Dialer<C>
where
    C: Service<Uri> + Send + 'static,
    C::Response: Send + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    fn start(self: Arc<Self>) {
        // A connection is the channel's, not any request's: it outlives the
        // call that asked for it.
        #[allow(clippy::disallowed_methods)]
        tokio::spawn(async move {
            let dialed = self.dial().await;
            if let Err(err) = &dialed {
                tracing::debug!(uri = %self.uri, error = %err, "dial failed");
            }
            *self
                .stash
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(dialed);
            self.link.dialed();
        });
    }

    fn failed(&self) -> bool {
        matches!(
            *self
                .stash
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            Some(Err(_))
        )
    }

    fn forget_failure(&self) {
        let mut stash = self
            .stash
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if matches!(*stash, Some(Err(_))) {
            *stash = None;
            drop(stash);
            self.link.failed();
        }
    }
}

/// The connector tonic is given: hands out the stashed stream, or dials.
struct Linked<C: Service<Uri>> {
    dialer: Arc<Dialer<C>>,
}

impl<C: Service<Uri>> Clone for Linked<C> {
    fn clone(&self) -> Self {
        Self {
            dialer: self.dialer.clone(),
        }
    }
}

impl<C> Service<Uri> for Linked<C>
where
    C: Service<Uri> + Send + 'static,
    C::Response: Read + Write + Unpin + Send + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = LinkedIo<C::Response>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let dialer = self.dialer.clone();
        Box::pin(async move {
            let dialed = match dialer.take_stash() {
                Some(stashed) => stashed,
                None => dialer.dial().await,
            };
            let io = match dialed {
                Ok(io) => io,
                Err(err) => {
                    // Reported by tonic as UNAVAILABLE; the next call dials anew.
                    dialer.link.failed();
                    return Err(err);
                }
            };
            let generation = dialer.link.in_use();
            let weak: Weak<Dialer<C>> = Arc::downgrade(&dialer);
            let on_close: Box<dyn Fn() + Send + Sync> = Box::new(move || {
                if let Some(dialer) = weak.upgrade() {
                    let empty = dialer.stash_is_empty();
                    dialer.link.closed(generation, empty);
                }
            });
            let meter = dialer
                .round_trip
                .as_ref()
                .map(|(round_trip, every)| Box::new(Metered::new(round_trip.clone(), *every)));
            Ok(LinkedIo {
                io,
                on_close,
                meter,
                scan: Some(Box::new(Scanned {
                    scan: SettingsScan::default(),
                    streams: dialer.streams.clone(),
                    scratch: Vec::new(),
                    resets: Resets::default(),
                    held_back: false,
                })),
            })
        })
    }
}

/// The connection's stream: tells the channel when it is gone (hyper drops
/// it when the connection ends, by either side).
struct LinkedIo<T> {
    io: T,
    on_close: Box<dyn Fn() + Send + Sync>,
    /// Set when the channel measures round trips: reads then go through a
    /// buffer of ours, to take our PING ACKs out.
    meter: Option<Box<Metered>>,
    /// Reads the server's stream limit; `None` once the stream turned out
    /// not to be HTTP/2 in the clear.
    scan: Option<Box<Scanned>>,
}

/// A [`SettingsScan`] of the bytes the server sends, where it reports, and
/// the streams the client reset (see [`Resets`]).
struct Scanned {
    scan: SettingsScan,
    streams: Arc<Streams>,
    /// Reads land here first, to be scanned, when no [`Metered`] reads them.
    scratch: Vec<u8>,
    resets: Resets,
    /// The last read was held back for a reset due.
    held_back: bool,
}

impl Scanned {
    /// Whether to hold this read back, once, because a call was dropped
    /// before its answer ended: h2 writes the reset it scheduled only once
    /// a read finds nothing, and an answer read before it would be charged
    /// (see [`Streams::take_reset_due`]). Never twice in a row, so reads
    /// go on under a storm of resets.
    fn hold_back(&mut self, cx: &Context<'_>) -> bool {
        if std::mem::take(&mut self.held_back) || !self.streams.take_reset_due() {
            return false;
        }
        self.held_back = true;
        cx.waker().wake_by_ref();
        true
    }

    fn scan(&mut self, bytes: &mut [u8]) {
        if let Limit::Set(limit) = self.scan.scan(bytes, &self.resets) {
            self.streams.set_limit(limit);
        }
    }

    /// Follows the first `n` bytes of `bufs`, written.
    fn wrote(&mut self, bufs: &[io::IoSlice<'_>], mut n: usize) {
        for buf in bufs {
            if n == 0 {
                break;
            }
            let take = n.min(buf.len());
            self.resets.wrote(&buf[..take]);
            n -= take;
        }
    }
}

/// A [`Meter`] and the read bytes waiting for hyper.
struct Metered {
    meter: Meter,
    ready: VecDeque<u8>,
    scratch: Vec<u8>,
}

impl Metered {
    fn new(round_trip: RoundTrip, every: Duration) -> Self {
        Self {
            meter: Meter::new(round_trip, every),
            ready: VecDeque::new(),
            scratch: vec![0; 16 * 1024],
        }
    }

    /// Moves what waits for hyper into `buf`; whether anything moved.
    fn hand_over(&mut self, buf: &mut ReadBufCursor<'_>) -> bool {
        let n = self.ready.len().min(buf.remaining());
        if n == 0 {
            return false;
        }
        let (a, b) = self.ready.as_slices();
        let from_a = n.min(a.len());
        buf.put_slice(&a[..from_a]);
        buf.put_slice(&b[..n - from_a]);
        self.ready.drain(..n);
        true
    }
}

impl<T> Drop for LinkedIo<T> {
    fn drop(&mut self) {
        (self.on_close)();
    }
}

impl<T> fmt::Debug for LinkedIo<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinkedIo").finish_non_exhaustive()
    }
}

impl<T: Read + Unpin> Read for LinkedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.scan.as_ref().is_some_and(|s| s.scan.is_off()) {
            this.scan = None;
        }
        if this.scan.as_deref_mut().is_some_and(|s| s.hold_back(cx)) {
            return Poll::Pending;
        }
        let Some(metered) = this.meter.as_deref_mut() else {
            let Some(scanned) = this.scan.as_deref_mut() else {
                return Pin::new(&mut this.io).poll_read(cx, buf);
            };
            // Read into our buffer, no more than hyper has room for, scan,
            // and hand it all over.
            let room = buf.remaining().min(16 * 1024);
            if scanned.scratch.len() < room {
                scanned.scratch.resize(room, 0);
            }
            let mut read = hyper::rt::ReadBuf::new(&mut scanned.scratch[..room]);
            std::task::ready!(Pin::new(&mut this.io).poll_read(cx, read.unfilled()))?;
            let n = read.filled().len();
            let mut filled = std::mem::take(&mut scanned.scratch);
            scanned.scan(&mut filled[..n]);
            buf.put_slice(&filled[..n]);
            scanned.scratch = filled;
            return Poll::Ready(Ok(()));
        };
        loop {
            if metered.hand_over(&mut buf) {
                return Poll::Ready(Ok(()));
            }
            let mut read = hyper::rt::ReadBuf::new(&mut metered.scratch);
            std::task::ready!(Pin::new(&mut this.io).poll_read(cx, read.unfilled()))?;
            let filled = read.filled();
            if filled.is_empty() {
                // The peer closed: hand over what was held back, then EOF.
                metered.meter.read_end(&mut metered.ready);
                metered.hand_over(&mut buf);
                return Poll::Ready(Ok(()));
            }
            // Our ACKs alone leave nothing for hyper: read on rather than
            // hand it an empty read, which would mean the end.
            let now = tokio::time::Instant::now();
            let mut filled = filled.to_vec();
            if let Some(scanned) = this.scan.as_deref_mut() {
                scanned.scan(&mut filled);
            }
            metered.meter.read(&filled, now, &mut metered.ready);
        }
    }
}

impl<T: Write + Unpin> Write for LinkedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let Some(metered) = this.meter.as_deref_mut() else {
            let n = std::task::ready!(Pin::new(&mut this.io).poll_write(cx, buf))?;
            if let Some(scanned) = this.scan.as_deref_mut() {
                scanned.resets.wrote(&buf[..n]);
            }
            return Poll::Ready(Ok(n));
        };
        // Our PING, if one is due, goes first, whole.
        loop {
            let ours = metered.meter.pending_write(tokio::time::Instant::now());
            if ours.is_empty() {
                break;
            }
            let n = std::task::ready!(Pin::new(&mut this.io).poll_write(cx, ours))?;
            if n == 0 {
                return Poll::Ready(Ok(0));
            }
            metered.meter.wrote_ours(n);
        }
        let n = std::task::ready!(Pin::new(&mut this.io).poll_write(cx, buf))?;
        metered.meter.wrote(&buf[..n]);
        if let Some(scanned) = this.scan.as_deref_mut() {
            scanned.resets.wrote(&buf[..n]);
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        // A measured stream takes one buffer at a time, to find the frame
        // boundaries between which a PING may go.
        self.meter.is_none() && self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.meter.is_some() {
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &**b);
            return self.poll_write(cx, first);
        }
        let this = self.get_mut();
        let n = std::task::ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs))?;
        if let Some(scanned) = this.scan.as_deref_mut() {
            scanned.wrote(bufs, n);
        }
        Poll::Ready(Ok(n))
    }
}
