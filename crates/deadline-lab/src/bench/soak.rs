//! A long soak through client → A → B → C: many calls with random
//! deadlines (1–50 ms) and random client cancels, then a look at what is
//! left: memory, tasks, admission permits, database connections.
//!
//! C is the hop that holds the scarce resources. For each call it
//!
//! 1. takes a permit from an [`Admission`] (its worker slots),
//! 2. spawns a child task under the request's scope that only ends when the
//!    scope does (an audit writer, say: if cancellation did not reach it, it
//!    would stay alive for ever and be counted as leaked),
//! 3. runs a pooled SQLite query of random length (0–0.5 ms of counting) that
//!    is interrupted on the database when the scope ends.
//!
//! The client runs `concurrency` loops; each call gets a deadline drawn from
//! 1–50 ms, and a fraction of them is cancelled at a random moment before its
//! deadline — half by cancelling the call's scope (the client answers
//! `CANCELLED` and resets the stream), half by dropping the call's future
//! (the stream is reset, no status is seen).
//!
//! Everything runs on a runtime of its own, so its task count is the soak's
//! alone. The figures are read at three quiet points — before the first
//! call, after the warm-up, after the last call — each once in-flight work
//! has drained (bounded: at most [`SETTLE`]):
//!
//! - `tasks_leaked`: tokio's `num_alive_tasks` after the last call minus
//!   after the warm-up (connections are open at both points);
//! - `permits_held`: C's admission permits in use;
//! - `db_conns_held`: C's pooled SQLite connections not idle;
//! - `unexpected_status`: answers other than OK, `DEADLINE_EXCEEDED` and
//!   `CANCELLED`;
//! - resident memory (`VmRSS`) at the three points.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use grpc_deadline_db::sqlite::SqlitePool;
use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use testkit::{CallReply, CallRequest};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic::service::Routes;
use tonic::transport::Endpoint;
use tonic::{Request, Response, Status};
use tonic_deadline::admission::Admission;
use tonic_deadline::client::{ReadyChannel, ReadyChannelBuilder};
use tonic_deadline::server::ResetGuard;
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::html::chart::{self, Bar};
use crate::html::{Part, Section};
use crate::net::{self, Layered};
use crate::report::{Outcome, code_name};
use crate::systems::chain::{Hop, Next, Plan};

/// The longest a quiet point waits for in-flight work to drain.
pub const SETTLE: Duration = Duration::from_secs(3);

/// SQLite counts roughly this many rows per millisecond on this machine
/// class.
const ROWS_PER_MS: u64 = 6_000;

/// C's longest query, in rows: half a millisecond of counting.
const MAX_ROWS: u64 = ROWS_PER_MS / 2;

/// How many calls and for how long.
#[derive(Debug, Clone)]
pub struct Load {
    /// Calls to make in all (warm-up included).
    pub calls: u64,
    /// The soak stops issuing calls after this long, whatever is left.
    pub max: Duration,
    /// Client loops running calls at the same time.
    pub concurrency: usize,
    /// The fraction of calls the client cancels before their deadline.
    pub cancel_fraction: f64,
    /// Seed of the random deadlines, cancels and query lengths.
    pub seed: u64,
    /// C's admission permits.
    pub permits: usize,
    /// C's pooled SQLite connections.
    pub connections: usize,
    /// Every hop's HTTP/2 guard against rapid resets: how many streams a
    /// client may have reset before the server accepted them, at one time
    /// on one connection, before the server closes the connection
    /// (`GOAWAY ENHANCE_YOUR_CALM`). Every expired deadline is a reset, so
    /// short deadlines under load trip hyper's default of 20. `None`: what
    /// a `tonic_deadline::server::ResetGuard`'s builder sets.
    pub pending_accept_resets: Option<usize>,
    /// How many streams each client connection remembers having reset
    /// (for one second). h2 ignores the peer's late frames on a remembered
    /// stream but charges each small DATA frame among them, for good, to
    /// the connection's budget for small DATA frames, and closes the
    /// connection when it runs out (`ENHANCE_YOUR_CALM`); on a forgotten
    /// stream it answers with a reset, which `ReadyChannel` lets it do
    /// without bound. `None`: `ReadyChannel`'s default, none.
    pub remembered_resets: Option<usize>,
}

impl Default for Load {
    fn default() -> Self {
        Self {
            calls: 1_000_000,
            max: Duration::from_secs(900),
            concurrency: 32,
            cancel_fraction: 0.2,
            seed: 0x5eed,
            permits: 8,
            connections: 4,
            pending_accept_resets: None,
            remembered_resets: None,
        }
    }
}

impl Load {
    /// The calls run before the baseline is read: a tenth, at least 1 000
    /// and at most 100 000.
    pub fn warmup_calls(&self) -> u64 {
        (self.calls / 10).clamp(1_000.min(self.calls), 100_000)
    }
}

/// What the soak measured. The printed table, `--json` and the tests all
/// read this.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Soak {
    /// Calls made (equal to `calls_requested` unless stopped by time).
    pub calls: u64,
    /// Calls asked for.
    pub calls_requested: u64,
    /// Of `calls`, those of the warm-up.
    pub warmup_calls: u64,
    /// Whether `--max-seconds` ended the soak before all calls were made.
    pub stopped_by_time: bool,
    /// Wall time of all calls, seconds.
    pub seconds: f64,
    /// Calls per second.
    pub calls_per_second: f64,
    /// Resident memory before the first call, MB.
    pub rss_start_mb: f64,
    /// Resident memory after the warm-up, MB.
    pub rss_after_warmup_mb: f64,
    /// Resident memory after the last call, MB.
    pub rss_end_mb: f64,
    /// `rss_end_mb − rss_after_warmup_mb`.
    pub rss_growth_after_warmup_mb: f64,
    /// Tasks alive on the soak's runtime after the warm-up (connections,
    /// servers).
    pub tasks_after_warmup: u64,
    /// Tasks alive after the last call.
    pub tasks_end: u64,
    /// `tasks_end − tasks_after_warmup` (negative if fewer remain).
    pub tasks_leaked: i64,
    /// TCP connections open to A, B and C after the warm-up (each one
    /// carries tasks of its own: the task count compares like with like
    /// only if this does not change).
    pub connections_after_warmup: u64,
    /// TCP connections open to A, B and C after the last call.
    pub connections_end: u64,
    /// The rapid-reset guard the hops ran with.
    pub pending_accept_resets: usize,
    /// The reset streams each client connection remembered.
    pub remembered_resets: usize,
    /// C's admission permits in use after the last call.
    pub permits_held: u64,
    /// C's SQLite connections not back in the pool after the last call.
    pub db_conns_held: u64,
    /// Answers other than OK, `DEADLINE_EXCEEDED`, `CANCELLED`.
    pub unexpected_status: u64,
    /// Answers by status name, plus `dropped` for calls whose future the
    /// client dropped.
    pub statuses: BTreeMap<String, u64>,
    /// The unexpected answers by status and message (the first 16 kinds).
    pub unexpected: BTreeMap<String, u64>,
    /// Calls the client cancelled through their scope.
    pub client_cancels: u64,
    /// Calls whose future the client dropped.
    pub client_drops: u64,
    /// C's queries stopped on the database because their scope ended.
    pub queries_interrupted: u64,
    /// Permits C's admission granted.
    pub permits_granted: u64,
    /// Child tasks C spawned under request scopes.
    pub children_spawned: u64,
    /// Whether every quiet point drained within the settle bound.
    pub settled: bool,
}

impl Soak {
    /// The goal: nothing leaked, no unexpected status, memory flat after the
    /// warm-up (growth ≤ `max_growth_mb`).
    pub fn holds(&self, max_growth_mb: f64) -> bool {
        self.tasks_leaked == 0
            && self.connections_end == self.connections_after_warmup
            && self.permits_held == 0
            && self.db_conns_held == 0
            && self.unexpected_status == 0
            && self.rss_growth_after_warmup_mb <= max_growth_mb
    }
}

/// The flags of `bench soak`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Calls in all, warm-up (a tenth) included.
    #[arg(long, default_value_t = 1_000_000)]
    calls: u64,
    /// Stop issuing calls after this many seconds, whatever is left.
    #[arg(long, default_value_t = 900)]
    max_seconds: u64,
    /// Client loops calling at the same time.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Streams a client may have reset before the server accepted them,
    /// at one time on one connection, before the server closes it
    /// (hyper's rapid-reset guard; hyper's default is 20). Without it,
    /// what a `tonic_deadline::server::ResetGuard`'s builder sets.
    #[arg(long)]
    max_pending_accept_resets: Option<usize>,
    /// Streams each client connection remembers having reset, so that
    /// late frames on them are ignored (h2's default is 50); h2 charges
    /// each small DATA frame it ignores to a budget that closes the
    /// connection when spent. Without it, `ReadyChannel`'s default: none.
    #[arg(long)]
    remembered_resets: Option<usize>,
}

/// The demo's soak: long enough to see a flat memory line, short enough to
/// keep the demo brief (`bench soak` runs 10^6).
const DEMO_CALLS: u64 = 30_000;

impl crate::registry::Experiment for Soak {
    const NAME: &'static str = "soak";
    const ABOUT: &'static str = "Many calls through A -> B -> C with random deadlines and client cancels; then memory, tasks, permits and connections left over";
    const PRINTS: &'static str =
        "10⁶ calls (default) through A → B → C with random 1–50 ms deadlines and client cancels; then memory, tasks, permits, database connections and statuses left over";
    const KIND: crate::registry::Kind = crate::registry::Kind::Bench;
    const SECTION: Option<Section> = Some(Section::LeftBehind);
    type Args = Args;

    fn demo_args() -> Args {
        Args {
            calls: DEMO_CALLS,
            max_seconds: 60,
            concurrency: 32,
            max_pending_accept_resets: None,
            remembered_resets: None,
        }
    }

    async fn run(args: Args, _: crate::registry::Spans) -> anyhow::Result<Self> {
        run_on_own_runtime(Load {
            calls: args.calls,
            max: Duration::from_secs(args.max_seconds),
            concurrency: args.concurrency.clamp(1, 4096),
            pending_accept_resets: args.max_pending_accept_resets,
            remembered_resets: args.remembered_resets,
            ..Default::default()
        })
        .await
    }

    fn outcome(&self) -> Outcome {
        let row =
            |what: &str, value: String, goal: &str| vec![what.to_owned(), value, goal.to_owned()];
        let mut notes = vec![format!(
            "{} calls in {:.1} s ({:.0} calls/s), warm-up {} calls{}",
            self.calls,
            self.seconds,
            self.calls_per_second,
            self.warmup_calls,
            if self.stopped_by_time {
                format!(" — stopped by time, {} asked", self.calls_requested)
            } else {
                String::new()
            }
        )];
        notes.push(format!(
            "statuses: {}",
            self.statuses
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        notes.push(format!(
            "C: {} permits granted, {} queries interrupted on the database, {} child tasks spawned under request scopes",
            self.permits_granted, self.queries_interrupted, self.children_spawned
        ));
        for (what, n) in &self.unexpected {
            notes.push(format!("unexpected: {n} x {what}"));
        }
        if !self.settled {
            notes.push(format!(
                "in-flight work had not drained {} s after a phase",
                SETTLE.as_secs()
            ));
        }
        Outcome {
            title: format!(
                "bench soak: {} calls client -> A -> B -> C, deadlines 1-50 ms, random client cancels",
                self.calls
            ),
            json: crate::report::to_json(self),
            columns: vec!["figure", "measured", "goal"],
            rows: vec![
                row("rss at start MB", format!("{:.1}", self.rss_start_mb), ""),
                row(
                    "rss after warm-up MB",
                    format!("{:.1}", self.rss_after_warmup_mb),
                    "",
                ),
                row("rss at end MB", format!("{:.1}", self.rss_end_mb), ""),
                row(
                    "rss growth after warm-up MB",
                    format!("{:+.1}", self.rss_growth_after_warmup_mb),
                    "<= 5",
                ),
                row(
                    "tasks leaked",
                    format!(
                        "{} ({} -> {})",
                        self.tasks_leaked, self.tasks_after_warmup, self.tasks_end
                    ),
                    "0",
                ),
                row(
                    "connections to A, B, C",
                    format!(
                        "{} -> {}",
                        self.connections_after_warmup, self.connections_end
                    ),
                    "unchanged",
                ),
                row("permits held", self.permits_held.to_string(), "0"),
                row("db connections held", self.db_conns_held.to_string(), "0"),
                row(
                    "unexpected statuses",
                    self.unexpected_status.to_string(),
                    "0",
                ),
            ],
            notes,
        }
    }

    /// Resident memory through the soak, and what it left behind as its
    /// table tells it.
    fn report(&self, table: &Outcome) -> Vec<Part> {
        let bars = vec![
            Bar::new("start", self.rss_start_mb, None),
            Bar::new("after warm-up", self.rss_after_warmup_mb, None),
            Bar::new("end", self.rss_end_mb, None).note(format!(
                "{:+.1} MB after warm-up",
                self.rss_growth_after_warmup_mb
            )),
        ];
        let mut html = chart::hbars(
            "soak-rss",
            &format!(
                "Soak, {} calls with 1-50 ms deadlines and client cancels: resident memory",
                self.calls
            ),
            "MB",
            &bars,
        );
        html.push_str(&chart::rows(table));
        vec![Part::new(html)]
    }
}

/// C: a permit, a child task tied to the request, a pooled query.
#[derive(Clone)]
struct Store {
    admission: Admission,
    pool: SqlitePool,
    children: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl testkit::CallOnly for Store {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        let rows = request.into_inner().work_ms.min(MAX_ROWS);
        let scope = Scope::current();
        let _slot = self.admission.acquire(&scope).await?;
        // Ends only when the request's scope does (completed, deadline,
        // caller cancel): a task that cancellation failed to reach would
        // stay alive and show in the task count.
        drop(scope.spawn(std::future::pending::<()>()));
        self.children.fetch_add(1, Ordering::Relaxed);
        let count: i64 = self
            .pool
            .acquire(&scope)
            .await?
            .run(move |c| {
                c.query_row(
                    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < ?1) \
                     SELECT count(*) FROM c",
                    [rows as i64],
                    |r| r.get(0),
                )
            })
            .await?;
        Ok(Response::new(CallReply {
            hops: Vec::new(),
            payload: count.to_string(),
        }))
    }
}

/// The client's tallies, shared by its loops.
#[derive(Debug, Default)]
struct Tally {
    started: AtomicU64,
    cancels: AtomicU64,
    drops: AtomicU64,
    statuses: std::sync::Mutex<BTreeMap<&'static str, u64>>,
    unexpected: std::sync::Mutex<BTreeMap<String, u64>>,
}

impl Tally {
    fn count(&self, status: &'static str) {
        let mut statuses = self.statuses.lock().unwrap_or_else(|p| p.into_inner());
        *statuses.entry(status).or_default() += 1;
    }

    fn unexpected(&self, status: &Status) {
        let mut unexpected = self.unexpected.lock().unwrap_or_else(|p| p.into_inner());
        let key = format!("{}: {}", code_name(status.code()), status.message());
        if unexpected.len() < 16 || unexpected.contains_key(&key) {
            *unexpected.entry(key).or_default() += 1;
        }
    }
}

/// How one call ends, drawn before it starts.
enum Ending {
    Natural,
    CancelAfter(Duration),
    DropAfter(Duration),
}

async fn one_call(
    client: ProbeClient<Layered>,
    rng: &mut fastrand::Rng,
    load: &Load,
    tally: &Tally,
) {
    let deadline = Duration::from_millis(rng.u64(1..=50));
    let rows = rng.u64(0..=MAX_ROWS);
    let ending = if rng.f64() < load.cancel_fraction {
        let after = Duration::from_micros(rng.u64(0..deadline.as_micros() as u64));
        if rng.bool() {
            Ending::CancelAfter(after)
        } else {
            Ending::DropAfter(after)
        }
    } else {
        Ending::Natural
    };
    let scope = Scope::background().with_timeout(deadline);
    let mut client = client;
    let call = scope.enter(client.call(CallRequest {
        work_ms: rows,
        ..Default::default()
    }));
    tokio::pin!(call);
    let result = match ending {
        Ending::Natural => call.await,
        Ending::CancelAfter(after) => {
            tokio::select! {
                biased;
                result = &mut call => result,
                () = tokio::time::sleep(after) => {
                    tally.cancels.fetch_add(1, Ordering::Relaxed);
                    scope.cancel();
                    call.await
                }
            }
        }
        Ending::DropAfter(after) => {
            tokio::select! {
                biased;
                result = &mut call => result,
                () = tokio::time::sleep(after) => {
                    tally.drops.fetch_add(1, Ordering::Relaxed);
                    tally.count("dropped");
                    return;
                }
            }
        }
    };
    match &result {
        Ok(_) => tally.count("OK"),
        Err(status) => {
            tally.count(code_name(status.code()));
            if !matches!(
                status.code(),
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ) {
                tally.unexpected(status);
            }
        }
    }
}

/// Runs calls from `concurrency` loops until `until` calls have started or
/// `stop_at` has passed; returns once every loop has finished its last call.
async fn drive(
    clients: &[ProbeClient<Layered>],
    load: &Load,
    tally: &Arc<Tally>,
    until: u64,
    stop_at: Instant,
    phase: u64,
) -> anyhow::Result<()> {
    let mut loops = tokio::task::JoinSet::new();
    for i in 0..load.concurrency {
        let client = clients[i % clients.len()].clone();
        let load = load.clone();
        let tally = tally.clone();
        let mut rng = fastrand::Rng::with_seed(load.seed ^ (phase << 32) ^ i as u64);
        #[allow(clippy::disallowed_methods)] // the load generator is no request's work
        loops.spawn(async move {
            while Instant::now() < stop_at && tally.started.fetch_add(1, Ordering::Relaxed) < until
            {
                one_call(client.clone(), &mut rng, &load, &tally).await;
            }
        });
    }
    while let Some(joined) = loops.join_next().await {
        joined?;
    }
    // Loops overshoot the counter by one each when they stop.
    tally.started.fetch_min(until, Ordering::Relaxed);
    Ok(())
}

/// A hop that forwards at once to `next` through our client layer.
fn forwarder(name: &'static str, next: SocketAddr, remembered: usize) -> anyhow::Result<Routes> {
    let next = Next::Layered(ProbeClient::new(net::layered(
        channel(next, remembered)?.lazy(),
    )));
    Ok(Hop::new(name, Plan::default(), Some(next)).routes())
}

/// A channel to `addr` remembering `remembered` reset streams.
fn channel(addr: SocketAddr, remembered: usize) -> anyhow::Result<ReadyChannelBuilder> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?.tcp_nodelay(true);
    Ok(ReadyChannel::builder(&endpoint).remembered_resets(remembered))
}

/// Serves `routes` behind our server layer on a free loopback port, with
/// the library's reset guard, hyper's bound on resets before accept set to
/// `pending_accept_resets`.
async fn serve(routes: Routes, pending_accept_resets: usize) -> anyhow::Result<SocketAddr> {
    let (incoming, addr) = net::bind("127.0.0.1:0").await?;
    let guard = ResetGuard::new();
    let server = guard
        .builder()
        .configure(|server| {
            server.http2_max_pending_accept_reset_streams(Some(pending_accept_resets))
        })
        .layer(ServerDeadlineLayer::new())
        .add_routes(routes);
    tonic_deadline::detach(server.serve_with_incoming(guard.incoming(incoming)));
    Ok(addr)
}

/// Resident memory of this process, MB (`VmRSS` in `/proc/self/status`).
pub fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| (kb / 1024.0 * 10.0).round() / 10.0)
}

/// Established TCP connections whose local port is one of `ports` (the
/// server side of connections to them), from `/proc/net/tcp`.
pub fn established_to(ports: &[u16]) -> u64 {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return 0;
    };
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let mut fields = line.split_whitespace().skip(1);
            let local = fields.next().unwrap_or_default();
            let state = fields.nth(1).unwrap_or_default();
            let port = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            state == "01" && port.is_some_and(|p| ports.contains(&p))
        })
        .count() as u64
}

/// What a quiet point reads.
#[derive(Debug, Clone, Copy)]
struct Quiet {
    tasks: u64,
    connections: u64,
    permits: u64,
    conns: u64,
    rss: f64,
    settled: bool,
}

/// Waits (at most [`SETTLE`]) until C holds nothing and the task count has
/// stopped falling, then reads the figures.
async fn quiet(store: &Store, ports: &[u16]) -> Quiet {
    let runtime = tokio::runtime::Handle::current();
    let read = || {
        let stats = store.pool.stats();
        (
            runtime.metrics().num_alive_tasks() as u64,
            store.admission.stats().in_use as u64,
            (stats.size - stats.idle) as u64,
        )
    };
    let give_up = Instant::now() + SETTLE;
    let mut last = read();
    let mut steady = 0;
    let settled = loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = read();
        steady = if now == last && now.1 == 0 && now.2 == 0 {
            steady + 1
        } else {
            0
        };
        last = now;
        if steady >= 5 {
            break true;
        }
        if Instant::now() >= give_up {
            break false;
        }
    };
    Quiet {
        tasks: last.0,
        connections: established_to(ports),
        permits: last.1,
        conns: last.2,
        rss: rss_mb(),
        settled,
    }
}

/// Runs the soak on the current runtime (see [`run_on_own_runtime`]).
///
/// # Errors
///
/// When a service cannot be started.
pub async fn run(load: Load) -> anyhow::Result<Soak> {
    let start = rss_mb();
    let store = Store {
        admission: Admission::new(load.permits.max(1)),
        pool: SqlitePool::open_in_memory(load.connections.max(1))?,
        children: Arc::new(AtomicU64::new(0)),
    };
    let guard = load
        .pending_accept_resets
        .unwrap_or(tonic_deadline::server::PENDING_ACCEPT_RESETS);
    let c = serve(Routes::new(ProbeServer::new(store.clone())), guard).await?;
    let remembered = load
        .remembered_resets
        .unwrap_or(tonic_deadline::client::REMEMBERED_RESETS);
    let b = serve(forwarder("B", c, remembered)?, guard).await?;
    let a = serve(forwarder("A", b, remembered)?, guard).await?;
    let ports = [a.port(), b.port(), c.port()];
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(ProbeClient::new(net::layered(
            channel(a, remembered)?.connect().await?,
        )));
    }

    let tally = Arc::new(Tally::default());
    let began = Instant::now();
    let stop_at = began + load.max;
    let warmup = load.warmup_calls();
    drive(&clients, &load, &tally, warmup, stop_at, 0).await?;
    let warmup_took = began.elapsed();
    let after_warmup = quiet(&store, &ports).await;
    let steady_began = Instant::now();
    drive(
        &clients,
        &load,
        &tally,
        load.calls,
        stop_at + (steady_began - began - warmup_took),
        1,
    )
    .await?;
    // Calling time only: the quiet points are not counted.
    let seconds = (warmup_took + steady_began.elapsed()).as_secs_f64();
    let end = quiet(&store, &ports).await;

    let calls = tally.started.load(Ordering::Relaxed).min(load.calls);
    let statuses: BTreeMap<String, u64> = tally
        .statuses
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(k, v)| ((*k).to_owned(), *v))
        .collect();
    let unexpected_status = statuses
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "OK" | "DEADLINE_EXCEEDED" | "CANCELLED" | "dropped"
            )
        })
        .map(|(_, v)| v)
        .sum();
    let admission = store.admission.stats();
    Ok(Soak {
        calls,
        calls_requested: load.calls,
        warmup_calls: warmup.min(calls),
        stopped_by_time: calls < load.calls,
        seconds: (seconds * 10.0).round() / 10.0,
        calls_per_second: (calls as f64 / seconds).round(),
        rss_start_mb: start,
        rss_after_warmup_mb: after_warmup.rss,
        rss_end_mb: end.rss,
        rss_growth_after_warmup_mb: ((end.rss - after_warmup.rss) * 10.0).round() / 10.0,
        tasks_after_warmup: after_warmup.tasks,
        tasks_end: end.tasks,
        tasks_leaked: end.tasks as i64 - after_warmup.tasks as i64,
        connections_after_warmup: after_warmup.connections,
        connections_end: end.connections,
        pending_accept_resets: guard,
        remembered_resets: remembered,
        permits_held: end.permits,
        db_conns_held: end.conns,
        unexpected_status,
        statuses,
        unexpected: tally
            .unexpected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
        client_cancels: tally.cancels.load(Ordering::Relaxed),
        client_drops: tally.drops.load(Ordering::Relaxed),
        queries_interrupted: store.pool.stats().cancels,
        permits_granted: admission.granted,
        children_spawned: store.children.load(Ordering::Relaxed),
        settled: after_warmup.settled && end.settled,
    })
}

/// Runs the soak on a runtime of its own (two worker threads, at most eight
/// blocking threads for the SQLite queries), so that its task count is the
/// soak's alone.
///
/// # Errors
///
/// When the runtime or a service cannot be started.
pub async fn run_on_own_runtime(load: Load) -> anyhow::Result<Soak> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(8)
            .enable_all()
            .build();
        let result = match runtime {
            Ok(runtime) => runtime.block_on(run(load)),
            Err(err) => Err(err.into()),
        };
        let _ = tx.send(result);
    });
    rx.await?
}
