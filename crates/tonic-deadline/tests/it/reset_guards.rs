//! HTTP/2's guards against reset streams: under a `server::ResetGuard`, a
//! Rapid Reset flood (CVE-2023-44487) — streams opened and reset at once,
//! faster or slower than the server accepts them, on one connection or
//! several — is cut off within 1 000 streams per connection, and an honest
//! client on another connection keeps its latency; an honest storm of
//! short deadlines on a starved server never trips it; as `ReadyChannel`
//! sets the client's guards, answers that arrive after their call gave up
//! never close the client's connection.

// Servers, floods and storms belong to no request.
#![allow(clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use probe::CallRequest;
use probe::flood::{self, Shape, frame};
use probe::frames::{
    ACK, DATA, END_HEADERS, END_STREAM, FrameParser, GOAWAY, HEADERS, PING, Parsed, RST_STREAM,
    SETTINGS,
};
use probe::probe_client::ProbeClient;
use probe::probe_server::ProbeServer;
use tokio::time::Instant;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Server};
use tonic_deadline::client::ReadyChannel;
use tonic_deadline::observe::Metrics;
use tonic_deadline::server::{ResetGuard, ServerTls};
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer};
use tower::Layer;

use crate::common::{Events, Node, PATIENCE, connect, loopback};

const ENHANCE_YOUR_CALM: u32 = 11;

/// The most streams a flooding connection may have the server take before
/// it is cut off.
const CUT_WITHIN: u32 = 1000;

const CANCEL: u32 = 8;

/// A server on `listener` with the guard and the layer, as the README
/// recommends; its guard reports to `metrics`.
fn serve_guarded(
    listener: tokio::net::TcpListener,
    node: Node,
    metrics: &Metrics,
) -> impl Future<Output = Result<(), tonic::transport::Error>> + use<> {
    serve_with(
        ResetGuard::new().observed_by(metrics.clone()),
        listener,
        node,
    )
}

/// A server on `listener` with `guard` and the layer.
fn serve_with(
    guard: ResetGuard,
    listener: tokio::net::TcpListener,
    node: Node,
) -> impl Future<Output = Result<(), tonic::transport::Error>> + use<> {
    guard
        .builder()
        .layer(ServerDeadlineLayer::new())
        .add_service(ProbeServer::new(node))
        .serve_with_incoming(guard.incoming(TcpListenerStream::new(listener)))
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

/// Threads that spin as `n` flooding threads will, so that a baseline
/// sees the same CPU the flood leaves.
fn spinners(n: usize) -> (Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>) {
    let spinning = Arc::new(AtomicBool::new(true));
    let threads = (0..n)
        .map(|_| {
            let spinning = spinning.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while spinning.load(Ordering::Relaxed) {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            })
        })
        .collect();
    (spinning, threads)
}

/// Held by the tests that flood or storm a server: each takes the machine's
/// two cores for a moment, and would otherwise be measured in the other's
/// load.
static MACHINE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long each trial floods: each flooding thread connects again
/// whenever the server cuts it off, as an attacker would.
const FLOODING: Duration = Duration::from_millis(400);

/// One trial: the honest client's median call before and during
/// `connections` floods of `shape` that connect again as soon as they are
/// cut off, for [`FLOODING`]; asserts that each flooding connection was
/// cut off within [`CUT_WITHIN`] streams.
async fn flood_trial(
    addr: SocketAddr,
    honest: &mut crate::common::Client,
    shape: Shape,
    connections: usize,
    tls: Option<&Arc<probe::tls::Pki>>,
) -> (Duration, Duration, usize) {
    let (spinning, threads) = spinners(connections);
    let mut quiet = Vec::new();
    for _ in 0..200 {
        quiet.push(timed_call(honest).await);
    }
    spinning.store(false, Ordering::Relaxed);
    threads
        .into_iter()
        .for_each(|t| t.join().expect("a spinner"));
    let quiet = median(quiet);

    let stop = Arc::new(AtomicBool::new(false));
    let cuts = Arc::new(AtomicUsize::new(0));
    let tls = tls.map(|pki| pki.client_config());
    let floods: Vec<_> = (0..connections)
        .map(|_| {
            let (stop, cuts) = (stop.clone(), cuts.clone());
            let tls = tls.clone();
            std::thread::spawn(move || {
                let mut floods = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let path = "/probe.v1.Probe/Call";
                    let flood = match &tls {
                        Some(tls) => flood::flood_tls(addr, tls, path, shape, &stop, PATIENCE),
                        None => flood::flood(addr, path, shape, &stop, PATIENCE),
                    };
                    if flood.was_cut() {
                        cuts.fetch_add(1, Ordering::Relaxed);
                    }
                    floods.push(flood);
                }
                floods
            })
        })
        .collect();
    // At least FLOODING, and on a loaded machine until each flooding
    // thread has had a connection cut (a TLS handshake alone can take a
    // while there): the law is about the cut, not how soon it came.
    let started = Instant::now();
    let mut flooded = Vec::new();
    while started.elapsed() < FLOODING
        || (cuts.load(Ordering::Relaxed) < connections && started.elapsed() < PATIENCE)
    {
        flooded.push(timed_call(honest).await);
    }
    stop.store(true, Ordering::Relaxed);
    let floods: Vec<_> = floods
        .into_iter()
        .flat_map(|t| t.join().expect("the flood thread"))
        .collect();
    // The last flood of each thread was stopped, not cut.
    let cut: Vec<_> = floods.iter().filter(|f| f.was_cut()).collect();
    assert!(
        cut.len() >= connections,
        "every flooding connection must be cut off: {floods:?}"
    );
    for flood in &cut {
        if let Some((code, _)) = flood.go_away {
            assert_eq!(
                code, ENHANCE_YOUR_CALM,
                "the GOAWAY must say why: {flood:?}"
            );
        }
        assert!(
            flood.before_cut() <= CUT_WITHIN,
            "{shape:?}: a flooding connection must be cut off within {CUT_WITHIN} streams: {flood:?}"
        );
    }
    let most = cut.iter().map(|f| f.before_cut()).max().unwrap_or_default();
    eprintln!(
        "{shape:?} x{connections}: {} connections cut in {FLOODING:?}, each after at most {most} streams",
        cut.len()
    );
    let calls = flooded.len();
    let during = median(flooded);
    eprintln!("honest median {quiet:?} quiet, {during:?} over {calls} calls flooded");
    (quiet, during, calls)
}

/// Floods a guarded server with `connections` floods of `shape`, three
/// times: each is cut off, and the honest client on its own connection
/// must keep its latency through one of them at least (the other tests of
/// this debug binary run beside it: a burst of theirs can triple a median
/// by itself; a server the flood starves slows it through all three). The
/// lab's `experiment rapid-reset` compares the release build's with plain
/// tonic's beside the same flood.
async fn floods_are_cut_off(shape: Shape, connections: usize) {
    floods_are_cut_off_over(shape, connections, None).await;
}

/// [`floods_are_cut_off`], the server and every client over TLS when
/// `tls` is given: the guard terminates it, as the README serves TLS.
async fn floods_are_cut_off_over(
    shape: Shape,
    connections: usize,
    tls: Option<Arc<probe::tls::Pki>>,
) {
    let _machine = MACHINE.lock().await;
    let (_events, tx) = Events::new();
    let (listener, addr) = loopback().await;
    let metrics = Metrics::new();
    let guard = ResetGuard::new().observed_by(metrics.clone());
    let node = Node::new("S", &tx);
    let mut honest = match &tls {
        None => {
            tokio::spawn(serve_with(guard, listener, node));
            connect(addr).await
        }
        Some(pki) => {
            let incoming = guard
                .incoming_tls(
                    TcpListenerStream::new(listener),
                    ServerTls::new(&pki.server_cert_pem, &pki.server_key_pem),
                )
                .expect("the guard takes the certificate");
            tokio::spawn(
                guard
                    .builder()
                    .layer(ServerDeadlineLayer::new())
                    .add_service(ProbeServer::new(node))
                    .serve_with_incoming(incoming),
            );
            let endpoint = Endpoint::from_shared(format!("https://{addr}"))
                .expect("uri")
                .tls_config(
                    ClientTlsConfig::new()
                        .ca_certificate(Certificate::from_pem(&pki.ca_pem))
                        .domain_name(probe::tls::SERVER_NAME),
                )
                .expect("the client takes the certificate");
            crate::common::with_deadlines(endpoint.connect().await.expect("connects over TLS"))
        }
    };
    for _ in 0..50 {
        timed_call(&mut honest).await; // warm-up
    }
    let mut trials = Vec::new();
    for _ in 0..3 {
        let (quiet, during, calls) =
            flood_trial(addr, &mut honest, shape, connections, tls.as_ref()).await;
        if during <= quiet * 3 {
            assert!(
                metrics.reset_floods_cut() >= connections as u64,
                "every connection cut off is counted"
            );
            return;
        }
        trials.push(format!(
            "median {during:?} of {calls} calls under the flood, {quiet:?} without"
        ));
    }
    panic!("an honest client keeps its latency: {}", trials.join("; "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rapid_reset_flood_is_cut_off_and_an_honest_client_keeps_its_latency() {
    floods_are_cut_off(Shape::FAST, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_slower_than_the_accept_loop_is_cut_off_too() {
    // Slower than the server takes streams (in this debug build too):
    // hyper's guard counts resets of streams not yet accepted, and sees
    // none pile up.
    floods_are_cut_off(Shape::at(2_000), 1).await;
}

/// The README's server over TLS, the guard terminating it: a flood over
/// TLS is cut off as one in the clear is (plain tonic with TLS closes such
/// a connection after a few hundred streams; the guard's builder raises
/// hyper's own bound, so a guard that could not read TLS would never).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rapid_reset_flood_over_tls_is_cut_off_and_an_honest_tls_client_keeps_its_latency() {
    let pki = Arc::new(probe::tls::Pki::new());
    floods_are_cut_off_over(Shape::FAST, 1, Some(pki.clone())).await;
    floods_are_cut_off_over(Shape::at(2_000).one_per_write(), 1, Some(pki)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_flooding_connections_at_once_are_each_cut_off() {
    // Four threads flooding as fast as they can take this machine's two
    // cores from everyone, the server and the honest client alike; at
    // 2 000 streams/s each, the flood is what costs. (The lab's
    // `experiment rapid-reset` floods four connections flat out, in a
    // release build, beside plain tonic.)
    floods_are_cut_off(Shape::at(2_000), 4).await;
}

/// A flood written all at once, far past the point the guard cuts it:
/// the server stops reading with most of it unread. A socket closed so
/// is reset, and a reset drops what was still queued to be sent, the
/// GOAWAY included (on a busy machine it often is). The guard shuts its
/// write side after the GOAWAY and reads what is left before closing: the
/// client reads the GOAWAY, then a clean end of stream, never a reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_ends_with_its_goaway_and_a_clean_close_not_a_reset() {
    let (_events, tx) = Events::new();
    let (listener, addr) = loopback().await;
    let metrics = Metrics::new();
    tokio::spawn(serve_guarded(listener, Node::new("S", &tx), &metrics));
    let ended = tokio::task::spawn_blocking(move || {
        let mut tcp = std::net::TcpStream::connect(addr).expect("the server accepts TCP");
        tcp.set_read_timeout(Some(PATIENCE))
            .expect("a read timeout");
        let block = flood::request_block(&addr.to_string(), "/probe.v1.Probe/Call", None);
        let mut wire = probe::frames::PREFACE.to_vec();
        frame(&mut wire, SETTINGS, 0, 0, &[]);
        for id in (1..4000u32).step_by(2) {
            frame(&mut wire, HEADERS, END_HEADERS, id, &block);
            frame(&mut wire, RST_STREAM, 0, id, &CANCEL.to_be_bytes());
        }
        tcp.write_all(&wire)
            .expect("the flood fits the socket's buffers");
        let mut parser = FrameParser::server_to_client();
        let mut go_away = None;
        let mut buf = vec![0; 64 * 1024];
        let end = loop {
            match tcp.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => {
                    for parsed in parser.feed(&buf[..n]) {
                        if parsed.frame.kind == GOAWAY {
                            go_away = parsed.error_code();
                        }
                    }
                }
                Err(e) => break Err(e.kind()),
            }
        };
        (go_away, end)
    })
    .await
    .expect("the flooding client");
    assert_eq!(
        ended,
        (Some(ENHANCE_YOUR_CALM), Ok(())),
        "the client must read GOAWAY ENHANCE_YOUR_CALM, then the end of the stream"
    );
    assert_eq!(metrics.reset_floods_cut(), 1);
}

/// How long the guard holds a connection that floods again from an
/// address it cut off lately, by default.
const HOLD: Duration = Duration::from_secs(1);

/// Floods `addr` from one thread for `window`, connecting again whenever
/// the server cuts the connection off; the connections it cut off.
async fn reconnecting_flood(addr: SocketAddr, window: Duration) -> Vec<flood::Flood> {
    tokio::task::spawn_blocking(move || {
        let stop = AtomicBool::new(false);
        let started = Instant::now();
        let mut floods = Vec::new();
        while started.elapsed() < window {
            let left = window.saturating_sub(started.elapsed());
            floods.push(flood::flood(
                addr,
                "/probe.v1.Probe/Call",
                Shape::FAST,
                &stop,
                left,
            ));
        }
        floods.into_iter().filter(|f| f.was_cut()).collect()
    })
    .await
    .expect("the flooding thread")
}

/// A call on a new connection from `from`; how long it took, connect
/// included.
async fn call_from(addr: SocketAddr, from: [u8; 4]) -> Result<Duration, tonic::Status> {
    let started = Instant::now();
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("uri")
        .local_address(Some(std::net::IpAddr::from(from)))
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("cannot connect from {from:?}: {e}")))?;
    ProbeClient::new(channel)
        .call(CallRequest::default())
        .await
        .map(|_| started.elapsed())
}

/// A flood that connects again as soon as it is cut off costs a
/// connection each time. After a cut, the guard puts the address's new
/// connections on probation: one that floods again is held unread for a
/// second, then cut off after its first stream. Beside the same flood
/// against a guard without probation, in the same run: many fewer
/// connections read. Honest clients that share the flood's address (a NAT,
/// a proxy that hides addresses) open new connections meanwhile and are
/// served at once, neither held nor refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_that_reconnects_is_held_and_its_neighbours_are_not() {
    let _machine = MACHINE.lock().await;
    const WINDOW: Duration = Duration::from_millis(1500);
    let (_events, tx) = Events::new();

    let (listener, free_addr) = loopback().await;
    let free_metrics = Metrics::new();
    let free_guard = ResetGuard::new()
        .hold_after_cut(None)
        .observed_by(free_metrics.clone());
    tokio::spawn(serve_with(free_guard, listener, Node::new("U", &tx)));
    let free = reconnecting_flood(free_addr, WINDOW).await.len();

    crate::seams::capture_logs();
    let said = || crate::seams::warnings_about("reset streams early again").len();
    let said_before = said();
    let (listener, addr) = loopback().await;
    let metrics = Metrics::new();
    tokio::spawn(serve_guarded(listener, Node::new("S", &tx), &metrics));
    let flood = tokio::spawn(reconnecting_flood(addr, WINDOW));
    // Honest clients from the flood's own address, each on a new
    // connection, while the flood reconnects.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut neighbours = Vec::new();
    for _ in 0..10 {
        neighbours.push(
            call_from(addr, [127, 0, 0, 1])
                .await
                .expect("a neighbour of the flood is served"),
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = flood.await.expect("the flood");
    eprintln!(
        "connections cut in {WINDOW:?}: {free} without probation, {} with it; held: {}, \
         neighbours' calls took at most {:?}",
        held.len(),
        metrics.connections_held(),
        neighbours.iter().max()
    );
    assert!(
        held.iter().all(|f| f.before_cut() <= CUT_WITHIN),
        "every connection is cut off: {held:?}"
    );
    // The first connection is cut off at once; each one after it is held
    // a second before its cut.
    let most = 2 + (WINDOW.as_millis() / HOLD.as_millis()) as usize;
    assert!(
        !held.is_empty() && held.len() <= most,
        "a flood held on probation has at most {most} connections cut in {WINDOW:?}: {}",
        held.len()
    );
    assert!(
        held[1..].iter().all(|f| f.before_cut() <= 1),
        "on probation a connection may reset no stream early: {held:?}"
    );
    assert!(
        free >= 10 * held.len(),
        "without probation the same flood has far more connections read: {free} vs {}",
        held.len()
    );
    assert!(
        metrics.connections_held() + 1 >= held.len() as u64,
        "every connection cut after the first was held, and counted: {} held",
        metrics.connections_held()
    );
    assert_eq!(free_metrics.connections_held(), 0);
    assert_eq!(
        metrics.connections_refused(),
        0,
        "no connection beyond those that may be held"
    );
    // Said once (and at most once every 10 s), naming the address.
    assert_eq!(said(), said_before + 1, "the guard says it holds one");
    assert!(
        crate::seams::warnings_about("reset streams early again")
            .iter()
            .all(|w| w.contains("127.0.0.1")),
        "the warning names the address"
    );
    // A neighbour's call waits for nothing the flood does: well within the
    // hold it would have waited for.
    assert!(
        neighbours.iter().all(|took| *took < HOLD / 2),
        "a neighbour of the flood is answered at once: {neighbours:?}"
    );
}

/// One raw connection that opens a stream and resets it at once: the
/// first stream of a flood.
fn one_early_reset(addr: SocketAddr) -> std::net::TcpStream {
    let mut tcp = std::net::TcpStream::connect(addr).expect("the server accepts TCP");
    let mut wire = probe::frames::PREFACE.to_vec();
    frame(&mut wire, SETTINGS, 0, 0, &[]);
    let block = flood::request_block(&addr.to_string(), "/probe.v1.Probe/Call", None);
    frame(&mut wire, HEADERS, END_HEADERS, 1, &block);
    frame(&mut wire, RST_STREAM, 0, 1, &CANCEL.to_be_bytes());
    tcp.write_all(&wire).expect("the flood is taken");
    tcp
}

/// Whether the server has closed `tcp` (it read the end of the stream, or
/// an error): what it sent before is read and dropped.
fn closed_by_the_server(tcp: &std::net::TcpStream) -> bool {
    let mut tcp = tcp.try_clone().expect("a second handle");
    tcp.set_nonblocking(true).expect("non-blocking");
    let mut buf = [0u8; 1024];
    loop {
        match tcp.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }
}

/// A flood that opens connections from its address without waiting for
/// them: each floods on probation and would be held, and piling up held
/// connections is an attack of its own. At most 20 are held at once; the
/// rest are cut off at once, counted, and the client sees the close; the
/// held ones are cut off when their hold ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_those_that_may_be_held_are_cut_off_at_once() {
    let _machine = MACHINE.lock().await;
    const OPENED: usize = 30;
    // Longer than the default, so that a loaded machine reads all 30
    // before the first hold ends (which would free a place for another).
    const LONG_HOLD: Duration = Duration::from_secs(4);
    let (_events, tx) = Events::new();
    let (listener, addr) = loopback().await;
    let metrics = Metrics::new();
    let guard = ResetGuard::new()
        .observed_by(metrics.clone())
        .hold_after_cut(Some(LONG_HOLD));
    tokio::spawn(serve_with(guard, listener, Node::new("S", &tx)));
    let cut = reconnecting_flood(addr, Duration::from_millis(1)).await;
    assert_eq!(cut.len(), 1, "one flooding connection, cut off: {cut:?}");

    let started = Instant::now();
    let opened = tokio::task::spawn_blocking(move || {
        (0..OPENED)
            .map(|_| one_early_reset(addr))
            .collect::<Vec<_>>()
    })
    .await
    .expect("the connecting thread");
    let deadline = Instant::now() + PATIENCE;
    while metrics.connections_held() + metrics.connections_refused() < OPENED as u64
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (held, refused) = (metrics.connections_held(), metrics.connections_refused());
    eprintln!("{OPENED} flooding connections on probation: {held} held, {refused} cut at once");
    assert_eq!(held, 20, "at most 20 are held at once");
    assert_eq!(
        held + refused,
        OPENED as u64,
        "the others are cut off at once"
    );
    // Those cut off at once are closed within moments; the held ones stay
    // open until their hold ends, and are closed after it.
    let closed = || {
        opened
            .iter()
            .filter(|tcp| closed_by_the_server(tcp))
            .count() as u64
    };
    while closed() < refused && started.elapsed() < LONG_HOLD / 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let closed_early = closed();
    assert!(
        started.elapsed() < LONG_HOLD,
        "the held ones are still held when counted: {:?} after the flood",
        started.elapsed()
    );
    assert_eq!(
        closed_early, refused,
        "only those not held are closed at once"
    );
    while closed() < OPENED as u64 && started.elapsed() < LONG_HOLD + PATIENCE {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        closed(),
        OPENED as u64,
        "the held ones are cut off once held"
    );
    assert!(
        started.elapsed() >= LONG_HOLD,
        "not before their hold ended: {:?}",
        started.elapsed()
    );
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
