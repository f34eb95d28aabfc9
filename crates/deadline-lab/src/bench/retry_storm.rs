//! A retry storm, or not (R-27, R-28): the overload setup of `bench
//! overload` (our server, a pool of 4 connections × 10 ms queries behind
//! an admission queue, 100 ms client deadlines) driven open-loop at 2× its
//! capacity, with a downstream that fails 10 % of calls at once
//! (`UNAVAILABLE`, before the pool).
//!
//! - **no retries**: our client layer, one attempt per call;
//! - **naive retries**: a retry loop around a timed call — up to 5 attempts
//!   at once on `UNAVAILABLE`, `RESOURCE_EXHAUSTED` or `DEADLINE_EXCEEDED`,
//!   each with a fresh 100 ms timeout, over plain tonic. The loop belongs to
//!   the call, not to its caller: when the caller stops waiting at 100 ms,
//!   the loop goes on (what a hop that retries on its own timeouts does
//!   once its caller is gone);
//! - **ours**: the resilience layer over the client layer, the same 5 attempts
//!   on `UNAVAILABLE` and `RESOURCE_EXHAUSTED`, inside the caller's
//!   deadline, with gRPC's `retryThrottling` (10 tokens, ratio 0.1) — and,
//!   as a second row, with a retry budget (10 % of calls + 1/s) instead.
//!
//! Goodput = OK answers before the caller's deadline per second ÷ capacity;
//! amplification = attempts the server saw per call.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use testkit::{CallReply, CallRequest};
use serde::{Deserialize, Serialize};
use tonic::service::Routes;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};
use tonic_deadline::client::{ClientDeadline, ReadyChannel};
use tonic_deadline::resilience::{Resilience, ResilienceLayer, RetryBudget};
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::bench::overload::{self, Load};
use crate::kit::pseudo_random::pseudo_random_share;
use crate::html::chart::escape;
use crate::html::{Part, Section};
use crate::net;
use crate::registry::{Experiment, Kind, Spans};
use crate::report::Outcome;

/// The share of calls the downstream fails.
pub const FAILING_SHARE: f64 = 0.1;
/// Offered load as a multiple of capacity.
pub const OFFERED_X: f64 = 2.0;

/// Our retry policy (the naive loop makes as many attempts).
pub const OUR_CONFIG: &str = r#"{"methodConfig": [{
    "name": [{"service": "probe.v1.Probe", "method": "Call"}],
    "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.01s", "maxBackoff": "0.05s",
                    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"]}}],
  "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#;

/// The flags of `bench retry-storm`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Seconds of open-loop load per variant.
    #[arg(long, default_value_t = 2.0)]
    window_s: f64,
}

/// The benchmark's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Storm {
    /// One row per variant.
    pub rows: Vec<Row>,
    /// Measured capacity (closed loop), OK answers per second.
    pub capacity_rps: f64,
    /// Offered load, calls per second.
    pub offered_rps: f64,
    /// The share of calls the downstream fails.
    pub failing_share: f64,
    /// Each call's deadline.
    pub deadline_ms: f64,
    /// Seconds of open-loop load per variant.
    pub window_s: f64,
}

/// One variant's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// `no retries`, `naive retries`, `ours`, `ours (retry budget)`.
    pub variant: String,
    /// OK answers before the deadline per second ÷ capacity.
    pub goodput: f64,
    /// Attempts the server saw per call.
    pub amplification: f64,
    /// Calls made.
    pub calls: u64,
    /// Calls answered OK in time.
    pub good: u64,
    /// Attempts the server's handler saw, during the window and after it.
    pub attempts: u64,
}

impl Storm {
    /// The row of `variant`.
    pub fn row(&self, variant: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.variant == variant)
    }
}

/// Our overload server with a flaky downstream in front of the pool.
#[derive(Clone)]
struct Flaky {
    pool: overload::Service,
    seen: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl testkit::CallOnly for Flaky {
    async fn call(&self, _: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        if pseudo_random_share(n, FAILING_SHARE) {
            return Err(Status::unavailable("downstream unavailable"));
        }
        self.pool.serve().await?;
        Ok(Response::new(CallReply::default()))
    }
}

#[derive(Clone)]
enum Variant {
    Single(ProbeClient<ClientDeadline<ReadyChannel>>),
    Naive(ProbeClient<Channel>),
    Ours(ProbeClient<Resilience<ClientDeadline<ReadyChannel>>>),
}

impl Variant {
    /// One call; true when it was answered OK.
    async fn call(mut self, deadline: Duration) -> bool {
        match &mut self {
            Variant::Single(client) => {
                let scope = Scope::background().with_timeout(deadline);
                scope
                    .enter(client.call(CallRequest::default()))
                    .await
                    .is_ok()
            }
            Variant::Ours(client) => {
                let scope = Scope::background().with_timeout(deadline);
                scope
                    .enter(client.call(CallRequest::default()))
                    .await
                    .is_ok()
            }
            Variant::Naive(client) => {
                let mut client = client.clone();
                let attempts = tonic_deadline::detach(async move {
                    for _ in 0..5 {
                        let mut request = Request::new(CallRequest::default());
                        request.set_timeout(deadline);
                        match client.call(request).await {
                            Ok(_) => return true,
                            Err(status)
                                if matches!(
                                    status.code(),
                                    Code::Unavailable
                                        | Code::ResourceExhausted
                                        | Code::DeadlineExceeded
                                        | Code::Cancelled
                                ) => {}
                            Err(_) => return false,
                        }
                    }
                    false
                });
                attempts.await.unwrap_or(false)
            }
        }
    }
}

/// Runs the benchmark.
///
/// # Errors
///
/// When a server cannot start or a client cannot connect.
pub async fn measure(load: Load) -> anyhow::Result<Storm> {
    let seen = Arc::new(AtomicU64::new(0));
    let server = Flaky {
        pool: overload::Service::ours(&load),
        seen: seen.clone(),
    };
    let addr = net::serve(
        "127.0.0.1:0",
        Routes::new(ProbeServer::new(server)),
        Some(ServerDeadlineLayer::new()),
    )
    .await?;
    let channels = load.channels.max(1);
    let mut single = Vec::new();
    let mut naive = Vec::new();
    let mut throttled = Vec::new();
    let mut budgeted = Vec::new();
    // One layer per variant: its channels to the one server share its
    // throttle (or budget), as a client's connections to one target do.
    let throttle = ResilienceLayer::from_service_config(OUR_CONFIG)?;
    let budget = ResilienceLayer::from_service_config(OUR_CONFIG)?.budget(RetryBudget::new(0.1, 1));
    for _ in 0..channels {
        use tower::Layer;
        single.push(Variant::Single(ProbeClient::new(
            net::connect_layered(addr).await?,
        )));
        naive.push(Variant::Naive(ProbeClient::new(net::connect(addr).await?)));
        let layered = net::connect_layered(addr).await?;
        throttled.push(Variant::Ours(ProbeClient::new(throttle.layer(layered))));
        let layered = net::connect_layered(addr).await?;
        budgeted.push(Variant::Ours(ProbeClient::new(budget.layer(layered))));
    }
    // Capacity: closed loop, enough callers to keep the pool busy, OK
    // answers per second (the failing share costs no pool time).
    let callers = load.connections * 4;
    let drive = single.clone();
    let capacity = {
        let call = move |i: usize| drive[i % drive.len()].clone().call(Duration::from_secs(5));
        overload::closed_loop_with(callers, Duration::from_millis(300), call.clone()).await;
        overload::closed_loop_with(callers, Duration::from_millis(1500), call).await
    };
    let rate = capacity * OFFERED_X;
    let mut rows = Vec::new();
    for (name, clients) in [
        ("no retries", single),
        ("naive retries", naive),
        ("ours", throttled),
        ("ours (retry budget)", budgeted),
    ] {
        let before = seen.load(Ordering::Relaxed);
        let deadline = load.deadline;
        let window = overload::open_loop_with(rate, load.window, deadline, move |i| {
            clients[i as usize % clients.len()].clone().call(deadline)
        })
        .await;
        // The naive loops outlive their callers: let them finish, and
        // count what they sent.
        tokio::time::sleep(deadline * 6).await;
        let attempts = seen.load(Ordering::Relaxed) - before;
        let goodput = window.good as f64 / window.seconds / capacity;
        rows.push(Row {
            variant: name.to_owned(),
            goodput: (goodput * 1000.0).round() / 1000.0,
            amplification: (attempts as f64 / window.sent.max(1) as f64 * 1000.0).round() / 1000.0,
            calls: window.sent,
            good: window.good,
            attempts,
        });
    }
    Ok(Storm {
        rows,
        capacity_rps: capacity.round(),
        offered_rps: rate.round(),
        failing_share: FAILING_SHARE,
        deadline_ms: load.deadline.as_secs_f64() * 1000.0,
        window_s: load.window.as_secs_f64(),
    })
}

impl Experiment for Storm {
    const NAME: &'static str = "retry-storm";
    const ABOUT: &'static str = "The overload setup at 2x capacity with a downstream failing 10 % of calls: no retries, naive retries, ours";
    const PRINTS: &'static str =
        "the overload setup at 2× capacity with a downstream failing 10 %: goodput and attempts per call with no retries, naive retries, ours (throttling, retry budget)";
    const KIND: Kind = Kind::Bench;
    const SECTION: Option<Section> = Some(Section::RetriesAndHedging);
    type Args = Args;

    /// Half-second windows, as `bench overload` in the demo: at 2x capacity
    /// a window still holds ~350 calls per variant.
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
                    r.variant.clone(),
                    format!("{:.3}", r.goodput),
                    format!("{:.2}", r.amplification),
                    r.calls.to_string(),
                    r.good.to_string(),
                    r.attempts.to_string(),
                ]
            })
            .collect();
        Outcome {
            title: format!(
                "bench retry-storm: {:.0}x capacity ({:.0} of {:.0} req/s), {:.0} % of calls failed by the downstream, {:.0} ms deadlines, {} s windows",
                OFFERED_X,
                self.offered_rps,
                self.capacity_rps,
                self.failing_share * 100.0,
                self.deadline_ms,
                self.window_s
            ),
            json: crate::report::to_json(self),
            columns: vec!["variant", "goodput", "amplification", "calls", "good", "attempts"],
            rows,
            notes: vec![
                "goal: ours goodput >= 0.90 of capacity and amplification <= 1.10, beside naive retries".into(),
                "naive: 5 attempts at once on UNAVAILABLE / RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED, a fresh 100 ms timeout each, the loop outliving its caller; ours: maxAttempts 5 inside the caller's deadline, retryThrottling 10 tokens / 0.1 (second row: a 10 % retry budget)".into(),
            ],
        }
    }

    fn report(&self, _: &Outcome) -> Vec<Part> {
        vec![Part::new(storm_chart(self))]
    }
}

/// Goodput per storm variant as bars, with the 90 % goal marked.
fn storm_chart(storm: &Storm) -> String {
    const W: f64 = 760.0;
    const LABEL: f64 = 170.0;
    const ROW: f64 = 30.0;
    const TOP: f64 = 34.0;
    let plot = W - LABEL - 230.0;
    let max = storm.rows.iter().map(|r| r.goodput).fold(1.0_f64, f64::max);
    let height = TOP + ROW * storm.rows.len() as f64 + 26.0;
    let title = format!(
        "Retry storm: goodput at {:.0} of {:.0} req/s, {:.0} % of calls failing downstream",
        storm.offered_rps,
        storm.capacity_rps,
        storm.failing_share * 100.0
    );
    let mut svg = format!(
        r#"<svg class="chart" data-chart="retry-storm" viewBox="0 0 {W} {height}" width="{W}" height="{height}" role="img" aria-label="{t}"><text class="title" x="0" y="18">{t}</text>"#,
        t = escape(&title)
    );
    for (i, row) in storm.rows.iter().enumerate() {
        let y = TOP + ROW * i as f64;
        let w = (row.goodput.max(0.0) / max * plot).max(1.0);
        let _ = write!(
            svg,
            r#"<text class="label" x="{x}" y="{ty}" text-anchor="end">{label}</text><rect class="bar{s}" x="{LABEL}" y="{y}" width="{w:.1}" height="20" rx="2"><title>{label}: {g:.0} % of capacity</title></rect><text class="value" x="{vx:.1}" y="{ty}">{g:.0} % of capacity, {a:.2} attempts per call</text>"#,
            x = LABEL - 8.0,
            ty = y + 15.0,
            label = escape(&row.variant),
            s = if row.variant.starts_with("naive") {
                " s1"
            } else {
                ""
            },
            g = row.goodput * 100.0,
            a = row.amplification,
            vx = LABEL + w + 6.0,
        );
    }
    let goal = LABEL + 0.9 / max * plot;
    let _ = write!(
        svg,
        r#"<line class="seed" x1="{goal:.1}" x2="{goal:.1}" y1="{TOP}" y2="{y2}"/><text class="legend" x="{LABEL}" y="{ly}">┃ the goal: 90 % of capacity</text></svg>"#,
        y2 = height - 26.0,
        ly = height - 6.0
    );
    svg
}
