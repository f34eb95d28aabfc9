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

use serde_json::{Value, json};
use tokio::time::Instant;
use tonic_deadline::Scope;
use tonic_deadline::observe::Metrics;

use crate::capture::Capture;
use crate::experiments::{status_name, wire_lines};
use crate::net;
use crate::pb::WorkReq;
use crate::pb::worker_client::WorkerClient;
use crate::report::{Outcome, ms};
use crate::systems::worker::{self, WorkerSvc};

/// The client's budget.
pub const BUDGET: Duration = Duration::from_millis(150);
/// The handler's work.
pub const WORK: Duration = Duration::from_secs(1);
/// How long after the call the server is looked at (the seed's 1.1 s, plus slack).
const SETTLE: Duration = Duration::from_millis(1200);

fn since(started: Instant, at: Option<Instant>) -> Value {
    at.map_or(Value::Null, |at| {
        json!(ms(at.saturating_duration_since(started)))
    })
}

async fn variant(watch: bool) -> anyhow::Result<Value> {
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
    let completed = u32::from(times.completed.is_some());
    let mut out = json!({
        "client_status": status_name(&result),
        "client_ms": client_ms,
        "completed": completed,
        "scope_ended_ms": since(started, times.scope_ended),
        "wire": wire_lines(&capture.records()),
    });
    if watch {
        out["server_noticed_ms"] = since(started, times.noticed);
    } else {
        out["zombie_ms"] = match (times.scope_ended, times.completed) {
            (Some(ended), Some(done)) => json!(ms(done.saturating_duration_since(ended))),
            _ => Value::Null,
        };
        out["work_done_ms"] = since(started, times.completed);
        out["outlived_detected"] = json!(metrics.outlived());
    }
    Ok(out)
}

/// Runs both variants at once (separate servers).
pub async fn run() -> anyhow::Result<Outcome> {
    let (watching, ignoring) = tokio::join!(variant(true), variant(false));
    let (watching, ignoring) = (watching?, ignoring?);
    let cell = |v: &Value| match v {
        Value::Null => "—".to_owned(),
        v => v.to_string(),
    };
    let rows = vec![
        vec![
            "watching (work spawned in its scope)".to_owned(),
            watching["client_status"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            cell(&watching["client_ms"]),
            cell(&watching["server_noticed_ms"]),
            cell(&watching["completed"]),
            "—".to_owned(),
            "151.1 / 151.1 / 0".to_owned(),
        ],
        vec![
            "ignoring (blocking, never checks)".to_owned(),
            ignoring["client_status"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            cell(&ignoring["client_ms"]),
            "never".to_owned(),
            cell(&ignoring["completed"]),
            cell(&ignoring["zombie_ms"]),
            "150.6 / never / 1".to_owned(),
        ],
    ];
    Ok(Outcome {
        title: "handler: 150 ms client budget, 1 s of handler work, server watched 1.2 s".into(),
        json: json!({ "budget_ms": BUDGET.as_millis() as u64, "work_ms": WORK.as_millis() as u64, "watching": watching, "ignoring": ignoring }),
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
                cell(&ignoring["zombie_ms"]),
                cell(&ignoring["outlived_detected"])
            ),
            "an async handler that ignores its scope cannot be a zombie here: the server layer drops it at the deadline; blocking threads cannot be dropped".into(),
        ],
    })
}
