//! HTTP/2 Rapid Reset (CVE-2023-44487) against plain tonic
//! (`Server::builder()`, hyper's own guard), our server layer alone
//! (`Server::builder().layer(ServerDeadlineLayer::new())`, which must be
//! no weaker), and ours as the README serves it (`ResetGuard`'s builder,
//! its incoming connections, the layer); and over TLS, plain tonic with
//! `tls_config` beside ours with the guard terminating TLS
//! (`ResetGuard::incoming_tls`), every client speaking TLS too.
//!
//! Each flood shape runs against the three servers in turn, each freshly
//! started: one connection as fast as the socket takes its streams (faster
//! than the server's accept loop), one at 11 000 streams a second, each
//! stream written on its own (slower than the accept loop; about what a
//! Python HTTP/2 client sends), and four connections at once of each.
//! Every flooding thread connects again as soon as its connection is cut
//! off, as an attacker would, for a fixed window; after it, each thread's
//! last connection floods on for a moment without reconnecting, so that
//! the server reads it. What is counted is how each connection ended (the
//! server's GOAWAY and its code, or a close) and how many streams the
//! server took before it cut the connection off.
//!
//! Beside the flood, an honest client on a connection (and a thread) of
//! its own calls the server's health check (`grpc.health.v1.Health/Check`,
//! the method the flood names too) in a loop: its median before the flood,
//! taken while threads spin as the flooding threads will, and during it,
//! with every failure counted. The flooding and spinning threads run on
//! half of the machine's CPUs, the server and the honest client on the
//! other half, so that the honest latency measures what the flood costs
//! the server, not the flood's own client.
//!
//! The floods come from `testkit::flood`, a raw client on threads of its
//! own, so that a flood never waits for the runtime of the server it
//! floods.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use testkit::flood::{self, Flood, Shape};
use testkit::tls::Pki;
use rustix::thread::CpuSet;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tonic::service::Routes;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic_deadline::observe::Metrics;
use tonic_deadline::server::{ResetGuard, ServerTls};
use tonic_deadline::{Scope, ServerDeadlineLayer};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::html::chart;
use crate::html::{Part, Section};
use crate::net::{self, Layered};
use crate::registry::{Experiment, Spans};
use crate::report::{Outcome, ms};

/// How long each row floods when the experiment runs alone.
pub const FLOOD_MS: u64 = 2_000;

/// How long each row floods in the demo.
pub const DEMO_FLOOD_MS: u64 = 300;

/// The flags of `experiment rapid-reset`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// How long each server is flooded with each shape, in milliseconds.
    #[arg(long, default_value_t = FLOOD_MS)]
    flood_ms: u64,
}

/// The rate of the slow shapes, per connection: slower than the server's
/// accept loop, about what a Python HTTP/2 client sends.
pub const SLOW_RATE: u32 = 11_000;

/// The most streams ours may take on a flooding connection before it cuts
/// it off.
pub const CUT_WITHIN: u32 = 1_000;

/// How much slower than plain tonic's, beside the same flood, ours may
/// answer the honest client (its median): ours takes 33 streams on a
/// connection before cutting it off where hyper's guard takes 21 of a fast
/// flood, and the bound says that this costs the honest client no more
/// than the noise of a shared machine.
pub const HONEST_P50_VS_PLAIN: f64 = 2.0;

/// How much slower than before the flood ours may answer the honest
/// client during it (its median). A flood that connects again whenever it
/// is cut off would cost the server a connection each time, whatever cuts
/// each one off (plain tonic's honest median doubles beside it); ours
/// reads the new connections of an address it cut off one at a time.
pub const HONEST_P50_VS_BEFORE: f64 = 2.0;

/// The servers, in the order each shape floods them.
pub const SERVERS: [&str; 5] = [
    "plain tonic",
    "layer alone",
    "ours",
    "plain tonic, TLS",
    "ours, TLS",
];

/// The flood shapes, as the rows name them: (label, connections, rate).
pub const SHAPES: [(&str, usize, Option<u32>); 4] = [
    ("1 × fast", 1, None),
    ("1 × 11 000/s", 1, Some(SLOW_RATE)),
    ("4 × fast", 4, None),
    ("4 × 11 000/s", 4, Some(SLOW_RATE)),
];

/// The method every flooded stream names, and the honest client calls.
const PATH: &str = "/grpc.health.v1.Health/Check";

/// Honest calls before the flood: the warm-up, then the baseline.
const WARM_UP_CALLS: usize = 50;
const BASELINE_CALLS: usize = 1_000;

/// Each honest call's budget.
const HONEST_BUDGET: Duration = Duration::from_secs(5);

/// How long the last connection of each flooding thread floods on after
/// the window: time for the server to read what it was sent.
const LAST_CONNECTION: Duration = Duration::from_millis(300);

/// How long a stopped server may take to close.
const SHUTDOWN: Duration = Duration::from_secs(2);

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RapidReset {
    /// One row per shape and server: for each shape, plain tonic, the
    /// layer alone and ours, in that order.
    pub rows: Vec<Row>,
    /// How long each row flooded.
    pub flooding_ms: f64,
    /// The most streams ours may take before a cut ([`CUT_WITHIN`]).
    pub cut_within: u32,
    /// The flooding threads ran on CPUs of their own, apart from the
    /// server's and the honest client's (false on a single CPU).
    pub cpus_split: bool,
}

impl RapidReset {
    /// The row of `server` under the flood `shape`.
    pub fn row(&self, shape: &str, server: &str) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.shape == shape && r.server == server)
    }
}

/// One server under one flood shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// `plain tonic`, `layer alone` or `ours`.
    pub server: String,
    /// `1 × fast`, `1 × 11 000/s`, `4 × fast`, `4 × 11 000/s`.
    pub shape: String,
    /// Flooding connections at once (one thread each).
    pub connections: usize,
    /// Streams per second per connection; `None`: as fast as the socket
    /// takes them.
    pub rate: Option<u32>,
    /// How the server cut the flooding connections off: `GOAWAY CODE`, or
    /// `closed` (without a GOAWAY), with how many of each when they
    /// differ; `not cut` when none was.
    pub cut: String,
    /// Connections cut off, by how (`GOAWAY ENHANCE_YOUR_CALM`, `closed`).
    pub cut_by: BTreeMap<String, u64>,
    /// Connections the flood opened (each thread connects again after a cut).
    pub connections_opened: u64,
    /// Connections the server cut off.
    pub connections_cut: u64,
    /// The most streams the server took on one connection before cutting
    /// it off (`None`: none was cut).
    pub streams_before_cut_max: Option<u32>,
    /// The median of the same, over the connections cut off.
    pub streams_before_cut_median: Option<u32>,
    /// The most streams written on one connection that was never cut off
    /// (it flooded until the window ended).
    pub streams_uncut_max: Option<u32>,
    /// Streams the flood wrote in all (opened and reset).
    pub streams_sent: u64,
    /// Connections the reset guard counted as cut off
    /// (`Metrics::reset_floods_cut`); `None` for the servers without it.
    pub guard_counted: Option<u64>,
    /// The honest client's median call before the flood, with threads
    /// spinning as the flooding threads will.
    pub honest_p50_before_ms: f64,
    /// Its median call during the flood.
    pub honest_p50_during_ms: f64,
    /// Calls it made during the flood.
    pub honest_calls: u64,
    /// Those that failed.
    pub honest_failures: u64,
    /// The first failure's status, if any.
    pub honest_first_failure: Option<String>,
}

/// A server under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    LayerAlone,
    Ours,
    PlainTls,
    OursTls,
}

impl Kind {
    const ALL: [Kind; 5] = [
        Kind::Plain,
        Kind::LayerAlone,
        Kind::Ours,
        Kind::PlainTls,
        Kind::OursTls,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::Plain => SERVERS[0],
            Kind::LayerAlone => SERVERS[1],
            Kind::Ours => SERVERS[2],
            Kind::PlainTls => SERVERS[3],
            Kind::OursTls => SERVERS[4],
        }
    }

    fn tls(self) -> bool {
        matches!(self, Kind::PlainTls | Kind::OursTls)
    }

    fn guarded(self) -> bool {
        matches!(self, Kind::Ours | Kind::OursTls)
    }
}

/// A server started for one row.
struct Running {
    addr: SocketAddr,
    stop: net::Stop,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Running {
    /// Serves the health check as `kind` says on a free loopback port (over
    /// TLS with `pki`'s server certificate); ours reports to `metrics`.
    async fn start(kind: Kind, metrics: &Metrics, pki: &Pki) -> anyhow::Result<Self> {
        // No delay on the servers' writes, for all three alike: the
        // honest client's latency is then the servers', not Nagle's.
        let (incoming, addr) = net::bind("127.0.0.1:0").await?;
        // The standard health check: answered at once, so the honest
        // client's latency is the server's own.
        let (_reporter, health) = tonic_health::server::health_reporter();
        let routes = Routes::new(health);
        let (stop, signal) = net::Stop::new();
        let task = match kind {
            Kind::Plain => tonic_deadline::detach(
                Server::builder()
                    .add_routes(routes)
                    .serve_with_incoming_shutdown(incoming, signal),
            ),
            Kind::LayerAlone => tonic_deadline::detach(
                Server::builder()
                    .layer(ServerDeadlineLayer::new())
                    .add_routes(routes)
                    .serve_with_incoming_shutdown(incoming, signal),
            ),
            Kind::Ours => {
                let guard = ResetGuard::new().observed_by(metrics.clone());
                tonic_deadline::detach(
                    guard
                        .builder()
                        .layer(ServerDeadlineLayer::new())
                        .add_routes(routes)
                        .serve_with_incoming_shutdown(guard.incoming(incoming), signal),
                )
            }
            Kind::PlainTls => {
                let identity = Identity::from_pem(&pki.server_cert_pem, &pki.server_key_pem);
                tonic_deadline::detach(
                    Server::builder()
                        .tls_config(ServerTlsConfig::new().identity(identity))?
                        .add_routes(routes)
                        .serve_with_incoming_shutdown(incoming, signal),
                )
            }
            Kind::OursTls => {
                let guard = ResetGuard::new().observed_by(metrics.clone());
                let tls = ServerTls::new(&pki.server_cert_pem, &pki.server_key_pem);
                tonic_deadline::detach(
                    guard
                        .builder()
                        .layer(ServerDeadlineLayer::new())
                        .add_routes(routes)
                        .serve_with_incoming_shutdown(guard.incoming_tls(incoming, tls)?, signal),
                )
            }
        };
        Ok(Self { addr, stop, task })
    }

    /// Stops the server and waits for it to close (or gives it up).
    async fn stop(self) {
        self.stop.stop();
        let mut task = self.task;
        if tokio::time::timeout(SHUTDOWN, &mut task).await.is_err() {
            task.abort();
        }
    }
}

/// One honest call: how long it took, and how it failed if it did.
#[derive(Debug)]
struct Call {
    took: Duration,
    failure: Option<String>,
}

/// What the honest client is asked to do: so many calls, or calls for so
/// long.
#[derive(Debug, Clone, Copy)]
enum Ask {
    Calls(usize),
    For(Duration),
}

type Asked = (Ask, oneshot::Sender<Result<Vec<Call>, String>>);

/// The honest client: on a thread and a runtime of its own, as a client on
/// another machine would be, so that its side of each call never waits in
/// the queue of the runtime that serves the flood; what it measures is the
/// server's answer. It calls the health check with a 5 s budget, one call at a
/// time, on its own connection.
struct Honest {
    asks: tokio::sync::mpsc::UnboundedSender<Asked>,
}

impl Honest {
    /// Starts the client of `addr`, over TLS trusting `tls`'s authority
    /// when given.
    fn start(addr: SocketAddr, tls: Option<&Pki>) -> Self {
        let ca = tls.map(|pki| pki.ca_pem.clone());
        let (asks, mut inbox) = tokio::sync::mpsc::unbounded_channel::<Asked>();
        std::thread::spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    if let Some((_, reply)) = inbox.blocking_recv() {
                        let _ = reply.send(Err(format!("the honest client's runtime: {e}")));
                    }
                    return;
                }
            };
            runtime.block_on(async move {
                let mut client = net::connect_layered_over(addr, ca.as_deref())
                    .await
                    .map(HealthClient::new)
                    .map_err(|e| format!("the honest client cannot connect: {e:#}"));
                while let Some((ask, reply)) = inbox.recv().await {
                    let calls = match &mut client {
                        Ok(client) => Ok(Self::calls(client, ask).await),
                        Err(e) => Err(e.clone()),
                    };
                    let _ = reply.send(calls);
                }
            });
        });
        Self { asks }
    }

    async fn calls(client: &mut HealthClient<Layered>, ask: Ask) -> Vec<Call> {
        let started = Instant::now();
        let mut calls = Vec::new();
        loop {
            let more = match ask {
                Ask::Calls(n) => calls.len() < n,
                Ask::For(lasting) => started.elapsed() < lasting,
            };
            if !more {
                return calls;
            }
            let at = Instant::now();
            let answer = Scope::background()
                .with_timeout(HONEST_BUDGET)
                .enter(client.check(HealthCheckRequest::default()))
                .await;
            calls.push(Call {
                took: at.elapsed(),
                failure: answer.err().map(|status| {
                    format!(
                        "{}: {}",
                        crate::report::code_name(status.code()),
                        status.message()
                    )
                }),
            });
        }
    }

    async fn ask(&self, ask: Ask) -> anyhow::Result<Vec<Call>> {
        let (reply, answer) = oneshot::channel();
        self.asks
            .send((ask, reply))
            .map_err(|_| anyhow::anyhow!("the honest client's thread ended"))?;
        answer
            .await
            .map_err(|_| anyhow::anyhow!("the honest client's thread ended"))?
            .map_err(|e| anyhow::anyhow!(e))
    }
}

fn median_ms(mut took: Vec<Duration>) -> f64 {
    if took.is_empty() {
        return f64::NAN;
    }
    took.sort();
    // Three decimals: a loopback call takes a fraction of a millisecond.
    (took[took.len() / 2].as_secs_f64() * 1_000_000.0).round() / 1000.0
}

/// The machine's CPUs split in two while the experiment runs: the server
/// and the honest client on one half, the flooding threads (and the
/// threads that spin in their place for the baseline) on the other, as if
/// the flood came from another machine. Without the split, the flooding
/// threads, which block and wake as often as the server's, would take
/// the cores from the server and the honest client in turns, and the
/// honest latency would measure the flood's client as much as the
/// server. The loopback's TCP work for what a thread sends runs on its
/// sender's CPU, the flood's; what the server does for each stream, on
/// the server's.
///
/// Every thread of the process is moved to the server's half (threads
/// started later inherit it from their parents); dropping the split gives
/// every thread all the CPUs back.
struct CpuSplit {
    all: CpuSet,
    flood: CpuSet,
}

impl CpuSplit {
    /// `None` on a single CPU, or where affinity cannot be set.
    fn new() -> Option<Self> {
        let all = rustix::thread::sched_getaffinity(None).ok()?;
        let cpus: Vec<usize> = (0..CpuSet::MAX_CPU).filter(|c| all.is_set(*c)).collect();
        if cpus.len() < 2 {
            return None;
        }
        let (server_cpus, flood_cpus) = cpus.split_at(cpus.len() / 2);
        let (mut server, mut flood) = (CpuSet::new(), CpuSet::new());
        server_cpus.iter().for_each(|c| server.set(*c));
        flood_cpus.iter().for_each(|c| flood.set(*c));
        let split = Self { all, flood };
        split.every_thread(&server).then_some(split)
    }

    /// Sets every thread of this process to `cpus`; whether all could be.
    fn every_thread(&self, cpus: &CpuSet) -> bool {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return false;
        };
        let mut all_set = true;
        for task in tasks.flatten() {
            let tid = task
                .file_name()
                .to_str()
                .and_then(|t| t.parse::<i32>().ok());
            if let Some(pid) = tid.and_then(rustix::process::Pid::from_raw) {
                // A thread that ended meanwhile needs nothing.
                all_set &= rustix::thread::sched_setaffinity(Some(pid), cpus).is_ok()
                    || !task.path().exists();
            }
        }
        all_set
    }
}

impl Drop for CpuSplit {
    fn drop(&mut self) {
        self.every_thread(&self.all);
    }
}

/// Moves the calling thread to `cpus`, if given.
fn run_on(cpus: Option<CpuSet>) {
    if let Some(cpus) = cpus {
        let _ = rustix::thread::sched_setaffinity(None, &cpus);
    }
}

/// Threads that spin as `n` flooding threads will, on the CPUs they will
/// run on, until dropped: the baseline sees the machine as busy as the
/// flood's client will make it.
struct Spinners {
    spinning: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Spinners {
    fn start(n: usize, cpus: Option<CpuSet>) -> Self {
        let spinning = Arc::new(AtomicBool::new(true));
        let threads = (0..n)
            .map(|_| {
                let spinning = spinning.clone();
                std::thread::spawn(move || {
                    run_on(cpus);
                    let mut n = 0u64;
                    while spinning.load(Ordering::Relaxed) {
                        n = std::hint::black_box(n.wrapping_add(1));
                    }
                })
            })
            .collect();
        Self { spinning, threads }
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        self.spinning.store(false, Ordering::Relaxed);
        // Each stops within a turn of its loop.
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// What the flooding threads saw: every connection, or the first thread
/// that failed.
type Floods = Result<Vec<Flood>, String>;

/// When the flooding threads stop.
#[derive(Debug, Default)]
struct Stops {
    /// Connect no more: the window is over.
    reconnect: AtomicBool,
    /// Stop flooding the connection open now, cut off or not.
    flood: AtomicBool,
}

/// Starts `connections` threads flooding `addr` with `shape`, each
/// connecting again whenever its connection is cut off, until `stops`
/// say so.
fn start_floods(
    addr: SocketAddr,
    shape: Shape,
    connections: usize,
    stops: &Arc<Stops>,
    give_up: Duration,
    cpus: Option<CpuSet>,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Vec<oneshot::Receiver<Floods>> {
    (0..connections)
        .map(|_| {
            let (done, floods) = oneshot::channel();
            let stops = stops.clone();
            let tls = tls.clone();
            std::thread::spawn(move || {
                // Each connection's reading thread, started by `flood`,
                // inherits the CPUs.
                run_on(cpus);
                let mut seen = Vec::new();
                let mut failed = None;
                while !stops.reconnect.load(Ordering::Relaxed) {
                    let stop = &stops.flood;
                    let one =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &tls {
                            Some(tls) => flood::flood_tls(addr, tls, PATH, shape, stop, give_up),
                            None => flood::flood(addr, PATH, shape, stop, give_up),
                        }));
                    match one {
                        Ok(one) => seen.push(one),
                        Err(_) => {
                            failed = Some("a flooding connection could not be made".to_owned());
                            break;
                        }
                    }
                }
                let _ = done.send(failed.map_or(Ok(seen), Err));
            });
            floods
        })
        .collect()
}

/// `GOAWAY ENHANCE_YOUR_CALM`, `closed`: how a connection was cut off.
fn how_cut(flood: &Flood) -> String {
    match flood.go_away {
        Some((code, _)) => format!(
            "GOAWAY {}",
            tonic_deadline_guard::frames::error_code_name(code)
        ),
        None => "closed".to_owned(),
    }
}

/// One row: `kind` flooded with `shape` by `connections` threads for
/// `flooding`, beside the honest client.
async fn row(
    kind: Kind,
    (label, connections, rate): (&str, usize, Option<u32>),
    flooding: Duration,
    flood_cpus: Option<CpuSet>,
    pki: &Pki,
) -> anyhow::Result<Row> {
    let metrics = Metrics::new();
    let server = Running::start(kind, &metrics, pki).await?;
    let addr = server.addr;
    let tls = kind.tls().then_some(pki);
    let honest = Honest::start(addr, tls);
    let warm = honest.ask(Ask::Calls(WARM_UP_CALLS)).await?;
    if let Some(failure) = warm.iter().find_map(|c| c.failure.as_ref()) {
        anyhow::bail!(
            "{}: an honest call failed before any flood: {failure}",
            kind.name()
        );
    }

    let before = {
        let _spinners = Spinners::start(connections, flood_cpus);
        honest.ask(Ask::Calls(BASELINE_CALLS)).await?
    };

    let shape = rate.map_or(Shape::FAST, |rate| Shape::at(rate).one_per_write());
    let stops = Arc::new(Stops::default());
    let floods = start_floods(
        addr,
        shape,
        connections,
        &stops,
        flooding * 4,
        flood_cpus,
        tls.map(Pki::client_config),
    );
    let during = honest.ask(Ask::For(flooding)).await?;
    // The last connection of each thread floods on for a moment, so that
    // one the server had yet to read is read, and cut off or not.
    stops.reconnect.store(true, Ordering::Relaxed);
    tokio::time::sleep(LAST_CONNECTION).await;
    stops.flood.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for thread in floods {
        all.extend(
            thread
                .await
                .map_err(|_| anyhow::anyhow!("a flooding thread died"))?
                .map_err(|e| anyhow::anyhow!("{}, {label}: {e}", kind.name()))?,
        );
    }
    drop(honest);
    server.stop().await;
    let failures: Vec<&String> = during.iter().filter_map(|c| c.failure.as_ref()).collect();

    // The last connection of each thread was stopped after the window,
    // unless the server cut it off first.
    let (cut, uncut): (Vec<&Flood>, Vec<&Flood>) = all.iter().partition(|f| f.was_cut());
    let mut cut_by = BTreeMap::new();
    for flood in &cut {
        *cut_by.entry(how_cut(flood)).or_insert(0u64) += 1;
    }
    let mut before_cut: Vec<u32> = cut.iter().map(|f| f.before_cut()).collect();
    before_cut.sort_unstable();
    Ok(Row {
        server: kind.name().to_owned(),
        shape: label.to_owned(),
        connections,
        rate,
        cut: describe(&cut_by),
        cut_by,
        connections_opened: all.len() as u64,
        connections_cut: cut.len() as u64,
        streams_before_cut_max: before_cut.last().copied(),
        streams_before_cut_median: before_cut.get(before_cut.len() / 2).copied(),
        streams_uncut_max: uncut.iter().map(|f| f.sent).max(),
        streams_sent: all.iter().map(|f| u64::from(f.sent)).sum(),
        guard_counted: kind.guarded().then(|| metrics.reset_floods_cut()),
        honest_p50_before_ms: median_ms(before.iter().map(|c| c.took).collect()),
        honest_p50_during_ms: median_ms(during.iter().map(|c| c.took).collect()),
        honest_calls: during.len() as u64,
        honest_failures: failures.len() as u64,
        honest_first_failure: failures.first().map(|f| (*f).clone()),
    })
}

/// `GOAWAY ENHANCE_YOUR_CALM`; `GOAWAY ENHANCE_YOUR_CALM 40, closed 2`
/// when the connections were cut off in different ways; `not cut`.
fn describe(cut_by: &BTreeMap<String, u64>) -> String {
    match cut_by.len() {
        0 => "not cut".to_owned(),
        1 => cut_by.keys().next().cloned().unwrap_or_default(),
        _ => cut_by
            .iter()
            .map(|(how, n)| format!("{how} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// Floods each server with each shape, `flooding` per row.
///
/// # Errors
///
/// When a server cannot start, the honest client cannot connect or fails
/// before any flood, or a flooding connection cannot be made.
pub async fn measure(flooding: Duration) -> anyhow::Result<RapidReset> {
    let split = CpuSplit::new();
    let flood_cpus = split.as_ref().map(|s| s.flood);
    let pki = Pki::new();
    let mut rows = Vec::new();
    for shape in SHAPES {
        for kind in Kind::ALL {
            rows.push(row(kind, shape, flooding, flood_cpus, &pki).await?);
        }
    }
    Ok(RapidReset {
        rows,
        flooding_ms: ms(flooding),
        cut_within: CUT_WITHIN,
        cpus_split: split.is_some(),
    })
}

/// A count that may be missing, as the table shows it.
fn or_dash(n: Option<u32>) -> String {
    n.map_or_else(|| "—".to_owned(), |n| n.to_string())
}

impl Experiment for RapidReset {
    const NAME: &'static str = "rapid-reset";
    const ABOUT: &'static str = "HTTP/2 Rapid Reset floods, fast and slow, on one connection and four, in the clear and over TLS: how plain tonic, the layer alone and ours cut them off, and an honest client's latency beside them";
    const PRINTS: &'static str =
        "HTTP/2 Rapid Reset floods against plain tonic, the layer alone and ours: how each server cuts them off, and an honest client's latency beside them ([more](#experiment-rapid-reset))";
    const SECTION: Option<Section> = Some(Section::ResetFloods);
    type Args = Args;

    fn demo_args() -> Args {
        Args {
            flood_ms: DEMO_FLOOD_MS,
        }
    }

    async fn run(args: Args, _: Spans) -> anyhow::Result<Self> {
        measure(Duration::from_millis(args.flood_ms.clamp(100, 60_000))).await
    }

    fn outcome(&self) -> Outcome {
        let rows = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.shape.clone(),
                    r.server.clone(),
                    r.cut.clone(),
                    format!("{} of {}", r.connections_cut, r.connections_opened),
                    or_dash(r.streams_before_cut_max),
                    or_dash(r.streams_before_cut_median),
                    or_dash(r.streams_uncut_max),
                    format!("{:.3}", r.honest_p50_before_ms),
                    format!("{:.3}", r.honest_p50_during_ms),
                    r.honest_calls.to_string(),
                    r.honest_failures.to_string(),
                ]
            })
            .collect();
        let mut notes = vec![
            format!(
                "each row: a fresh server, flooded for {:.1} s; each flooding thread connects again whenever it is cut off; streams per connection: those the server took before the cut (the last stream its GOAWAY names, or all written when it only closed)",
                self.flooding_ms / 1000.0
            ),
            "uncut: the most streams on one connection the server never cut off".into(),
            format!(
                "honest: one client on its own connection calling grpc.health.v1.Health/Check in a loop; before: {BASELINE_CALLS} calls while threads spin as the flooding threads will; {}",
                if self.cpus_split {
                    "the flooding and spinning threads on half the CPUs, the server and the honest client on the other half"
                } else {
                    "all threads on one CPU"
                }
            ),
            format!(
                "ours must cut every flooding connection within {} streams, with no honest failure, and answer the honest client within {HONEST_P50_VS_PLAIN} x plain tonic's median beside the same flood and within {HONEST_P50_VS_BEFORE} x its own before the flood",
                self.cut_within
            ),
            format!(
                "honest median during / before: {}",
                self.rows
                    .iter()
                    .map(|r| format!(
                        "{}, {} {:.2}",
                        r.shape,
                        r.server,
                        r.honest_p50_during_ms / r.honest_p50_before_ms
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        ];
        let counted: Vec<String> = self
            .rows
            .iter()
            .filter_map(|r| {
                r.guard_counted
                    .map(|n| format!("{}, {} {n} of {}", r.shape, r.server, r.connections_cut))
            })
            .collect();
        if !counted.is_empty() {
            notes.push(format!(
                "cut off as counted by the guard (Metrics::reset_floods_cut) of those the flood saw cut: {}",
                counted.join("; ")
            ));
        }
        for r in self.rows.iter().filter(|r| r.honest_failures > 0) {
            notes.push(format!(
                "{}, {}: first honest failure: {}",
                r.shape,
                r.server,
                r.honest_first_failure.as_deref().unwrap_or("?")
            ));
        }
        Outcome {
            title: "rapid-reset: HTTP/2 Rapid Reset floods (streams opened and reset at once) against plain tonic, the layer alone and ours, in the clear and over TLS, beside an honest client".into(),
            json: crate::report::to_json(self),
            columns: vec![
                "flood",
                "server",
                "cut",
                "connections cut",
                "streams before cut max",
                "median",
                "uncut",
                "honest p50 before ms",
                "during ms",
                "honest calls",
                "honest failures",
            ],
            rows,
            notes,
        }
    }

    fn report(&self, table: &Outcome) -> Vec<Part> {
        vec![Part::new(chart::table(table))]
    }
}
