//! Goodput under overload (R-26, R-27): a service whose handler needs a
//! pooled database connection for a ~10 ms query, driven open-loop at 1×, 2×
//! and 4× its measured capacity with 100 ms client deadlines.
//!
//! The pool is simulated — `connections` slots, each held for `query` — so the
//! figure measures queueing, not the machine's CPU. Both servers run in this
//! process, one after the other at each load level:
//!
//! - **plain**: plain tonic, the handler written the usual way — wait for a
//!   connection from a first-in-first-out pool (`tokio::sync::Semaphore`,
//!   as in deadpool or bb8), run the query, answer. A query, once started,
//!   runs to its end on the database even if the caller has gone (dropping a
//!   future does not stop a server).
//! - **ours**: [`ServerDeadlineLayer`] and the pool behind an [`Admission`]:
//!   queue time spends the request's budget, a request that cannot finish in
//!   time is refused before it takes a connection, and a query is stopped
//!   when the request's scope ends (what our SQLite and PostgreSQL pools do).
//!   Measured with each queue [`Discipline`], so the default is chosen from
//!   the figures.
//!
//! Goodput = answers received OK before the client's deadline, per second,
//! ÷ capacity.

use std::sync::Arc;
use std::time::Duration;

use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use testkit::{CallReply, CallRequest};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tonic::service::Routes;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tonic_deadline::admission::{Admission, Discipline};
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::html::chart::{self, Series};
use crate::html::{Part, Section};
use crate::net;
use crate::registry::{Experiment, Kind, Spans};
use crate::report::Outcome;

/// The flags of `bench overload`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Seconds of open-loop load per server and level.
    #[arg(long, default_value_t = 3.0)]
    window_s: f64,
}

/// How hard and how long to run.
#[derive(Debug, Clone)]
pub struct Load {
    /// Connections in the simulated database pool.
    pub connections: usize,
    /// How long one query holds a connection.
    pub query: Duration,
    /// The client's deadline for every call.
    pub deadline: Duration,
    /// Offered load, as multiples of the measured capacity.
    pub levels: Vec<u32>,
    /// How long each variant is driven at each level.
    pub window: Duration,
    /// gRPC connections from the load generator to each server.
    pub channels: usize,
}

impl Default for Load {
    fn default() -> Self {
        Self {
            connections: 4,
            query: Duration::from_millis(10),
            deadline: Duration::from_millis(100),
            levels: vec![1, 2, 4],
            window: Duration::from_secs(3),
            channels: 4,
        }
    }
}

#[derive(Clone)]
pub(crate) enum Pool {
    /// A first-in-first-out pool that knows no deadlines.
    Plain(Arc<Semaphore>),
    /// Our deadline-aware admission in front of the connections.
    Ours(Admission),
}

#[derive(Clone)]
pub(crate) struct Service {
    pool: Pool,
    query: Duration,
}

impl Service {
    async fn plain(&self, pool: &Arc<Semaphore>) -> Result<(), Status> {
        let connection = pool
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Status::unavailable("pool closed"))?;
        let query = self.query;
        // The database runs the query to its end whatever happens to us.
        tonic_deadline::detach(async move {
            tokio::time::sleep(query).await;
            drop(connection);
        })
        .await
        .map_err(|_| Status::internal("query failed"))
    }

    /// Our server's handler: behind an [`Admission`] for `load`'s pool.
    pub(crate) fn ours(load: &Load) -> Self {
        Self {
            pool: Pool::Ours(Admission::new(load.connections)),
            query: load.query,
        }
    }

    /// Waits for a connection, runs the query, answers.
    pub(crate) async fn serve(&self) -> Result<(), Status> {
        match &self.pool {
            Pool::Plain(pool) => self.plain(pool).await,
            Pool::Ours(admission) => self.ours_query(admission).await,
        }
    }

    async fn ours_query(&self, admission: &Admission) -> Result<(), Status> {
        let scope = Scope::current();
        let connection = admission.acquire(&scope).await?;
        // Stopped (and the connection freed) when the request's scope ends.
        scope.run(tokio::time::sleep(self.query)).await?;
        drop(connection);
        Ok(())
    }
}

#[tonic::async_trait]
impl testkit::CallOnly for Service {
    async fn call(&self, _request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        self.serve().await?;
        Ok(Response::new(CallReply::default()))
    }
}

/// One server under test and the clients that drive it.
struct Target {
    clients: Vec<ProbeClient<Channel>>,
    pool: Pool,
}

impl Target {
    /// Waits, at most `bound`, for the plain server's abandoned queries to
    /// drain: its pool runs every query it queued to the end. Ours stops
    /// each query with its request, so nothing of it is left once the
    /// calls have answered.
    async fn drained(&self, connections: usize, bound: Duration) {
        let Pool::Plain(pool) = &self.pool else {
            return;
        };
        let until = Instant::now() + bound;
        while pool.available_permits() < connections && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

async fn start(pool: Pool, load: &Load) -> anyhow::Result<Target> {
    let layer = matches!(pool, Pool::Ours(_)).then(ServerDeadlineLayer::new);
    let service = Service {
        pool: pool.clone(),
        query: load.query,
    };
    let addr = net::serve("127.0.0.1:0", Routes::new(ProbeServer::new(service)), layer).await?;
    let mut clients = Vec::new();
    for _ in 0..load.channels.max(1) {
        clients.push(ProbeClient::new(net::connect(addr).await?));
    }
    Ok(Target { clients, pool })
}

/// Closed loop, `callers` at a time, for `length`: completed calls per second.
async fn closed_loop(target: &Target, callers: usize, length: Duration) -> f64 {
    let clients = target.clients.clone();
    closed_loop_with(callers, length, move |i| {
        let mut client = clients[i % clients.len()].clone();
        async move {
            let mut request = Request::new(CallRequest::default());
            request.set_timeout(Duration::from_secs(5));
            client.call(request).await.is_ok()
        }
    })
    .await
}

/// Closed loop, `callers` at a time, for `length`, each running `call`
/// (given its caller's number) again and again: OK calls per second.
pub(crate) async fn closed_loop_with<F, Fut>(callers: usize, length: Duration, call: F) -> f64
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = bool> + Send,
{
    let end = Instant::now() + length;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..callers {
        let call = call.clone();
        tasks.push(tonic_deadline::detach(async move {
            let mut done = 0u64;
            while Instant::now() < end {
                if call(i).await {
                    done += 1;
                }
            }
            done
        }));
    }
    let mut done = 0u64;
    for task in tasks {
        done += task.await.unwrap_or(0);
    }
    done as f64 / started.elapsed().as_secs_f64()
}

/// What one open-loop window produced.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Window {
    pub(crate) sent: u64,
    pub(crate) good: u64,
    pub(crate) late: u64,
    pub(crate) failed: u64,
    pub(crate) seconds: f64,
}

/// Open loop at `rate` calls per second for `length`; every call carries
/// `deadline`. Counts answers received OK before the deadline.
async fn open_loop(target: &Target, rate: f64, length: Duration, deadline: Duration) -> Window {
    let clients = target.clients.clone();
    open_loop_with(rate, length, deadline, move |i| {
        let mut client = clients[i as usize % clients.len()].clone();
        async move {
            let mut request = Request::new(CallRequest::default());
            request.set_timeout(deadline);
            client.call(request).await.is_ok()
        }
    })
    .await
}

/// Open loop at `rate` calls per second for `length`, each call made by
/// `call(i)` (true: answered OK) and waited for `deadline` at most.
pub(crate) async fn open_loop_with<F, Fut>(
    rate: f64,
    length: Duration,
    deadline: Duration,
    call: F,
) -> Window
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = bool> + Send + 'static,
{
    let total = (rate * length.as_secs_f64()).round() as u64;
    let gap = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..total {
        tokio::time::sleep_until(start + gap.mul_f64(i as f64)).await;
        let answer = call(i);
        #[allow(clippy::disallowed_methods)] // the load generator is no request's work
        calls.spawn(async move {
            let sent = Instant::now();
            match tokio::time::timeout(deadline, answer).await {
                Ok(true) if sent.elapsed() <= deadline => Answer::Good,
                Ok(true) => Answer::Late,
                _ => Answer::Failed,
            }
        });
    }
    let mut window = Window {
        sent: total,
        seconds: length.as_secs_f64(),
        ..Window::default()
    };
    while let Some(done) = calls.join_next().await {
        match done {
            Ok(Answer::Good) => window.good += 1,
            Ok(Answer::Late) => window.late += 1,
            _ => window.failed += 1,
        }
    }
    window
}

enum Answer {
    Good,
    Late,
    Failed,
}

/// What one variant's calls came to in one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Calls {
    /// Calls sent.
    pub sent: u64,
    /// Answered OK before the deadline.
    pub good: u64,
    /// Answered OK, after the deadline.
    pub late: u64,
    /// Failed or not answered within the deadline.
    pub failed: u64,
}

/// One offered load: every variant's goodput (÷ capacity) and calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Level {
    /// Offered load, as a multiple of capacity.
    pub offered_x: u32,
    /// Offered load, calls per second.
    pub offered_rps: f64,
    /// Plain tonic, a FIFO pool that knows no deadlines.
    pub plain_goodput: f64,
    /// Its calls.
    pub plain_calls: Calls,
    /// Ours with the default discipline (adaptive LIFO).
    pub ours_goodput: f64,
    /// Its calls.
    pub ours_calls: Calls,
    /// Ours, FIFO.
    pub ours_fifo_goodput: f64,
    /// Its calls.
    pub ours_fifo_calls: Calls,
    /// Ours, LIFO.
    pub ours_lifo_goodput: f64,
    /// Its calls.
    pub ours_lifo_calls: Calls,
}

impl Level {
    /// Every variant's goodput, in [`Overload::VARIANTS`] order.
    pub fn goodputs(&self) -> [f64; 4] {
        [
            self.plain_goodput,
            self.ours_fifo_goodput,
            self.ours_lifo_goodput,
            self.ours_goodput,
        ]
    }
}

/// The benchmark's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Overload {
    /// The capacity goodput is divided by: the larger of the two below.
    pub capacity_rps: f64,
    /// Plain tonic's closed-loop throughput.
    pub capacity_plain_rps: f64,
    /// Ours, closed loop.
    pub capacity_ours_rps: f64,
    /// Connections in the simulated pool.
    pub connections: usize,
    /// How long one query holds a connection.
    pub query_ms: u64,
    /// The client's deadline.
    pub deadline_ms: u64,
    /// Seconds of open-loop load per variant and level.
    pub window_s: f64,
    /// One row per offered load.
    pub rows: Vec<Level>,
}

impl Overload {
    /// The variants' names, in [`Level::goodputs`] order.
    pub const VARIANTS: [&'static str; 4] = [
        "plain tonic",
        "ours FIFO",
        "ours LIFO",
        "ours (adaptive LIFO)",
    ];
}

/// Runs the benchmark.
///
/// # Errors
///
/// When a server cannot be started.
pub async fn measure(load: Load) -> anyhow::Result<Overload> {
    let plain = start(
        Pool::Plain(Arc::new(Semaphore::new(load.connections))),
        &load,
    )
    .await?;
    let disciplines = [Discipline::default(), Discipline::Fifo, Discipline::Lifo];
    let mut ours = Vec::new();
    for discipline in disciplines {
        let admission = Admission::new(load.connections).discipline(discipline);
        ours.push(start(Pool::Ours(admission), &load).await?);
    }

    // Capacity first: closed loop, enough callers to keep every connection
    // busy, on both servers; the larger figure is the one we divide by.
    let callers = load.connections * 4;
    let warm = Duration::from_millis(300);
    closed_loop(&plain, callers, warm).await;
    closed_loop(&ours[0], callers, warm).await;
    let capacity_plain = closed_loop(&plain, callers, Duration::from_millis(1500)).await;
    let capacity_ours = closed_loop(&ours[0], callers, Duration::from_millis(1500)).await;
    let capacity = capacity_plain.max(capacity_ours);

    let mut rows = Vec::new();
    for &x in &load.levels {
        let rate = capacity * f64::from(x);
        let mut measured = Vec::new();
        for target in std::iter::once(&plain).chain(&ours) {
            let w = open_loop(target, rate, load.window, load.deadline).await;
            let goodput = w.good as f64 / w.seconds / capacity;
            let calls = Calls {
                sent: w.sent,
                good: w.good,
                late: w.late,
                failed: w.failed,
            };
            measured.push(((goodput * 1000.0).round() / 1000.0, calls));
            // Let the plain server's abandoned queries drain before the next.
            target.drained(load.connections, load.deadline * 3).await;
        }
        // In the order the targets were started: plain, ours, FIFO, LIFO.
        let [plain, ours, fifo, lifo] = measured[..] else {
            anyhow::bail!("four variants must have run");
        };
        rows.push(Level {
            offered_x: x,
            offered_rps: rate.round(),
            plain_goodput: plain.0,
            plain_calls: plain.1,
            ours_goodput: ours.0,
            ours_calls: ours.1,
            ours_fifo_goodput: fifo.0,
            ours_fifo_calls: fifo.1,
            ours_lifo_goodput: lifo.0,
            ours_lifo_calls: lifo.1,
        });
    }
    Ok(Overload {
        capacity_rps: capacity.round(),
        capacity_plain_rps: capacity_plain.round(),
        capacity_ours_rps: capacity_ours.round(),
        connections: load.connections,
        query_ms: load.query.as_millis() as u64,
        deadline_ms: load.deadline.as_millis() as u64,
        window_s: load.window.as_secs_f64(),
        rows,
    })
}

impl Experiment for Overload {
    const NAME: &'static str = "overload";
    const ABOUT: &'static str =
        "Goodput at 1x, 2x and 4x capacity: a pooled ~10 ms query, 100 ms deadlines";
    const PRINTS: &'static str =
        "goodput at 1×, 2× and 4× capacity with 100 ms deadlines: plain tonic vs our admission queue (FIFO, LIFO, adaptive LIFO)";
    const KIND: Kind = Kind::Bench;
    const SECTION: Option<Section> = Some(Section::Overload);
    type Args = Args;

    /// Half-second windows: the windows are the demo's longest bench, and
    /// at 1x capacity one still holds ~175 calls (`bench overload` alone
    /// keeps 3 s).
    fn demo_args() -> Args {
        Args { window_s: 0.5 }
    }

    async fn run(args: Args, _: Spans) -> anyhow::Result<Self> {
        measure(Load {
            window: Duration::from_secs_f64(args.window_s.clamp(0.5, 30.0)),
            ..Default::default()
        })
        .await
    }

    fn outcome(&self) -> Outcome {
        let rows = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    format!("{}x", r.offered_x),
                    format!("{:.0}", r.offered_rps),
                    format!("{:.3}", r.plain_goodput),
                    format!("{:.3}", r.ours_goodput),
                    format!("{:.3}", r.ours_fifo_goodput),
                    format!("{:.3}", r.ours_lifo_goodput),
                ]
            })
            .collect();
        Outcome {
            title: format!(
                "bench overload: pool of {} connections x {} ms queries, {} ms client deadlines, {} s open-loop windows",
                self.connections, self.query_ms, self.deadline_ms, self.window_s
            ),
            json: crate::report::to_json(self),
            columns: vec![
                "offered",
                "req/s",
                "plain tonic",
                "ours (adaptive LIFO)",
                "ours FIFO",
                "ours LIFO",
            ],
            rows,
            notes: vec![
                format!(
                    "capacity: {:.0} req/s (closed loop; plain {:.0}, ours {:.0})",
                    self.capacity_rps, self.capacity_plain_rps, self.capacity_ours_rps
                ),
                "goodput = OK answers before the client's deadline per second / capacity (goal: ours >= 0.90 at 2x, >= 0.80 at 4x)".into(),
            ],
        }
    }

    /// Goodput over offered load, one line per variant, with the goals
    /// (0.90 at 2×, 0.80 at 4×) as ticks.
    fn report(&self, _: &Outcome) -> Vec<Part> {
        let xs: Vec<String> = self
            .rows
            .iter()
            .map(|r| format!("{}× ({:.0} req/s)", r.offered_x, r.offered_rps))
            .collect();
        let series: Vec<Series> = Overload::VARIANTS
            .iter()
            .enumerate()
            .map(|(v, name)| {
                (
                    (*name).to_owned(),
                    self.rows.iter().map(|r| r.goodputs()[v]).collect(),
                )
            })
            .collect();
        let goals: Vec<(usize, f64)> = self
            .rows
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r.offered_x {
                2 => Some((i, 0.90)),
                4 => Some((i, 0.80)),
                _ => None,
            })
            .collect();
        let mut html = chart::lines(
            "overload",
            &format!(
                "Goodput (OK before the {} ms deadline ÷ capacity) over offered load; capacity {:.0} req/s",
                self.deadline_ms, self.capacity_rps
            ),
            "of capacity",
            &xs,
            &series,
            &goals,
        );
        html.push_str(&format!(
            r#"<p class="note">a pool of {} connections × {} ms queries; {} s open-loop windows per variant and load</p>"#,
            self.connections, self.query_ms, self.window_s
        ));
        vec![Part::new(html)]
    }
}
