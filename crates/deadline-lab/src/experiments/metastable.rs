//! Overload that outlives its trigger (a *metastable failure*: Bronson et
//! al., HotOS 2021; Huang et al., OSDI 2022). A service runs at 0.9 of its
//! capacity, called open-loop; a trigger hits it — its capacity cut to
//! 20 % (the pool's queries five times slower), or the load doubled — for a
//! while, then ends. Does goodput come back, and which part of the stack
//! brings it back?
//!
//! The service is the one `bench overload` models: a pool of 4 connections
//! whose queries take 20 ms (200 calls a second), simulated, so that the
//! figures measure queueing and not the machine. Every root call has a 1 s
//! deadline. The stacks, driven side by side through the same timeline,
//! each on its own server and pool:
//!
//! - **plain, no retries**: plain tonic as a careful caller uses it without
//!   retries: the deadline sent (`Request::set_timeout`, so tonic's server
//!   drops the handler when it passes), one attempt. The handler waits for
//!   a connection from a FIFO pool, and a query, once started, runs to its
//!   end on the database even if its caller has gone (every plain stack's
//!   database does).
//! - **careful plain**: the deadline sent; tonic's `Server::timeout` (1 s),
//!   `concurrency_limit_per_connection(32)` and `load_shed(true)` (as
//!   tonic's docs show them); the client retries `UNAVAILABLE` and
//!   `RESOURCE_EXHAUSTED` with `tower::retry`, a `TpsBudget` and an
//!   `ExponentialBackoffMaker` with jitter (tower's defaults, as its docs
//!   set them up), every attempt sent with what is left of the deadline.
//! - **hand-written retry loop**: no deadline sent; a loop over a fresh
//!   200 ms `tokio::time::timeout` per attempt, up to 4 retries at once, no
//!   backoff, no budget — as retries are often written by hand.
//! - **ours**: as the README recommends: the layers on both sides (the 1 s
//!   deadline travels), the pool behind an `Admission` (queue time spends
//!   the budget, work that cannot finish in time is refused before it
//!   takes a connection, the newest waiter first under a standing queue, a
//!   query stops when its request's scope ends), retries from service
//!   config (`maxAttempts` 5 inside the one deadline, `retryThrottling`).
//!
//! And ours with one part taken out at a time ([`ABLATIONS`]): a FIFO
//! queue; no refusal of work that cannot finish (the wait still ends with
//! the caller); queries that run to their end; no retry policy. Last, ours
//! with a bounded queue (8 waiters), whose refusals answer
//! `RESOURCE_EXHAUSTED`: the one case where its retry policy has something
//! to retry.
//!
//! Counted per 100 ms bucket: root calls started (offered); root calls
//! answered OK before their deadline (goodput), counted in the bucket their
//! call *started* in, so that a backlog's late answers are not mistaken
//! for recovery; attempts the client sent; queries run, and those started
//! for a caller that had already given up on its attempt (work for callers
//! gone). Every figure is the median of `--runs` runs (3), with their
//! spread.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use testkit::{CallReply, CallRequest};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::Routes;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status};
use tonic_deadline::admission::{Admission, Discipline};
use tonic_deadline::resilience::{Resilience, ResilienceLayer};
use tonic_deadline::{Scope, ServerDeadlineLayer};
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::load_shed::LoadShedLayer;
use tower::retry::backoff::{Backoff, ExponentialBackoff, ExponentialBackoffMaker, MakeBackoff};
use tower::retry::budget::{Budget, TpsBudget};
use tower::retry::{Policy, Retry};
use tower::{Service, ServiceExt};

use crate::html::chart::{self, Series};
use crate::html::{Part, Section};
use crate::net::{self, Layered};
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
/// The hand-written loop's timeout per attempt, and its retries.
const LOOP_ATTEMPT: Duration = Duration::from_millis(200);
const LOOP_RETRIES: u32 = 4;
/// The careful plain server's limit of requests in flight (the figure
/// tonic's docs give its `concurrency_limit_per_connection`), here across
/// the server.
const CAREFUL_LIMIT: usize = 32;
/// Root clients per stack, each on a connection of its own, taking the
/// calls in turn: the open load of many callers, not one connection's
/// queue of streams.
const CLIENTS: usize = 4;
/// Waiters the bounded queue of `ours, bounded queue` holds.
const BOUNDED_QUEUE: usize = 8;
/// The capacity trigger's slowdown (20 % of capacity), the spike's load.
const SLOWDOWN: u64 = 5;
const SPIKE: f64 = 2.0;
/// The buckets counted.
const BUCKET: Duration = Duration::from_millis(100);
const PER_SECOND: usize = 10;
/// Goodput is back from a bucket on when every second-long window of
/// buckets starting there or later answers in time this share of the calls
/// started in it (a window, not a bucket: one late call of a bucket's 18
/// would be 5.6 %).
pub const RECOVERED_SHARE: f64 = 0.95;
/// The window, in buckets.
const RECOVERED_FOR: usize = 10;

/// The stacks compared, as the rows name them.
pub const STACKS: [&str; 4] = [
    "plain, no retries",
    "careful plain",
    "hand-written retry loop",
    "ours",
];
/// Ours with one part taken out, then ours with a bounded queue (where
/// its retry policy engages).
pub const ABLATIONS: [&str; 5] = [
    "ours, FIFO queue",
    "ours, no refusal",
    "ours, no query cancel",
    "ours, no retries",
    "ours, bounded queue",
];
/// The triggers.
pub const TRIGGERS: [&str; 2] = ["capacity", "spike"];

/// The timeline when run alone: before, during and after the trigger.
pub const TIMELINE_MS: [u64; 3] = [2_000, 10_000, 10_000];
/// The demo's: each part at least [`MIN_PART_MS`], as every run's.
pub const DEMO_TIMELINE_MS: [u64; 3] = [MIN_PART_MS, 2_000, 2_000];
/// The shortest part of a timeline a run takes: a second of buckets, the
/// window goodput is judged on.
pub const MIN_PART_MS: u64 = 1_000;
/// Runs each figure is the median of.
pub const RUNS: usize = 3;

/// The flags of `experiment metastable`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Milliseconds of load before the trigger (each part at least 1 000).
    #[arg(long, default_value_t = TIMELINE_MS[0])]
    before_ms: u64,
    /// How long the trigger lasts, in milliseconds (at least 1 000).
    #[arg(long, default_value_t = TIMELINE_MS[1])]
    trigger_ms: u64,
    /// Milliseconds of load after it (at least 1 000).
    #[arg(long, default_value_t = TIMELINE_MS[2])]
    after_ms: u64,
    /// Runs of the whole timeline; each figure is their median.
    #[arg(long, default_value_t = RUNS)]
    runs: usize,
}

/// Ours's config: retries inside the one deadline, throttled.
const OUR_CONFIG: &str = r#"{"methodConfig": [{"name": [{"service": "probe.v1.Probe"}],
    "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
                    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"]}}],
    "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#;

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metastable {
    /// One row per stack and trigger: [`STACKS`], then [`ABLATIONS`].
    pub rows: Vec<Row>,
    /// Calls a second the service can serve.
    pub capacity_rps: f64,
    /// The offered load, calls a second.
    pub offered_rps: f64,
    /// Seconds before, during and after the trigger.
    pub timeline_s: [f64; 3],
    /// Runs each figure is the median of.
    #[serde(default)]
    pub runs: usize,
}

impl Metastable {
    /// The row of `stack` under `trigger`.
    pub fn row(&self, stack: &str, trigger: &str) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.stack == stack && r.trigger == trigger)
    }
}

/// One stack under one trigger: medians over the runs, and each run's
/// figure.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// One of [`STACKS`] or [`ABLATIONS`].
    pub stack: String,
    /// `capacity` or `spike`.
    pub trigger: String,
    /// Seconds from the trigger's end (in steps of 100 ms) until every
    /// second-long window from then to the end of the run answers in time
    /// at least 95 % of the calls started in it; `None`: never within the
    /// run. The median of the runs, a run that never recovered counting as
    /// the longest.
    pub recovery_s: Option<f64>,
    /// Calls started during the trigger (after its first second) and
    /// answered in time, per second, ÷ the capacity left (20 % of it, or
    /// all of it under the spike).
    pub during_share_of_remaining: f64,
    /// Queries started for a caller that had given up on its attempt ÷
    /// queries started.
    pub expired_work_share: f64,
    /// Goodput per second (calls answered in time, by the second they
    /// started in), ÷ capacity.
    pub goodput: Vec<f64>,
    /// Root calls started per second.
    pub offered: Vec<f64>,
    /// Attempts the client sent per second.
    pub attempts: Vec<f64>,
    /// Share of each second's queries started for callers gone.
    pub expired_share: Vec<f64>,
    /// Attempts sent per second while the trigger lasted.
    #[serde(default)]
    pub attempts_per_s_during: f64,
    /// Attempts sent per root call, over the whole run.
    #[serde(default)]
    pub attempts_per_call: f64,
    /// Each run's recovery.
    #[serde(default)]
    pub recovery_s_runs: Vec<Option<f64>>,
    /// Each run's goodput during the trigger ÷ the capacity left.
    #[serde(default)]
    pub during_runs: Vec<f64>,
    /// Each run's share of work for callers gone.
    #[serde(default)]
    pub expired_work_runs: Vec<f64>,
    /// Each run's attempts per second during the trigger.
    #[serde(default)]
    pub attempts_per_s_during_runs: Vec<f64>,
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

    /// µs from the start to `at`: how a request tells the server when its
    /// caller gives up.
    fn offset(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.start).as_micros() as u64
    }

    /// A query starts now for an attempt whose caller gives up at
    /// `gives_up` (µs from the start).
    fn started(&self, gives_up: u64) {
        let now = Instant::now();
        let gone = self.offset(now) > gives_up;
        self.timeline.count(now, |c| {
            c.queries += 1;
            c.expired += u64::from(gone);
        });
    }
}

/// How a stack is built: its client, its server and its pool.
#[derive(Debug, Clone, Copy)]
struct Variant {
    caller: Caller,
    front: Front,
    pool: PoolKind,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Caller {
    /// One attempt, the deadline sent.
    Once,
    /// `tower::retry` with a budget and backoff, the deadline sent.
    Careful,
    /// The hand-written loop: fresh 200 ms timeouts, no deadline sent.
    Loop,
    /// Our client layer, with (or without) our retry layer.
    Ours { retries: bool },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Front {
    /// Tonic's server as it comes (it honours `grpc-timeout`).
    Plain,
    /// Tonic's `Server::timeout`, concurrency limit and load shedding.
    Careful,
    /// Our server layer.
    Ours,
}

/// Which parts of ours a pool keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Parts {
    discipline: Discipline,
    /// Work that cannot finish in time is refused before it takes a
    /// connection.
    refuse: bool,
    /// A query stops when its request's scope ends.
    cancel: bool,
    max_queue: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum PoolKind {
    /// A FIFO semaphore; a query runs to its end.
    Plain,
    /// Our `Admission`, with these parts.
    Ours(Parts),
}

fn variant(stack: &str) -> Variant {
    let all = Parts {
        discipline: Discipline::default(),
        refuse: true,
        cancel: true,
        max_queue: None,
    };
    let plain = |caller, front| Variant {
        caller,
        front,
        pool: PoolKind::Plain,
    };
    let ours = |parts, retries| Variant {
        caller: Caller::Ours { retries },
        front: Front::Ours,
        pool: PoolKind::Ours(parts),
    };
    match stack {
        "plain, no retries" => plain(Caller::Once, Front::Plain),
        "careful plain" => plain(Caller::Careful, Front::Careful),
        "hand-written retry loop" => plain(Caller::Loop, Front::Plain),
        "ours, FIFO queue" => ours(
            Parts {
                discipline: Discipline::Fifo,
                ..all
            },
            true,
        ),
        "ours, no refusal" => ours(
            Parts {
                refuse: false,
                ..all
            },
            true,
        ),
        "ours, no query cancel" => ours(
            Parts {
                cancel: false,
                ..all
            },
            true,
        ),
        "ours, no retries" => ours(all, false),
        "ours, bounded queue" => ours(
            Parts {
                max_queue: Some(BOUNDED_QUEUE),
                ..all
            },
            true,
        ),
        _ => ours(all, true),
    }
}

#[derive(Clone)]
enum Pool {
    Plain(Arc<Semaphore>),
    Ours {
        admission: Admission,
        refuse: bool,
        cancel: bool,
    },
}

#[derive(Clone)]
struct Handler {
    pool: Pool,
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl testkit::CallOnly for Handler {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        // When the attempt's caller gives up, µs from the start.
        let gives_up = request.get_ref().interval_ms;
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
            Pool::Ours {
                admission,
                refuse,
                cancel,
            } => {
                let scope = Scope::current();
                let connection = if *refuse {
                    admission.acquire(&scope).await?
                } else {
                    // Queued without the deadline, so nothing is refused
                    // for lack of time; the wait still ends with the caller.
                    scope.run(admission.acquire(&Scope::background())).await??
                };
                self.shared.started(gives_up);
                if *cancel {
                    scope.run(tokio::time::sleep(query)).await?;
                    drop(connection);
                } else {
                    tonic_deadline::detach(async move {
                        tokio::time::sleep(query).await;
                        drop(connection);
                    })
                    .await
                    .map_err(|_| Status::internal("query failed"))?;
                }
            }
        }
        Ok(Response::new(CallReply::default()))
    }
}

/// A channel that counts the attempts sent through it.
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S, B> Service<http::Request<B>> for Counted<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        self.shared
            .timeline
            .count(Instant::now(), |c| c.attempts += 1);
        self.inner.call(request)
    }
}

/// One root call of the careful plain client: its deadline.
#[derive(Debug, Clone, Copy)]
struct Call {
    deadline: Instant,
}

/// One attempt of a careful plain call: the deadline sent with what is
/// left of it (`Request::set_timeout`), and kept by the client too.
#[derive(Clone)]
struct Attempts {
    client: ProbeClient<Counted<Channel>>,
    shared: Arc<Shared>,
}

impl Service<Call> for Attempts {
    type Response = ();
    type Error = Status;
    type Future = BoxFuture<'static, Result<(), Status>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: Call) -> Self::Future {
        let mut client = self.client.clone();
        let gives_up = self.shared.offset(call.deadline);
        Box::pin(async move {
            let left = call.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Status::deadline_exceeded("no time left"));
            }
            let mut request = Request::new(CallRequest {
                interval_ms: gives_up,
                ..CallRequest::default()
            });
            request.set_timeout(left);
            match tokio::time::timeout(left, client.call(request)).await {
                Ok(answer) => answer.map(drop),
                Err(_) => Err(Status::deadline_exceeded("deadline passed")),
            }
        })
    }
}

/// The careful plain client's retry policy, after tower's budget example:
/// a success deposits, a retry withdraws; retries `UNAVAILABLE` and
/// `RESOURCE_EXHAUSTED` (what load shedding answers) after an exponential
/// backoff with jitter, while the deadline has not passed.
#[derive(Clone)]
struct CarefulPolicy {
    budget: Arc<TpsBudget>,
    backoff: ExponentialBackoff,
}

impl Policy<Call, (), Status> for CarefulPolicy {
    type Future = tokio::time::Sleep;

    fn retry(&mut self, call: &mut Call, result: &mut Result<(), Status>) -> Option<Self::Future> {
        match result {
            Ok(()) => {
                self.budget.deposit();
                None
            }
            Err(status) => {
                let retryable =
                    matches!(status.code(), Code::Unavailable | Code::ResourceExhausted);
                let time_left = Instant::now() < call.deadline;
                (retryable && time_left && self.budget.withdraw())
                    .then(|| self.backoff.next_backoff())
            }
        }
    }

    fn clone_request(&mut self, call: &Call) -> Option<Call> {
        Some(*call)
    }
}

/// A root client.
#[derive(Clone)]
enum Client {
    Once(ProbeClient<Counted<Channel>>),
    Careful(Retry<CarefulPolicy, Attempts>),
    Loop(ProbeClient<Counted<Channel>>),
    Ours(ProbeClient<Resilience<Counted<Layered>>>),
    OursAlone(ProbeClient<Counted<Layered>>),
}

impl Client {
    /// One root call, started at `began`: whether it was answered OK
    /// before its deadline.
    async fn call(&mut self, shared: &Shared, began: Instant) -> bool {
        let deadline = began + DEADLINE;
        let ok = match self {
            Client::Once(client) => {
                let mut request = Request::new(CallRequest {
                    interval_ms: shared.offset(deadline),
                    ..CallRequest::default()
                });
                request.set_timeout(DEADLINE);
                matches!(
                    tokio::time::timeout_at(deadline, client.call(request)).await,
                    Ok(Ok(_))
                )
            }
            Client::Careful(client) => {
                let call = async { client.ready().await?.call(Call { deadline }).await };
                matches!(tokio::time::timeout_at(deadline, call).await, Ok(Ok(())))
            }
            Client::Loop(client) => {
                for _ in 0..=LOOP_RETRIES {
                    let request = CallRequest {
                        interval_ms: shared.offset(Instant::now() + LOOP_ATTEMPT),
                        ..CallRequest::default()
                    };
                    let attempt = client.call(request);
                    if let Ok(Ok(_)) = tokio::time::timeout(LOOP_ATTEMPT, attempt).await {
                        return Instant::now() <= deadline;
                    }
                    if Instant::now() >= deadline {
                        return false;
                    }
                }
                false
            }
            Client::Ours(client) => {
                let request = CallRequest {
                    interval_ms: shared.offset(deadline),
                    ..CallRequest::default()
                };
                Scope::background()
                    .with_deadline(deadline)
                    .enter(client.call(request))
                    .await
                    .is_ok()
            }
            Client::OursAlone(client) => {
                let request = CallRequest {
                    interval_ms: shared.offset(deadline),
                    ..CallRequest::default()
                };
                Scope::background()
                    .with_deadline(deadline)
                    .enter(client.call(request))
                    .await
                    .is_ok()
            }
        };
        ok && Instant::now() <= deadline
    }
}

/// Serves `routes` as tonic's and tower's docs set a careful server up:
/// tonic's own timeout, and tower's limit of requests in flight across the
/// server with load shedding beyond it (tonic answers the shed request
/// `RESOURCE_EXHAUSTED`).
async fn serve_careful(routes: Routes) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let bound = listener.local_addr()?;
    let incoming = TcpListenerStream::new(listener).map(|conn| {
        conn.inspect(|stream| {
            let _ = stream.set_nodelay(true);
        })
    });
    let server = Server::builder()
        .timeout(DEADLINE)
        .layer(
            tower::ServiceBuilder::new()
                .layer(LoadShedLayer::new())
                .layer(GlobalConcurrencyLimitLayer::new(CAREFUL_LIMIT)),
        )
        .add_routes(routes);
    tonic_deadline::detach(server.serve_with_incoming(incoming));
    Ok(bound)
}

fn counted<S>(inner: S, shared: &Arc<Shared>) -> Counted<S> {
    Counted {
        inner,
        shared: shared.clone(),
    }
}

/// The stack's server, and its root clients (each on a connection of its
/// own).
async fn stack(variant: Variant, shared: &Arc<Shared>) -> anyhow::Result<Vec<Client>> {
    let pool = match variant.pool {
        PoolKind::Plain => Pool::Plain(Arc::new(Semaphore::new(CONNECTIONS))),
        PoolKind::Ours(parts) => {
            let admission = Admission::new(CONNECTIONS).discipline(parts.discipline);
            Pool::Ours {
                admission: match parts.max_queue {
                    Some(max) => admission.max_queue(max),
                    None => admission,
                },
                refuse: parts.refuse,
                cancel: parts.cancel,
            }
        }
    };
    let routes = Routes::new(ProbeServer::new(Handler {
        pool,
        shared: shared.clone(),
    }));
    let addr = match variant.front {
        Front::Plain => net::serve("127.0.0.1:0", routes, None).await?,
        Front::Careful => serve_careful(routes).await?,
        Front::Ours => net::serve("127.0.0.1:0", routes, Some(ServerDeadlineLayer::new())).await?,
    };
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(match variant.caller {
            Caller::Once => {
                Client::Once(ProbeClient::new(counted(net::connect(addr).await?, shared)))
            }
            Caller::Loop => {
                Client::Loop(ProbeClient::new(counted(net::connect(addr).await?, shared)))
            }
            Caller::Careful => {
                let attempts = Attempts {
                    client: ProbeClient::new(counted(net::connect(addr).await?, shared)),
                    shared: shared.clone(),
                };
                let policy = CarefulPolicy {
                    budget: Arc::new(TpsBudget::default()),
                    backoff: ExponentialBackoffMaker::default().make_backoff(),
                };
                Client::Careful(Retry::new(policy, attempts))
            }
            Caller::Ours { retries } => {
                let channel = counted(net::connect_layered(addr).await?, shared);
                if retries {
                    Client::Ours(ProbeClient::new(
                        tower::ServiceBuilder::new()
                            .layer(ResilienceLayer::from_service_config(OUR_CONFIG)?)
                            .service(channel),
                    ))
                } else {
                    Client::OursAlone(ProbeClient::new(channel))
                }
            }
        });
    }
    Ok(clients)
}

/// What one run measured of one stack under one trigger.
#[derive(Debug, Clone, Default)]
struct Measured {
    recovery_s: Option<f64>,
    during: f64,
    expired: f64,
    attempts_during: f64,
    attempts_per_call: f64,
    goodput: Vec<f64>,
    offered: Vec<f64>,
    attempts: Vec<f64>,
    expired_share: Vec<f64>,
}

/// One stack under one trigger, on its own server, once.
async fn run_once(stack: &str, trigger: &str, timeline: [Duration; 3]) -> anyhow::Result<Measured> {
    let start = Instant::now() + Duration::from_millis(200);
    let shared = Arc::new(Shared {
        slowdown: AtomicU64::new(1),
        timeline: Timeline::new(start),
        start,
    });
    let clients = self::stack(variant(stack), &shared).await?;

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
    let mut turn = clients.iter().cycle();
    while next < end {
        tokio::time::sleep_until(next).await;
        let Some(mut client) = turn.next().cloned() else {
            break;
        };
        let shared = shared.clone();
        let began = next;
        shared.timeline.count(began, |c| c.offered += 1);
        #[allow(clippy::disallowed_methods)] // the load generator is no request's work
        calls.spawn(async move {
            if client.call(&shared, began).await {
                // Counted when the call started: a late backlog's answers
                // are not the recovery of the calls made then.
                shared.timeline.count(began, |c| c.good += 1);
            }
        });
        let in_spike =
            trigger == "spike" && next >= start + before && next < start + before + during;
        let rate = if in_spike { base * SPIKE } else { base };
        next += Duration::from_secs_f64(1.0 / rate);
    }
    // Calls still running end within their deadline, then the counts are
    // read.
    let _ = tokio::time::timeout(DEADLINE + Duration::from_millis(100), async {
        while calls.join_next().await.is_some() {}
    })
    .await;
    calls.abort_all();
    let _ = trigger_task.await;

    let n = total.as_micros() / BUCKET.as_micros();
    let buckets = shared.timeline.buckets(n as u64);
    let bucket_s = BUCKET.as_secs_f64();
    let seconds = |f: &dyn Fn(&Counts) -> f64| -> Vec<f64> {
        buckets
            .chunks(PER_SECOND)
            .map(|s| round3(s.iter().map(f).sum::<f64>() / (bucket_s * s.len() as f64)))
            .collect()
    };
    let goodput = seconds(&|c| c.good as f64 / CAPACITY);
    let offered = seconds(&|c| c.offered as f64);
    let attempts = seconds(&|c| c.attempts as f64);
    let expired_share: Vec<f64> = buckets
        .chunks(PER_SECOND)
        .map(|s| {
            let queries: u64 = s.iter().map(|c| c.queries).sum();
            let expired: u64 = s.iter().map(|c| c.expired).sum();
            round3(expired as f64 / queries.max(1) as f64)
        })
        .collect();
    let bucket_of = |d: Duration| (d.as_micros() / BUCKET.as_micros()) as usize;
    let (trigger_start, trigger_end) = (bucket_of(before), bucket_of(before + during));
    // During: skip the first second, while the queue fills.
    let during_buckets = &buckets[(trigger_start + PER_SECOND).min(trigger_end)..trigger_end];
    let remaining = if trigger == "capacity" {
        CAPACITY / SLOWDOWN as f64
    } else {
        CAPACITY
    };
    let good_during = during_buckets.iter().map(|c| c.good).sum::<u64>() as f64
        / (during_buckets.len().max(1) as f64 * bucket_s);
    let trigger_buckets = &buckets[trigger_start..trigger_end];
    let attempts_during = trigger_buckets.iter().map(|c| c.attempts).sum::<u64>() as f64
        / (trigger_buckets.len().max(1) as f64 * bucket_s);
    let recovery = recovered_from(&buckets, trigger_end);
    let sum = |f: fn(&Counts) -> u64| buckets.iter().map(f).sum::<u64>();
    Ok(Measured {
        recovery_s: recovery.map(|b| round3((b - trigger_end) as f64 * bucket_s)),
        during: round3(good_during / remaining),
        expired: round4(sum(|c| c.expired) as f64 / sum(|c| c.queries).max(1) as f64),
        attempts_during: round3(attempts_during),
        attempts_per_call: round3(sum(|c| c.attempts) as f64 / sum(|c| c.offered).max(1) as f64),
        goodput,
        offered,
        attempts,
        expired_share,
    })
}

/// The first bucket from `from` on such that every window of
/// [`RECOVERED_FOR`] buckets starting there or later (to the run's end)
/// answers in time [`RECOVERED_SHARE`] of the calls started in it; `None`
/// if not even the run's last window does.
fn recovered_from(buckets: &[Counts], from: usize) -> Option<usize> {
    let last_start = buckets.len().checked_sub(RECOVERED_FOR)?;
    let short = |k: usize| {
        let window = &buckets[k..k + RECOVERED_FOR];
        let good: u64 = window.iter().map(|c| c.good).sum();
        let offered: u64 = window.iter().map(|c| c.offered).sum();
        (good as f64) < RECOVERED_SHARE * offered as f64
    };
    // The last window that falls short; recovery starts after it.
    let first = match (from..=last_start).rev().find(|&k| short(k)) {
        Some(k) => k + 1,
        None => from,
    };
    (first <= last_start).then_some(first)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
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

/// The median of recoveries, `None` (never) counting as the longest.
fn median_recovery(xs: &[Option<f64>]) -> Option<f64> {
    let mut sorted = xs.to_vec();
    sorted.sort_by(|a, b| match (a, b) {
        (Some(a), Some(b)) => a.total_cmp(b),
        (a, b) => a.is_none().cmp(&b.is_none()),
    });
    sorted
        .get(sorted.len().saturating_sub(1) / 2)
        .copied()
        .flatten()
}

/// Each second's median over the runs.
fn median_series(runs: &[&[f64]]) -> Vec<f64> {
    let len = runs.iter().map(|r| r.len()).min().unwrap_or(0);
    (0..len)
        .map(|i| median(&runs.iter().map(|r| r[i]).collect::<Vec<_>>()))
        .collect()
}

/// The row of `stack` under `trigger` from its runs.
fn row(stack: &str, trigger: &str, runs: &[Measured]) -> Row {
    let each = |f: fn(&Measured) -> f64| runs.iter().map(f).collect::<Vec<f64>>();
    let series =
        |f: fn(&Measured) -> &[f64]| median_series(&runs.iter().map(f).collect::<Vec<_>>());
    let recovery_s_runs: Vec<Option<f64>> = runs.iter().map(|m| m.recovery_s).collect();
    Row {
        stack: stack.to_owned(),
        trigger: trigger.to_owned(),
        recovery_s: median_recovery(&recovery_s_runs),
        during_share_of_remaining: median(&each(|m| m.during)),
        expired_work_share: median(&each(|m| m.expired)),
        goodput: series(|m| &m.goodput),
        offered: series(|m| &m.offered),
        attempts: series(|m| &m.attempts),
        expired_share: series(|m| &m.expired_share),
        attempts_per_s_during: median(&each(|m| m.attempts_during)),
        attempts_per_call: median(&each(|m| m.attempts_per_call)),
        recovery_s_runs,
        during_runs: each(|m| m.during),
        expired_work_runs: each(|m| m.expired),
        attempts_per_s_during_runs: each(|m| m.attempts_during),
    }
}

/// Every stack ([`STACKS`], then [`ABLATIONS`]) under both triggers,
/// through `timeline` (before, during, after the trigger), `runs` times
/// one after another. In each run, one trigger then the other; for each,
/// plain tonic's three stacks side by side, then ours and its variants
/// side by side (each its own server, pool and clients; the pool is
/// simulated, so they share no capacity).
///
/// # Errors
///
/// When a server cannot be served or connected to.
pub async fn measure(timeline: [Duration; 3], runs: usize) -> anyhow::Result<Metastable> {
    let cases: Vec<(&str, &str)> = TRIGGERS
        .iter()
        .flat_map(|trigger| {
            STACKS
                .iter()
                .chain(&ABLATIONS)
                .map(move |stack| (*trigger, *stack))
        })
        .collect();
    let mut measured: Vec<Vec<Measured>> = vec![Vec::new(); cases.len()];
    // Plain tonic's stacks apart from ours: the hand-written loop's
    // thousands of attempts a second would otherwise decide, through the
    // machine they share, what every other row measures.
    let plain = |stack: &str| STACKS[..3].contains(&stack);
    for _ in 0..runs.max(1) {
        for trigger in TRIGGERS {
            for group in [true, false] {
                let tasks: Vec<_> = cases
                    .iter()
                    .enumerate()
                    .filter(|(_, (t, s))| *t == trigger && plain(s) == group)
                    .map(|(i, &(trigger, stack))| {
                        (
                            i,
                            tonic_deadline::detach(async move {
                                run_once(stack, trigger, timeline).await
                            }),
                        )
                    })
                    .collect();
                for (i, task) in tasks {
                    measured[i].push(task.await??);
                }
            }
        }
    }
    Ok(Metastable {
        rows: cases
            .iter()
            .zip(&measured)
            .map(|(&(trigger, stack), runs)| row(stack, trigger, runs))
            .collect(),
        capacity_rps: CAPACITY,
        offered_rps: CAPACITY * LOAD,
        timeline_s: timeline.map(|d| d.as_secs_f64()),
        runs: runs.max(1),
    })
}

/// `median (min–max)` of a figure over the runs.
fn spread(median: f64, runs: &[f64], digits: usize) -> String {
    let min = runs.iter().copied().fold(f64::INFINITY, f64::min);
    let max = runs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if runs.len() < 2 {
        format!("{median:.digits$}")
    } else {
        format!("{median:.digits$} ({min:.digits$}–{max:.digits$})")
    }
}

/// The same for recoveries, a run that never recovered shown as `never`.
fn recovery_spread(median: Option<f64>, runs: &[Option<f64>]) -> String {
    let show = |r: Option<f64>| r.map_or_else(|| "never".to_owned(), |s| format!("{s:.1}"));
    let mut sorted = runs.to_vec();
    sorted.sort_by(|a, b| match (a, b) {
        (Some(a), Some(b)) => a.total_cmp(b),
        (a, b) => a.is_none().cmp(&b.is_none()),
    });
    match (sorted.first(), sorted.last()) {
        (Some(&min), Some(&max)) if runs.len() >= 2 => {
            format!("{} ({}–{})", show(median), show(min), show(max))
        }
        _ => show(median),
    }
}

impl Experiment for Metastable {
    const NAME: &'static str = "metastable";
    const ABOUT: &'static str = "A service at 0.9 of capacity hit by a capacity cut or a load spike that then ends: recovery, goodput during the trigger and attempts per second for plain tonic without retries, careful plain tonic (limit, load shedding, tower::retry with a budget), a hand-written retry loop, ours and ours with each part taken out";
    const PRINTS: &'static str =
        "a service at 0.9 of its capacity meets a trigger: recovery, goodput during it and attempts per second for plain tonic without retries, careful plain tonic, a hand-written retry loop, ours and ours with each part taken out ([more](#experiment-metastable))";
    const SECTION: Option<Section> = Some(Section::Metastable);
    type Args = Args;

    fn demo_args() -> Args {
        let [before_ms, trigger_ms, after_ms] = DEMO_TIMELINE_MS;
        Args {
            before_ms,
            trigger_ms,
            after_ms,
            // One run in the demo, which must stay short; the docs' tables
            // are the median of RUNS.
            runs: 1,
        }
    }

    async fn run(args: Args, _: Spans) -> anyhow::Result<Self> {
        let timeline = [args.before_ms, args.trigger_ms, args.after_ms];
        measure(
            timeline.map(|ms| Duration::from_millis(ms.clamp(MIN_PART_MS, 120_000))),
            args.runs.clamp(1, 9),
        )
        .await
    }

    fn outcome(&self) -> Outcome {
        let [before, during, _] = self.timeline_s;
        let rows = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.trigger.clone(),
                    r.stack.clone(),
                    recovery_spread(r.recovery_s, &r.recovery_s_runs),
                    spread(r.during_share_of_remaining, &r.during_runs, 2),
                    spread(r.expired_work_share, &r.expired_work_runs, 3),
                    spread(r.attempts_per_s_during, &r.attempts_per_s_during_runs, 0),
                    format!("{:.2}", r.attempts_per_call),
                    r.goodput
                        .iter()
                        .map(|x| format!("{x:.2}"))
                        .collect::<Vec<_>>()
                        .join(" "),
                ]
            })
            .collect();
        let notes = vec![
            format!(
                "a pool of {CONNECTIONS} × {} ms queries ({:.0} calls/s), offered {:.0} calls/s open-loop, 1 s deadlines; the trigger from {before:.1} s for {during:.1} s: capacity cut to 20 %, or twice the load; each figure the median of {} runs (min–max)",
                QUERY.as_millis(),
                self.capacity_rps,
                self.offered_rps,
                self.runs.max(1),
            ),
            "plain, no retries: the deadline sent (Request::set_timeout), one attempt, a FIFO pool whose queries run to their end; careful plain: the same pool, Server::timeout 1 s, concurrency_limit_per_connection(32), load_shed(true), tower::retry on UNAVAILABLE / RESOURCE_EXHAUSTED with TpsBudget::default() and ExponentialBackoffMaker::default() inside the deadline; hand-written retry loop: no deadline sent, a fresh 200 ms timeout per attempt, up to 4 retries at once".into(),
            "ours: the layers, Admission in front of the pool, retries from service config (maxAttempts 5 in the one deadline, retryThrottling 10 / 0.1); ablations: FIFO queue, no refusal of work that cannot finish, queries run to their end, no retry layer; ours, bounded queue: 8 waiters, the oldest refused with RESOURCE_EXHAUSTED, which the retry policy retries".into(),
            format!(
                "recovery: from the trigger's end, in 100 ms steps, until every second-long window from then to the end of the run answers in time {:.0} % of the calls started in it; goodput counted by when its call started",
                RECOVERED_SHARE * 100.0
            ),
            "goals for ours: during the trigger at least 0.90 of the capacity left; recovered within 1 s of its end; at most 1 % of the work for callers already gone".into(),
        ];
        Outcome {
            title: "metastable: a service at 0.9 of capacity, a trigger that ends — does goodput come back, on which stack, and which part of ours brings it back?".into(),
            json: crate::report::to_json(self),
            columns: vec![
                "trigger",
                "stack",
                "recovery s",
                "during / capacity left",
                "work for callers gone",
                "attempts/s during",
                "attempts per call",
                "goodput per second (÷ capacity)",
            ],
            rows,
            notes,
        }
    }

    /// Goodput second by second through the trigger, one chart per
    /// trigger, every stack compared, beside the load offered.
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
                    "Goodput ÷ capacity, by the second each call started: {what} from {before:.1} s to {:.1} s",
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
