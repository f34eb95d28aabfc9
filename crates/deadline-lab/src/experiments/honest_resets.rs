//! Honest clients that end their streams early, against plain tonic, the
//! layer alone and ours as the README serves it (`ResetGuard`'s builder,
//! its connections, the layer), one server after the other in one run.
//!
//! A reset guard that takes honest traffic for a flood cuts its connections
//! and fails its calls; plain tonic's guard (hyper's: more than 20 streams
//! reset before the server accepted them, at once on one connection) does
//! not see most of these patterns at all. So each pattern is judged by what
//! plain tonic does with it: a call ends in one of the pattern's own
//! outcomes (an answer, its deadline, the client's own timeout or cancel),
//! or it *fails* (anything else: a connection the server cut, a refusal).
//! Ours may fail no more calls than plain tonic, and with no status plain
//! tonic's calls did not see.
//!
//! The patterns:
//! - **deadline storm**: 4 connections × 16 callers, our client layer,
//!   every call with a 2 ms budget, a third of them asking for 5 ms of work;
//! - **hedging 0 s** and **hedging 5 ms**: our resilience layer with a
//!   `hedgingPolicy` of 3 attempts after `hedgingDelay`, 5 % of attempts
//!   20 ms slow: the losers are reset as soon as a winner answers;
//! - **client timeout 1 ms** and **8 ms**: plain tonic clients that bound
//!   each call with `tokio::time::timeout`, no `grpc-timeout` on the wire,
//!   through a one-second latency spike (every call takes 1 s): every call
//!   of the spike resets its stream at the client's timeout;
//! - **cancel most**: plain tonic clients that drop each call after 1 to
//!   10 ms, before its answer (0 to 10 ms of work) more often than not;
//! - **NAT neighbours of a flood**: short-lived clients (each connects,
//!   makes 5 calls, and goes) from the address a reconnecting Rapid Reset
//!   flood comes from, as behind a NAT or a proxy that hides addresses:
//!   their connect and first call, p50 and p99.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use testkit::flood::{self, Shape};
use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use testkit::{CallReply, CallRequest};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic::service::Routes;
use tonic::transport::Server;
use tonic::{Request, Response, Status};
use tonic_deadline::observe::Metrics;
use tonic_deadline::resilience::ResilienceLayer;
use tonic_deadline::server::ResetGuard;
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::net;
use crate::registry::{Experiment, Spans};
use crate::report::{Outcome, quantile};

/// The servers, in the order each pattern meets them.
pub const SERVERS: [&str; 3] = ["plain tonic", "layer alone", "ours"];

/// The patterns, in order.
pub const PATTERNS: [&str; 7] = [
    "deadline storm",
    "hedging 0 s",
    "hedging 5 ms",
    "client timeout 1 ms",
    "client timeout 8 ms",
    "cancel most",
    "NAT neighbours of a flood",
];

/// How long each pattern runs against each server when run alone.
pub const WINDOW_MS: u64 = 1500;

/// How long each pattern runs in the demo: 300 ms hold hundreds of calls
/// per pattern and server; the client-timeout patterns still run a second,
/// through their latency spike.
pub const DEMO_WINDOW_MS: u64 = 300;

/// The flags of `experiment honest-resets`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// How long each pattern runs against each server, in milliseconds
    /// (at least 200; the client-timeout patterns run at least 1 000:
    /// their latency spike lasts a second).
    #[arg(long, default_value_t = WINDOW_MS)]
    window_ms: u64,
}

/// What a call ended with when the client gave up on its own (its
/// `tokio::time::timeout`), or dropped it.
const CLIENT_TIMEOUT: &str = "client timeout";
const CLIENT_CANCEL: &str = "cancelled by the client";

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HonestResets {
    /// One row per pattern and server.
    pub rows: Vec<Row>,
    /// How long each pattern ran against each server.
    pub window_ms: f64,
    /// Every pattern failed no more calls against ours than against plain
    /// tonic, with no status plain tonic's did not see.
    pub ours_never_harsher: bool,
}

/// One pattern against one server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The pattern ([`PATTERNS`]).
    pub pattern: String,
    /// `plain tonic`, `layer alone` or `ours`.
    pub server: String,
    /// Calls made.
    pub calls: u64,
    /// How they ended: `OK`, a gRPC status name, `client timeout`,
    /// `cancelled by the client`.
    pub outcomes: BTreeMap<String, u64>,
    /// Calls that ended in none of the pattern's own outcomes.
    pub failures: u64,
    /// The statuses of those.
    pub failure_statuses: Vec<String>,
    /// Connections the reset guard cut off (ours; `None` for the others).
    pub cut_by_guard: Option<u64>,
    /// The median call (for the NAT neighbours: connect and first call), ms.
    pub p50_ms: f64,
    /// Its 99th percentile, ms.
    pub p99_ms: f64,
}

impl HonestResets {
    /// The row of `pattern` against `server`.
    pub fn row(&self, pattern: &str, server: &str) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.pattern == pattern && r.server == server)
    }
}

/// The outcomes that are a pattern's own: not failures.
fn own_outcomes(pattern: &str) -> &'static [&'static str] {
    match pattern {
        "deadline storm" => &["OK", "DEADLINE_EXCEEDED"],
        "client timeout 1 ms" | "client timeout 8 ms" => &["OK", CLIENT_TIMEOUT],
        "cancel most" => &["OK", CLIENT_CANCEL],
        _ => &["OK"],
    }
}

/// A server under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    LayerAlone,
    Ours,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Plain, Kind::LayerAlone, Kind::Ours];

    fn name(self) -> &'static str {
        match self {
            Kind::Plain => SERVERS[0],
            Kind::LayerAlone => SERVERS[1],
            Kind::Ours => SERVERS[2],
        }
    }
}

/// The probe's handler: `work_ms` of work, or (with `count` > 0) that
/// percentage of attempts `interval_ms` slow and the rest at once.
#[derive(Debug, Clone, Copy)]
struct Worker;

#[tonic::async_trait]
impl testkit::CallOnly for Worker {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        let r = request.into_inner();
        let work = if r.count > 0 {
            if fastrand::u32(0..100) < r.count {
                r.interval_ms
            } else {
                0
            }
        } else {
            r.work_ms
        };
        if work > 0 {
            tokio::time::sleep(Duration::from_millis(work)).await;
        }
        Ok(Response::new(CallReply::default()))
    }
}

/// A server started for one row.
struct Running {
    addr: SocketAddr,
    stop: net::Stop,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Running {
    async fn start(kind: Kind, metrics: &Metrics) -> anyhow::Result<Self> {
        let (incoming, addr) = net::bind("127.0.0.1:0").await?;
        let routes = Routes::new(ProbeServer::new(Worker));
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
        };
        Ok(Self { addr, stop, task })
    }

    async fn stop(self) {
        self.stop.stop();
        let mut task = self.task;
        if tokio::time::timeout(Duration::from_secs(2), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
}

/// What one pattern's calls ended with, and how long they took.
#[derive(Debug, Default)]
struct Tally {
    outcomes: BTreeMap<String, u64>,
    took: Vec<f64>,
}

impl Tally {
    fn add(&mut self, outcome: &str, took: Duration) {
        *self.outcomes.entry(outcome.to_owned()).or_insert(0) += 1;
        self.took.push(took.as_secs_f64() * 1000.0);
    }

    fn merge(&mut self, other: Tally) {
        for (outcome, n) in other.outcomes {
            *self.outcomes.entry(outcome).or_insert(0) += n;
        }
        self.took.extend(other.took);
    }
}

fn outcome_of<T>(result: &Result<T, Status>) -> String {
    crate::kit::calls::status_name(result).to_owned()
}

/// Runs `callers` tasks of `each` at once (each ends itself); their
/// tallies together.
async fn callers<F, Fut>(callers: usize, each: F) -> anyhow::Result<Tally>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = anyhow::Result<Tally>> + Send + 'static,
{
    let tasks: Vec<_> = (0..callers)
        .map(|i| tonic_deadline::detach(each(i)))
        .collect();
    let mut tally = Tally::default();
    for task in tasks {
        tally.merge(task.await??);
    }
    Ok(tally)
}

/// The deadline storm: our client layer, a 2 ms budget on every call.
async fn deadline_storm(addr: SocketAddr, window: Duration) -> anyhow::Result<Tally> {
    let until = Instant::now() + window;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(ProbeClient::new(net::connect_layered(addr).await?));
    }
    callers(64, move |i| {
        let mut client = clients[i % clients.len()].clone();
        async move {
            let mut tally = Tally::default();
            while Instant::now() < until {
                let work = if fastrand::u8(0..3) == 0 { 5 } else { 0 };
                let at = Instant::now();
                let answer = Scope::background()
                    .with_timeout(Duration::from_millis(2))
                    .enter(client.call(CallRequest {
                        work_ms: work,
                        ..CallRequest::default()
                    }))
                    .await;
                tally.add(&outcome_of(&answer), at.elapsed());
            }
            Ok(tally)
        }
    })
    .await
}

/// Hedged calls: 3 attempts, `delay` apart, 5 % of attempts 20 ms slow.
async fn hedging(addr: SocketAddr, window: Duration, delay: &str) -> anyhow::Result<Tally> {
    let config = format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "probe.v1.Probe", "method": "Call"}}], "idempotent": true,
        "hedgingPolicy": {{"maxAttempts": 3, "hedgingDelay": "{delay}", "nonFatalStatusCodes": ["UNAVAILABLE"]}}}}]}}"#
    );
    let until = Instant::now() + window;
    let client = ProbeClient::new(
        tower::ServiceBuilder::new()
            .layer(ResilienceLayer::from_service_config(&config)?)
            .service(net::connect_layered(addr).await?),
    );
    callers(8, move |_| {
        let mut client = client.clone();
        async move {
            let mut tally = Tally::default();
            while Instant::now() < until {
                let at = Instant::now();
                let answer = Scope::background()
                    .with_timeout(Duration::from_secs(1))
                    .enter(client.call(CallRequest {
                        count: 5,
                        interval_ms: 20,
                        ..CallRequest::default()
                    }))
                    .await;
                tally.add(&outcome_of(&answer), at.elapsed());
            }
            Ok(tally)
        }
    })
    .await
}

/// Plain tonic clients bounding each call with `tokio::time::timeout`,
/// through a one-second latency spike in the middle of the window.
async fn client_timeouts(
    addr: SocketAddr,
    window: Duration,
    timeout: Duration,
) -> anyhow::Result<Tally> {
    let started = Instant::now();
    let spike = (window.saturating_sub(Duration::from_secs(1))) / 2;
    let spike = started + spike..started + spike + Duration::from_secs(1);
    let until = started + window.max(Duration::from_secs(1));
    let channel = net::connect(addr).await?;
    callers(8, move |_| {
        let mut client = ProbeClient::new(channel.clone());
        let spike = spike.clone();
        async move {
            let mut tally = Tally::default();
            loop {
                let at = Instant::now();
                if at >= until {
                    break;
                }
                let work = if spike.contains(&at) { 1000 } else { 0 };
                let call = client.call(CallRequest {
                    work_ms: work,
                    ..CallRequest::default()
                });
                let outcome = match Scope::background()
                    .enter(tokio::time::timeout(timeout, call))
                    .await
                {
                    Ok(answer) => outcome_of(&answer),
                    Err(_) => CLIENT_TIMEOUT.to_owned(),
                };
                tally.add(&outcome, at.elapsed());
            }
            Ok(tally)
        }
    })
    .await
}

/// Plain tonic clients that drop each call after 1 to 10 ms.
async fn cancel_most(addr: SocketAddr, window: Duration) -> anyhow::Result<Tally> {
    let until = Instant::now() + window;
    let channel = net::connect(addr).await?;
    callers(8, move |_| {
        let mut client = ProbeClient::new(channel.clone());
        async move {
            let mut tally = Tally::default();
            while Instant::now() < until {
                let at = Instant::now();
                let call = client.call(CallRequest {
                    work_ms: fastrand::u64(0..=10),
                    ..CallRequest::default()
                });
                let patience = Duration::from_micros(fastrand::u64(1_000..=10_000));
                let outcome = match Scope::background()
                    .enter(tokio::time::timeout(patience, call))
                    .await
                {
                    Ok(answer) => outcome_of(&answer),
                    Err(_) => CLIENT_CANCEL.to_owned(),
                };
                tally.add(&outcome, at.elapsed());
            }
            Ok(tally)
        }
    })
    .await
}

/// Short-lived clients from the address a reconnecting flood comes from.
async fn nat_neighbours(addr: SocketAddr, window: Duration) -> anyhow::Result<Tally> {
    let stop = Arc::new(AtomicBool::new(false));
    let flooding = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = flood::flood(
                    addr,
                    "/probe.v1.Probe/Call",
                    Shape::FAST,
                    &stop,
                    Duration::from_secs(5),
                );
            }
        })
    };
    // The flood's first cut, before the neighbours come.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let until = Instant::now() + window;
    let tally = callers(4, move |_| async move {
        let mut tally = Tally::default();
        while Instant::now() < until {
            let at = Instant::now();
            let channel = match net::endpoint(addr)?.connect().await {
                Ok(channel) => channel,
                Err(e) => {
                    tally.add(&format!("connect failed: {e}"), at.elapsed());
                    continue;
                }
            };
            let mut client = ProbeClient::new(channel);
            for i in 0..5 {
                let answer = crate::kit::calls::without_deadline(client.call(CallRequest::default())).await;
                let outcome = outcome_of(&answer);
                if i == 0 {
                    // Connect and first call: what a neighbour waits for.
                    tally.add(&outcome, at.elapsed());
                } else {
                    *tally.outcomes.entry(outcome).or_insert(0) += 1;
                }
            }
            drop(client);
        }
        Ok(tally)
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    // The flood's thread belongs to no request.
    #[allow(clippy::disallowed_methods)]
    let _ = tokio::task::spawn_blocking(move || flooding.join()).await;
    tally
}

async fn pattern(pattern: &str, addr: SocketAddr, window: Duration) -> anyhow::Result<Tally> {
    match pattern {
        "deadline storm" => deadline_storm(addr, window).await,
        "hedging 0 s" => hedging(addr, window, "0s").await,
        "hedging 5 ms" => hedging(addr, window, "0.005s").await,
        "client timeout 1 ms" => client_timeouts(addr, window, Duration::from_millis(1)).await,
        "client timeout 8 ms" => client_timeouts(addr, window, Duration::from_millis(8)).await,
        "cancel most" => cancel_most(addr, window).await,
        "NAT neighbours of a flood" => nat_neighbours(addr, window).await,
        other => anyhow::bail!("no pattern {other:?}"),
    }
}

async fn row(kind: Kind, name: &str, window: Duration) -> anyhow::Result<Row> {
    let metrics = Metrics::new();
    let server = Running::start(kind, &metrics).await?;
    let tally = pattern(name, server.addr, window).await;
    server.stop().await;
    let mut tally = tally?;
    tally.took.sort_by(f64::total_cmp);
    let own = own_outcomes(name);
    let failed: Vec<(&String, &u64)> = tally
        .outcomes
        .iter()
        .filter(|(outcome, _)| !own.contains(&outcome.as_str()))
        .collect();
    Ok(Row {
        pattern: name.to_owned(),
        server: kind.name().to_owned(),
        calls: tally.outcomes.values().sum(),
        failures: failed.iter().map(|(_, n)| **n).sum(),
        failure_statuses: failed.iter().map(|(s, _)| (*s).clone()).collect(),
        outcomes: tally.outcomes.clone(),
        cut_by_guard: (kind == Kind::Ours).then(|| metrics.reset_floods_cut()),
        p50_ms: round3(quantile(&tally.took, 0.5)),
        p99_ms: round3(quantile(&tally.took, 0.99)),
    })
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Whether, for every pattern, ours failed no more calls than plain tonic,
/// and with no status plain tonic's calls did not see.
pub fn ours_never_harsher(rows: &[Row]) -> bool {
    PATTERNS.iter().all(|pattern| {
        let find = |server: &str| {
            rows.iter()
                .find(|r| r.pattern == *pattern && r.server == server)
        };
        match (find("plain tonic"), find("ours")) {
            (Some(plain), Some(ours)) => {
                ours.failures <= plain.failures
                    && ours
                        .failure_statuses
                        .iter()
                        .all(|s| plain.failure_statuses.contains(s))
            }
            _ => false,
        }
    })
}

/// Runs every pattern against every server, `window` each.
///
/// # Errors
///
/// When a server cannot start or a client cannot connect.
pub async fn measure(window: Duration) -> anyhow::Result<HonestResets> {
    let mut rows = Vec::new();
    for name in PATTERNS {
        for kind in Kind::ALL {
            rows.push(row(kind, name, window).await?);
        }
    }
    Ok(HonestResets {
        ours_never_harsher: ours_never_harsher(&rows),
        window_ms: window.as_secs_f64() * 1000.0,
        rows,
    })
}

impl Experiment for HonestResets {
    const NAME: &'static str = "honest-resets";
    const ABOUT: &'static str = "Honest clients that end streams early (deadline storms, hedges, their own short timeouts, cancels, a flood's neighbours behind one address) against plain tonic, the layer alone and ours";
    const PRINTS: &'static str =
        "honest clients that end streams early, `N` ms each (1 500), against plain tonic, the layer alone and ours: outcomes, failures, connections cut, p50/p99 ([more](#experiment-honest-resets))";
    type Args = Args;

    fn demo_args() -> Args {
        Args {
            window_ms: DEMO_WINDOW_MS,
        }
    }

    async fn run(args: Args, _: Spans) -> anyhow::Result<Self> {
        measure(Duration::from_millis(args.window_ms.clamp(200, 60_000))).await
    }

    fn outcome(&self) -> Outcome {
        let rows = self
            .rows
            .iter()
            .map(|r| {
                let outcomes: Vec<String> = r
                    .outcomes
                    .iter()
                    .map(|(outcome, n)| format!("{outcome} {n}"))
                    .collect();
                vec![
                    r.pattern.clone(),
                    r.server.clone(),
                    r.calls.to_string(),
                    outcomes.join(", "),
                    r.failures.to_string(),
                    r.cut_by_guard
                        .map_or_else(|| "—".to_owned(), |n| n.to_string()),
                    format!("{:.2}", r.p50_ms),
                    format!("{:.2}", r.p99_ms),
                ]
            })
            .collect();
        Outcome {
            title: "honest-resets: clients that end streams early (deadlines, hedges, their own timeouts, cancels, a flood's neighbours) against plain tonic, the layer alone and ours".into(),
            json: crate::report::to_json(self),
            columns: vec![
                "pattern",
                "server",
                "calls",
                "outcomes",
                "failures",
                "cut by guard",
                "p50 ms",
                "p99 ms",
            ],
            rows,
            notes: vec![
                format!(
                    "each pattern for {:.1} s (the client timeouts at least 1.0 s, through their latency spike) against a fresh server; a failure is an outcome not the pattern's own (an answer, its deadline, the client's own timeout or cancel); NAT neighbours: p50/p99 of connect + first call",
                    self.window_ms / 1000.0
                ),
                format!(
                    "ours failed no more calls than plain tonic, with no status plain tonic's did not see, in every pattern: {}",
                    if self.ours_never_harsher { "yes" } else { "NO" }
                ),
            ],
        }
    }
}
