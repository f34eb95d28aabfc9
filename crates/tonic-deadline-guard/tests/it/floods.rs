//! Rapid Reset floods (CVE-2023-44487) — streams opened and reset at
//! once, faster or slower than the server accepts them, on one connection
//! or several, in the clear or over TLS the guard terminates — are cut off
//! within 1 000 streams per connection, with `GOAWAY ENHANCE_YOUR_CALM`
//! and a clean close, and an honest client on another connection keeps its
//! latency.

// Servers and floods belong to no request.
#![allow(clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use testkit::flood::{self, Shape};
use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use tokio::time::Instant;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tonic_deadline_guard::frames::{
    END_HEADERS, GOAWAY, HEADERS, PREFACE, RST_STREAM, SETTINGS, WholeFrames, append_frame,
};
use tonic_deadline_guard::{ResetGuard, ServerTls};

use crate::common::{
    Answerer, CALL, CANCEL, Client, Counts, ENHANCE_YOUR_CALM, MACHINE, PATIENCE, connect,
    loopback, serve_guarded, serve_with, timed_call,
};

/// The most streams a flooding connection may have the server take before
/// it is cut off.
pub(crate) const CUT_WITHIN: u32 = 1000;

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

/// How long each trial floods: each flooding thread connects again
/// whenever the server cuts it off, as an attacker would.
const FLOODING: Duration = Duration::from_millis(400);

/// One trial: the honest client's median call before and during
/// `connections` floods of `shape` that connect again as soon as they are
/// cut off, for [`FLOODING`]; asserts that each flooding connection was
/// cut off within [`CUT_WITHIN`] streams.
async fn flood_trial(
    addr: SocketAddr,
    honest: &mut Client,
    shape: Shape,
    connections: usize,
    tls: Option<&Arc<testkit::tls::Pki>>,
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
                    let path = CALL;
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
/// `tls` is given: the guard terminates it (`ResetGuard::incoming_tls`).
async fn floods_are_cut_off_over(
    shape: Shape,
    connections: usize,
    tls: Option<Arc<testkit::tls::Pki>>,
) {
    let _machine = MACHINE.lock().await;
    let (listener, addr) = loopback().await;
    let counts = Counts::default();
    let guard = ResetGuard::new().observed_by(counts.clone());
    let mut honest = match &tls {
        None => {
            tokio::spawn(serve_with(guard, listener));
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
                    .add_service(ProbeServer::new(Answerer))
                    .serve_with_incoming(incoming),
            );
            let endpoint = Endpoint::from_shared(format!("https://{addr}"))
                .expect("uri")
                .tls_config(
                    ClientTlsConfig::new()
                        .ca_certificate(Certificate::from_pem(&pki.ca_pem))
                        .domain_name(testkit::tls::SERVER_NAME),
                )
                .expect("the client takes the certificate");
            ProbeClient::new(endpoint.connect().await.expect("connects over TLS"))
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
                counts.reset_floods_cut() >= connections as u64,
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

/// A server over TLS, the guard terminating it: a flood over
/// TLS is cut off as one in the clear is (plain tonic with TLS closes such
/// a connection after a few hundred streams; the guard's builder raises
/// hyper's own bound, so a guard that could not read TLS would never).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rapid_reset_flood_over_tls_is_cut_off_and_an_honest_tls_client_keeps_its_latency() {
    let pki = Arc::new(testkit::tls::Pki::new());
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
    let (listener, addr) = loopback().await;
    let counts = Counts::default();
    tokio::spawn(serve_guarded(listener, &counts));
    let ended = tokio::task::spawn_blocking(move || {
        let mut tcp = std::net::TcpStream::connect(addr).expect("the server accepts TCP");
        tcp.set_read_timeout(Some(PATIENCE))
            .expect("a read timeout");
        let block = flood::request_block(&addr.to_string(), CALL, None);
        let mut wire = PREFACE.to_vec();
        append_frame(&mut wire, SETTINGS, 0, 0, &[]);
        for id in (1..4000u32).step_by(2) {
            append_frame(&mut wire, HEADERS, END_HEADERS, id, &block);
            append_frame(&mut wire, RST_STREAM, 0, id, &CANCEL.to_be_bytes());
        }
        tcp.write_all(&wire)
            .expect("the flood fits the socket's buffers");
        let mut frames = WholeFrames::from_server();
        let mut go_away = None;
        let mut buf = vec![0; 64 * 1024];
        let end = loop {
            match tcp.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => {
                    for frame in frames.feed(&buf[..n]) {
                        if frame.header.kind == GOAWAY {
                            go_away = frame.error_code();
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
    assert_eq!(counts.reset_floods_cut(), 1);
}
