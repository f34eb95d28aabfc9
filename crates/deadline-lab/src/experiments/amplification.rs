//! Retries multiplying across hops: client → A → B → C, every hop calling
//! the next through `ResilienceLayer` with the same `retryPolicy`
//! (`maxAttempts` 3, `UNAVAILABLE` retryable), as teams ship one service
//! config to every service. C fails, and C counts what reaches it.
//!
//! Two stacks, side by side in one run:
//! - **ours**: the layer as it comes, its chain budget on: a hop whose
//!   retries are spent answers its caller with `grpc-retry-pushback-ms: -1`,
//!   and every hop above (and the root) stops there;
//! - **per-hop**: the same layer with `chain_budget(false)`: every hop
//!   retries what failed below it, as gRPC's A6 has each channel do.
//!
//! Four cases:
//! - **outage**: C fails every call (20 root calls, 4 at a time);
//! - **outage, throttling**: the same, with `retryThrottling` (10 tokens,
//!   0.1) on every hop: what the first root call sends counts too;
//! - **5 % failures**: C fails 5 % of calls at random (2 000 root calls, 8
//!   at a time): the retries must still do their job;
//! - **fan-in, throttling**: 50 root clients, each on a channel of its own
//!   (each its own throttle), each calling 10 times a second through A and
//!   B while C is down, `retryThrottling` on every hop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use probe::probe_client::ProbeClient;
use probe::probe_server::ProbeServer;
use probe::{CallReply, CallRequest};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tonic_deadline::Scope;
use tonic_deadline::client::{ClientDeadline, ReadyChannel};
use tonic_deadline::resilience::{Resilience, ResilienceLayer};

use crate::html::chart::{self, Group};
use crate::html::{Part, Section};
use crate::net;
use crate::registry::{Experiment, Spans};
use crate::report::Outcome;

/// The stacks, in the order each case runs them.
pub const STACKS: [&str; 2] = ["ours", "per-hop"];

/// The cases, in order.
pub const CASES: [&str; 4] = [
    "outage",
    "outage, throttling",
    "5 % failures",
    "fan-in, throttling",
];

/// How long the fan-in case's outage lasts when run alone.
pub const FAN_IN_MS: u64 = 10_000;

/// How long it lasts in the demo.
pub const DEMO_FAN_IN_MS: u64 = 2_000;

/// The flags of `experiment amplification`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// How long C is down in the fan-in case, in milliseconds.
    #[arg(long, default_value_t = FAN_IN_MS)]
    fan_in_ms: u64,
}

/// Root clients of the fan-in case, and each one's calls per second.
const FAN_IN_CLIENTS: usize = 50;
const FAN_IN_RATE: f64 = 10.0;

/// Every root call's budget.
const BUDGET: Duration = Duration::from_secs(2);

/// The policy every hop ships with.
fn config(throttling: bool) -> String {
    let throttle = if throttling {
        r#", "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}"#
    } else {
        ""
    };
    format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "probe.v1.Probe"}}],
            "retryPolicy": {{"maxAttempts": 3, "initialBackoff": "0.002s", "maxBackoff": "0.01s",
                            "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}}}]{throttle}}}"#
    )
}

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Amplification {
    /// One row per case and stack.
    pub rows: Vec<Row>,
    /// How long the fan-in case's outage lasted.
    pub fan_in_ms: f64,
}

impl Amplification {
    /// The row of `case` for `stack`.
    pub fn row(&self, case: &str, stack: &str) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.case == case && r.stack == stack)
    }
}

/// One case, one stack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}

/// How C answers.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Leaf {
    Down,
    Failing(f64),
}

/// C: counts every attempt, answers as its mode says.
#[derive(Clone)]
struct Last {
    mode: Leaf,
    seen: Arc<AtomicU64>,
}

type Hop = ProbeClient<Resilience<ClientDeadline<ReadyChannel>>>;

/// A or B: counts every attempt, calls the next hop, and answers what it
/// got: a handler that returns the status it was given.
#[derive(Clone)]
struct Relay {
    next: Hop,
    seen: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl probe::CallOnly for Last {
    async fn call(&self, _: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        self.seen.fetch_add(1, Ordering::Relaxed);
        let fails = match self.mode {
            Leaf::Down => true,
            Leaf::Failing(p) => fastrand::f64() < p,
        };
        if fails {
            return Err(Status::unavailable("C is down"));
        }
        Ok(Response::new(CallReply::default()))
    }
}

#[tonic::async_trait]
impl probe::CallOnly for Relay {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        self.seen.fetch_add(1, Ordering::Relaxed);
        let mut next = self.next.clone();
        next.call(request.into_inner()).await
    }
}

/// A hop's client of `addr`: the resilience layer over the client layer.
async fn hop(addr: SocketAddr, config: &str, chain: bool) -> anyhow::Result<Hop> {
    let channel = ReadyChannel::connect(&net::endpoint(addr)?).await?;
    Ok(ProbeClient::new(
        tower::ServiceBuilder::new()
            .layer(ResilienceLayer::from_service_config(config)?.chain_budget(chain))
            .service(net::layered(channel)),
    ))
}

/// A → B → C, served; A's address and the three counters.
struct Chain {
    a: SocketAddr,
    seen: [Arc<AtomicU64>; 3],
}

async fn chain(mode: Leaf, config: &str, chain: bool) -> anyhow::Result<Chain> {
    let seen = [
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    ];
    let mut next = net::serve(
        "127.0.0.1:0",
        Routes::new(ProbeServer::new(Last {
            mode,
            seen: seen[2].clone(),
        })),
        Some(tonic_deadline::ServerDeadlineLayer::new()),
    )
    .await?;
    // B in front of C, then A in front of B.
    for seen in [&seen[1], &seen[0]] {
        next = net::serve(
            "127.0.0.1:0",
            Routes::new(ProbeServer::new(Relay {
                next: hop(next, config, chain).await?,
                seen: seen.clone(),
            })),
            Some(tonic_deadline::ServerDeadlineLayer::new()),
        )
        .await?;
    }
    Ok(Chain { a: next, seen })
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
    config: &str,
    stack: bool,
    calls: u64,
    at_once: u64,
) -> anyhow::Result<(u64, u64, [u64; 3])> {
    let client = hop(chain.a, config, stack).await?;
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
    config: &str,
    stack: bool,
    outage: Duration,
) -> anyhow::Result<(u64, u64, [u64; 3])> {
    let mut clients = Vec::new();
    for _ in 0..FAN_IN_CLIENTS {
        clients.push(hop(chain.a, config, stack).await?);
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

async fn row(case: &str, stack: &str, fan_in_outage: Duration) -> anyhow::Result<Row> {
    let ours = stack == "ours";
    let throttling = case.contains("throttling");
    let config = config(throttling);
    let mode = if case == "5 % failures" {
        Leaf::Failing(0.05)
    } else {
        Leaf::Down
    };
    let chain = chain(mode, &config, ours).await?;
    let (root, ok, first) = match case {
        "outage" | "outage, throttling" => calls(&chain, &config, ours, 20, 4).await?,
        "5 % failures" => calls(&chain, &config, ours, 2000, 8).await?,
        _ => fan_in(&chain, &config, ours, fan_in_outage).await?,
    };
    let seen = chain.seen();
    let per_root = |n: u64| n as f64 / root.max(1) as f64;
    let first_root = if case.starts_with("fan-in") {
        FAN_IN_CLIENTS as f64
    } else {
        1.0
    };
    Ok(Row {
        stack: stack.to_owned(),
        case: case.to_owned(),
        root_calls: root,
        attempts_at_leaf_per_root: round3(per_root(seen[2])),
        attempts_at_b_per_root: round3(per_root(seen[1])),
        attempts_at_a_per_root: round3(per_root(seen[0])),
        first_attempts_at_leaf: round3(first[2] as f64 / first_root),
        root_ok_share: round4(ok as f64 / root.max(1) as f64),
    })
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

/// Runs every case with both stacks, the fan-in outage lasting
/// `fan_in_outage`.
///
/// # Errors
///
/// When a hop cannot be served or connected to.
pub async fn measure(fan_in_outage: Duration) -> anyhow::Result<Amplification> {
    let mut rows = Vec::new();
    for case in CASES {
        for stack in STACKS {
            rows.push(row(case, stack, fan_in_outage).await?);
        }
    }
    Ok(Amplification {
        rows,
        fan_in_ms: fan_in_outage.as_secs_f64() * 1000.0,
    })
}

impl Experiment for Amplification {
    const NAME: &'static str = "amplification";
    const ABOUT: &'static str = "Retries on every hop of client → A → B → C with C down, failing 5 % of calls, and under fan-in: attempts reaching C per root call, one budget for the chain beside per-hop retries";
    const SECTION: Option<Section> = Some(Section::RetriesAcrossHops);
    type Args = Args;

    fn demo_args() -> Args {
        Args {
            fan_in_ms: DEMO_FAN_IN_MS,
        }
    }

    async fn run(args: Args, _: Spans) -> anyhow::Result<Self> {
        measure(Duration::from_millis(args.fan_in_ms.clamp(500, 60_000))).await
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
                    format!("{:.2}", r.attempts_at_leaf_per_root),
                    format!("{:.2}", r.first_attempts_at_leaf),
                    format!("{:.4}", r.root_ok_share),
                ]
            })
            .collect();
        Outcome {
            title: "amplification: retries on every hop of client → A → B → C (maxAttempts 3, UNAVAILABLE), ours with one budget for the chain beside per-hop retries".into(),
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
                "ours: a hop whose retries are spent answers grpc-retry-pushback-ms -1 and the hops above stop; per-hop: ResilienceLayer::chain_budget(false), every hop retries".into(),
                "goals for ours: at most 3 attempts at C per root call from the first on; at least 0.995 of root calls OK with 5 % failures; fan-in with throttling: at most 1.1 attempts at C per root call".into(),
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
