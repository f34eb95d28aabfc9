//! Hedging against a slow tail ("The Tail at Scale"): 5 % of the server's
//! answers take 200 ms, the rest 5 ms; 1 000 calls, each with a 1 s budget,
//! without hedging, through our resilience layer, and through `tower::hedge`.
//!
//! The server records, for every attempt, when its scope ended and why, so
//! a losing hedge that was reset shows up as a server scope ended
//! `Abandoned`; it answers with the attempt's number, so the winner of each
//! call is known.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use testkit::{CallReply, CallRequest};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tonic_deadline::client::{ClientDeadline, ReadyChannel};
use tonic_deadline::observe::Metrics;
use tonic_deadline::resilience::{Resilience, ResilienceLayer};
use tonic_deadline::{Cause, Scope, ServerDeadlineLayer};

use crate::html::chart::{self, escape};
use crate::html::{Part, Section};
use crate::kit::pseudo_random::pseudo_random_share;
use crate::net;
use crate::registry::{Experiment, NoArgs, Spans};
use crate::report::{Outcome, ms, quantile};

/// Calls measured per variant.
pub const CALLS: usize = 1000;
/// Each call's budget.
pub const BUDGET: Duration = Duration::from_secs(1);
/// The share of slow answers.
pub const SLOW_SHARE: f64 = 0.05;
const FAST: Duration = Duration::from_millis(5);
const SLOW: Duration = Duration::from_millis(200);
/// Calls in flight at once.
const CONCURRENCY: usize = 8;
/// Warm-up before measuring (connections, and tower::hedge's histogram).
const WARM_UP: Duration = Duration::from_millis(600);
/// Time for the servers' scopes to end after the last call.
const SETTLE: Duration = Duration::from_millis(400);

/// Our policy: up to 3 attempts, a hedge after 20 ms.
pub const OUR_CONFIG: &str = r#"{"methodConfig": [{
    "name": [{"service": "probe.v1.Probe", "method": "Call"}], "idempotent": true,
    "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.02s", "nonFatalStatusCodes": ["UNAVAILABLE"]}}]}"#;
/// The extra row: our layer with the delay learned from the answers' p95.
pub const ADAPTIVE: &str = "ours (adaptive p95)";
const ADAPTIVE_QUANTILE: f64 = 0.95;
/// tower::hedge's settings: hedge after the p90 latency of the last period.
pub const TOWER_PERCENTILE: f32 = 0.9;

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HedgeRows {
    /// One row per variant: `none`, `ours`, `tower::hedge`, and
    /// `ours (adaptive p95)`.
    pub rows: Vec<Row>,
    /// Calls per variant.
    pub calls: usize,
    /// The calls' budget.
    pub budget_ms: f64,
    /// The share of slow answers.
    pub slow_share: f64,
}

/// One variant's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// `none`, `ours` or `tower::hedge`.
    pub variant: String,
    /// Median latency the caller saw.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Attempts beyond one per call, as a fraction of the calls.
    pub extra_load: f64,
    /// Attempts that did not win their call.
    pub losers: u64,
    /// Of those, the ones whose server scope ended `Abandoned` (reset by
    /// the client while the server still worked).
    pub losers_cancelled_on_server: u64,
    /// Losers whose server scope ended any way at all (reset, or answered
    /// just before the reset arrived); `losers` when none is left running.
    pub losers_ended_on_server: u64,
    /// Calls answered after their deadline, and server attempts whose
    /// scope ended after the caller's deadline.
    pub after_deadline: u64,
    /// Calls that did not end OK.
    pub failed: u64,
    /// Latency at the quantiles 0, 0.01, …, 1 (101 points), for the CDF.
    pub cdf_ms: Vec<f64>,
}

impl HedgeRows {
    /// The row of `variant`.
    pub fn row(&self, variant: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.variant == variant)
    }
}

/// What the server saw of one attempt.
#[derive(Debug, Clone, Default)]
struct Attempt {
    ended: Option<(Cause, Instant)>,
}

#[derive(Debug, Clone, Default)]
struct Tail {
    next: Arc<AtomicU64>,
    attempts: Arc<Mutex<HashMap<String, Vec<Attempt>>>>,
}

#[tonic::async_trait]
impl testkit::CallOnly for Tail {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        let id = request.into_inner().payload;
        let index = {
            let mut attempts = self
                .attempts
                .lock()
                .map_err(|_| Status::internal("poisoned"))?;
            let list = attempts.entry(id.clone()).or_default();
            list.push(Attempt::default());
            list.len() - 1
        };
        let scope = Scope::current();
        let attempts = self.attempts.clone();
        let key = id.clone();
        scope.on_end(move |cause| async move {
            if let Ok(mut attempts) = attempts.lock()
                && let Some(a) = attempts.get_mut(&key).and_then(|l| l.get_mut(index))
            {
                a.ended = Some((cause, Instant::now()));
            }
        });
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let work = if pseudo_random_share(n, SLOW_SHARE) {
            SLOW
        } else {
            FAST
        };
        scope.run(tokio::time::sleep(work)).await?;
        Ok(Response::new(CallReply {
            payload: index.to_string(),
            ..Default::default()
        }))
    }
}

/// How a variant makes one call: `(call id, its deadline)` → the winning
/// attempt's number, or the status.
#[derive(Clone)]
enum Caller {
    None(ProbeClient<ClientDeadline<ReadyChannel>>),
    Ours(ProbeClient<Resilience<ClientDeadline<ReadyChannel>>>),
    /// tower's Hedge is not `Clone`: the callers share one.
    Tower(Arc<tokio::sync::Mutex<TowerHedge>>),
}

type TowerHedge = tower::hedge::Hedge<PlainCall, Always>;

/// One plain tonic call with its own timeout: what a tower::hedge user
/// hedges (the policy clones the message, not a deadline).
#[derive(Clone)]
struct PlainCall(ProbeClient<tonic::transport::Channel>);

impl tower::Service<CallRequest> for PlainCall {
    type Response = CallReply;
    type Error = Status;
    type Future = Pin<Box<dyn Future<Output = Result<CallReply, Status>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Status>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, message: CallRequest) -> Self::Future {
        let mut client = self.0.clone();
        Box::pin(async move {
            let mut request = Request::new(message);
            request.set_timeout(BUDGET);
            Ok(client.call(request).await?.into_inner())
        })
    }
}

#[derive(Clone, Copy)]
struct Always;

impl tower::hedge::Policy<CallRequest> for Always {
    fn clone_request(&self, req: &CallRequest) -> Option<CallRequest> {
        Some(req.clone())
    }

    fn can_retry(&self, _: &CallRequest) -> bool {
        true
    }
}

impl Caller {
    async fn call(&mut self, id: String) -> Result<String, Status> {
        let message = CallRequest {
            payload: id,
            ..Default::default()
        };
        let scope = Scope::background().with_timeout(BUDGET);
        let reply = match self {
            Caller::None(client) => scope.enter(client.call(message)).await?.into_inner(),
            Caller::Ours(client) => scope.enter(client.call(message)).await?.into_inner(),
            Caller::Tower(hedge) => {
                use tower::{Service, ServiceExt};
                let call = {
                    let mut hedge = hedge.lock().await;
                    hedge
                        .ready()
                        .await
                        .map_err(Status::from_error)?
                        .call(message)
                };
                match tokio::time::timeout(BUDGET, call).await {
                    Ok(reply) => reply.map_err(Status::from_error)?,
                    Err(_) => return Err(Status::deadline_exceeded("deadline exceeded")),
                }
            }
        };
        Ok(reply.payload)
    }
}

/// What one call gave: latency, whether it ended OK and in time, and
/// which attempt won.
struct Call {
    id: String,
    took: Duration,
    winner: Option<usize>,
    deadline: Instant,
}

async fn drive(caller: &Caller, prefix: &str, calls: Option<usize>, length: Duration) -> Vec<Call> {
    let next = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + length;
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let mut caller = caller.clone();
        let next = next.clone();
        let prefix = prefix.to_owned();
        tasks.push(tonic_deadline::detach(async move {
            let mut done = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed) as usize;
                if calls.is_some_and(|c| n >= c) || (calls.is_none() && Instant::now() >= end) {
                    break;
                }
                let id = format!("{prefix}{n}");
                let started = Instant::now();
                let winner = caller
                    .call(id.clone())
                    .await
                    .ok()
                    .and_then(|w| w.parse().ok());
                done.push(Call {
                    id,
                    took: started.elapsed(),
                    winner,
                    deadline: started + BUDGET,
                });
            }
            done
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap_or_default());
    }
    all
}

async fn variant(name: &str, caller: Caller, server: &Tail) -> Row {
    let prefix = format!("{name}:");
    drive(&caller, &format!("{prefix}warm-"), None, WARM_UP).await;
    let calls = drive(&caller, &format!("{prefix}m-"), Some(CALLS), Duration::ZERO).await;
    tokio::time::sleep(SETTLE).await;
    let attempts = server
        .attempts
        .lock()
        .map(|a| a.clone())
        .unwrap_or_default();
    let mut latencies: Vec<f64> = calls.iter().map(|c| ms(c.took)).collect();
    latencies.sort_by(f64::total_cmp);
    let mut sent = 0u64;
    let (mut losers, mut cancelled, mut ended, mut after, mut failed) = (0, 0, 0, 0, 0);
    for call in &calls {
        if call.winner.is_none() {
            failed += 1;
        }
        if Instant::now() > call.deadline && call.took > BUDGET {
            after += 1;
        }
        let Some(list) = attempts.get(&call.id) else {
            continue;
        };
        sent += list.len() as u64;
        for (i, attempt) in list.iter().enumerate() {
            if attempt.ended.is_some_and(|(_, at)| at > call.deadline) {
                after += 1;
            }
            if Some(i) == call.winner {
                continue;
            }
            losers += 1;
            match attempt.ended {
                Some((Cause::Abandoned, _)) => {
                    cancelled += 1;
                    ended += 1;
                }
                Some(_) => ended += 1,
                None => {}
            }
        }
    }
    let n = calls.len().max(1) as f64;
    Row {
        variant: name.to_owned(),
        p50_ms: quantile(&latencies, 0.5),
        p99_ms: quantile(&latencies, 0.99),
        p999_ms: quantile(&latencies, 0.999),
        extra_load: ((sent as f64 - n) / n * 1000.0).round() / 1000.0,
        losers,
        losers_cancelled_on_server: cancelled,
        losers_ended_on_server: ended,
        after_deadline: after,
        failed,
        cdf_ms: (0..=100)
            .map(|i| quantile(&latencies, f64::from(i) / 100.0))
            .collect(),
    }
}

/// Runs the three variants against one server, one after another.
///
/// # Errors
///
/// When the server cannot start or a client cannot connect.
pub async fn measure() -> anyhow::Result<(HedgeRows, Metrics)> {
    let server = Tail::default();
    let addr = net::serve(
        "127.0.0.1:0",
        Routes::new(ProbeServer::new(server.clone())),
        Some(ServerDeadlineLayer::new()),
    )
    .await?;
    let metrics = Metrics::new();
    let none = Caller::None(ProbeClient::new(net::connect_layered(addr).await?));
    let hedged = tower::ServiceBuilder::new()
        .layer(ResilienceLayer::from_service_config(OUR_CONFIG)?.metrics(&metrics))
        .service(net::connect_layered(addr).await?);
    let ours = Caller::Ours(ProbeClient::new(hedged));
    let adaptive = tower::ServiceBuilder::new()
        .layer(
            ResilienceLayer::from_service_config(OUR_CONFIG)?
                .adaptive_hedging_delay(ADAPTIVE_QUANTILE),
        )
        .service(net::connect_layered(addr).await?);
    let adaptive = Caller::Ours(ProbeClient::new(adaptive));
    let plain = PlainCall(ProbeClient::new(net::connect(addr).await?));
    let tower = Caller::Tower(Arc::new(tokio::sync::Mutex::new(tower::hedge::Hedge::new(
        plain,
        Always,
        50,
        TOWER_PERCENTILE,
        Duration::from_millis(300),
    ))));
    let mut rows = Vec::new();
    for (name, caller) in [
        ("none", none),
        ("ours", ours),
        ("tower::hedge", tower),
        (ADAPTIVE, adaptive),
    ] {
        rows.push(variant(name, caller, &server).await);
    }
    Ok((
        HedgeRows {
            rows,
            calls: CALLS,
            budget_ms: ms(BUDGET),
            slow_share: SLOW_SHARE,
        },
        metrics,
    ))
}

impl Experiment for HedgeRows {
    const NAME: &'static str = "hedge";
    const LIGHT: bool = true;
    const ABOUT: &'static str = "Hedging against a 5 % slow tail: none, ours, tower::hedge";
    const PRINTS: &'static str =
        "5 % of answers 200 ms slow, 1 000 calls: p50/p99/p99.9 and extra load without hedging, with ours, with `tower::hedge`, with ours adaptive; losers reset on the server";
    const SECTION: Option<Section> = Some(Section::RetriesAndHedging);
    type Args = NoArgs;

    async fn run(_: NoArgs, _: Spans) -> anyhow::Result<Self> {
        Ok(measure().await?.0)
    }

    fn outcome(&self) -> Outcome {
        let rows = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.variant.clone(),
                    format!("{:.1}", r.p50_ms),
                    format!("{:.1}", r.p99_ms),
                    format!("{:.1}", r.p999_ms),
                    format!("{:.1} %", r.extra_load * 100.0),
                    r.losers.to_string(),
                    r.losers_cancelled_on_server.to_string(),
                    r.losers_ended_on_server.to_string(),
                    r.after_deadline.to_string(),
                ]
            })
            .collect();
        let ratio = match (self.row("none"), self.row("ours")) {
            (Some(none), Some(ours)) if ours.p99_ms > 0.0 => {
                format!(
                    "ours p99 is 1/{:.1} of none (goal: at most 1/5, at most 10 % extra load)",
                    none.p99_ms / ours.p99_ms
                )
            }
            _ => "ours p99 vs none: missing a row".to_owned(),
        };
        Outcome {
            title: format!(
                "hedge: {} calls, {:.0} % of answers take 200 ms and the rest 5 ms, {:.0} ms budget each, {CONCURRENCY} in flight",
                self.calls,
                self.slow_share * 100.0,
                self.budget_ms
            ),
            json: crate::report::to_json(self),
            columns: vec![
                "variant",
                "p50 ms",
                "p99 ms",
                "p99.9 ms",
                "extra load",
                "losers",
                "reset on server",
                "ended on server",
                "after deadline",
            ],
            rows,
            notes: vec![
                ratio,
                "ours: hedgingPolicy maxAttempts 3, hedgingDelay 20 ms, over our client layer; tower::hedge: its p90 of the last 300 ms, one hedge, over plain tonic with a fresh 1 s timeout per attempt; ours (adaptive p95): the same policy, the delay learned from the answers' p95".into(),
                "reset on server: losing attempts whose server scope ended Abandoned (the client's RST_STREAM arrived while it worked); ended: ended any way".into(),
            ],
        }
    }

    fn report(&self, table: &Outcome) -> Vec<Part> {
        let mut html = cdf_chart(self);
        html.push_str(&chart::table(table));
        vec![Part::new(html)]
    }
}

/// Stroke colours of the CDF's lines, in the order of the bar series.
const STROKES: [&str; 4] = ["#e76f51", "#2a9d8f", "#8ab17d", "#6d597a"];

/// How far up the tail a quantile is: 0 at p0, 1 at p90, 2 at p99, 3 at
/// p99.9, so the tail hedging changes gets as much room as the body.
fn tail_depth(q: f64) -> f64 {
    -(1.0 - q.min(0.999)).log10()
}

/// The latency CDF of every hedging variant: milliseconds on a log scale
/// across, the quantile down the tail (p50, p90, p99, p99.9) upwards.
fn cdf_chart(hedge: &HedgeRows) -> String {
    const W: f64 = 760.0;
    const H: f64 = 340.0;
    const LEFT: f64 = 56.0;
    const RIGHT: f64 = 20.0;
    const TOP: f64 = 34.0;
    const BOTTOM: f64 = 84.0;
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let max = hedge
        .rows
        .iter()
        .flat_map(|r| r.cdf_ms.iter().copied().chain([r.p999_ms]))
        .fold(10.0_f64, f64::max);
    let hi = max.log10().ceil().max(1.0);
    let x = |ms: f64| LEFT + ms.max(1.0).log10() / hi * plot_w;
    let y = |q: f64| TOP + (1.0 - tail_depth(q) / 3.0) * plot_h;
    let title = format!(
        "Latency CDF, {} calls, {:.0} % of answers slow: without and with hedging",
        hedge.calls,
        hedge.slow_share * 100.0
    );
    let mut svg = format!(
        r#"<svg class="chart" data-chart="hedge-cdf" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{t}"><text class="title" x="0" y="18">{t}</text>"#,
        t = escape(&title)
    );
    let base = TOP + plot_h;
    let _ = write!(
        svg,
        r#"<line class="axis" x1="{LEFT}" x2="{x2}" y1="{base}" y2="{base}"/><line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{base}"/>"#,
        x2 = W - RIGHT
    );
    let mut decade = 1.0;
    while decade <= 10f64.powf(hi) {
        let _ = write!(
            svg,
            r#"<text class="label" x="{:.1}" y="{}" text-anchor="middle">{} ms</text>"#,
            x(decade),
            base + 16.0,
            decade
        );
        decade *= 10.0;
    }
    for (q, name) in [(0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (0.999, "p99.9")] {
        let _ = write!(
            svg,
            r#"<line class="axis" stroke-dasharray="3 3" x1="{LEFT}" x2="{x2}" y1="{yy:.1}" y2="{yy:.1}"/><text class="label" x="{lx}" y="{ty:.1}" text-anchor="end">{name}</text>"#,
            x2 = W - RIGHT,
            yy = y(q),
            lx = LEFT - 4.0,
            ty = y(q) + 4.0,
        );
    }
    for (i, row) in hedge.rows.iter().enumerate() {
        let n = row.cdf_ms.len().saturating_sub(1).max(1) as f64;
        // The 101 quantiles up to p99, then p99.9 (p100 is off the scale).
        let points: Vec<String> = row
            .cdf_ms
            .iter()
            .enumerate()
            .map(|(k, ms)| (k as f64 / n, *ms))
            .filter(|(q, _)| *q < 0.9995)
            .chain([(0.999, row.p999_ms)])
            .map(|(q, ms)| format!("{:.1},{:.1}", x(ms), y(q)))
            .collect();
        let stroke = STROKES[i % STROKES.len()];
        let _ = write!(
            svg,
            r#"<polyline class="cdf" fill="none" stroke="{stroke}" stroke-width="2.5" points="{}"><title>{}: p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms</title></polyline>"#,
            points.join(" "),
            escape(&row.variant),
            row.p50_ms,
            row.p99_ms,
            row.p999_ms
        );
        let label = format!(
            "{} (p99 {:.0} ms, p99.9 {:.0} ms)",
            row.variant, row.p99_ms, row.p999_ms
        );
        let (lx, ly) = (
            LEFT + 340.0 * (i % 2) as f64,
            H - 42.0 + 20.0 * (i / 2) as f64,
        );
        let _ = write!(
            svg,
            r#"<rect class="bar" style="fill:{stroke}" x="{lx}" y="{ry}" width="12" height="12"/><text class="legend" x="{tx}" y="{ly}">{l}</text>"#,
            ry = ly - 10.0,
            tx = lx + 16.0,
            l = escape(&label)
        );
    }
    svg.push_str("</svg>");
    svg
}
