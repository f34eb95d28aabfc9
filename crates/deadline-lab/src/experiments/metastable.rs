//! Overload that outlives its trigger (a *metastable failure*: Bronson et
//! al., HotOS 2021; Huang et al., OSDI 2022). A service runs at 0.9 of its
//! capacity, called open-loop by clients that retry; a trigger hits it —
//! its capacity cut to 20 % (the pool's queries five times slower), or the
//! load doubled — for a while, then ends. Does goodput come back?
//!
//! The service is the one `bench overload` models: a pool of 4 connections
//! whose queries take 20 ms (200 calls a second), simulated, so that the
//! figures measure queueing and not the machine. Every root call has a 1 s
//! deadline. Two stacks, driven side by side through the same timeline:
//!
//! - **plain**: plain tonic; the handler waits for a connection from a FIFO
//!   pool, and a query, once started, runs to its end on the database even
//!   if its caller has gone. The clients are written as people write them:
//!   a fresh 200 ms timeout per attempt and up to 4 retries at once (a
//!   loop over `tokio::time::timeout`), the deadline known to no one but
//!   the caller.
//! - **ours**: as the README recommends: the layers on both sides (the 1 s
//!   deadline travels), the pool behind an `Admission` (queue time spends
//!   the budget; work that cannot finish in time is refused before it takes
//!   a connection; a query stops when its request's scope ends), retries
//!   from service config (`maxAttempts` 5 inside the one deadline,
//!   `retryThrottling`).
//!
//! Counted per quarter second: root calls started (offered), attempts that
//! reached the server, root calls answered OK before their deadline
//! (goodput, ÷ capacity), queries run and those started for a caller that
//! had already given up on its attempt (work for callers gone).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use probe::probe_client::ProbeClient;
use probe::probe_server::ProbeServer;
use probe::{CallReply, CallRequest};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tonic::service::Routes;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tonic_deadline::admission::Admission;
use tonic_deadline::client::{ClientDeadline, ReadyChannel};
use tonic_deadline::resilience::{Resilience, ResilienceLayer};
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::html::chart::{self, Series};
use crate::html::{Part, Section};
use crate::net;
use crate::registry::{Experiment, Spans};
use crate::report::Outcome;

/// Connections in the pool, and how long a query holds one.
const CONNECTIONS: usize = 4;
const QUERY: Duration = Duration::from_millis(20);
/// Calls a second the pool can serve.
pub const CAPACITY: f64 = CONNECTIONS as f64 / 0.020;
/// The offered load, as a share of capacity.
pub const LOAD: f64 = 0.9;
/// Every root call's deadline.
const DEADLINE: Duration = Duration::from_secs(1);
/// The plain clients' timeout per attempt, and their retries.
const PLAIN_ATTEMPT: Duration = Duration::from_millis(200);
const PLAIN_RETRIES: u32 = 4;
/// The capacity trigger's slowdown (20 % of capacity), the spike's load.
const SLOWDOWN: u64 = 5;
const SPIKE: f64 = 2.0;
/// The buckets counted.
const BUCKET: Duration = Duration::from_millis(250);

/// The stacks and triggers, as the rows name them.
pub const STACKS: [&str; 2] = ["plain", "ours"];
/// The triggers.
pub const TRIGGERS: [&str; 2] = ["capacity", "spike"];

/// The timeline when run alone: before, during and after the trigger.
pub const TIMELINE_MS: [u64; 3] = [2_000, 10_000, 10_000];
/// The demo's.
pub const DEMO_TIMELINE_MS: [u64; 3] = [1_500, 3_000, 4_000];

/// The flags of `experiment metastable`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Milliseconds of load before the trigger.
    #[arg(long, default_value_t = TIMELINE_MS[0])]
    before_ms: u64,
    /// How long the trigger lasts, in milliseconds.
    #[arg(long, default_value_t = TIMELINE_MS[1])]
    trigger_ms: u64,
    /// Milliseconds of load after it.
    #[arg(long, default_value_t = TIMELINE_MS[2])]
    after_ms: u64,
}

/// Ours's config: retries inside the one deadline, throttled.
const OUR_CONFIG: &str = r#"{"methodConfig": [{"name": [{"service": "probe.v1.Probe"}],
    "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
                    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"]}}],
    "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#;

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metastable {
    /// One row per stack and trigger.
    pub rows: Vec<Row>,
    /// Calls a second the service can serve.
    pub capacity_rps: f64,
    /// The offered load, calls a second.
    pub offered_rps: f64,
    /// Seconds before, during and after the trigger.
    pub timeline_s: [f64; 3],
}

impl Metastable {
    /// The row of `stack` under `trigger`.
    pub fn row(&self, stack: &str, trigger: &str) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.stack == stack && r.trigger == trigger)
    }
}

/// One stack under one trigger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// `plain` or `ours`.
    pub stack: String,
    /// `capacity` or `spike`.
    pub trigger: String,
    /// Seconds from the trigger's end until goodput is back at 95 % of the
    /// offered load (a second of it); `None` if never within the run.
    pub recovery_s: Option<f64>,
    /// Goodput during the trigger ÷ the capacity left (20 % of it, or all
    /// of it under the spike).
    pub during_share_of_remaining: f64,
    /// Queries started for a caller that had given up on its attempt ÷
    /// queries started.
    pub expired_work_share: f64,
    /// Goodput per second, ÷ capacity.
    pub goodput: Vec<f64>,
    /// Root calls started per second.
    pub offered: Vec<f64>,
    /// Attempts that reached the server per second.
    pub attempts: Vec<f64>,
    /// Share of each second's queries started for callers gone.
    pub expired_share: Vec<f64>,
}

/// Counts per bucket, from the start of the run.
#[derive(Debug)]
struct Timeline {
    buckets: Mutex<BTreeMap<u64, Counts>>,
    start: Instant,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    offered: u64,
    attempts: u64,
    good: u64,
    queries: u64,
    expired: u64,
}

impl Timeline {
    fn new(start: Instant) -> Self {
        Self {
            buckets: Mutex::default(),
            start,
        }
    }

    fn count(&self, at: Instant, f: impl FnOnce(&mut Counts)) {
        let since = at.saturating_duration_since(self.start);
        let bucket = (since.as_micros() / BUCKET.as_micros()) as u64;
        if let Ok(mut buckets) = self.buckets.lock() {
            f(buckets.entry(bucket).or_default());
        }
    }

    fn buckets(&self, n: u64) -> Vec<Counts> {
        let buckets = self.buckets.lock().map(|b| b.clone()).unwrap_or_default();
        (0..n)
            .map(|i| buckets.get(&i).copied().unwrap_or_default())
            .collect()
    }
}

/// What the service shares with the experiment: the query time (the
/// trigger slows it), and the timeline.
struct Shared {
    slowdown: AtomicU64,
    timeline: Timeline,
    /// What the attempts' deadlines count from (µs).
    start: Instant,
}

impl Shared {
    fn query(&self) -> Duration {
        QUERY * u32::try_from(self.slowdown.load(Ordering::Relaxed)).unwrap_or(1)
    }

    /// A query starts now for an attempt whose caller gives up at
    /// `gives_up` (µs from the start).
    fn started(&self, gives_up: u64) {
        let now = Instant::now();
        let gone = now.saturating_duration_since(self.start).as_micros() as u64 > gives_up;
        self.timeline.count(now, |c| {
            c.queries += 1;
            c.expired += u64::from(gone);
        });
    }
}

#[derive(Clone)]
enum Pool {
    Plain(Arc<Semaphore>),
    Ours(Admission),
}

#[derive(Clone)]
struct Service {
    pool: Pool,
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl probe::CallOnly for Service {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        // When the attempt's caller gives up, µs from the start.
        let gives_up = request.get_ref().interval_ms;
        self.shared
            .timeline
            .count(Instant::now(), |c| c.attempts += 1);
        let query = self.shared.query();
        match &self.pool {
            Pool::Plain(pool) => {
                let connection = pool
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| Status::unavailable("pool closed"))?;
                self.shared.started(gives_up);
                // The database runs the query to its end whatever happens
                // to the caller.
                tonic_deadline::detach(async move {
                    tokio::time::sleep(query).await;
                    drop(connection);
                })
                .await
                .map_err(|_| Status::internal("query failed"))?;
            }
            Pool::Ours(admission) => {
                let scope = Scope::current();
                let connection = admission.acquire(&scope).await?;
                self.shared.started(gives_up);
                scope.run(tokio::time::sleep(query)).await?;
                drop(connection);
            }
        }
        Ok(Response::new(CallReply::default()))
    }
}

/// A root client.
#[derive(Clone)]
enum Client {
    Plain(ProbeClient<Channel>),
    Ours(ProbeClient<Resilience<ClientDeadline<ReadyChannel>>>),
}

impl Client {
    /// One root call made at `started` (µs offsets from `start`): whether
    /// it was answered OK before its deadline.
    async fn call(&mut self, start: Instant) -> bool {
        let began = Instant::now();
        let offset = |at: Instant| at.saturating_duration_since(start).as_micros() as u64;
        match self {
            Client::Plain(client) => {
                for _ in 0..=PLAIN_RETRIES {
                    let request = CallRequest {
                        interval_ms: offset(Instant::now() + PLAIN_ATTEMPT),
                        ..CallRequest::default()
                    };
                    let attempt = client.call(request);
                    if let Ok(Ok(_)) = tokio::time::timeout(PLAIN_ATTEMPT, attempt).await {
                        return began.elapsed() <= DEADLINE;
                    }
                    if began.elapsed() >= DEADLINE {
                        return false;
                    }
                }
                false
            }
            Client::Ours(client) => {
                let request = CallRequest {
                    interval_ms: offset(began + DEADLINE),
                    ..CallRequest::default()
                };
                let answer = Scope::background()
                    .with_timeout(DEADLINE)
                    .enter(client.call(request))
                    .await;
                answer.is_ok() && began.elapsed() <= DEADLINE
            }
        }
    }
}

/// One stack under one trigger, on its own server.
async fn row(stack: &str, trigger: &str, timeline: [Duration; 3]) -> anyhow::Result<Row> {
    let start = Instant::now() + Duration::from_millis(200);
    let shared = Arc::new(Shared {
        slowdown: AtomicU64::new(1),
        timeline: Timeline::new(start),
        start,
    });
    let ours = stack == "ours";
    let pool = if ours {
        Pool::Ours(Admission::new(CONNECTIONS))
    } else {
        Pool::Plain(Arc::new(Semaphore::new(CONNECTIONS)))
    };
    let service = Service {
        pool,
        shared: shared.clone(),
    };
    let layer = ours.then(ServerDeadlineLayer::new);
    let addr = net::serve("127.0.0.1:0", Routes::new(ProbeServer::new(service)), layer).await?;
    let client = if ours {
        let channel = ReadyChannel::connect(&net::endpoint(addr)?).await?;
        Client::Ours(ProbeClient::new(
            tower::ServiceBuilder::new()
                .layer(ResilienceLayer::from_service_config(OUR_CONFIG)?)
                .service(net::layered(channel)),
        ))
    } else {
        Client::Plain(ProbeClient::new(net::connect(addr).await?))
    };

    let [before, during, after] = timeline;
    let total = before + during + after;
    // The trigger, on its own timeline.
    let trigger_task = {
        let shared = shared.clone();
        let capacity = trigger == "capacity";
        tonic_deadline::detach(async move {
            tokio::time::sleep_until(start + before).await;
            if capacity {
                shared.slowdown.store(SLOWDOWN, Ordering::Relaxed);
            }
            tokio::time::sleep_until(start + before + during).await;
            shared.slowdown.store(1, Ordering::Relaxed);
        })
    };
    // Open loop: evenly spaced root calls, twice as many during a spike.
    let base = CAPACITY * LOAD;
    let mut calls = tokio::task::JoinSet::new();
    let mut next = start;
    let end = start + total;
    while next < end {
        tokio::time::sleep_until(next).await;
        let mut client = client.clone();
        let shared = shared.clone();
        shared.timeline.count(next, |c| c.offered += 1);
        #[allow(clippy::disallowed_methods)] // the load generator is no request's work
        calls.spawn(async move {
            if client.call(start).await {
                shared.timeline.count(Instant::now(), |c| c.good += 1);
            }
        });
        let in_spike =
            trigger == "spike" && next >= start + before && next < start + before + during;
        let rate = if in_spike { base * SPIKE } else { base };
        next += Duration::from_secs_f64(1.0 / rate);
    }
    // Calls still running end within their deadline (plain's within its
    // attempts), then the counts are read.
    tokio::time::sleep(DEADLINE + Duration::from_millis(100)).await;
    calls.abort_all();
    let _ = trigger_task.await;

    let n = total.as_micros() / BUCKET.as_micros();
    let buckets = shared.timeline.buckets(n as u64);
    let per_second = BUCKET.as_secs_f64();
    let seconds = |f: &dyn Fn(&Counts) -> f64| -> Vec<f64> {
        buckets
            .chunks(4)
            .map(|s| round3(s.iter().map(f).sum::<f64>() / (per_second * s.len() as f64)))
            .collect()
    };
    let goodput = seconds(&|c| c.good as f64 / CAPACITY);
    let offered = seconds(&|c| c.offered as f64);
    let attempts = seconds(&|c| c.attempts as f64);
    let expired_share: Vec<f64> = buckets
        .chunks(4)
        .map(|s| {
            let queries: u64 = s.iter().map(|c| c.queries).sum();
            let expired: u64 = s.iter().map(|c| c.expired).sum();
            round3(expired as f64 / queries.max(1) as f64)
        })
        .collect();
    let bucket_of = |d: Duration| (d.as_micros() / BUCKET.as_micros()) as usize;
    let (trigger_start, trigger_end) = (bucket_of(before), bucket_of(before + during));
    // During: skip the first second, while the queue fills.
    let during_buckets = &buckets[(trigger_start + 4).min(trigger_end)..trigger_end];
    let remaining = if trigger == "capacity" {
        CAPACITY / SLOWDOWN as f64
    } else {
        CAPACITY
    };
    let good_during = during_buckets.iter().map(|c| c.good).sum::<u64>() as f64
        / (during_buckets.len().max(1) as f64 * per_second);
    // Recovery: the first quarter from the trigger's end whose next second
    // answers 95 % of the offered load in time.
    let recovery = (trigger_end..buckets.len().saturating_sub(4)).find(|&b| {
        let second = &buckets[b..b + 4];
        let good: u64 = second.iter().map(|c| c.good).sum();
        good as f64 >= 0.95 * base
    });
    let queries: u64 = buckets.iter().map(|c| c.queries).sum();
    let expired: u64 = buckets.iter().map(|c| c.expired).sum();
    Ok(Row {
        stack: stack.to_owned(),
        trigger: trigger.to_owned(),
        recovery_s: recovery.map(|b| (b - trigger_end) as f64 * per_second),
        during_share_of_remaining: round3(good_during / remaining),
        expired_work_share: round4(expired as f64 / queries.max(1) as f64),
        goodput,
        offered,
        attempts,
        expired_share,
    })
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

/// Runs both stacks under both triggers, all four side by side (each its
/// own server, pool and clients; the pool is simulated, so they share no
/// capacity), through `timeline` (before, during, after the trigger).
///
/// # Errors
///
/// When a server cannot be served or connected to.
pub async fn measure(timeline: [Duration; 3]) -> anyhow::Result<Metastable> {
    let mut runs = Vec::new();
    for trigger in TRIGGERS {
        for stack in STACKS {
            runs.push(tonic_deadline::detach(async move {
                row(stack, trigger, timeline).await
            }));
        }
    }
    let mut rows = Vec::new();
    for run in runs {
        rows.push(run.await??);
    }
    Ok(Metastable {
        rows,
        capacity_rps: CAPACITY,
        offered_rps: CAPACITY * LOAD,
        timeline_s: timeline.map(|d| d.as_secs_f64()),
    })
}

impl Experiment for Metastable {
    const NAME: &'static str = "metastable";
    const ABOUT: &'static str = "A service at 0.9 of capacity under retrying clients, hit by a capacity cut or a load spike that then ends: goodput per second and the time it takes to come back, plain tonic beside ours";
    const SECTION: Option<Section> = Some(Section::Metastable);
    type Args = Args;

    fn demo_args() -> Args {
        let [before_ms, trigger_ms, after_ms] = DEMO_TIMELINE_MS;
        Args {
            before_ms,
            trigger_ms,
            after_ms,
        }
    }

    async fn run(args: Args, _: Spans) -> anyhow::Result<Self> {
        let timeline = [args.before_ms, args.trigger_ms, args.after_ms];
        measure(timeline.map(|ms| Duration::from_millis(ms.clamp(1_000, 120_000)))).await
    }

    fn outcome(&self) -> Outcome {
        let [before, during, _] = self.timeline_s;
        let rows = self
            .rows
            .iter()
            .map(|r| {
                let series = |v: &[f64], digits: usize| {
                    v.iter()
                        .map(|x| format!("{x:.digits$}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                vec![
                    r.trigger.clone(),
                    r.stack.clone(),
                    r.recovery_s
                        .map_or_else(|| "never".to_owned(), |s| format!("{s:.2}")),
                    format!("{:.3}", r.during_share_of_remaining),
                    format!("{:.4}", r.expired_work_share),
                    series(&r.goodput, 2),
                ]
            })
            .collect();
        let mut notes = vec![
            format!(
                "a pool of {CONNECTIONS} × {} ms queries ({:.0} calls/s), offered {:.0} calls/s open-loop, 1 s deadlines; the trigger from {before:.1} s for {during:.1} s: capacity cut to 20 %, or twice the load",
                QUERY.as_millis(),
                self.capacity_rps,
                self.offered_rps
            ),
            "plain: FIFO pool, queries run to their end, clients with a fresh 200 ms timeout per attempt and up to 4 retries; ours: the layers, Admission in front of the pool, retries from service config (maxAttempts 5 in the one deadline, retryThrottling 10 / 0.1)".into(),
            "goals for ours: during the trigger at least 0.90 of the capacity left; back to 95 % of the offered load within 1 s of its end; at most 1 % of the work for callers already gone".into(),
        ];
        for r in &self.rows {
            notes.push(format!(
                "{}, {}: offered/s {}; attempts/s {}; work for callers gone {}",
                r.trigger,
                r.stack,
                r.offered
                    .iter()
                    .map(|x| format!("{x:.0}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                r.attempts
                    .iter()
                    .map(|x| format!("{x:.0}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                r.expired_share
                    .iter()
                    .map(|x| format!("{x:.2}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
        }
        Outcome {
            title: "metastable: a service at 0.9 of capacity, retrying clients, a trigger that ends — does goodput come back?".into(),
            json: crate::report::to_json(self),
            columns: vec![
                "trigger",
                "stack",
                "recovery s",
                "during / capacity left",
                "work for callers gone",
                "goodput per second (÷ capacity)",
            ],
            rows,
            notes,
        }
    }

    /// Goodput second by second through the trigger, one chart per
    /// trigger, plain and ours, beside the load offered.
    fn report(&self, _: &Outcome) -> Vec<Part> {
        let [before, during, _] = self.timeline_s;
        let mut parts = Vec::new();
        for trigger in TRIGGERS {
            let rows: Vec<&Row> = STACKS
                .iter()
                .filter_map(|stack| self.row(stack, trigger))
                .collect();
            let Some(seconds) = rows.iter().map(|r| r.goodput.len()).max() else {
                continue;
            };
            // Each figure is the second that starts at its label.
            let xs: Vec<String> = (0..seconds).map(|s| format!("{s} s")).collect();
            let mut series: Vec<Series> = rows
                .iter()
                .map(|r| (r.stack.clone(), r.goodput.clone()))
                .collect();
            if let Some(first) = rows.first() {
                series.push((
                    "offered".to_owned(),
                    first
                        .offered
                        .iter()
                        .map(|o| o / self.capacity_rps)
                        .collect(),
                ));
            }
            let what = if trigger == "capacity" {
                "capacity cut to 20 %"
            } else {
                "twice the load"
            };
            parts.push(Part::new(chart::lines(
                &format!("metastable-{trigger}"),
                &format!(
                    "Goodput ÷ capacity, each second from its start: {what} from {before:.1} s to {:.1} s",
                    before + during
                ),
                "of capacity",
                &xs,
                &series,
                &[],
            )));
        }
        parts
    }
}
