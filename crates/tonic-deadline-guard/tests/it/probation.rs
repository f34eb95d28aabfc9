//! Probation: after a cut, a flood that connects again from the same
//! address is held unread for a while, then cut off after its first early
//! reset; beyond 20 held at once, the rest are cut off at once. Honest
//! clients from the same address are served as any other.

// Servers and floods belong to no request.
#![allow(clippy::disallowed_methods)]

use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use testkit::CallRequest;
use testkit::flood::{self, Shape};
use testkit::probe_client::ProbeClient;
use tokio::time::Instant;
use tonic::transport::Endpoint;
use tonic_deadline_guard::ResetGuard;

use crate::common::{CALL, Counts, MACHINE, PATIENCE, loopback, serve_guarded, serve_with};
use crate::floods::CUT_WITHIN;

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
            floods.push(flood::flood(addr, CALL, Shape::FAST, &stop, left));
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

    let (listener, free_addr) = loopback().await;
    let free_counts = Counts::default();
    let free_guard = ResetGuard::new()
        .hold_after_cut(None)
        .observed_by(free_counts.clone());
    tokio::spawn(serve_with(free_guard, listener));
    let free = reconnecting_flood(free_addr, WINDOW).await.len();

    testkit::logs::capture();
    let said = || testkit::logs::warnings_about("reset streams early again").len();
    let said_before = said();
    let (listener, addr) = loopback().await;
    let counts = Counts::default();
    tokio::spawn(serve_guarded(listener, &counts));
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
        counts.connections_held(),
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
        counts.connections_held() + 1 >= held.len() as u64,
        "every connection cut after the first was held, and counted: {} held",
        counts.connections_held()
    );
    assert_eq!(free_counts.connections_held(), 0);
    assert_eq!(
        counts.connections_refused(),
        0,
        "no connection beyond those that may be held"
    );
    // Said once (and at most once every 10 s), naming the address.
    assert_eq!(said(), said_before + 1, "the guard says it holds one");
    assert!(
        testkit::logs::warnings_about("reset streams early again")
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
    let (listener, addr) = loopback().await;
    let counts = Counts::default();
    let guard = ResetGuard::new()
        .observed_by(counts.clone())
        .hold_after_cut(Some(LONG_HOLD));
    tokio::spawn(serve_with(guard, listener));
    // One flooding connection, and only one: a second, opened before the
    // first was cut, would be on probation too and take a place.
    let cut = tokio::task::spawn_blocking(move || {
        let first = flood::flood(addr, CALL, Shape::FAST, &AtomicBool::new(false), PATIENCE);
        [first]
            .into_iter()
            .filter(|f| f.was_cut())
            .collect::<Vec<_>>()
    })
    .await
    .expect("the flooding thread");
    assert_eq!(cut.len(), 1, "one flooding connection, cut off: {cut:?}");

    let started = Instant::now();
    let opened = tokio::task::spawn_blocking(move || {
        (0..OPENED)
            .map(|_| flood::one_early_reset(addr, CALL))
            .collect::<Vec<_>>()
    })
    .await
    .expect("the connecting thread");
    let deadline = Instant::now() + PATIENCE;
    while counts.connections_held() + counts.connections_refused() < OPENED as u64
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (held, refused) = (counts.connections_held(), counts.connections_refused());
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

/// A flood on probation that waits after connecting before its first
/// early reset (as a busy server, reading it late, also makes it seem to)
/// has earned nothing by waiting: it is held like one that floods at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_that_waits_after_connecting_is_held_all_the_same() {
    let _machine = MACHINE.lock().await;
    let (listener, addr) = loopback().await;
    let counts = Counts::default();
    tokio::spawn(serve_guarded(listener, &counts));
    let first = tokio::task::spawn_blocking(move || {
        flood::flood(addr, CALL, Shape::FAST, &AtomicBool::new(false), PATIENCE)
    })
    .await
    .expect("the flooding thread");
    assert!(first.was_cut(), "the first flood is cut off: {first:?}");

    // At the default refill of 100 early resets a second, 300 ms would
    // have refilled the whole allowance of a connection not on probation.
    let waited = tokio::task::spawn_blocking(move || {
        flood::early_reset_after(addr, CALL, Duration::from_millis(300))
    })
    .await
    .expect("the connecting thread");
    let deadline = Instant::now() + PATIENCE;
    while counts.connections_held() + counts.connections_refused() == 0 && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        (counts.connections_held(), counts.connections_refused()),
        (1, 0),
        "the waiting flood is held"
    );
    assert!(
        !closed_by_the_server(&waited),
        "and held open, unread, until its hold ends"
    );
}
