//! HTTP/2's guards against reset streams: as `server::reset_guards` sets
//! them, a Rapid Reset flood (CVE-2023-44487) — streams opened and reset at
//! once, as fast as a socket takes them — is still cut off, and an honest
//! client on another connection keeps its latency; as `ReadyChannel` sets
//! them, answers that arrive after their call gave up never close the
//! client's connection.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use probe::CallRequest;
use probe::frames::{
    ACK, DATA, END_HEADERS, END_STREAM, FrameParser, GOAWAY, HEADERS, PING, PREFACE, Parsed,
    RST_STREAM, SETTINGS,
};
use probe::probe_client::ProbeClient;
use probe::probe_server::ProbeServer;
use tokio::time::Instant;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Endpoint, Server};
use tonic_deadline::client::ReadyChannel;
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer};
use tower::Layer;

use crate::common::{Events, Node, PATIENCE, connect, loopback};

const ENHANCE_YOUR_CALM: u32 = 11;
const CANCEL: u32 = 8;

/// A request's header block in HPACK, with no dynamic table (the same bytes
/// fit every stream): POST http /probe.Probe/Call, application/grpc.
fn request_block(authority: &str) -> Vec<u8> {
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (static)
    let literal = |block: &mut Vec<u8>, name_index: u8, value: &[u8]| {
        block.push(name_index); // literal without indexing, indexed name
        block.push(u8::try_from(value.len()).expect("short value"));
        block.extend_from_slice(value);
    };
    literal(&mut block, 0x04, b"/probe.Probe/Call"); // :path
    literal(&mut block, 0x01, authority.as_bytes()); // :authority
    block.extend([0x0f, 0x10]); // content-type (static index 31)
    block.push(16);
    block.extend_from_slice(b"application/grpc");
    block.push(0x00); // te: trailers, literal name
    block.push(2);
    block.extend_from_slice(b"te");
    block.push(8);
    block.extend_from_slice(b"trailers");
    block
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len();
    out.extend([(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// What the flooding connection saw.
#[derive(Debug)]
struct Flood {
    /// Streams opened and reset.
    streams: u32,
    /// The GOAWAY's error code and last stream, if one came.
    go_away: Option<(u32, u32)>,
    /// The server closed (or reset) the connection.
    closed: bool,
}

/// Opens a raw connection to `addr` and writes HEADERS + RST_STREAM pairs
/// on it as fast as the socket takes them until the server closes it or
/// `stop` is set.
fn flood_one(addr: SocketAddr, stop: &AtomicBool) -> Flood {
    let mut tcp = std::net::TcpStream::connect(addr).expect("the server accepts TCP");
    tcp.set_nodelay(true).expect("nodelay");
    let mut start = PREFACE.to_vec();
    frame(&mut start, SETTINGS, 0, 0, &[]);
    tcp.write_all(&start).expect("the preface is taken");
    let mut reader = tcp.try_clone().expect("a second handle");
    let read_side = std::thread::spawn(move || {
        let mut parser = FrameParser::server_to_client();
        let mut buf = vec![0; 64 * 1024];
        let mut go_away = None;
        while let Ok(n @ 1..) = reader.read(&mut buf) {
            for parsed in parser.feed(&buf[..n]) {
                if parsed.frame.kind == GOAWAY && parsed.payload.len() >= 8 {
                    let p = &parsed.payload;
                    let last = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff;
                    go_away = Some((parsed.error_code().unwrap_or_default(), last));
                }
            }
        }
        go_away
    });
    let block = request_block(&addr.to_string());
    let mut streams = 0u32;
    let mut closed = false;
    let mut batch = Vec::new();
    let mut id = 1u32;
    while !stop.load(Ordering::Relaxed) {
        batch.clear();
        for _ in 0..512 {
            frame(&mut batch, HEADERS, END_HEADERS, id, &block);
            frame(&mut batch, RST_STREAM, 0, id, &CANCEL.to_be_bytes());
            id += 2;
        }
        if tcp.write_all(&batch).is_err() {
            closed = true;
            break;
        }
        streams += 512;
    }
    let _ = tcp.shutdown(std::net::Shutdown::Both);
    Flood {
        streams,
        go_away: read_side.join().expect("the reading thread"),
        closed,
    }
}

/// Floods `addr` on one connection from a thread of its own, until the
/// server cuts it off or `stop` is set.
fn flood(addr: SocketAddr, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Flood> {
    std::thread::spawn(move || flood_one(addr, &stop))
}

/// One call with a 5 s budget; how long it took.
async fn timed_call(client: &mut crate::common::Client) -> Duration {
    let started = Instant::now();
    Scope::background()
        .with_timeout(Duration::from_secs(5))
        .enter(client.call(CallRequest::default()))
        .await
        .expect("an honest call is answered");
    started.elapsed()
}

fn median(mut took: Vec<Duration>) -> Duration {
    took.sort();
    took[took.len() / 2]
}

/// The honest client's median call before and during one flood, and how
/// many calls it made during it; asserts that the flood was cut off.
async fn flood_trial(
    addr: SocketAddr,
    honest: &mut crate::common::Client,
) -> (Duration, Duration, usize) {
    // The baseline shares the CPU with a thread that spins as the flooding
    // thread will, so that the comparison sees only what the flood costs
    // the server.
    let spinning = Arc::new(AtomicBool::new(true));
    let spinner = {
        let spinning = spinning.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while spinning.load(Ordering::Relaxed) {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        })
    };
    let mut quiet = Vec::new();
    for _ in 0..200 {
        quiet.push(timed_call(honest).await);
    }
    spinning.store(false, Ordering::Relaxed);
    spinner.join().expect("the spinning thread");
    let quiet = median(quiet);

    // The honest client calls on while one connection floods, until the
    // server has cut it off.
    let stop = Arc::new(AtomicBool::new(false));
    let flooding = flood(addr, stop.clone());
    let started = Instant::now();
    let mut flooded = Vec::new();
    while !flooding.is_finished() {
        if started.elapsed() > PATIENCE {
            stop.store(true, Ordering::Relaxed);
        }
        flooded.push(timed_call(honest).await);
    }
    let lasted = started.elapsed();
    // Finished: the join does not block.
    let flood = flooding.join().expect("the flood thread");

    let (code, last_stream) = flood
        .go_away
        .unwrap_or_else(|| panic!("the flooding connection must be sent a GOAWAY: {flood:?}"));
    assert_eq!(
        code, ENHANCE_YOUR_CALM,
        "the GOAWAY must say why: {flood:?}"
    );
    assert!(flood.closed, "and the connection must be closed: {flood:?}");
    let processed = last_stream.div_ceil(2);
    assert!(
        processed < flood.streams,
        "the server stops processing the flood's streams: {flood:?}"
    );
    let calls = flooded.len();
    let under_flood = median(flooded);
    eprintln!(
        "flood cut off after {processed} of {} streams, in {lasted:?}; honest median {quiet:?} quiet, {under_flood:?} over {calls} calls flooded",
        flood.streams
    );
    (quiet, under_flood, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rapid_reset_flood_is_cut_off_and_an_honest_client_keeps_its_latency() {
    let (_events, tx) = Events::new();
    let (listener, addr) = loopback().await;
    #[allow(clippy::disallowed_methods)] // the server outlives every request
    tokio::spawn(
        tonic_deadline::server::reset_guards(Server::builder())
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(Node::new("S", &tx)))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let mut honest = connect(addr).await;
    for _ in 0..50 {
        timed_call(&mut honest).await; // warm-up
    }
    // A flood is cut off within about 100 ms, and the other tests of this
    // binary run beside it: a burst of theirs that falls on those 100 ms
    // can triple a median by itself. So each of three floods is cut off,
    // and the honest client must keep its latency through one of them at
    // least; a server the flood starves slows it through all three.
    let mut trials = Vec::new();
    for _ in 0..3 {
        let (quiet, under_flood, calls) = flood_trial(addr, &mut honest).await;
        if under_flood <= quiet * 3 {
            return;
        }
        trials.push(format!(
            "median {under_flood:?} of {calls} calls under the flood, {quiet:?} without"
        ));
    }
    panic!("an honest client keeps its latency: {}", trials.join("; "));
}

/// Calls that give up before their answer, on one `ReadyChannel`
/// connection to a server that answers every call 30 ms late (plain tonic:
/// it ignores deadlines), `at_once` at a time; their statuses.
async fn give_up_on_late_answers(channel: ReadyChannel, calls: usize) -> Vec<tonic::Code> {
    let client = ProbeClient::new(ClientDeadlineLayer::new().layer(channel));
    let at_once = 32;
    let mut codes = Vec::with_capacity(calls);
    for _ in 0..calls / at_once {
        let round = (0..at_once).map(|_| {
            let mut client = client.clone();
            async move {
                Scope::background()
                    .with_timeout(Duration::from_millis(5))
                    .enter(client.call(CallRequest::default()))
                    .await
            }
        });
        for answer in futures_util::future::join_all(round).await {
            codes.push(answer.map_or_else(|status| status.code(), |_| tonic::Code::Ok));
        }
    }
    codes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_answers_to_calls_that_gave_up_do_not_close_the_client_connection() {
    let (_events, tx) = Events::new();
    let (listener, addr) = loopback().await;
    #[allow(clippy::disallowed_methods)] // the server outlives every request
    // The server's own guard raised, so that only the client's are tried.
    tokio::spawn(
        tonic_deadline::server::reset_guards(Server::builder())
            .add_service(ProbeServer::new(
                Node::new("S", &tx).working(Duration::from_millis(30)),
            ))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    // h2 budgets a connection's small DATA frames at half its window: a
    // small window makes a small budget, so that a few hundred calls would
    // spend it if late answers were charged to it — on a channel that
    // remembers no reset streams (the default) and on one that remembers
    // many (whose late answers h2 ignores, and would charge).
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .expect("uri")
        .initial_connection_window_size(65_535);
    for remembered in [None, Some(4096)] {
        let mut builder = ReadyChannel::builder(&endpoint);
        if let Some(streams) = remembered {
            builder = builder.remembered_resets(streams);
        }
        let channel = builder.connect().await.expect("connects");
        let codes = give_up_on_late_answers(channel.clone(), 640).await;
        let others: Vec<_> = codes
            .iter()
            .filter(|c| **c != tonic::Code::DeadlineExceeded)
            .collect();
        assert!(
            others.is_empty(),
            "remembering {remembered:?}: every call that gave up must say so, and none may fail with its connection: {others:?}"
        );
        let mut client = ProbeClient::new(ClientDeadlineLayer::new().layer(channel));
        Scope::background()
            .with_timeout(Duration::from_secs(5))
            .enter(client.call(CallRequest::default()))
            .await
            .expect("the connection still serves");
    }
}

/// What a client sent [`Scripted`]'s server.
#[derive(Clone, Debug, Default)]
struct Seen {
    /// Streams the client reset because its call was dropped.
    cancelled: usize,
    /// The error code of the client's GOAWAY, if it sent one.
    go_away: Option<u32>,
    /// The client closed the connection: nothing more will be seen.
    closed: bool,
}

enum Event {
    Frame(Parsed),
    /// The client closed the connection.
    Closed,
    /// Finish the oldest call answered in part with this many more small
    /// replies and the trailers.
    Rest(usize),
}

/// A raw HTTP/2 server on one connection that answers each call with its
/// headers and one reply, then waits to be told how the answer goes on: so
/// a test can put the rest of an answer on the socket exactly while the
/// client's connection task cannot read it.
struct Scripted {
    events: std::sync::mpsc::Sender<Event>,
    written: std::sync::mpsc::Receiver<()>,
    seen: tokio::sync::watch::Receiver<Seen>,
}

impl Scripted {
    fn start() -> (Self, SocketAddr) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        let (events, inbox) = std::sync::mpsc::channel();
        let (done, written) = std::sync::mpsc::channel();
        let (noted, seen) = tokio::sync::watch::channel(Seen::default());
        let frames = events.clone();
        std::thread::spawn(move || {
            // One connection: a client that reconnects is refused.
            let (tcp, _) = listener.accept().expect("the client connects");
            drop(listener);
            tcp.set_nodelay(true).expect("nodelay");
            let mut reader = tcp.try_clone().expect("a second handle");
            std::thread::spawn(move || {
                let mut parser = FrameParser::client_to_server();
                let mut buf = vec![0; 64 * 1024];
                while let Ok(n @ 1..) = reader.read(&mut buf) {
                    for parsed in parser.feed(&buf[..n]) {
                        if frames.send(Event::Frame(parsed)).is_err() {
                            return;
                        }
                    }
                }
                let _ = frames.send(Event::Closed);
            });
            serve_scripted(tcp, &inbox, &done, &noted);
        });
        let server = Self {
            events,
            written,
            seen,
        };
        (server, addr)
    }

    /// Has the oldest call answered in part finished with `replies` more
    /// replies; returns once they are on the socket.
    fn finish(&self, replies: usize) {
        self.events
            .send(Event::Rest(replies))
            .expect("the server runs");
        self.written
            .recv_timeout(PATIENCE)
            .expect("the server writes the rest of its answer");
    }
}

fn serve_scripted(
    mut tcp: std::net::TcpStream,
    inbox: &std::sync::mpsc::Receiver<Event>,
    written: &std::sync::mpsc::Sender<()>,
    seen: &tokio::sync::watch::Sender<Seen>,
) {
    // :status 200 (static), content-type: application/grpc (indexed name).
    let mut response = vec![0x88, 0x0f, 0x10, 16];
    response.extend_from_slice(b"application/grpc");
    let mut trailers = vec![0x00, 11];
    trailers.extend_from_slice(b"grpc-status");
    trailers.extend([1, b'0']);
    // An empty message: not compressed, 0 bytes.
    let reply = [0u8; 5];
    let mut out = Vec::new();
    frame(&mut out, SETTINGS, 0, 0, &[]);
    let mut answered = std::collections::VecDeque::new();
    let mut rests = std::collections::VecDeque::new();
    while let Ok(event) = inbox.recv() {
        match event {
            Event::Frame(parsed) => {
                let f = &parsed.frame;
                match f.kind {
                    SETTINGS if f.flags & ACK == 0 => frame(&mut out, SETTINGS, ACK, 0, &[]),
                    PING if f.flags & ACK == 0 => {
                        frame(&mut out, PING, ACK, 0, &parsed.payload);
                    }
                    HEADERS => {
                        frame(&mut out, HEADERS, END_HEADERS, f.stream, &response);
                        frame(&mut out, DATA, 0, f.stream, &reply);
                        answered.push_back(f.stream);
                    }
                    RST_STREAM if parsed.error_code() == Some(CANCEL) => {
                        seen.send_modify(|seen| seen.cancelled += 1);
                    }
                    GOAWAY => seen.send_modify(|seen| seen.go_away = parsed.error_code()),
                    _ => {}
                }
            }
            Event::Closed => seen.send_modify(|seen| seen.closed = true),
            Event::Rest(replies) => rests.push_back(replies),
        }
        let finished = answered.len().min(rests.len());
        for (stream, replies) in answered.drain(..finished).zip(rests.drain(..finished)) {
            for _ in 0..replies {
                frame(&mut out, DATA, 0, stream, &reply);
            }
            frame(
                &mut out,
                HEADERS,
                END_HEADERS | END_STREAM,
                stream,
                &trailers,
            );
        }
        if !out.is_empty() && tcp.write_all(&std::mem::take(&mut out)).is_err() {
            return;
        }
        for _ in 0..finished {
            let _ = written.send(());
        }
    }
}

/// A call dropped while the rest of its answer is already on the socket,
/// then one more call, on `client`'s one connection to `server`: whether
/// that call was answered whole, and what the server saw.
async fn drop_mid_answer<T>(
    mut client: ProbeClient<T>,
    server: Scripted,
) -> (Result<(), tonic::Status>, Seen)
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut replies = Scope::background()
        .with_timeout(PATIENCE)
        .enter(client.watch(CallRequest::default()))
        .await
        .expect("the call is answered")
        .into_inner();
    let first = replies.message().await;
    assert!(matches!(first, Ok(Some(_))), "the first reply: {first:?}");
    // This thread, and with it the connection's task, is blocked while the
    // rest of the answer lands on the socket.
    server.finish(200);
    // One turn of the runtime's IO driver: the socket is marked readable
    // and the connection's task woken, but `block_on` polls this task
    // first, and it drops the call, its answer unread.
    tokio::task::yield_now().await;
    assert!(
        replies.message().now_or_never().is_none(),
        "the connection's task read the answer before its call could be dropped"
    );
    drop(replies);

    // The next call runs the connection's task: h2 reads what crossed.
    server.events.send(Event::Rest(0)).expect("the server runs");
    let next = async {
        let mut next = Scope::background()
            .with_timeout(PATIENCE)
            .enter(client.watch(CallRequest::default()))
            .await?
            .into_inner();
        while next.message().await?.is_some() {}
        Ok(())
    };
    let answered = next.await;
    // A reset is read before the answer to the next call; but a GOAWAY may
    // still be on its way when the call fails, so a failed call waits for
    // the connection to be closed.
    let mut seen = server.seen;
    if answered.is_err() {
        let closed = tokio::time::timeout(PATIENCE, seen.wait_for(|seen| seen.closed)).await;
        assert!(
            matches!(closed, Ok(Ok(_))),
            "a call failed, yet the client kept its connection open"
        );
    }
    let seen = seen.borrow().clone();
    (answered, seen)
}

/// A call dropped while the rest of its answer is already on the socket:
/// h2 reads that answer before it writes the call's reset, ignores it,
/// and charges each small DATA frame to the connection's budget for them,
/// for good. `ReadyChannel` has the reset written first, so nothing is
/// charged and the connection lives. A plain tonic channel that remembers
/// no resets either, beside it, shows that the answer did cross.
#[tokio::test(flavor = "current_thread")]
async fn an_answer_that_crosses_its_calls_reset_is_not_charged_to_the_connection() {
    // A 64 KiB window makes a budget of 32 767 bytes; each empty reply is
    // charged 251 of it: 200 of them spend it.
    let endpoint = |addr: SocketAddr| {
        Endpoint::from_shared(format!("http://{addr}"))
            .expect("uri")
            .initial_connection_window_size(65_535)
    };

    let (server, addr) = Scripted::start();
    let plain = endpoint(addr)
        .http2_max_concurrent_reset_streams(0)
        .connect()
        .await
        .expect("connects");
    let (answered, seen) = drop_mid_answer(
        ProbeClient::new(ClientDeadlineLayer::new().layer(plain)),
        server,
    )
    .await;
    assert_eq!(
        seen.go_away,
        Some(ENHANCE_YOUR_CALM),
        "on a plain channel the answer crosses its reset and closes the connection: {seen:?}"
    );
    // The next call was not sent: unavailable, not cancelled (as tonic
    // alone says), since nobody cancelled it.
    let status = answered.expect_err("the connection is closed");
    assert_eq!(
        status.code(),
        tonic::Code::Unavailable,
        "a call the connection closed before it was sent: {status:?}"
    );

    let (server, addr) = Scripted::start();
    let ready = ReadyChannel::connect(&endpoint(addr))
        .await
        .expect("connects");
    let (answered, seen) = drop_mid_answer(
        ProbeClient::new(ClientDeadlineLayer::new().layer(ready)),
        server,
    )
    .await;
    answered.expect("the connection still serves");
    assert_eq!(
        seen.go_away, None,
        "the client must not close its connection over an answer it gave up on: {seen:?}"
    );
    assert_eq!(seen.cancelled, 1, "the dropped call was reset: {seen:?}");
}
