//! The reset guard (tonic-deadline-guard, re-exported as
//! `server::ResetGuard`) as tonic-deadline's own pieces meet it: an honest
//! storm of 1 ms deadlines from its clients on a starved server never trips
//! it; `Metrics` counts what a guard observed by it reports; and as
//! `ReadyChannel` sets the client's guards, answers that arrive after their
//! call gave up never close the client's connection.
//!
//! The guard's own tests (floods cut off in every shape, over TLS,
//! probation) are in its crate, `crates/tonic-deadline-guard/tests/it`.

// Servers, floods and storms belong to no request.
#![allow(clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use futures_util::FutureExt;
use testkit::CallRequest;
use testkit::flood::{self, Shape};
use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use tokio::time::Instant;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Endpoint, Server};
use tonic_deadline::client::ReadyChannel;
use tonic_deadline::observe::Metrics;
use tonic_deadline::server::ResetGuard;
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer};
use tonic_deadline_guard::frames::{
    ACK, DATA, END_HEADERS, END_STREAM, Frame, GOAWAY, HEADERS, PING, RST_STREAM, SETTINGS,
    WholeFrames, append_frame,
};
use tower::Layer;

use crate::common::{Events, Node, PATIENCE, loopback};

const ENHANCE_YOUR_CALM: u32 = 11;

const CANCEL: u32 = 8;

/// A server on `listener` with the guard and the layer, as the README
/// recommends; its guard reports to `metrics`.
fn serve_guarded(
    listener: tokio::net::TcpListener,
    node: Node,
    metrics: &Metrics,
) -> impl Future<Output = Result<(), tonic::transport::Error>> + use<> {
    let guard = ResetGuard::new().observed_by(metrics.clone());
    guard
        .builder()
        .layer(ServerDeadlineLayer::new())
        .add_service(ProbeServer::new(node))
        .serve_with_incoming(guard.incoming(TcpListenerStream::new(listener)))
}

/// Held by the tests that flood or storm a server: each takes the machine's
/// two cores for a moment, and would otherwise be measured in the other's
/// load.
static MACHINE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits (at most [`PATIENCE`]) until `counted` says yes.
async fn until(counted: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !counted() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `Metrics` handed to `ResetGuard::observed_by` counts what the guard
/// reports: a flooding connection cut off, then a connection from the same
/// address, on probation, held for resetting a stream early. (What the
/// guard reports, and when, is tested in its crate; a TLS connection it
/// refuses is counted in `compat::tls`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_the_cuts_and_holds_of_the_guard_they_observe() {
    let _machine = MACHINE.lock().await;
    let (_events, tx) = Events::new();
    let (listener, addr) = loopback().await;
    let metrics = Metrics::new();
    tokio::spawn(serve_guarded(listener, Node::new("S", &tx), &metrics));
    let flood = tokio::task::spawn_blocking(move || {
        flood::flood(
            addr,
            "/probe.v1.Probe/Call",
            Shape::FAST,
            &AtomicBool::new(false),
            PATIENCE,
        )
    })
    .await
    .expect("the flooding thread");
    assert!(flood.was_cut(), "the flood must be cut off: {flood:?}");
    until(|| metrics.reset_floods_cut() > 0).await;
    assert_eq!(metrics.reset_floods_cut(), 1, "the cut is counted, once");

    let _held =
        tokio::task::spawn_blocking(move || flood::one_early_reset(addr, "/probe.v1.Probe/Call"))
            .await
            .expect("the connecting thread");
    until(|| metrics.connections_held() > 0).await;
    assert_eq!(
        metrics.connections_held(),
        1,
        "a connection held on probation is counted"
    );
    assert_eq!(metrics.connections_refused(), 0, "none beyond those held");
}

/// How a server is built for the storm: hyper's own guard (what a server
/// with the layer alone has), or the reset guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guarding {
    HypersOwn,
    ResetGuard,
}

/// Serves a probe on a runtime of its own whose one thread is kept busy 15
/// ms of every 20 (a server short of CPU); returns its address.
fn starved_server(guarding: Guarding, metrics: &Metrics) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    listener.set_nonblocking(true).expect("non-blocking");
    let addr = listener.local_addr().expect("its address");
    let metrics = metrics.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            tokio::spawn(async {
                loop {
                    // Blocks the server's one thread: nothing of it runs.
                    std::thread::sleep(Duration::from_millis(15));
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
            let listener = tokio::net::TcpListener::from_std(listener).expect("a listener");
            let (_events, tx) = Events::new();
            let node = Node::new("S", &tx);
            let _ = match guarding {
                Guarding::ResetGuard => serve_guarded(listener, node, &metrics).await,
                Guarding::HypersOwn => {
                    Server::builder()
                        .layer(ServerDeadlineLayer::new())
                        .add_service(ProbeServer::new(node))
                        .serve_with_incoming(TcpListenerStream::new(listener))
                        .await
                }
            };
        });
    });
    addr
}

/// An honest deadline storm: 4 connections, 16 callers each, every call
/// with a 1 ms deadline, for `lasting`; the codes the calls ended with.
async fn storm(addr: SocketAddr, lasting: Duration) -> std::collections::BTreeMap<String, usize> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}")).expect("uri");
    let until = Instant::now() + lasting;
    let mut callers = Vec::new();
    for _ in 0..4 {
        let channel = ReadyChannel::connect(&endpoint).await.expect("connects");
        let client = ProbeClient::new(ClientDeadlineLayer::new().layer(channel));
        for _ in 0..16 {
            let mut client = client.clone();
            callers.push(tokio::spawn(async move {
                let mut codes = Vec::new();
                while Instant::now() < until {
                    let answer = Scope::background()
                        .with_timeout(Duration::from_millis(1))
                        .enter(client.call(CallRequest::default()))
                        .await;
                    codes.push(match answer {
                        Ok(_) => "Ok".to_owned(),
                        Err(status) => format!("{:?}: {}", status.code(), status.message()),
                    });
                }
                codes
            }));
        }
    }
    let mut codes = std::collections::BTreeMap::new();
    for caller in callers {
        for code in caller.await.expect("a caller") {
            *codes.entry(code).or_insert(0) += 1;
        }
    }
    codes
}

fn honest(code: &str) -> bool {
    ["Ok", "DeadlineExceeded:", "Cancelled:"]
        .iter()
        .any(|ok| code.starts_with(ok))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_1_ms_deadlines_on_a_starved_server_never_trips_the_reset_guard() {
    let _machine = MACHINE.lock().await;
    // The same storm on the same starved server, with hyper's guard alone:
    // streams reset before the server could accept them pile up past its 20,
    // and it closes connections — the storm is one a guard must let through.
    let unguarded = storm(
        starved_server(Guarding::HypersOwn, &Metrics::new()),
        Duration::from_millis(1500),
    )
    .await;
    eprintln!("hyper's guard alone: {unguarded:?}");
    assert!(
        unguarded.keys().any(|code| !honest(code)),
        "the storm must trip hyper's own guard, or it shows nothing: {unguarded:?}"
    );

    let metrics = Metrics::new();
    let guarded = storm(
        starved_server(Guarding::ResetGuard, &metrics),
        Duration::from_millis(1500),
    )
    .await;
    eprintln!("the reset guard: {guarded:?}");
    assert!(
        guarded.keys().all(|code| honest(code)),
        "an honest storm must answer only OK, DEADLINE_EXCEEDED and CANCELLED: {guarded:?}"
    );
    assert_eq!(metrics.reset_floods_cut(), 0, "no connection cut off");
    assert!(
        guarded.values().sum::<usize>() > 1000,
        "a storm, not a trickle: {guarded:?}"
    );
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
    // The server's own guard raised, so that only the client's are tried.
    tokio::spawn({
        let guard = ResetGuard::new();
        guard
            .builder()
            .add_service(ProbeServer::new(
                Node::new("S", &tx).working(Duration::from_millis(30)),
            ))
            .serve_with_incoming(guard.incoming(TcpListenerStream::new(listener)))
    });
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
    Frame(Frame),
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
                let mut parser = WholeFrames::from_client();
                let mut buf = vec![0; 64 * 1024];
                while let Ok(n @ 1..) = reader.read(&mut buf) {
                    for frame in parser.feed(&buf[..n]) {
                        if frames.send(Event::Frame(frame)).is_err() {
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
    append_frame(&mut out, SETTINGS, 0, 0, &[]);
    let mut answered = std::collections::VecDeque::new();
    let mut rests = std::collections::VecDeque::new();
    while let Ok(event) = inbox.recv() {
        match event {
            Event::Frame(frame) => {
                let f = &frame.header;
                match f.kind {
                    SETTINGS if f.flags & ACK == 0 => append_frame(&mut out, SETTINGS, ACK, 0, &[]),
                    PING if f.flags & ACK == 0 => {
                        append_frame(&mut out, PING, ACK, 0, &frame.payload);
                    }
                    HEADERS => {
                        append_frame(&mut out, HEADERS, END_HEADERS, f.stream, &response);
                        append_frame(&mut out, DATA, 0, f.stream, &reply);
                        answered.push_back(f.stream);
                    }
                    RST_STREAM if frame.error_code() == Some(CANCEL) => {
                        seen.send_modify(|seen| seen.cancelled += 1);
                    }
                    GOAWAY => seen.send_modify(|seen| seen.go_away = frame.error_code()),
                    _ => {}
                }
            }
            Event::Closed => seen.send_modify(|seen| seen.closed = true),
            Event::Rest(replies) => rests.push_back(replies),
        }
        let finished = answered.len().min(rests.len());
        for (stream, replies) in answered.drain(..finished).zip(rests.drain(..finished)) {
            for _ in 0..replies {
                append_frame(&mut out, DATA, 0, stream, &reply);
            }
            append_frame(
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
