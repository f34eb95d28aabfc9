//! Retries multiplying across hops: client → A → B → C, every hop calling
//! the next through `ResilienceLayer` with the same `retryPolicy`
//! (`maxAttempts` 3, `UNAVAILABLE` retryable), as teams ship one service
//! config to every service. C fails, and C counts what reaches it.
//!
//! Three stacks, one after another in each run:
//! - **ours**: the layer as it comes, its chain budget on: a hop whose
//!   retries are spent answers its caller with `grpc-retry-pushback-ms: -1`,
//!   and every hop above (and the root) stops there;
//! - **per-hop**: the same layer with `chain_budget(false)`: every hop
//!   retries what failed below it, as gRPC's A6 has each channel do;
//! - **edge only**: the root client retries (the same policy); A and B
//!   ship no `retryPolicy` and send each call once.
//!
//! The cases:
//! - **outage**: C fails every call (20 root calls, 4 at a time);
//! - **outage, throttling**: the same, with `retryThrottling` (10 tokens,
//!   0.1) on every hop: what the first root call sends counts too;
//! - **5 % failures**: C fails 5 % of calls at random (2 000 root calls, 8
//!   at a time): the retries must still do their job;
//! - **fan-in, throttling**: 50 root clients, each on a channel of its own
//!   (each its own throttle), each calling 10 times a second through A and
//!   B while C is down, `retryThrottling` on every hop;
//! - **outage, slow**: C never answers: every attempt runs out of time
//!   (each hop caps an attempt at 100 ms and retries `DEADLINE_EXCEEDED`
//!   too, as an idempotent method's config may);
//! - **replicas, one path down**: three replicas of B, which A's channel
//!   takes in turn; B1's path to C is broken (its C fails every call at
//!   once), B2's and B3's C answers;
//! - **replicas, one path slow**: the same with B1's C never answering
//!   (attempts capped and retried as in *outage, slow*);
//! - **replicas, two of three paths down**: B1's and B2's C fail every
//!   call, B3's answers;
//! - **replicas, every path down**: the three replicas of B in front of one
//!   C that fails every call: the whole service is down.
//!
//! Every run makes all of them; each figure is the median of the runs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use testkit::{CallReply, CallRequest};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tonic_deadline::Scope;
use tonic_deadline::client::{Avoid, ClientDeadline, ReadyChannel, Replica, ReplicaFailed};
use tonic_deadline::resilience::{Resilience, ResilienceLayer};
use tower::{Service, ServiceExt};

use crate::html::chart::{self, Group};
use crate::html::{Part, Section};
use crate::net;
use crate::registry::{Experiment, Spans};
use crate::report::Outcome;

/// The stacks, in the order each case runs them.
pub const STACKS: [&str; 3] = ["ours", "per-hop", "edge only"];

/// The cases, in order.
pub const CASES: [&str; 9] = [
    "outage",
    "outage, throttling",
    "5 % failures",
    "fan-in, throttling",
    "outage, slow",
    "replicas, one path down",
    "replicas, one path slow",
    "replicas, two of three paths down",
    "replicas, every path down",
];

/// Runs each figure is the median of.
pub const RUNS: usize = 3;

/// Replicas of B in the replica cases; the first ones' paths to C are
/// broken.
const REPLICAS: usize = 3;

/// Root calls of the replica cases.
const REPLICA_CALLS: u64 = 60;

/// How long a hop lets one attempt run in the slow cases.
const SLOW_ATTEMPT: Duration = Duration::from_millis(100);

/// How long the fan-in case's outage lasts when run alone.
pub const FAN_IN_MS: u64 = 10_000;

/// How long it lasts in the demo.
pub const DEMO_FAN_IN_MS: u64 = 1_000;

/// The flags of `experiment amplification`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// How long C is down in the fan-in case, in milliseconds.
    #[arg(long, default_value_t = FAN_IN_MS)]
    fan_in_ms: u64,
    /// Runs of every case; each figure is their median.
    #[arg(long, default_value_t = RUNS)]
    runs: usize,
}

/// Root clients of the fan-in case, and each one's calls per second.
const FAN_IN_CLIENTS: usize = 50;
const FAN_IN_RATE: f64 = 10.0;

/// Every root call's budget.
const BUDGET: Duration = Duration::from_secs(2);

/// The policy every hop ships with; the slow cases retry an attempt that
/// ran out of its time too (the method declared idempotent, as the layer
/// asks before it repeats a call whose outcome is unknown).
fn config(throttling: bool, slow: bool) -> String {
    let throttle = if throttling {
        r#", "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}"#
    } else {
        ""
    };
    let (codes, idempotent) = if slow {
        (
            r#"["UNAVAILABLE", "DEADLINE_EXCEEDED"]"#,
            r#""idempotent": true,"#,
        )
    } else {
        (r#"["UNAVAILABLE"]"#, "")
    };
    format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "probe.v1.Probe"}}], {idempotent}
            "retryPolicy": {{"maxAttempts": 3, "initialBackoff": "0.002s", "maxBackoff": "0.01s",
                            "backoffMultiplier": 2, "retryableStatusCodes": {codes}}}}}]{throttle}}}"#
    )
}

/// What a hop that does not retry ships: no `retryPolicy`.
const NO_RETRIES: &str = "{}";

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Amplification {
    /// One row per case and stack.
    pub rows: Vec<Row>,
    /// How long the fan-in case's outage lasted.
    pub fan_in_ms: f64,
    /// Runs each figure is the median of.
    #[serde(default)]
    pub runs: usize,
}

impl Amplification {
    /// The row of `case` for `stack`.
    pub fn row(&self, case: &str, stack: &str) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.case == case && r.stack == stack)
    }
}

/// One case, one stack: medians over the runs, and each run's figure.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// `ours` or `per-hop`.
    pub stack: String,
    /// The case ([`CASES`]).
    pub case: String,
    /// Calls made at the root.
    pub root_calls: u64,
    /// Attempts that reached C, per root call.
    pub attempts_at_leaf_per_root: f64,
    /// Attempts that reached B, per root call.
    pub attempts_at_b_per_root: f64,
    /// Attempts that reached A, per root call.
    pub attempts_at_a_per_root: f64,
    /// Attempts that reached C for the first root call alone (before any
    /// throttle has seen a failure); for the fan-in case, the first 50.
    pub first_attempts_at_leaf: f64,
    /// Root calls answered OK.
    pub root_ok_share: f64,
    /// Each run's attempts at C per root call.
    #[serde(default)]
    pub attempts_at_leaf_runs: Vec<f64>,
    /// Each run's share of root calls answered OK.
    #[serde(default)]
    pub root_ok_runs: Vec<f64>,
}

/// How C answers.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Leaf {
    Down,
    Failing(f64),
    /// Never answers: every attempt runs out of time.
    Hanging,
    Up,
}

/// C: counts every attempt, answers as its mode says.
#[derive(Clone)]
struct Last {
    mode: Leaf,
    seen: Arc<AtomicU64>,
}

type Hop = ProbeClient<Resilience<RoundRobin>>;

/// A channel to one or more replicas of the next hop, each through the
/// client layer, taking them in turn call by call (the order a round-robin
/// balancer keeps); under the resilience layer, so that a retry goes to
/// the next replica. It says which replica took each call ([`Replica`] in
/// the response, [`ReplicaFailed`] around a local failure) and skips the
/// replicas an [`Avoid`] names, as `tonic_deadline::client::Balanced`
/// does: a balancer of one's own takes part in the same few lines.
#[derive(Clone)]
struct RoundRobin {
    replicas: Arc<[ClientDeadline<ReadyChannel>]>,
    next: Arc<AtomicUsize>,
}

impl Service<http::Request<tonic::body::Body>> for RoundRobin {
    type Response = http::Response<tonic::body::Body>;
    type Error = tower::BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each call waits for its replica's readiness in `oneshot`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let n = self.replicas.len();
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let avoid = request.extensions().get::<Avoid>();
        let Some(pick) = (0..n)
            .map(|step| (turn + step) % n)
            .find(|&i| avoid.is_none_or(|a| !a.contains(i as u64)))
        else {
            return Box::pin(async { Err(Status::unavailable("every replica avoided").into()) });
        };
        let replica = Replica::new(pick as u64, n);
        let channel = self.replicas[pick].clone();
        Box::pin(async move {
            match channel.oneshot(request).await {
                Ok(mut response) => {
                    response.extensions_mut().insert(replica);
                    Ok(response.map(tonic::body::Body::new))
                }
                Err(err) => Err(ReplicaFailed::new(replica, err).into()),
            }
        })
    }
}

/// How a hop's client retries.
#[derive(Debug, Clone)]
struct Policy {
    config: String,
    chain: bool,
    per_attempt: Option<Duration>,
}

/// A or B: counts every attempt, calls the next hop, and answers what it
/// got: a handler that returns the status it was given.
#[derive(Clone)]
struct Relay {
    next: Hop,
    seen: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl testkit::CallOnly for Last {
    async fn call(&self, _: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        self.seen.fetch_add(1, Ordering::Relaxed);
        let fails = match self.mode {
            Leaf::Down => true,
            Leaf::Failing(p) => fastrand::f64() < p,
            Leaf::Hanging => {
                // Until the attempt's deadline ends the request.
                std::future::pending::<()>().await;
                true
            }
            Leaf::Up => false,
        };
        if fails {
            return Err(Status::unavailable("C is down"));
        }
        Ok(Response::new(CallReply::default()))
    }
}

#[tonic::async_trait]
impl testkit::CallOnly for Relay {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        self.seen.fetch_add(1, Ordering::Relaxed);
        let mut next = self.next.clone();
        next.call(request.into_inner()).await
    }
}

/// A hop's client of the replicas at `addrs`: the resilience layer over
/// the client layer of each.
async fn hop(addrs: &[SocketAddr], policy: &Policy) -> anyhow::Result<Hop> {
    let mut replicas = Vec::new();
    for addr in addrs {
        replicas.push(net::layered(
            ReadyChannel::connect(&net::endpoint(*addr)?).await?,
        ));
    }
    let mut layer =
        ResilienceLayer::from_service_config(&policy.config)?.chain_budget(policy.chain);
    if let Some(cap) = policy.per_attempt {
        layer = layer.per_attempt_timeout(cap);
    }
    Ok(ProbeClient::new(
        tower::ServiceBuilder::new()
            .layer(layer)
            .service(RoundRobin {
                replicas: replicas.into(),
                next: Arc::default(),
            }),
    ))
}

/// A → B → C, served; A's address and the three counters (B's and C's
/// summed over their replicas).
struct Chain {
    a: SocketAddr,
    seen: [Arc<AtomicU64>; 3],
}

/// How C answers: behind one B or `replicas` of them, every one alike, or
/// the first `broken.1` paths broken (`broken.0`: how their own C answers).
#[derive(Debug, Clone, Copy)]
struct Leaves {
    mode: Leaf,
    replicas: usize,
    broken: Option<(Leaf, usize)>,
}

async fn serve(service: impl testkit::CallOnly) -> anyhow::Result<SocketAddr> {
    net::serve(
        "127.0.0.1:0",
        Routes::new(ProbeServer::new(service)),
        Some(tonic_deadline::ServerDeadlineLayer::new()),
    )
    .await
}

async fn chain(leaves: Leaves, hops: &Policy) -> anyhow::Result<Chain> {
    let seen = [
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    ];
    let leaf = |mode| Last {
        mode,
        seen: seen[2].clone(),
    };
    let c = serve(leaf(leaves.mode)).await?;
    // B in front of C (B1 in front of a broken C if its path is broken),
    // then A in front of B's replicas.
    let mut b = Vec::new();
    for replica in 0..leaves.replicas {
        let next = match leaves.broken {
            Some((mode, broken)) if replica < broken => serve(leaf(mode)).await?,
            _ => c,
        };
        b.push(
            serve(Relay {
                next: hop(&[next], hops).await?,
                seen: seen[1].clone(),
            })
            .await?,
        );
    }
    let a = serve(Relay {
        next: hop(&b, hops).await?,
        seen: seen[0].clone(),
    })
    .await?;
    Ok(Chain { a, seen })
}

impl Chain {
    fn seen(&self) -> [u64; 3] {
        self.seen.each_ref().map(|s| s.load(Ordering::Relaxed))
    }
}

/// One root call through `client`: whether it was answered OK.
async fn root_call(client: &mut Hop) -> bool {
    Scope::background()
        .with_timeout(BUDGET)
        .enter(client.call(CallRequest::default()))
        .await
        .is_ok()
}

/// `calls` root calls, `at_once` at a time, through one root client (the
/// first alone, first).
async fn calls(
    chain: &Chain,
    root: &Policy,
    calls: u64,
    at_once: u64,
) -> anyhow::Result<(u64, u64, [u64; 3])> {
    let client = hop(&[chain.a], root).await?;
    let mut first = client.clone();
    let mut ok = u64::from(root_call(&mut first).await);
    let after_first = chain.seen();
    let mut tasks = Vec::new();
    for task in 0..at_once {
        let mut client = client.clone();
        let mine = (calls - 1) / at_once + u64::from(task < (calls - 1) % at_once);
        tasks.push(tonic_deadline::detach(async move {
            let mut ok = 0;
            for _ in 0..mine {
                ok += u64::from(root_call(&mut client).await);
            }
            ok
        }));
    }
    for task in tasks {
        ok += task.await?;
    }
    Ok((calls, ok, after_first))
}

/// The fan-in case: `FAN_IN_CLIENTS` root clients, each on a channel of
/// its own, `FAN_IN_RATE` calls a second each, for `outage`.
async fn fan_in(
    chain: &Chain,
    root: &Policy,
    outage: Duration,
) -> anyhow::Result<(u64, u64, [u64; 3])> {
    let mut clients = Vec::new();
    for _ in 0..FAN_IN_CLIENTS {
        clients.push(hop(&[chain.a], root).await?);
    }
    let gap = Duration::from_secs_f64(1.0 / FAN_IN_RATE);
    let started = Instant::now();
    let until = started + outage;
    let first = Arc::new(std::sync::Mutex::new(None));
    let mut tasks = Vec::new();
    for (i, mut client) in clients.into_iter().enumerate() {
        let first = first.clone();
        let seen = chain.seen.clone();
        tasks.push(tonic_deadline::detach(async move {
            // Spread over the first gap, as independent clients are.
            tokio::time::sleep(gap.mul_f64(i as f64 / FAN_IN_CLIENTS as f64)).await;
            let (mut made, mut ok) = (0u64, 0u64);
            let mut next = Instant::now();
            while next < until {
                tokio::time::sleep_until(next).await;
                ok += u64::from(root_call(&mut client).await);
                made += 1;
                if made == 1 && i == FAN_IN_CLIENTS - 1 {
                    *first.lock().expect("not poisoned") =
                        Some(seen.each_ref().map(|s| s.load(Ordering::Relaxed)));
                }
                next += gap;
            }
            (made, ok)
        }));
    }
    let (mut made, mut ok) = (0, 0);
    for task in tasks {
        let (m, o) = task.await?;
        made += m;
        ok += o;
    }
    let after_first = first
        .lock()
        .expect("not poisoned")
        .unwrap_or_else(|| chain.seen());
    Ok((made, ok, after_first))
}

/// One case, one stack, once.
async fn row(case: &str, stack: &str, fan_in_outage: Duration) -> anyhow::Result<Row> {
    let throttling = case.contains("throttling");
    let slow = case.ends_with("slow");
    let retrying = Policy {
        config: config(throttling, slow),
        chain: stack != "per-hop",
        per_attempt: slow.then_some(SLOW_ATTEMPT),
    };
    // The hops in the chain; the root retries on every stack.
    let hops = if stack == "edge only" {
        Policy {
            config: NO_RETRIES.to_owned(),
            ..retrying.clone()
        }
    } else {
        retrying.clone()
    };
    let one = |mode| Leaves {
        mode,
        replicas: 1,
        broken: None,
    };
    let replicas = |mode, broken| Leaves {
        mode,
        replicas: REPLICAS,
        broken,
    };
    let leaves = match case {
        "5 % failures" => one(Leaf::Failing(0.05)),
        "outage, slow" => one(Leaf::Hanging),
        "replicas, one path down" => replicas(Leaf::Up, Some((Leaf::Down, 1))),
        "replicas, one path slow" => replicas(Leaf::Up, Some((Leaf::Hanging, 1))),
        "replicas, two of three paths down" => replicas(Leaf::Up, Some((Leaf::Down, 2))),
        "replicas, every path down" => replicas(Leaf::Down, None),
        _ => one(Leaf::Down),
    };
    let chain = chain(leaves, &hops).await?;
    let (root, ok, first) = match case {
        "5 % failures" => calls(&chain, &retrying, 2000, 8).await?,
        "fan-in, throttling" => fan_in(&chain, &retrying, fan_in_outage).await?,
        _ if leaves.replicas > 1 => calls(&chain, &retrying, REPLICA_CALLS, 4).await?,
        _ => calls(&chain, &retrying, 20, 4).await?,
    };
    let seen = chain.seen();
    let per_root = |n: u64| n as f64 / root.max(1) as f64;
    let first_root = if case.starts_with("fan-in") {
        FAN_IN_CLIENTS as f64
    } else {
        1.0
    };
    let at_leaf = round3(per_root(seen[2]));
    let ok_share = round4(ok as f64 / root.max(1) as f64);
    Ok(Row {
        stack: stack.to_owned(),
        case: case.to_owned(),
        root_calls: root,
        attempts_at_leaf_per_root: at_leaf,
        attempts_at_b_per_root: round3(per_root(seen[1])),
        attempts_at_a_per_root: round3(per_root(seen[0])),
        first_attempts_at_leaf: round3(first[2] as f64 / first_root),
        root_ok_share: ok_share,
        attempts_at_leaf_runs: vec![at_leaf],
        root_ok_runs: vec![ok_share],
    })
}

/// The median of `xs` (the lower of the middle two for an even count).
fn median(xs: &[f64]) -> f64 {
    let mut sorted = xs.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted
        .get(sorted.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0.0)
}

/// One row from the same case's runs: each figure their median.
fn combine(runs: &[Row]) -> Row {
    let each = |f: fn(&Row) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    let first = runs.first().cloned().unwrap_or_default();
    Row {
        root_calls: each(|r| r.root_calls as f64) as u64,
        attempts_at_leaf_per_root: each(|r| r.attempts_at_leaf_per_root),
        attempts_at_b_per_root: each(|r| r.attempts_at_b_per_root),
        attempts_at_a_per_root: each(|r| r.attempts_at_a_per_root),
        first_attempts_at_leaf: each(|r| r.first_attempts_at_leaf),
        root_ok_share: each(|r| r.root_ok_share),
        attempts_at_leaf_runs: runs.iter().map(|r| r.attempts_at_leaf_per_root).collect(),
        root_ok_runs: runs.iter().map(|r| r.root_ok_share).collect(),
        ..first
    }
}

/// `median (min–max)` of a figure over the runs.
fn spread(median: f64, runs: &[f64], digits: usize) -> String {
    let min = runs.iter().copied().fold(f64::INFINITY, f64::min);
    let max = runs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if runs.len() < 2 || min == max {
        format!("{median:.digits$}")
    } else {
        format!("{median:.digits$} ({min:.digits$}–{max:.digits$})")
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

/// Runs every case with every stack, `runs` times, the fan-in outage
/// lasting `fan_in_outage`.
///
/// # Errors
///
/// When a hop cannot be served or connected to.
pub async fn measure(fan_in_outage: Duration, runs: usize) -> anyhow::Result<Amplification> {
    let mut measured: Vec<Vec<Row>> = Vec::new();
    for run in 0..runs.max(1) {
        let mut i = 0;
        for case in CASES {
            for stack in STACKS {
                let row = row(case, stack, fan_in_outage).await?;
                if run == 0 {
                    measured.push(Vec::new());
                }
                measured[i].push(row);
                i += 1;
            }
        }
    }
    Ok(Amplification {
        rows: measured.iter().map(|runs| combine(runs)).collect(),
        fan_in_ms: fan_in_outage.as_secs_f64() * 1000.0,
        runs: runs.max(1),
    })
}

impl Experiment for Amplification {
    const NAME: &'static str = "amplification";
    const ABOUT: &'static str = "Retries on every hop of client → A → B → C with C down, failing 5 % of calls, under fan-in, never answering, and behind three replicas of B one, two or all of whose paths are broken: attempts reaching C per root call and calls answered OK, one budget for the chain beside per-hop retries and retries at the edge only";
    const PRINTS: &'static str =
        "a chain client → A → B → C with `maxAttempts` 3 and C failing (at once or by running out of time, behind one B or three replicas of B): attempts per call at C, B and A and the calls answered OK, ours beside per-hop retries and retries at the edge only ([more](#experiment-amplification))";
    const SECTION: Option<Section> = Some(Section::RetriesAcrossHops);
    type Args = Args;

    fn demo_args() -> Args {
        Args {
            fan_in_ms: DEMO_FAN_IN_MS,
            // One run in the demo, which must stay short; the docs' tables
            // are the median of RUNS.
            runs: 1,
        }
    }

    async fn run(args: Args, _: Spans) -> anyhow::Result<Self> {
        measure(
            Duration::from_millis(args.fan_in_ms.clamp(500, 60_000)),
            args.runs.clamp(1, 9),
        )
        .await
    }

    fn outcome(&self) -> Outcome {
        let rows = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.case.clone(),
                    r.stack.clone(),
                    r.root_calls.to_string(),
                    format!("{:.2}", r.attempts_at_a_per_root),
                    format!("{:.2}", r.attempts_at_b_per_root),
                    spread(r.attempts_at_leaf_per_root, &r.attempts_at_leaf_runs, 2),
                    format!("{:.2}", r.first_attempts_at_leaf),
                    spread(r.root_ok_share, &r.root_ok_runs, 4),
                ]
            })
            .collect();
        Outcome {
            title: format!(
                "amplification: retries on client → A → B → C (maxAttempts 3, UNAVAILABLE), ours with one budget for the chain beside per-hop retries and retries at the edge only; each figure the median of {} runs (min–max where they differ)",
                self.runs.max(1)
            ),
            json: crate::report::to_json(self),
            columns: vec![
                "case",
                "stack",
                "root calls",
                "at A per root",
                "at B per root",
                "at C per root",
                "at C, first root call",
                "root OK share",
            ],
            rows,
            notes: vec![
                format!(
                    "outage: C fails every call, 20 root calls; 5 % failures: 2 000 root calls; fan-in: {FAN_IN_CLIENTS} root clients on channels of their own, {FAN_IN_RATE} calls a second each, C down for {:.1} s; throttling: retryThrottling (10, 0.1) on every hop",
                    self.fan_in_ms / 1000.0
                ),
                format!(
                    "outage, slow: C never answers, each hop caps an attempt at {} ms and retries DEADLINE_EXCEEDED (the method declared idempotent); replicas: A takes {REPLICAS} replicas of B in turn (the balancer says which one answered), B1's path to C fails at once (down) or never answers (slow), or B1's and B2's fail, or every replica's C fails; {REPLICA_CALLS} root calls",
                    SLOW_ATTEMPT.as_millis()
                ),
                "ours: a hop whose retries are spent answers grpc-retry-pushback-ms -1 and the hops above stop; per-hop: ResilienceLayer::chain_budget(false), every hop retries; edge only: the root retries, A and B ship no retryPolicy".into(),
                "goals for ours: at most 3 attempts at C per root call from the first on; at least 0.995 of root calls OK with 5 % failures; fan-in with throttling: at most 1.1 attempts at C per root call; behind replicas with one path broken at least 0.98 OK; every path down at most 3.3 attempts at C per root call".into(),
            ],
        }
    }

    fn report(&self, _: &Outcome) -> Vec<Part> {
        let groups: Vec<Group> = CASES
            .iter()
            .map(|case| {
                let values = STACKS
                    .iter()
                    .map(|stack| {
                        let at_leaf = self
                            .row(case, stack)
                            .map_or(0.0, |r| r.attempts_at_leaf_per_root);
                        ((at_leaf * 100.0).round() / 100.0, None)
                    })
                    .collect();
                ((*case).to_owned(), values)
            })
            .collect();
        vec![Part::new(chart::grouped(
            "amplification",
            "Attempts at the failing leaf per call at the root: client → A → B → C, maxAttempts 3 on each",
            "attempts",
            &STACKS,
            &groups,
        ))]
    }
}
