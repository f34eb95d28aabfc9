//! One budget across the crates a Rust service is built from: an axum HTTP
//! edge (900 ms default budget) fans out to a tonic service, which runs a
//! sqlx PostgreSQL query that would take 5 s, and to a REST service through
//! reqwest. The HTTP client gives up at 300 ms.
//!
//! Each layer reports the budget it saw on entry and when its work stopped;
//! the query is watched in `pg_stat_activity` from a second connection, and
//! the pool is checked whole afterwards. Two contrasts measure what the
//! sqlx integration costs and what it avoids: plain sqlx leaving a dropped
//! query running (and the connection's next query waiting behind it), and
//! the latency of a statement and of a whole call (take a connection, run
//! one statement) through the scoped pool beside plain sqlx — the call pays
//! the round trip that sets `statement_timeout`, once per connection taken,
//! since sqlx cannot pipeline it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use grpc_deadline_db::sqlx_postgres::{SqlxPgPool, sqlx};
use grpc_deadline_reqwest::DeadlineMiddleware;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tonic_deadline::deadline_headers::DeadlineHeader;
use tonic_deadline::{Cause, Scope, ServerDeadlineLayer};

use sqlx::{Connection, Executor, Row};

use crate::kit::postgres::{Throwaway, server};
use crate::html::chart::{self, Bar};
use crate::html::{Part, Section};
use crate::net;
use crate::pb::worker_client::WorkerClient;
use crate::pb::worker_server::{Worker, WorkerServer};
use crate::pb::{WorkReq, WorkResp};
use crate::report::{Outcome, ms};

/// The edge's default budget for requests without a deadline header.
pub const EDGE_BUDGET: Duration = Duration::from_millis(900);
/// When the HTTP client gives up.
pub const CLIENT_GIVES_UP: Duration = Duration::from_millis(300);
/// The query the gRPC service runs; the comment finds it in
/// `pg_stat_activity`.
const QUERY: &str = "SELECT pg_sleep(5) /* deadline-lab edge */";
/// How long the REST service would work.
const REST_WORK: Duration = Duration::from_secs(5);
/// How long plain sqlx's abandoned query runs.
const PLAIN_QUERY: &str = "SELECT pg_sleep(2) /* deadline-lab plain sqlx */";
/// Statements (and calls) timed for the costs.
const COST_SAMPLES: usize = 200;

/// The layers, as named in the result rows.
pub const LAYERS: [&str; 4] = ["http edge", "grpc service", "sqlx query", "reqwest call"];

/// One layer of the chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerRow {
    /// `http edge`, `grpc service`, `sqlx query` or `reqwest call`.
    pub layer: String,
    /// The budget the layer saw on entry, in ms (`None` without a
    /// deadline).
    pub remaining_on_entry_ms: Option<f64>,
    /// When its work stopped, in ms from the client's request (`None` if
    /// it never stopped within the experiment's patience).
    pub stopped_ms: Option<f64>,
    /// Whether the work stopped where it ran — the handler's scope ended
    /// and it did not finish; for the query, it left `pg_stat_activity` —
    /// rather than running on for a caller who was gone.
    pub stopped_on_server: bool,
    /// Why the layer's scope ended, as the library names it.
    pub cause: Option<String>,
}

/// The sqlx pool after the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolAfter {
    /// Connections open.
    pub size: usize,
    /// Connections idle.
    pub idle: usize,
    /// The pool's maximum.
    pub max_size: usize,
    /// `pg_cancel_backend` requests sent.
    pub cancels_sent: u64,
    /// Connections closed because they could not be cleaned.
    pub discarded: u64,
    /// Whether every open connection is idle and none was lost.
    pub whole: bool,
    /// Statements of this experiment still active on the server.
    pub queries_still_active: i64,
}

/// Plain sqlx, for contrast: a query future dropped after 300 ms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlainSqlx {
    /// The abandoned query's length on the server, in ms.
    pub query_ms: f64,
    /// When the future was dropped, in ms.
    pub dropped_at_ms: f64,
    /// Whether the server still ran it after the drop.
    pub still_active_after_drop: bool,
    /// How long the connection's next `SELECT 1` waited, in ms.
    pub next_query_waited_ms: f64,
}

/// What a statement and a call cost through the scoped pool, against plain
/// sqlx.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SqlxCosts {
    /// Median `SELECT 1` on a plain sqlx connection, in µs.
    pub plain_statement_us: f64,
    /// Median `SELECT 1` on one connection taken from [`SqlxPgPool`], after
    /// its first statement, in µs.
    pub scoped_statement_us: f64,
    /// `scoped_statement_us - plain_statement_us`.
    pub extra_us: f64,
    /// Median call on a plain `sqlx::PgPool` (no test before acquire): take
    /// a connection, `SELECT 1`, give it back; in µs.
    pub plain_call_us: f64,
    /// Median call through [`SqlxPgPool`]: acquire under a scope (the
    /// admission queue), set `statement_timeout` (one round trip per
    /// connection taken), `SELECT 1`, give it back; in µs.
    pub scoped_call_us: f64,
    /// `scoped_call_us - plain_call_us`.
    pub call_extra_us: f64,
}

/// The experiment's result: shared by the table, `--json` and the tests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Edge {
    /// One row per layer, in [`LAYERS`] order.
    pub rows: Vec<LayerRow>,
    /// The edge's default budget, in ms.
    pub edge_budget_ms: f64,
    /// When the HTTP client gave up, in ms.
    pub client_gave_up_ms: f64,
    /// The sqlx pool after the run.
    pub pool: PoolAfter,
    /// Plain sqlx for contrast.
    pub plain_sqlx: PlainSqlx,
    /// The per-statement cost of the sqlx integration.
    pub sqlx_costs: SqlxCosts,
}

impl Edge {
    /// The row of `layer`.
    pub fn row(&self, layer: &str) -> Option<&LayerRow> {
        self.rows.iter().find(|r| r.layer == layer)
    }
}

/// What each layer reports while the experiment runs.
#[derive(Debug, Default)]
struct Seen {
    entered: Option<Option<Duration>>,
    ended: Option<(Instant, Cause)>,
    finished: bool,
}

#[derive(Debug, Clone)]
struct Recorder {
    seen: Arc<Mutex<BTreeMap<&'static str, Seen>>>,
}

impl Recorder {
    fn new() -> Self {
        Self {
            seen: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    fn with(&self, layer: &'static str, f: impl FnOnce(&mut Seen)) {
        if let Ok(mut seen) = self.seen.lock() {
            f(seen.entry(layer).or_default());
        }
    }

    /// Records the budget on entry and, on a task of its own, when and why
    /// the scope ended.
    fn enter(&self, layer: &'static str, scope: &Scope, watch: bool) {
        let remaining = scope.remaining();
        self.with(layer, |s| s.entered = Some(remaining));
        if watch {
            let (recorder, scope) = (self.clone(), scope.clone());
            tonic_deadline::detach(async move {
                let cause = scope.ended().await;
                recorder.with(layer, |s| s.ended = Some((Instant::now(), cause)));
            });
        }
    }

    fn finished(&self, layer: &'static str) {
        self.with(layer, |s| s.finished = true);
    }

    fn take(&self) -> BTreeMap<&'static str, Seen> {
        self.seen
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default()
    }
}

/// The tonic service: runs the 5 s query under its request's scope.
struct QuerySvc {
    pool: SqlxPgPool,
    recorder: Recorder,
}

#[tonic::async_trait]
impl Worker for QuerySvc {
    async fn work(&self, _request: Request<WorkReq>) -> Result<Response<WorkResp>, Status> {
        let scope = Scope::current();
        self.recorder.enter("grpc service", &scope, true);
        let mut conn = self.pool.acquire(&scope).await?;
        self.recorder.enter("sqlx query", &scope, false);
        conn.fetch_all(sqlx::query(QUERY)).await?;
        self.recorder.finished("grpc service");
        Ok(Response::new(WorkResp {
            completed: true,
            ..Default::default()
        }))
    }
}

#[derive(Clone)]
struct EdgeState {
    grpc: WorkerClient<net::Layered>,
    http: reqwest_middleware::ClientWithMiddleware,
    rest: SocketAddr,
    recorder: Recorder,
}

/// The HTTP edge: fans out to the gRPC service and the REST service.
async fn edge(State(state): State<EdgeState>) -> String {
    let scope = Scope::current();
    state.recorder.enter("http edge", &scope, true);
    let mut grpc = state.grpc.clone();
    let (query, rest) = tokio::join!(
        grpc.work(WorkReq::default()),
        state
            .http
            .get(format!("http://{}/price", state.rest))
            .send(),
    );
    state.recorder.finished("http edge");
    format!("query: {:?}, rest: {:?}", query.is_ok(), rest.is_ok())
}

/// The REST service behind reqwest: works for 5 s unless stopped.
async fn price(State(recorder): State<Recorder>) -> &'static str {
    recorder.enter("reqwest call", &Scope::current(), true);
    tokio::time::sleep(REST_WORK).await;
    recorder.finished("reqwest call");
    "42"
}

async fn serve_http(app: Router) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tonic_deadline::detach(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// The PostgreSQL server: `TONIC_DEADLINE_PG_URL`, or a throwaway one.
async fn postgres() -> anyhow::Result<(String, Option<Throwaway>)> {
    server().await?.ok_or_else(|| {
        anyhow::anyhow!(
            "experiment edge needs PostgreSQL: set TONIC_DEADLINE_PG_URL or install the server \
             (Debian: apt-get install postgresql; scripts/postgres does it)"
        )
    })
}

async fn active_tagged(monitor: &mut sqlx::PgConnection, tag: &str) -> anyhow::Result<i64> {
    let row = sqlx::query(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
         AND strpos(query, $1) > 0 AND pid <> pg_backend_pid()",
    )
    .bind(tag)
    .fetch_one(&mut *monitor)
    .await?;
    Ok(row.try_get(0)?)
}

/// Polls `pg_stat_activity` until the query has been seen and is gone (at
/// most 8 s); returns when it was gone.
async fn watch_query(url: String, start: Instant) -> anyhow::Result<Option<Instant>> {
    let mut monitor = sqlx::PgConnection::connect(&url).await?;
    let mut seen = false;
    while start.elapsed() < Duration::from_secs(8) {
        let active = active_tagged(&mut monitor, "deadline-lab edge").await? > 0;
        if active {
            seen = true;
        } else if seen {
            return Ok(Some(Instant::now()));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(None)
}

async fn plain_sqlx(url: &str) -> anyhow::Result<PlainSqlx> {
    let mut monitor = sqlx::PgConnection::connect(url).await?;
    let mut conn = sqlx::PgConnection::connect(url).await?;
    let drop_after = Duration::from_millis(300);
    let _ = tokio::time::timeout(drop_after, conn.execute(PLAIN_QUERY)).await;
    let still_active = active_tagged(&mut monitor, "deadline-lab plain sqlx").await? > 0;
    let next = Instant::now();
    conn.execute("SELECT 1").await?;
    Ok(PlainSqlx {
        query_ms: 2000.0,
        dropped_at_ms: ms(drop_after),
        still_active_after_drop: still_active,
        next_query_waited_ms: ms(next.elapsed()),
    })
}

fn median_us(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples
        .get(samples.len() / 2)
        .map_or(f64::NAN, |d| (d.as_secs_f64() * 1e7).round() / 10.0)
}

async fn costs(url: &str, pool: &SqlxPgPool) -> anyhow::Result<SqlxCosts> {
    let mut plain = sqlx::PgConnection::connect(url).await?;
    let plain_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(url)
        .await?;
    let scope = Scope::background().with_timeout(Duration::from_secs(30));
    let mut scoped = pool.acquire(&scope).await?;
    // Its first statement sets the connection's statement_timeout.
    scoped.fetch_all(sqlx::query("SELECT 1")).await?;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    // Interleaved, so both see the same machine load.
    for _ in 0..COST_SAMPLES {
        let t = Instant::now();
        plain.execute("SELECT 1").await?;
        a.push(t.elapsed());
        let t = Instant::now();
        scoped.fetch_all(sqlx::query("SELECT 1")).await?;
        b.push(t.elapsed());
    }
    drop(scoped);
    let (mut c, mut d) = (Vec::new(), Vec::new());
    for _ in 0..COST_SAMPLES {
        let t = Instant::now();
        let mut conn = plain_pool.acquire().await?;
        conn.execute("SELECT 1").await?;
        drop(conn);
        c.push(t.elapsed());
        let t = Instant::now();
        let mut conn = pool.acquire(&scope).await?;
        conn.fetch_all(sqlx::query("SELECT 1")).await?;
        drop(conn);
        d.push(t.elapsed());
    }
    plain_pool.close().await;
    let (plain_us, scoped_us) = (median_us(a), median_us(b));
    let (plain_call_us, scoped_call_us) = (median_us(c), median_us(d));
    let tenth = |us: f64| (us * 10.0).round() / 10.0;
    Ok(SqlxCosts {
        plain_statement_us: plain_us,
        scoped_statement_us: scoped_us,
        extra_us: tenth(scoped_us - plain_us),
        plain_call_us,
        scoped_call_us,
        call_extra_us: tenth(scoped_call_us - plain_call_us),
    })
}

/// Measures everything; the typed result.
pub async fn measure() -> anyhow::Result<Edge> {
    let (url, _server) = postgres().await?;
    let pool = SqlxPgPool::connect(&url, 2).map_err(|e| anyhow::anyhow!("{e}"))?;
    {
        // Open a connection first, so the measured call pays no connect.
        let mut conn = pool.acquire(&Scope::background()).await?;
        conn.fetch_all(sqlx::query("SELECT 1")).await?;
    }
    let recorder = Recorder::new();
    let rest = serve_http(
        Router::new()
            .route("/price", get(price))
            .with_state(recorder.clone())
            .layer(ServerDeadlineLayer::http()),
    )
    .await?;
    let grpc = net::serve(
        "127.0.0.1:0",
        Routes::new(WorkerServer::new(QuerySvc {
            pool: pool.clone(),
            recorder: recorder.clone(),
        })),
        Some(ServerDeadlineLayer::new()),
    )
    .await?;
    let state = EdgeState {
        grpc: WorkerClient::new(net::connect_layered(grpc).await?),
        http: reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(DeadlineMiddleware::new().propagate_as(DeadlineHeader::GrpcTimeout))
            .build(),
        rest,
        recorder: recorder.clone(),
    };
    let edge_addr = serve_http(
        Router::new()
            .route("/", get(edge))
            .with_state(state)
            .layer(ServerDeadlineLayer::http().default_timeout(EDGE_BUDGET)),
    )
    .await?;

    let start = Instant::now();
    let watcher = tonic_deadline::detach(watch_query(url.clone(), start));
    let client = reqwest::Client::new();
    let answer = client
        .get(format!("http://{edge_addr}/"))
        .timeout(CLIENT_GIVES_UP)
        .send()
        .await;
    let gave_up = start.elapsed();
    anyhow::ensure!(
        answer.is_err(),
        "the edge answered within {CLIENT_GIVES_UP:?}; the client was to give up first"
    );
    let query_gone = watcher.await??;
    // Let every layer report its end (bounded).
    let waited = Instant::now();
    loop {
        let ended = recorder
            .seen
            .lock()
            .map(|s| {
                ["http edge", "grpc service", "reqwest call"]
                    .iter()
                    .all(|l| s.get(l).is_some_and(|seen| seen.ended.is_some()))
            })
            .unwrap_or(false);
        if ended || waited.elapsed() > Duration::from_secs(6) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    while (pool.stats().cleanups_running > 0 || pool.stats().idle < pool.stats().size)
        && waited.elapsed() < Duration::from_secs(8)
    {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut seen = recorder.take();
    let since = |at: Instant| ms(at.saturating_duration_since(start));
    let rows = LAYERS
        .iter()
        .map(|&layer| {
            let s = seen.remove(layer).unwrap_or_default();
            let (stopped_ms, stopped_on_server, cause) = if layer == "sqlx query" {
                let gone = query_gone.map(since);
                // pg_sleep(5) ends on its own at 5 s: gone well before means stopped.
                (gone, gone.is_some_and(|g| g < 4500.0), None)
            } else {
                let ended = s.ended.map(|(at, _)| since(at));
                (
                    ended,
                    ended.is_some() && !s.finished,
                    s.ended.map(|(_, c)| c.to_string()),
                )
            };
            LayerRow {
                layer: layer.to_owned(),
                remaining_on_entry_ms: s.entered.flatten().map(ms),
                stopped_ms,
                stopped_on_server,
                cause,
            }
        })
        .collect();
    let mut monitor = sqlx::PgConnection::connect(&url).await?;
    let still = active_tagged(&mut monitor, "deadline-lab edge").await?;
    let stats = pool.stats();
    let pool_after = PoolAfter {
        size: stats.size,
        idle: stats.idle,
        max_size: stats.max_size,
        cancels_sent: stats.cancels,
        discarded: stats.discarded,
        whole: stats.idle == stats.size && stats.discarded == 0 && stats.size > 0,
        queries_still_active: still,
    };
    let sqlx_costs = costs(&url, &pool).await?;
    let plain = plain_sqlx(&url).await?;
    Ok(Edge {
        rows,
        edge_budget_ms: ms(EDGE_BUDGET),
        client_gave_up_ms: ms(gave_up),
        pool: pool_after,
        plain_sqlx: plain,
        sqlx_costs,
    })
}

fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

impl crate::registry::Experiment for Edge {
    const NAME: &'static str = "edge";
    const LIGHT: bool = true;
    const ABOUT: &'static str = "An axum edge → tonic → sqlx query (and → reqwest → REST) under one 900 ms budget, the client giving up at 300 ms (needs PostgreSQL)";
    const PRINTS: &'static str =
        "an axum edge (900 ms default) → tonic → a 5 s sqlx query, and → reqwest → REST; the client gives up at 300 ms: each layer's budget on entry, when it stopped and whether on the server, the pool after (see [Beyond tonic](beyond-tonic.md))";
    const SECTION: Option<Section> = Some(Section::BeyondTonic);
    type Args = crate::registry::NoArgs;

    async fn run(_: Self::Args, _: crate::registry::Spans) -> anyhow::Result<Self> {
        measure().await
    }

    fn outcome(&self) -> Outcome {
        let rows = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.layer.clone(),
                    cell(r.remaining_on_entry_ms),
                    cell(r.stopped_ms),
                    if r.stopped_on_server { "yes" } else { "NO" }.to_owned(),
                    r.cause.clone().unwrap_or_else(|| "-".to_owned()),
                ]
            })
            .collect();
        let p = &self.pool;
        let plain = &self.plain_sqlx;
        let c = &self.sqlx_costs;
        let notes = vec![
            format!(
                "the HTTP client gave up at {:.1} ms; the query was watched in pg_stat_activity from a second connection",
                self.client_gave_up_ms
            ),
            format!(
                "pool after: {}/{} idle, {} cancel request(s), {} discarded, {} statement(s) still active: {}",
                p.idle,
                p.size,
                p.cancels_sent,
                p.discarded,
                p.queries_still_active,
                if p.whole { "whole" } else { "NOT whole" }
            ),
            format!(
                "plain sqlx: a {:.0} ms query dropped at {:.0} ms {} on the server; the next query waited {:.1} ms",
                plain.query_ms,
                plain.dropped_at_ms,
                if plain.still_active_after_drop {
                    "still ran"
                } else {
                    "had stopped"
                },
                plain.next_query_waited_ms
            ),
            format!(
                "cost per statement on a connection taken (median of {COST_SAMPLES}): plain sqlx {:.1} µs, scoped {:.1} µs: {:+.1} µs",
                c.plain_statement_us, c.scoped_statement_us, c.extra_us
            ),
            format!(
                "cost per call, take a connection + one statement (median of {COST_SAMPLES}): plain sqlx pool {:.1} µs, scoped {:.1} µs: {:+.1} µs, mostly the statement_timeout round trip",
                c.plain_call_us, c.scoped_call_us, c.call_extra_us
            ),
        ];
        Outcome {
            title: format!(
                "experiment edge: axum edge ({} ms default) → tonic → sqlx pg_sleep(5), and → reqwest → REST; the client gives up at {} ms",
                EDGE_BUDGET.as_millis(),
                CLIENT_GIVES_UP.as_millis()
            ),
            json: crate::report::to_json(self),
            columns: vec![
                "layer",
                "remaining on entry ms",
                "stopped at ms",
                "stopped on the server",
                "cause",
            ],
            rows,
            notes,
        }
    }

    /// Budget on entry and when each layer stopped, with the pool after and
    /// plain sqlx's contrast as the table's notes tell them.
    fn report(&self, table: &Outcome) -> Vec<Part> {
        let entry: Vec<Bar> = self
            .rows
            .iter()
            .map(|r| Bar::new(&r.layer, r.remaining_on_entry_ms.unwrap_or(0.0), None))
            .collect();
        let stopped: Vec<Bar> = self
            .rows
            .iter()
            .map(|r| {
                Bar::new(&r.layer, r.stopped_ms.unwrap_or(0.0), None).note(if r.stopped_on_server {
                    "stopped on the server"
                } else {
                    "ran on"
                })
            })
            .collect();
        let mut html = chart::hbars(
            "edge-entry",
            &format!(
                "Budget on entry (the edge's default is {} ms)",
                chart::fmt_ms(self.edge_budget_ms)
            ),
            "ms",
            &entry,
        );
        html.push_str(&chart::hbars(
            "edge-stopped",
            &format!(
                "When each layer stopped; the client gave up at {} ms",
                chart::fmt_ms(self.client_gave_up_ms)
            ),
            "ms",
            &stopped,
        ));
        html.push_str(&chart::notes(&table.notes));
        vec![Part::new(html)]
    }
}
