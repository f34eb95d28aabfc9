//! Shared pieces of the integration tests: a probe service that reports what
//! each handler sees, real servers and clients on loopback, raw HTTP/2 peers
//! for what tonic will not send or answer, and a proxy that counts the HTTP/2
//! frames a client writes.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]
// Each feature set, and the `logs` binary, uses a different subset of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::HeaderMap;
use prost::Message;
use testkit::probe_client::ProbeClient;
use testkit::probe_server::{Probe, ProbeServer};
use testkit::{CallReply, CallRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status, Streaming};
use tonic_deadline::client::ClientDeadline;
use tonic_deadline::{ClientDeadlineLayer, Ended, Scope, ServerDeadlineLayer};

/// How long a test waits for something that must happen. Generous: the
/// machines are shared and slow; a pass is usually milliseconds.
pub(crate) const PATIENCE: Duration = Duration::from_secs(10);

/// A probe client whose channel obeys the current scope.
pub(crate) type Client = ProbeClient<ClientDeadline<Channel>>;

/// What a handler reports while it runs.
#[derive(Debug)]
pub(crate) enum Event {
    /// The handler started. `scope` is its current scope, if one was installed.
    Entered {
        hop: &'static str,
        scope: Option<Scope>,
        in_extensions: bool,
        metadata: HeaderMap,
    },
    /// A task the handler spawned under its scope stopped.
    ChildStopped {
        hop: &'static str,
        result: Result<(), Ended>,
    },
    /// The handler (or its response stream) is gone; `completed` tells
    /// whether it ran to the end or was dropped on the way.
    Exited { hop: &'static str, completed: bool },
}

/// The receiving side of the events of every node in a test.
pub(crate) struct Events {
    rx: mpsc::UnboundedReceiver<Event>,
    backlog: Vec<Event>,
}

impl Events {
    pub(crate) fn new() -> (Self, mpsc::UnboundedSender<Event>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Self {
                rx,
                backlog: Vec::new(),
            },
            tx,
        )
    }

    /// Waits (at most [`PATIENCE`]) for the first event `pick` accepts,
    /// keeping the others for later.
    pub(crate) async fn wait_for(
        &mut self,
        what: &str,
        mut pick: impl FnMut(&Event) -> bool,
    ) -> Event {
        if let Some(at) = self.backlog.iter().position(&mut pick) {
            return self.backlog.remove(at);
        }
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let event = tokio::time::timeout_at(deadline, self.rx.recv())
                .await
                .unwrap_or_else(|_| panic!("{what} must happen within {PATIENCE:?}"))
                .expect("the nodes keep their senders");
            if pick(&event) {
                return event;
            }
            self.backlog.push(event);
        }
    }

    /// The scope `hop`'s handler ran in.
    pub(crate) async fn entered(&mut self, hop: &'static str) -> Scope {
        self.entered_with_metadata(hop).await.0
    }

    pub(crate) async fn entered_with_metadata(&mut self, hop: &'static str) -> (Scope, HeaderMap) {
        let event = self
            .wait_for(
                &format!("{hop} entering its handler"),
                |e| matches!(e, Event::Entered { hop: h, .. } if *h == hop),
            )
            .await;
        let Event::Entered {
            scope,
            in_extensions,
            metadata,
            ..
        } = event
        else {
            unreachable!("picked an Entered event")
        };
        assert!(
            in_extensions,
            "{hop}: the scope must be in the request extensions"
        );
        let scope = scope.unwrap_or_else(|| panic!("{hop}: the handler must run inside its scope"));
        (scope, metadata)
    }

    /// Whether `hop`'s handler ran to completion.
    pub(crate) async fn exited(&mut self, hop: &'static str) -> bool {
        match self
            .wait_for(
                &format!("{hop} leaving its handler"),
                |e| matches!(e, Event::Exited { hop: h, .. } if *h == hop),
            )
            .await
        {
            Event::Exited { completed, .. } => completed,
            _ => unreachable!("picked an Exited event"),
        }
    }

    /// How the task `hop`'s handler spawned ended.
    pub(crate) async fn child_stopped(&mut self, hop: &'static str) -> Result<(), Ended> {
        match self
            .wait_for(
                &format!("the task spawned by {hop} stopping"),
                |e| matches!(e, Event::ChildStopped { hop: h, .. } if *h == hop),
            )
            .await
        {
            Event::ChildStopped { result, .. } => result,
            _ => unreachable!("picked a ChildStopped event"),
        }
    }

    /// Every event received so far that no wait has taken.
    pub(crate) fn received(&mut self) -> Vec<Event> {
        while let Ok(event) = self.rx.try_recv() {
            self.backlog.push(event);
        }
        std::mem::take(&mut self.backlog)
    }
}

/// Reports `Exited` when dropped.
struct ExitGuard {
    hop: &'static str,
    events: mpsc::UnboundedSender<Event>,
    completed: bool,
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let _ = self.events.send(Event::Exited {
            hop: self.hop,
            completed: self.completed,
        });
    }
}

/// One service of a test topology, implementing `probe.v1.Probe`.
///
/// `Call` reports its remaining budget on entry, works for the node's own
/// `work` (or the request's `work_ms`) while ignoring its scope — the server
/// layer must enforce the deadline by itself — then calls the next node, if
/// any, and returns every hop's report.
#[derive(Clone)]
pub(crate) struct Node {
    name: &'static str,
    events: mpsc::UnboundedSender<Event>,
    next: Option<Client>,
    work: Option<Duration>,
    detach_next: bool,
    spawn_child: bool,
}

impl Node {
    pub(crate) fn new(name: &'static str, events: &mpsc::UnboundedSender<Event>) -> Self {
        Self {
            name,
            events: events.clone(),
            next: None,
            work: None,
            detach_next: false,
            spawn_child: false,
        }
    }

    /// Calls `next` after its own work.
    pub(crate) fn calling(mut self, next: Client) -> Self {
        self.next = Some(next);
        self
    }

    /// Works this long whatever the request says.
    pub(crate) fn working(mut self, work: Duration) -> Self {
        self.work = Some(work);
        self
    }

    /// Makes the downstream call inside `detach`: the explicit opt-out.
    pub(crate) fn detaching(mut self) -> Self {
        self.detach_next = true;
        self
    }

    /// Spawns, under the handler's scope, a task that never ends by itself.
    pub(crate) fn spawning_child(mut self) -> Self {
        self.spawn_child = true;
        self
    }

    fn enter<T>(&self, request: &Request<T>) -> (ExitGuard, testkit::Hop) {
        let scope = Scope::try_current();
        let metadata = request.metadata().clone().into_headers();
        let header = metadata
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let remaining_us = scope
            .as_ref()
            .and_then(Scope::remaining)
            .map_or(-1, |left| {
                i64::try_from(left.as_micros()).unwrap_or(i64::MAX)
            });
        let _ = self.events.send(Event::Entered {
            hop: self.name,
            scope,
            in_extensions: request.extensions().get::<Scope>().is_some(),
            metadata,
        });
        if self.spawn_child {
            let task = tonic_deadline::spawn(std::future::pending::<()>());
            let events = self.events.clone();
            let hop = self.name;
            tokio::spawn(async move {
                let result = task.await.expect("the spawned task must not panic");
                let _ = events.send(Event::ChildStopped { hop, result });
            });
        }
        let guard = ExitGuard {
            hop: self.name,
            events: self.events.clone(),
            completed: false,
        };
        let report = testkit::Hop {
            service: self.name.to_owned(),
            remaining_us,
            header,
            ..testkit::Hop::default()
        };
        (guard, report)
    }
}

#[tonic::async_trait]
impl Probe for Node {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        let (mut guard, report) = self.enter(&request);
        let request = request.into_inner();
        let work = self.work.unwrap_or(Duration::from_millis(request.work_ms));
        tokio::time::sleep(work).await;

        let mut hops = vec![report];
        if let Some(next) = &self.next {
            let mut next = next.clone();
            let downstream = request.clone();
            let reply = if self.detach_next {
                tonic_deadline::detach(async move { next.call(downstream).await })
                    .await
                    .map_err(|e| Status::internal(format!("detached call panicked: {e}")))?
            } else {
                next.call(downstream).await
            }?;
            hops.extend(reply.into_inner().hops);
        }
        guard.completed = true;
        Ok(Response::new(CallReply {
            hops,
            payload: request.payload,
        }))
    }

    type WatchStream = Ticks;

    async fn watch(&self, request: Request<CallRequest>) -> Result<Response<Ticks>, Status> {
        let (guard, report) = self.enter(&request);
        let request = request.into_inner();
        let period = Duration::from_millis(request.interval_ms.max(1));
        Ok(Response::new(Ticks {
            interval: tokio::time::interval_at(tokio::time::Instant::now() + period, period),
            left: request.count,
            report,
            guard,
        }))
    }

    type ChatStream = Echo;

    async fn chat(
        &self,
        request: Request<Streaming<CallRequest>>,
    ) -> Result<Response<Echo>, Status> {
        let (guard, _) = self.enter(&request);
        Ok(Response::new(Echo {
            inbound: request.into_inner(),
            guard,
        }))
    }
}

/// `Watch`'s stream: `count` replies, one per interval.
pub(crate) struct Ticks {
    interval: tokio::time::Interval,
    left: u32,
    report: testkit::Hop,
    guard: ExitGuard,
}

impl Stream for Ticks {
    type Item = Result<CallReply, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.left == 0 {
            self.guard.completed = true;
            return Poll::Ready(None);
        }
        ready!(self.interval.poll_tick(cx));
        self.left -= 1;
        Poll::Ready(Some(Ok(CallReply {
            hops: vec![self.report.clone()],
            payload: self.left.to_string(),
        })))
    }
}

/// `Chat`'s stream: every inbound message echoed back.
pub(crate) struct Echo {
    inbound: Streaming<CallRequest>,
    guard: ExitGuard,
}

impl Stream for Echo {
    type Item = Result<CallReply, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match ready!(Pin::new(&mut self.inbound).poll_next(cx)) {
            Some(Ok(message)) => Poll::Ready(Some(Ok(CallReply {
                hops: Vec::new(),
                payload: message.payload,
            }))),
            Some(Err(status)) => Poll::Ready(Some(Err(status))),
            None => {
                self.guard.completed = true;
                Poll::Ready(None)
            }
        }
    }
}

/// A listener on a free loopback port.
pub(crate) async fn loopback() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("loopback must accept a listener");
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    (listener, addr)
}

/// Serves `node` behind the default server layer on `listener`.
pub(crate) async fn serve_on(listener: TcpListener, node: Node) {
    Server::builder()
        .layer(ServerDeadlineLayer::new())
        .add_service(ProbeServer::new(node))
        .serve_with_incoming(TcpListenerStream::new(listener))
        .await
        .expect("the test server must keep serving");
}

/// Serves `node` behind `layer` on a fresh loopback port until the test ends.
pub(crate) async fn serve(layer: ServerDeadlineLayer, node: Node) -> SocketAddr {
    let (listener, addr) = loopback().await;
    tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(ProbeServer::new(node))
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .expect("the test server must keep serving");
    });
    addr
}

fn endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint::from_shared(format!("http://{addr}")).expect("a loopback address is a valid URI")
}

/// A connected channel to `addr`, without the deadline layer.
pub(crate) async fn channel(addr: SocketAddr) -> Channel {
    endpoint(addr)
        .connect()
        .await
        .expect("the test server must accept a connection")
}

/// A client with the deadline layer, connected to `addr`.
pub(crate) async fn connect(addr: SocketAddr) -> Client {
    with_deadlines(channel(addr).await)
}

/// A client with the deadline layer that connects on first use.
pub(crate) fn connect_lazy(addr: SocketAddr) -> Client {
    with_deadlines(endpoint(addr).connect_lazy())
}

pub(crate) fn with_deadlines(channel: Channel) -> Client {
    ProbeClient::new(
        tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new())
            .service(channel),
    )
}

/// The status code of a failed call, for assertions.
pub(crate) fn code<T: std::fmt::Debug>(outcome: &Result<T, Status>) -> tonic::Code {
    match outcome {
        Ok(reply) => panic!("the call must fail, got {reply:?}"),
        Err(status) => status.code(),
    }
}

// ---------------------------------------------------------------------------
// Raw HTTP/2 peers
// ---------------------------------------------------------------------------

/// A gRPC length-prefixed message.
pub(crate) fn grpc_message(message: &impl Message) -> Bytes {
    let body = message.encode_to_vec();
    let len = u32::try_from(body.len()).expect("a test message fits in a gRPC frame");
    let mut framed = BytesMut::with_capacity(5 + body.len());
    framed.put_u8(0);
    framed.put_u32(len);
    framed.put_slice(&body);
    framed.freeze()
}

/// An HTTP/2 connection to `addr` driven in the background.
pub(crate) async fn raw_client(addr: SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = TcpStream::connect(addr)
        .await
        .expect("the server must accept TCP");
    let (sender, connection) = h2::client::handshake(tcp)
        .await
        .expect("the server must speak HTTP/2");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender
}

/// What a raw unary call got back.
#[derive(Debug)]
pub(crate) struct RawAnswer {
    /// The gRPC status, from the head (trailers-only) or the trailers.
    pub(crate) status: Status,
    pub(crate) trailers_only: bool,
    pub(crate) data: Bytes,
}

/// Sends one unary `Call` on an existing HTTP/2 connection, with
/// `grpc-timeout` set to exactly `timeout` (any bytes) when given.
pub(crate) async fn raw_call(
    sender: &mut h2::client::SendRequest<Bytes>,
    addr: SocketAddr,
    timeout: Option<&[u8]>,
    message: &CallRequest,
) -> RawAnswer {
    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/probe.v1.Probe/Call"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(timeout) = timeout {
        let value =
            http::HeaderValue::from_bytes(timeout).expect("the test sends a valid header value");
        request = request.header("grpc-timeout", value);
    }
    let request = request.body(()).expect("a valid request head");

    let ready = sender
        .clone()
        .ready()
        .await
        .expect("the connection must stay usable");
    *sender = ready;
    let (response, mut body) = sender
        .send_request(request, false)
        .expect("the connection must accept a new stream");
    body.send_data(grpc_message(message), true)
        .expect("the request body must be accepted");

    let response = tokio::time::timeout(PATIENCE, response)
        .await
        .expect("the server must answer")
        .expect("the answer must be a valid HTTP/2 response");
    assert_eq!(
        response.status(),
        http::StatusCode::OK,
        "gRPC answers use HTTP 200"
    );
    if let Some(status) = Status::from_header_map(response.headers()) {
        return RawAnswer {
            status,
            trailers_only: true,
            data: Bytes::new(),
        };
    }
    let mut stream = response.into_body();
    let mut data = BytesMut::new();
    while let Some(chunk) = stream.data().await {
        let chunk = chunk.expect("the response body must arrive intact");
        let _ = stream.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = stream
        .trailers()
        .await
        .expect("the trailers must arrive intact")
        .expect("a gRPC response that is not trailers-only ends with trailers");
    RawAnswer {
        status: Status::from_header_map(&trailers).expect("the trailers must carry grpc-status"),
        trailers_only: false,
        data: data.freeze(),
    }
}

/// Decodes the one `CallReply` of a raw answer's body.
pub(crate) fn decode_reply(data: &[u8]) -> CallReply {
    let (prefix, message) = data
        .split_at_checked(5)
        .expect("a gRPC message has a 5-byte prefix");
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]);
    assert_eq!(
        usize::try_from(len).ok(),
        Some(message.len()),
        "exactly one whole message"
    );
    CallReply::decode(message).expect("the reply must be a CallReply")
}

/// Runs an HTTP/2 server on loopback that hands every request stream to
/// `handle` in its own task.
async fn raw_server<F, Fut>(handle: F) -> SocketAddr
where
    F: Fn(http::Request<h2::RecvStream>, h2::server::SendResponse<Bytes>) -> Fut
        + Clone
        + Send
        + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (listener, addr) = loopback().await;
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let handle = handle.clone();
            tokio::spawn(async move {
                let Ok(mut connection) = h2::server::handshake(tcp).await else {
                    return;
                };
                // Accepting also drives the connection; keep at it.
                while let Some(Ok((request, respond))) = connection.accept().await {
                    tokio::spawn(handle(request, respond));
                }
            });
        }
    });
    addr
}

fn grpc_response_head() -> http::Response<()> {
    http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(())
        .expect("a valid response head")
}

/// A server whose every answer is one gRPC message cut in the middle: the
/// prefix promises `promised` bytes, only `sent` follow, and the stream ends.
pub(crate) async fn cut_message_server(promised: u32, sent: usize) -> SocketAddr {
    raw_server(move |_request, mut respond| async move {
        let Ok(mut stream) = respond.send_response(grpc_response_head(), false) else {
            return;
        };
        let mut data = BytesMut::new();
        data.put_u8(0);
        data.put_u32(promised);
        data.put_bytes(0x2a, sent);
        let _ = stream.send_data(data.freeze(), true);
    })
    .await
}

/// A server that takes one request on each connection and then drops the
/// connection under it, the socket closing as if the process had died. With
/// `partial = Some((promised, sent))` it first sends the response head and
/// the start of a message: a prefix promising `promised` bytes and `sent` of
/// them.
pub(crate) async fn dropping_server(partial: Option<(u32, usize)>) -> SocketAddr {
    let (listener, addr) = loopback().await;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut connection) = h2::server::handshake(tcp).await else {
                    return;
                };
                let Some(Ok((_request, mut respond))) = connection.accept().await else {
                    return;
                };
                let mut stream = None;
                if let Some((promised, sent)) = partial
                    && let Ok(mut open) = respond.send_response(grpc_response_head(), false)
                {
                    let mut data = BytesMut::new();
                    data.put_u8(0);
                    data.put_u32(promised);
                    data.put_bytes(0x2a, sent);
                    let _ = open.send_data(data.freeze(), false);
                    stream = Some(open);
                }
                // Drive the connection a moment so what was written goes out,
                // then drop it while the stream is still open (dropping the
                // stream handles first would reset the stream instead).
                let _ = tokio::time::timeout(Duration::from_millis(50), connection.accept()).await;
                drop(connection);
                drop((respond, stream));
            });
        }
    });
    addr
}

/// What a silent server saw of one request.
#[derive(Debug)]
pub(crate) struct Silenced {
    pub(crate) headers: http::HeaderMap,
    /// How the client ended the stream, if it reset it.
    pub(crate) reset: Option<h2::Reason>,
}

/// A server that never completes an answer and reports how each request
/// stream ended. With `send_head` it sends the response head first, so the
/// call is under way (a stream is open both ways) when it goes quiet.
pub(crate) async fn silent_server(
    send_head: bool,
) -> (SocketAddr, mpsc::UnboundedReceiver<Silenced>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let addr = raw_server(move |request, mut respond| {
        let tx = tx.clone();
        async move {
            let headers = request.headers().clone();
            let reset = if send_head {
                // Once the head is sent, the response stream reports resets.
                match respond.send_response(grpc_response_head(), false) {
                    Ok(mut open) => std::future::poll_fn(|cx| open.poll_reset(cx)).await.ok(),
                    Err(_) => None,
                }
            } else {
                std::future::poll_fn(|cx| respond.poll_reset(cx)).await.ok()
            };
            let _ = tx.send(Silenced { headers, reset });
        }
    })
    .await;
    (addr, rx)
}

// ---------------------------------------------------------------------------
// A proxy that counts the client's HTTP/2 frames
// ---------------------------------------------------------------------------

pub(crate) use tonic_deadline_guard::frames::{DATA, Frame, HEADERS, WholeFrames};

/// Everything the proxy saw from clients to the server.
#[derive(Debug, Default)]
pub(crate) struct FrameLog {
    frames: Mutex<Vec<Frame>>,
    connections: AtomicUsize,
}

impl FrameLog {
    pub(crate) fn frames(&self) -> Vec<Frame> {
        self.frames.lock().expect("not poisoned").clone()
    }

    /// The streams on which the client sent HEADERS or DATA.
    pub(crate) fn streams_with_requests(&self) -> Vec<u32> {
        let streams: std::collections::BTreeSet<u32> = self
            .frames()
            .into_iter()
            .filter(|f| f.header.kind == HEADERS || f.header.kind == DATA)
            .map(|f| f.header.stream)
            .collect();
        streams.into_iter().collect()
    }

    pub(crate) fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// A TCP proxy to `upstream` that logs every frame clients send before
/// forwarding it.
pub(crate) async fn frame_counting_proxy(upstream: SocketAddr) -> (SocketAddr, Arc<FrameLog>) {
    let (listener, addr) = loopback().await;
    let log = Arc::new(FrameLog::default());
    let shared = log.clone();
    tokio::spawn(async move {
        loop {
            let Ok((inbound, _)) = listener.accept().await else {
                return;
            };
            shared.connections.fetch_add(1, Ordering::SeqCst);
            let log = shared.clone();
            tokio::spawn(async move {
                let Ok(outbound) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut from_client, mut to_client) = inbound.into_split();
                let (mut from_server, mut to_server) = outbound.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                    let _ = to_client.shutdown().await;
                });
                let mut parser = WholeFrames::from_client();
                let mut buf = vec![0; 16 * 1024];
                loop {
                    let n = match from_client.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    // Logged before forwarding: once the server has acted on
                    // a frame, the log already holds it.
                    let mut seen = parser.feed(&buf[..n]);
                    log.frames.lock().expect("not poisoned").append(&mut seen);
                    if to_server.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = to_server.shutdown().await;
            });
        }
    });
    (addr, log)
}
