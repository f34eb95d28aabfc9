//! The handler watches its scope, or ignores it: 150 ms client budget, 1 s of
//! handler work.
//!
//! Both calls end for the client at the deadline (the server's own timer
//! answers `DEADLINE_EXCEEDED` and the client resets the stream). What
//! differs is the server: watching work stops when the scope ends; blocking
//! work that never checks runs its full second — a zombie the library detects
//! (`spawn_blocking` notices it finished after its scope ended and counts it in
//! the server layer's metrics, `tonic_deadline_outlived_total`).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic_deadline::Scope;
use tonic_deadline::observe::Metrics;

use crate::capture::Capture;
use crate::kit::calls::{status_name, wire_lines};
use crate::html::chart;
use crate::html::{Part, Section};
use crate::net;
use crate::pb::WorkReq;
use crate::pb::worker_client::WorkerClient;
use crate::registry::{Experiment, NoArgs, Spans};
use crate::report::{Outcome, ms};
use crate::systems::worker::{self, WorkerSvc};

/// The client's budget.
pub const BUDGET: Duration = Duration::from_millis(150);
/// The handler's work.
pub const WORK: Duration = Duration::from_secs(1);
/// How long after the call the server is looked at (the seed's 1.1 s, plus slack).
const SETTLE: Duration = Duration::from_millis(1200);

/// One handler, watching its scope or ignoring it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    /// What the client got.
    pub client_status: String,
    /// When, after the call began.
    pub client_ms: f64,
    /// 1 if the handler's work ran to its end, else 0.
    pub completed: u32,
    /// When the request's scope ended, after the call began.
    pub scope_ended_ms: Option<f64>,
    /// The frames of the call, as the capture proxy decoded them.
    pub wire: Vec<String>,
    /// Watching: when the work noticed its scope had ended.
    pub server_noticed_ms: Option<f64>,
    /// Ignoring: how long the work outlived its scope.
    pub zombie_ms: Option<f64>,
    /// Ignoring: when the work finished, after the call began.
    pub work_done_ms: Option<f64>,
    /// Ignoring: how many tasks the library counted as outliving their
    /// scope during the call (`tonic_deadline_outlived_total`).
    pub outlived_detected: Option<u64>,
}

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Handler {
    /// The client's budget.
    pub budget_ms: u64,
    /// The handler's work.
    pub work_ms: u64,
    /// The handler that watches its scope.
    pub watching: Variant,
    /// The handler that blocks and never checks.
    pub ignoring: Variant,
}

fn since(started: Instant, at: Option<Instant>) -> Option<f64> {
    at.map(|at| ms(at.saturating_duration_since(started)))
}

async fn variant(watch: bool) -> anyhow::Result<Variant> {
    let svc = WorkerSvc::new();
    let metrics = Metrics::new();
    let addr =
        crate::metrics::with_metrics(metrics.clone(), worker::start("127.0.0.1:0", svc.clone()))
            .await?;
    let capture = Capture::start(addr).await?;
    let mut client = WorkerClient::new(net::connect_layered(capture.addr()).await?);
    client.work(WorkReq::default()).await?;
    svc.take();
    capture.clear();

    let scope = Scope::background().with_timeout(BUDGET);
    let started = Instant::now();
    let request = WorkReq {
        work_ms: WORK.as_millis() as u64,
        watch,
    };
    let result = scope.enter(client.work(request)).await;
    let client_ms = ms(started.elapsed());
    tokio::time::sleep_until(started + SETTLE).await;
    let times = svc.take();
    let mut out = Variant {
        client_status: status_name(&result).to_owned(),
        client_ms,
        completed: u32::from(times.completed.is_some()),
        scope_ended_ms: since(started, times.scope_ended),
        wire: wire_lines(&capture.records()),
        server_noticed_ms: None,
        zombie_ms: None,
        work_done_ms: None,
        outlived_detected: None,
    };
    if watch {
        out.server_noticed_ms = since(started, times.noticed);
    } else {
        out.zombie_ms = match (times.scope_ended, times.completed) {
            (Some(ended), Some(done)) => Some(ms(done.saturating_duration_since(ended))),
            _ => None,
        };
        out.work_done_ms = since(started, times.completed);
        out.outlived_detected = Some(metrics.outlived());
    }
    Ok(out)
}

/// Runs both variants at once (separate servers).
///
/// # Errors
///
/// When a server or the capture proxy cannot be started.
pub async fn measure() -> anyhow::Result<Handler> {
    let (watching, ignoring) = tokio::join!(variant(true), variant(false));
    Ok(Handler {
        budget_ms: BUDGET.as_millis() as u64,
        work_ms: WORK.as_millis() as u64,
        watching: watching?,
        ignoring: ignoring?,
    })
}

impl Experiment for Handler {
    const NAME: &'static str = "handler";
    const LIGHT: bool = true;
    const ABOUT: &'static str = "A handler that watches its scope vs one that ignores it";
    const PRINTS: &'static str =
        "150 ms budget, 1 s of work: a handler that watches its scope stops; one that ignores it finishes, and is counted as outliving its scope";
    const SECTION: Option<Section> = Some(Section::WorkAfterGivingUp);
    type Args = NoArgs;

    async fn run(_: NoArgs, _: Spans) -> anyhow::Result<Self> {
        measure().await
    }

    fn outcome(&self) -> Outcome {
        let (watching, ignoring) = (&self.watching, &self.ignoring);
        let cell = |v: Option<f64>| v.map_or_else(|| "—".to_owned(), |v| v.to_string());
        let rows = vec![
            vec![
                "watching (work spawned in its scope)".to_owned(),
                watching.client_status.clone(),
                watching.client_ms.to_string(),
                cell(watching.server_noticed_ms),
                watching.completed.to_string(),
                "—".to_owned(),
                "151.1 / 151.1 / 0".to_owned(),
            ],
            vec![
                "ignoring (blocking, never checks)".to_owned(),
                ignoring.client_status.clone(),
                ignoring.client_ms.to_string(),
                "never".to_owned(),
                ignoring.completed.to_string(),
                cell(ignoring.zombie_ms),
                "150.6 / never / 1".to_owned(),
            ],
        ];
        Outcome {
            title: format!(
                "handler: {} ms client budget, {} s of handler work, server watched 1.2 s",
                self.budget_ms,
                self.work_ms as f64 / 1000.0
            ),
            json: crate::report::to_json(self),
            columns: vec![
                "handler",
                "client status",
                "client ms",
                "server noticed ms",
                "completed",
                "zombie ms",
                "seed client / noticed / completed",
            ],
            rows,
            notes: vec![
                format!(
                    "the ignoring handler's work outlived its scope by {} ms; the library counted it (tonic_deadline_outlived_total +{})",
                    cell(ignoring.zombie_ms),
                    ignoring.outlived_detected.map_or_else(|| "—".to_owned(), |n| n.to_string())
                ),
                "an async handler that ignores its scope cannot be a zombie here: the server layer drops it at the deadline; blocking threads cannot be dropped".into(),
            ],
        }
    }

    fn report(&self, _: &Outcome) -> Vec<Part> {
        vec![
            Part::bars(vec![
                (
                    "handler watches".to_owned(),
                    vec![(f64::from(self.watching.completed), Some(0.0))],
                ),
                (
                    "handler ignores".to_owned(),
                    vec![(f64::from(self.ignoring.completed), Some(1.0))],
                ),
            ]),
            Part::in_section(
                Section::OnTheWire,
                chart::wire_block(
                    "handler, 150 ms budget: the server's DEADLINE_EXCEEDED and the client's RST_STREAM",
                    &self.watching.wire,
                ),
            ),
        ]
    }
}
