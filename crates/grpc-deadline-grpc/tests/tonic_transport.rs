//! `TonicInvoke` over real sockets: a tonic server on loopback, reached
//! through a proxy that reads the client's HTTP/2 frames.
//!
//! What it must do that the `grpc` crate's own transport (0.9) does not: a
//! cancel before the server's response headers reaches the server; an
//! abandoned request is reset, never ended as if complete; the first
//! message leaves with its headers, not an acknowledgement later.

// The servers, the proxy and the calls under test belong to no request.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use grpc::client::interceptor::InvokeExt;
use grpc::client::{
    CallOptions, Channel, ChannelOptions, Invoke, RecvStream, ResponseStreamItem, SendOptions,
    SendStream,
};
use grpc::core::{RecvMessage, RequestHeaders, SendMessage};
use grpc::credentials::LocalChannelCredentials;
use grpc::{StatusCodeError, StatusError};
use grpc_deadline::{Scope, timeout_header};
use grpc_deadline_grpc::{DeadlineInterceptor, TonicInvoke};
use prost::Message;
use testkit::probe_server::{Probe, ProbeServer};
use testkit::{CallReply, CallRequest, ReplyStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status, Streaming};
use tonic_deadline_guard::frames::{DATA, END_STREAM, Frame, HEADERS, RST_STREAM, WholeFrames};

/// How long a test waits for what must happen. Generous: the machines are
/// shared; a pass takes milliseconds.
const PATIENCE: Duration = Duration::from_secs(10);

/// RST_STREAM's error code CANCEL.
const CANCEL: u32 = 0x8;

// ---- the server ------------------------------------------------------------

/// What the server saw, in order.
#[derive(Debug)]
enum Seen {
    /// A handler started: the call's headers arrived.
    Entered { header: Option<String>, at: Instant },
    /// A request message arrived (in `Chat`).
    Message,
    /// The handler's request messages ended, as tonic reads them: cleanly
    /// (`Ok(None)`) or with an error.
    InputEnded { clean: bool },
    /// A request's headers arrived (in front of the server, before tonic
    /// decodes anything).
    HeadersArrived { at: Instant },
    /// The first DATA of a request arrived.
    FirstData { at: Instant },
    /// The request body ended, as hyper hands it to tonic: cleanly
    /// (`END_STREAM`), or not (failed by a reset, or dropped unended).
    BodyEnded { clean: bool },
    /// The handler is over: ran to its end, or was dropped on the way.
    Exited { completed: bool },
}

/// Reports the handler's end when it is dropped.
struct Exit {
    seen: mpsc::UnboundedSender<Seen>,
    completed: bool,
}

impl Drop for Exit {
    fn drop(&mut self) {
        let _ = self.seen.send(Seen::Exited {
            completed: self.completed,
        });
    }
}

/// In front of the server: reports how each request body ended, below
/// tonic's decoding.
#[derive(Clone)]
struct ObserveBodies<S> {
    inner: S,
    seen: mpsc::UnboundedSender<Seen>,
}

impl<S> tower_service::Service<http::Request<tonic::body::Body>> for ObserveBodies<S>
where
    S: tower_service::Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> S::Future {
        let seen = self.seen.clone();
        let _ = seen.send(Seen::HeadersArrived { at: Instant::now() });
        self.inner.call(request.map(|body| {
            tonic::body::Body::new(WatchedBody {
                inner: body,
                seen: Some(seen),
                data_seen: false,
            })
        }))
    }
}

struct WatchedBody {
    inner: tonic::body::Body,
    /// Until the end is reported.
    seen: Option<mpsc::UnboundedSender<Seen>>,
    data_seen: bool,
}

/// A body dropped before its end never ended cleanly either.
impl Drop for WatchedBody {
    fn drop(&mut self) {
        if let Some(seen) = self.seen.take() {
            let _ = seen.send(Seen::BodyEnded { clean: false });
        }
    }
}

impl http_body::Body for WatchedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if !self.data_seen
            && let Poll::Ready(Some(Ok(frame))) = &polled
            && frame.is_data()
            && let Some(seen) = &self.seen
        {
            let _ = seen.send(Seen::FirstData { at: Instant::now() });
            self.data_seen = true;
        }
        let clean = match &polled {
            Poll::Ready(None) => Some(true),
            Poll::Ready(Some(Err(_))) => Some(false),
            _ => None,
        };
        if let Some(clean) = clean
            && let Some(seen) = self.seen.take()
        {
            let _ = seen.send(Seen::BodyEnded { clean });
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

#[derive(Clone)]
struct Reporter {
    seen: mpsc::UnboundedSender<Seen>,
}

impl Reporter {
    fn enter<T>(&self, request: &Request<T>) -> Exit {
        let header = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let _ = self.seen.send(Seen::Entered {
            header,
            at: Instant::now(),
        });
        Exit {
            seen: self.seen.clone(),
            completed: false,
        }
    }
}

#[tonic::async_trait]
impl Probe for Reporter {
    /// Works `work_ms`, then echoes the payload.
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        let mut exit = self.enter(&request);
        let request = request.into_inner();
        tokio::time::sleep(Duration::from_millis(request.work_ms)).await;
        exit.completed = true;
        Ok(Response::new(CallReply {
            payload: request.payload,
            ..CallReply::default()
        }))
    }

    type WatchStream = ReplyStream;

    async fn watch(&self, _: Request<CallRequest>) -> Result<Response<ReplyStream>, Status> {
        Err(Status::unimplemented("not served here"))
    }

    type ChatStream = ReplyStream;

    /// Reads every request message before it answers (a client stream):
    /// reports each, and how the input ended.
    async fn chat(
        &self,
        request: Request<Streaming<CallRequest>>,
    ) -> Result<Response<ReplyStream>, Status> {
        let mut exit = self.enter(&request);
        let mut input = request.into_inner();
        loop {
            match input.message().await {
                Ok(Some(_)) => {
                    let _ = self.seen.send(Seen::Message);
                }
                Ok(None) => {
                    let _ = self.seen.send(Seen::InputEnded { clean: true });
                    break;
                }
                Err(_) => {
                    let _ = self.seen.send(Seen::InputEnded { clean: false });
                    break;
                }
            }
        }
        exit.completed = true;
        Ok(Response::new(Box::pin(
            tonic::codegen::tokio_stream::empty(),
        )))
    }
}

/// What the server saw, read in order.
struct Log(mpsc::UnboundedReceiver<Seen>);

impl Log {
    /// The next thing the server saw, within [`PATIENCE`].
    async fn next(&mut self) -> Seen {
        tokio::time::timeout(PATIENCE, self.0.recv())
            .await
            .expect("the server must report within the test's patience")
            .expect("the server lives as long as the test")
    }

    /// Skips to the next handler's entry; its `grpc-timeout` and when.
    async fn entered(&mut self) -> (Option<String>, Instant) {
        loop {
            if let Seen::Entered { header, at } = self.next().await {
                return (header, at);
            }
        }
    }
}

/// The client's HTTP/2 frames, as a proxy in front of the server read them.
#[derive(Clone, Default)]
struct Wire(Arc<Mutex<Vec<Frame>>>);

impl Wire {
    fn frames(&self) -> Vec<(u8, u8, u32, Option<u32>)> {
        self.0
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|f| {
                (
                    f.header.kind,
                    f.header.flags,
                    f.header.stream,
                    f.error_code(),
                )
            })
            .collect()
    }

    /// The stream of the last request the client opened.
    fn last_stream(&self) -> u32 {
        self.frames()
            .iter()
            .rev()
            .find(|(kind, ..)| *kind == HEADERS)
            .map(|(_, _, stream, _)| *stream)
            .expect("the client must have opened a stream")
    }

    /// The reset the client sent on `stream`, if any.
    fn reset_of(&self, stream: u32) -> Option<u32> {
        self.frames()
            .iter()
            .find(|(kind, _, s, _)| *kind == RST_STREAM && *s == stream)
            .and_then(|(.., code)| *code)
    }

    /// Whether the client half-closed `stream` (END_STREAM on its DATA or
    /// HEADERS).
    fn ended(&self, stream: u32) -> bool {
        self.frames().iter().any(|(kind, flags, s, _)| {
            *s == stream && (*kind == DATA || *kind == HEADERS) && flags & END_STREAM != 0
        })
    }

    /// Waits until the client reset `stream`.
    async fn wait_reset(&self, stream: u32) -> u32 {
        let end = Instant::now() + PATIENCE;
        loop {
            if let Some(code) = self.reset_of(stream) {
                return code;
            }
            assert!(
                Instant::now() < end,
                "the client must reset stream {stream}; it sent {:?}",
                self.frames()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A server on loopback and a proxy in front of it: the proxy's address,
/// the server's log and the client's frames.
async fn serve() -> (SocketAddr, Log, Wire) {
    let (seen, log) = mpsc::unbounded_channel();
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let server = listener.local_addr().expect("a bound port");
    let bodies = seen.clone();
    tokio::spawn(
        Server::builder()
            .layer(tower_layer::layer_fn(move |inner| ObserveBodies {
                inner,
                seen: bodies.clone(),
            }))
            .add_service(ProbeServer::new(Reporter { seen }))
            .serve_with_incoming(
                tonic::codegen::tokio_stream::wrappers::TcpListenerStream::new(listener),
            ),
    );
    let wire = Wire::default();
    let proxy = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = proxy.local_addr().expect("a bound port");
    let frames = wire.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = proxy.accept().await {
            let Ok(upstream) = TcpStream::connect(server).await else {
                continue;
            };
            // As the peers set it: the proxy must not delay what it copies.
            let _ = (client.set_nodelay(true), upstream.set_nodelay(true));
            let (mut client_read, mut client_write) = client.into_split();
            let (mut upstream_read, mut upstream_write) = upstream.into_split();
            let frames = frames.clone();
            tokio::spawn(async move {
                let mut parser = WholeFrames::from_client();
                let mut buf = vec![0; 64 * 1024];
                while let Ok(n) = client_read.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    frames
                        .0
                        .lock()
                        .expect("not poisoned")
                        .extend(parser.feed(&buf[..n]));
                    if upstream_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut upstream_read, &mut client_write).await;
            });
        }
    });
    (addr, Log(log), wire)
}

fn endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint::from_shared(format!("http://{addr}")).expect("a valid URI")
}

// ---- calls, as generated code makes them --------------------------------

struct Encoded(Bytes);

impl SendMessage for Encoded {
    fn encode(&self) -> Result<Box<dyn Buf + Send + Sync>, String> {
        Ok(Box::new(self.0.clone()))
    }
}

fn message(request: &CallRequest) -> Encoded {
    Encoded(Bytes::from(request.encode_to_vec()))
}

#[derive(Default)]
struct Decoded(Option<CallReply>);

impl RecvMessage for Decoded {
    fn decode(&mut self, data: &mut dyn Buf) -> Result<(), String> {
        let bytes = data.copy_to_bytes(data.remaining());
        self.0 = Some(CallReply::decode(bytes).map_err(|e| e.to_string())?);
        Ok(())
    }
}

fn headers(method: &str) -> RequestHeaders {
    RequestHeaders::new().with_method_name(format!("/probe.v1.Probe/{method}"))
}

/// A unary call as the crate's generated code makes one.
async fn unary<I: Invoke>(
    invoke: &I,
    request: &CallRequest,
    options: CallOptions,
) -> Result<CallReply, StatusError> {
    let (mut send, mut recv) = invoke.invoke(headers("Call"), options).await;
    // A failed send shows in the trailers.
    let _ = send
        .send(&message(request), SendOptions::new().with_final_msg(true))
        .await;
    let mut reply = Decoded::default();
    loop {
        match recv.recv(&mut reply).await {
            ResponseStreamItem::Trailers(trailers) => {
                trailers.status().clone()?;
                return reply.0.ok_or_else(|| {
                    StatusError::new(StatusCodeError::Internal, "no reply message")
                });
            }
            ResponseStreamItem::StreamClosed => {
                return Err(StatusError::new(StatusCodeError::Internal, "no trailers"));
            }
            ResponseStreamItem::Headers(_) | ResponseStreamItem::Message => {}
        }
    }
}

/// The status the call's trailers carry.
async fn trailers(recv: &mut impl RecvStream) -> Result<(), StatusError> {
    loop {
        match recv.recv(&mut Decoded::default()).await {
            ResponseStreamItem::Trailers(trailers) => return trailers.status().clone(),
            ResponseStreamItem::StreamClosed => panic!("a call must end with trailers"),
            ResponseStreamItem::Headers(_) | ResponseStreamItem::Message => {}
        }
    }
}

fn work(ms: u64) -> CallRequest {
    CallRequest {
        work_ms: ms,
        ..CallRequest::default()
    }
}

#[allow(clippy::disallowed_types, reason = "CallOptions take std's Instant")]
fn options_in(timeout: Duration) -> CallOptions {
    let mut options = CallOptions::new();
    options.set_deadline((Instant::now() + timeout).into_std());
    options
}

fn budget(header: Option<String>) -> Duration {
    let header = header.expect("the call must carry grpc-timeout");
    timeout_header::decode(header.as_bytes()).expect("the header must be well formed")
}

// ---- the rules -------------------------------------------------------------

#[tokio::test]
async fn a_unary_call_is_answered_through_the_interceptor() {
    let (addr, mut log, _) = serve().await;
    let calls = TonicInvoke::lazy(&endpoint(addr)).with_interceptor(DeadlineInterceptor::new());
    let request = CallRequest {
        payload: "hello".to_owned(),
        ..CallRequest::default()
    };
    let scope = Scope::background().with_timeout(PATIENCE);
    let reply = scope
        .enter(unary(&calls, &request, CallOptions::new()))
        .await
        .expect("the call must succeed");
    assert_eq!(reply.payload, "hello", "the reply must come back whole");
    log.entered().await;
}

#[tokio::test]
async fn the_remaining_budget_arrives_as_grpc_timeout() {
    let (addr, mut log, _) = serve().await;
    let bare = TonicInvoke::lazy(&endpoint(addr));
    let intercepted = bare.clone().with_interceptor(DeadlineInterceptor::new());
    let scope = Scope::background().with_timeout(Duration::from_millis(800));

    scope
        .enter(unary(&bare, &work(0), CallOptions::new()))
        .await
        .expect("the call must succeed");
    let sent = budget(log.entered().await.0);
    assert!(
        sent <= Duration::from_millis(800) && sent > Duration::from_millis(400),
        "the scope's remaining budget must be on the wire, got {sent:?}"
    );

    scope
        .enter(unary(
            &bare,
            &work(0),
            options_in(Duration::from_millis(300)),
        ))
        .await
        .expect("the call must succeed");
    let sent = budget(log.entered().await.0);
    assert!(
        sent <= Duration::from_millis(300) && sent > Duration::from_millis(100),
        "a tighter CallOptions deadline must win, got {sent:?}"
    );

    scope
        .enter(unary(&intercepted, &work(0), CallOptions::new()))
        .await
        .expect("the call must succeed");
    let sent = budget(log.entered().await.0);
    assert!(
        sent <= Duration::from_millis(800) && sent > Duration::from_millis(100),
        "through the interceptor too, got {sent:?}"
    );
}

#[tokio::test]
async fn a_cancel_before_the_response_headers_resets_the_stream_and_stops_the_server() {
    let (addr, mut log, wire) = serve().await;
    let interceptor = DeadlineInterceptor::new().abandoned(grpc_deadline_grpc::Abandoned::Drop);
    let calls = TonicInvoke::lazy(&endpoint(addr)).with_interceptor(interceptor.clone());
    let scope = Scope::background().with_timeout(Duration::from_secs(30));
    let call = tokio::spawn(
        scope
            .clone()
            .enter(async move { unary(&calls, &work(20_000), CallOptions::new()).await }),
    );
    log.entered().await;
    let stream = wire.last_stream();
    scope.cancel();
    let status = tokio::time::timeout(PATIENCE, call)
        .await
        .expect("the call must end at the cancel")
        .expect("the call must not panic")
        .expect_err("a cancelled call fails");
    assert_eq!(status.code(), StatusCodeError::Cancelled);
    loop {
        match log.next().await {
            Seen::Exited { completed } => {
                assert!(!completed, "the server's work must stop, not run 20 s");
                break;
            }
            // The unary request's body ended (with its message) before the
            // handler started.
            Seen::BodyEnded { .. } | Seen::FirstData { .. } => {}
            other => panic!("the server must see its handler end, saw {other:?}"),
        }
    }
    assert_eq!(
        wire.wait_reset(stream).await,
        CANCEL,
        "the server must be told with RST_STREAM CANCEL"
    );
    assert_eq!(
        interceptor.stats().cancels_not_reset(),
        0,
        "a cancel that reached the server is not reported as one that did not"
    );
}

/// Opens `Chat` and sends two messages, none final; returns the streams
/// once the server has read both.
async fn two_messages_sent(
    invoke: &TonicInvoke,
    log: &mut Log,
) -> (impl SendStream + use<>, impl RecvStream + use<>) {
    let (mut send, recv) = invoke.invoke(headers("Chat"), CallOptions::new()).await;
    for _ in 0..2 {
        send.send(&message(&work(0)), SendOptions::new())
            .await
            .expect("the call is open");
    }
    log.entered().await;
    let mut read = 0;
    while read < 2 {
        match log.next().await {
            Seen::Message => read += 1,
            Seen::FirstData { .. } => {}
            other => panic!("the server must read both messages, saw {other:?}"),
        }
    }
    (send, recv)
}

/// How the server saw the request end: whether its body ended cleanly
/// (`END_STREAM`), and whether the handler read a clean end (`None`: the
/// handler was dropped before it read one).
async fn input_end(log: &mut Log) -> (bool, Option<bool>) {
    let (mut body, mut handler) = (None, None);
    while body.is_none() || handler.is_none() {
        match log.next().await {
            Seen::BodyEnded { clean } => body = Some(clean),
            Seen::InputEnded { clean } => handler = Some(Some(clean)),
            Seen::Exited { completed: false } => handler = Some(None),
            Seen::Exited { completed: true } | Seen::FirstData { .. } => {}
            other => panic!("the server must see its input end, saw {other:?}"),
        }
    }
    (body.unwrap_or_default(), handler.flatten())
}

#[tokio::test]
async fn a_final_message_half_closes_the_request() {
    let (addr, mut log, wire) = serve().await;
    let invoke = TonicInvoke::lazy(&endpoint(addr));
    let scope = Scope::background().with_timeout(PATIENCE);
    let (mut send, mut recv) = scope.enter(two_messages_sent(&invoke, &mut log)).await;
    let stream = wire.last_stream();
    send.send(&message(&work(0)), SendOptions::new().with_final_msg(true))
        .await
        .expect("the call is open");
    assert!(matches!(log.next().await, Seen::Message));
    assert_eq!(
        input_end(&mut log).await,
        (true, Some(true)),
        "a final message must end the input cleanly"
    );
    scope
        .enter(trailers(&mut recv))
        .await
        .expect("the call must succeed");
    assert!(wire.ended(stream), "the request must carry END_STREAM");
    assert_eq!(wire.reset_of(stream), None, "and no reset");
}

/// Which side of a call the caller lets go of first.
#[derive(Debug, Clone, Copy)]
enum First {
    Send,
    Recv,
}

#[tokio::test]
async fn a_dropped_client_stream_is_reset_never_ended_cleanly() {
    for first in [First::Send, First::Recv] {
        let (addr, mut log, wire) = serve().await;
        let invoke = TonicInvoke::lazy(&endpoint(addr));
        let scope = Scope::background().with_timeout(PATIENCE);
        let (send, recv) = scope.enter(two_messages_sent(&invoke, &mut log)).await;
        let stream = wire.last_stream();
        // One side, then (once the connection had its chance to end the
        // request) the other: a handler's streams go in either order.
        let pause = Duration::from_millis(20);
        match first {
            First::Send => {
                drop(send);
                tokio::time::sleep(pause).await;
                drop(recv);
            }
            First::Recv => {
                drop(recv);
                tokio::time::sleep(pause).await;
                drop(send);
            }
        }
        let (body_clean, _) = input_end(&mut log).await;
        assert!(
            !body_clean,
            "{first:?} dropped first: an abandoned request must reach the server as a reset, \
             not as a complete request"
        );
        assert_eq!(
            wire.wait_reset(stream).await,
            CANCEL,
            "{first:?} dropped first"
        );
        assert!(
            !wire.ended(stream),
            "{first:?} dropped first: no END_STREAM on an abandoned request"
        );
    }
}

#[tokio::test]
async fn a_send_stream_dropped_unfinished_ends_the_upload_when_the_answer_is_read() {
    // How the crate's generated client-streaming calls finish an upload:
    // drop the sending side, then read the answer.
    let (addr, mut log, wire) = serve().await;
    let invoke = TonicInvoke::lazy(&endpoint(addr));
    let scope = Scope::background().with_timeout(PATIENCE);
    let (send, mut recv) = scope.enter(two_messages_sent(&invoke, &mut log)).await;
    let stream = wire.last_stream();
    drop(send);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !wire.ended(stream) && wire.reset_of(stream).is_none(),
        "the drop alone neither ends nor resets the request: the caller may be going away"
    );
    let status = scope.enter(trailers(&mut recv)).await;
    assert_eq!(
        input_end(&mut log).await,
        (true, Some(true)),
        "read, the drop was the caller's end of input"
    );
    assert!(status.is_ok(), "the call is answered: {status:?}");
    assert!(wire.ended(stream), "the request carries END_STREAM");
}

#[tokio::test]
async fn a_send_stream_dropped_unfinished_then_the_call_dropped_is_reset() {
    let (addr, mut log, wire) = serve().await;
    let invoke = TonicInvoke::lazy(&endpoint(addr));
    let scope = Scope::background().with_timeout(PATIENCE);
    let (send, recv) = scope.enter(two_messages_sent(&invoke, &mut log)).await;
    let stream = wire.last_stream();
    // A generated call dropped whole drops its sending side first.
    drop(send);
    drop(recv);
    let (body_clean, _) = input_end(&mut log).await;
    assert!(
        !body_clean,
        "a request whose caller went away must reach the server as a reset, not as complete"
    );
    assert_eq!(wire.wait_reset(stream).await, CANCEL);
    assert!(!wire.ended(stream), "no END_STREAM on an abandoned request");
}

#[tokio::test]
async fn an_invalid_method_name_fails_with_internal_and_sends_nothing() {
    let (addr, _log, wire) = serve().await;
    let invoke = TonicInvoke::lazy(&endpoint(addr));
    let (_send, mut recv) = Scope::background()
        .enter(invoke.invoke(
            RequestHeaders::new().with_method_name("no slash"),
            CallOptions::new(),
        ))
        .await;
    let status = trailers(&mut recv).await.expect_err("the call must fail");
    assert_eq!(status.code(), StatusCodeError::Internal);
    assert!(
        status.message().contains("method"),
        "the message names the problem: {}",
        status.message()
    );
    assert!(wire.frames().is_empty(), "nothing must be sent");
}

/// The median time, over `calls` calls of `method`, between a request's
/// headers and its first DATA arriving in front of the server, the message
/// sent (as the last) at once.
async fn first_data_gap<I: Invoke>(
    invoke: &I,
    log: &mut Log,
    method: &str,
    calls: usize,
) -> Duration {
    let mut gaps = Vec::new();
    for _ in 0..calls {
        let (mut send, mut recv) = invoke.invoke(headers(method), CallOptions::new()).await;
        send.send(&message(&work(0)), SendOptions::new().with_final_msg(true))
            .await
            .expect("the call is open");
        trailers(&mut recv).await.expect("the call must succeed");
        let (mut arrived, mut data) = (None, None);
        while arrived.is_none() || data.is_none() {
            match log.next().await {
                Seen::HeadersArrived { at } => arrived = Some(at),
                Seen::FirstData { at } => data = Some(at),
                _ => {}
            }
        }
        if let (Some(arrived), Some(data)) = (arrived, data) {
            gaps.push(data.saturating_duration_since(arrived));
        }
        while !matches!(log.next().await, Seen::Exited { .. }) {}
    }
    gaps.sort();
    gaps[gaps.len() / 2]
}

#[tokio::test]
async fn the_first_message_leaves_with_its_headers_not_an_ack_later() {
    let (addr, mut log, _) = serve().await;
    let ours = TonicInvoke::lazy(&endpoint(addr));
    // The crate's own transport, on the same server in the same run.
    let theirs = Channel::new(
        &format!("dns:///{addr}"),
        Arc::new(LocalChannelCredentials::new()),
        ChannelOptions::default(),
    );
    let scope = Scope::background().with_timeout(Duration::from_secs(60));
    for method in ["Call", "Chat"] {
        let ours_gap = scope
            .enter(first_data_gap(&ours, &mut log, method, 5))
            .await;
        let theirs_gap = scope
            .enter(first_data_gap(&theirs, &mut log, method, 5))
            .await;
        eprintln!(
            "{method}: first DATA after HEADERS: ours {ours_gap:?}, the crate's {theirs_gap:?}"
        );
        assert!(
            ours_gap < Duration::from_millis(20),
            "{method}: with TCP_NODELAY the first message must not wait for an ACK (~40 ms); \
             took {ours_gap:?} (the crate's own transport: {theirs_gap:?})"
        );
    }
}

// ---- the `grpc` crate's own transport under the interceptor -------------
//
// What the interceptor's docs promise over the crate's own channel (0.9),
// against a real tonic server: the budget on the wire, the call ended at
// its deadline and the server's work with it, nothing sent for an ended
// scope, and a cancel the crate cannot carry counted. The abandoned upload
// over this transport is the lab's test
// (`an_upload_cancelled_through_the_grpc_crate_never_ends_normally_on_the_wire`).

/// The crate's own channel to `addr`, under a fresh interceptor, warmed up
/// with a call that carries no deadline.
async fn crates_channel(
    addr: SocketAddr,
    log: &mut Log,
) -> (
    grpc::client::interceptor::Intercepted<Channel, DeadlineInterceptor>,
    DeadlineInterceptor,
) {
    let channel = Channel::new(
        &format!("dns:///{addr}"),
        Arc::new(LocalChannelCredentials::new()),
        ChannelOptions::default(),
    );
    let interceptor = DeadlineInterceptor::new();
    let calls = channel.with_interceptor(interceptor.clone());
    Scope::background()
        .enter(unary(&calls, &work(0), CallOptions::new()))
        .await
        .expect("the warm-up call is answered");
    log.entered().await;
    (calls, interceptor)
}

/// Waits for the next handler's end: whether it ran to its end.
async fn exited(log: &mut Log) -> bool {
    loop {
        if let Seen::Exited { completed } = log.next().await {
            return completed;
        }
    }
}

#[tokio::test]
async fn over_the_crates_channel_the_budget_arrives_and_the_deadline_ends_call_and_work() {
    let (addr, mut log, _) = serve().await;
    let (calls, _interceptor) = crates_channel(addr, &mut log).await;
    assert!(exited(&mut log).await, "the warm-up ran to its end");
    let scope = Scope::background().with_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let outcome = scope
        .enter(unary(&calls, &work(5_000), CallOptions::new()))
        .await;
    let elapsed = started.elapsed();
    assert_eq!(
        outcome
            .expect_err("the server works past the deadline")
            .code(),
        StatusCodeError::DeadlineExceeded
    );
    assert!(
        elapsed < Duration::from_millis(2_000),
        "the call ends at its deadline, not with the server's work: {elapsed:?}"
    );
    let (header, _) = log.entered().await;
    let sent = timeout_header::decode(header.expect("grpc-timeout is sent").as_bytes())
        .expect("a valid grpc-timeout");
    assert!(
        sent <= Duration::from_millis(300) && sent > Duration::from_millis(100),
        "the server is told what is left of 300 ms: {sent:?}"
    );
    assert!(
        !exited(&mut log).await,
        "the server's work stops at the deadline it was sent"
    );
}

#[tokio::test]
async fn over_the_crates_channel_an_ended_scope_sends_nothing() {
    let (addr, mut log, wire) = serve().await;
    let (calls, interceptor) = crates_channel(addr, &mut log).await;
    let before = wire.frames().len();
    let scope = Scope::background().with_timeout(PATIENCE);
    scope.cancel();
    let outcome = scope
        .enter(unary(&calls, &work(0), CallOptions::new()))
        .await;
    assert_eq!(
        outcome.expect_err("the scope has ended").code(),
        StatusCodeError::Cancelled
    );
    assert_eq!(interceptor.stats().refused_cancelled(), 1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !wire.frames()[before..]
            .iter()
            .any(|(kind, ..)| *kind == HEADERS),
        "no call leaves for an ended scope"
    );
}

#[tokio::test]
async fn over_the_crates_channel_a_cancel_before_the_headers_is_counted_and_the_deadline_stops_the_server()
 {
    let (addr, mut log, _) = serve().await;
    let (calls, interceptor) = crates_channel(addr, &mut log).await;
    assert!(exited(&mut log).await, "the warm-up ran to its end");
    let scope = Scope::background().with_timeout(Duration::from_secs(1));
    let started = Instant::now();
    let canceller = scope.clone();
    let request = work(5_000);
    let call = scope.enter(unary(&calls, &request, CallOptions::new()));
    tokio::pin!(call);
    // The handler has started: then the caller goes away.
    tokio::select! {
        _ = &mut call => panic!("the server works 5 s"),
        _ = log.entered() => {}
    }
    canceller.cancel();
    let cancelled_at = Instant::now();
    let outcome = call.await;
    assert_eq!(
        outcome.expect_err("the scope ended").code(),
        StatusCodeError::Cancelled
    );
    assert!(
        cancelled_at.elapsed() < Duration::from_millis(500),
        "the caller is answered at once"
    );
    assert_eq!(
        interceptor.stats().cancels_not_reset(),
        1,
        "the crate's transport cannot carry this cancel: counted"
    );
    assert!(
        !exited(&mut log).await,
        "the server's work does not run to its end"
    );
    assert!(
        started.elapsed() < Duration::from_millis(4_000),
        "it stops at the deadline it was sent (1 s), not after its 5 s of work: {:?}",
        started.elapsed()
    );
}
