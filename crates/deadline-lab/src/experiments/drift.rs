//! Relative timeouts ignore transit time: a 1 s budget sent through the
//! capture proxy with injected client → server delay.
//!
//! The server turns `grpc-timeout` into a deadline from its own clock when the
//! request arrives, so it always sees about the full second; the client's
//! deadline was fixed when the call started, so by then it really has the
//! transit time less. Both clocks are this process's, so "what the client
//! really has left" is read at the instant the handler runs.

use std::time::Duration;

use tower::Layer;

use futures_util::future::join_all;
use serde_json::{Value, json};
use tonic_deadline::Scope;

use crate::capture::{Capture, Direction, Options};
use crate::experiments::{status_name, wire_lines};
use crate::net;
use crate::pb::WorkReq;
use crate::pb::worker_client::WorkerClient;
use crate::report::{Outcome, ms};
use crate::systems::worker::{self, WorkerSvc};

/// The client's budget.
pub const BUDGET: Duration = Duration::from_secs(1);
/// The injected delays, with the seed's (server sees, client left) in ms.
pub const ROWS: [(u64, u32, u32); 3] = [(0, 999, 999), (100, 999, 798), (300, 999, 598)];
/// The delay of the row repeated with transit compensation.
const COMPENSATED_DELAY_MS: u64 = 100;

async fn row(delay_ms: u64, allowance_ms: u64) -> anyhow::Result<Value> {
    let svc = WorkerSvc::new();
    let addr = worker::start("127.0.0.1:0", svc.clone()).await?;
    let capture = Capture::start_with(
        addr,
        Options {
            delay: Duration::from_millis(delay_ms),
            ..Options::default()
        },
    )
    .await?;
    let channel = tonic_deadline::ClientDeadlineLayer::new()
        .transit_allowance(Duration::from_millis(allowance_ms))
        .layer(
            tonic_deadline::client::ReadyChannel::connect(&net::endpoint(capture.addr())?).await?,
        );
    let mut client = WorkerClient::new(channel);
    client.work(WorkReq::default()).await?;
    // Let the warm-up's trailing frames (acks, window updates) pass.
    tokio::time::sleep(Duration::from_millis(delay_ms * 2 + 20)).await;
    svc.take();
    capture.clear();

    let scope = Scope::background().with_timeout(BUDGET);
    let started = tokio::time::Instant::now();
    let deadline = scope
        .deadline()
        .ok_or_else(|| anyhow::anyhow!("a timeout scope has a deadline"))?;
    let result = scope.enter(client.work(WorkReq::default())).await;
    let times = svc.take();
    let reply = result.as_ref().ok().map(|r| r.get_ref().clone());
    let entered = times
        .entered
        .ok_or_else(|| anyhow::anyhow!("the handler must have run"))?;
    let server_sees_ms = reply
        .as_ref()
        .map_or(f64::NAN, |r| r.remaining_us as f64 / 1000.0);
    let records = capture.records();
    let chunks = records
        .iter()
        .filter(|r| r.direction == Direction::ClientToServer)
        .map(|r| r.chunk)
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    Ok(json!({
        "delay_ms": delay_ms,
        "transit_allowance_ms": allowance_ms,
        "status": status_name(&result),
        "server_sees_ms": (server_sees_ms * 10.0).round() / 10.0,
        "client_left_ms": ms(deadline.saturating_duration_since(entered)),
        "header": reply.map(|r| r.header),
        "request_chunks": chunks,
        "arrived_late_ms": ms(entered.saturating_duration_since(started)),
        "wire": wire_lines(&records),
    }))
}

/// Runs the three delays at once (separate servers and proxies).
pub async fn run() -> anyhow::Result<Outcome> {
    let (rows, compensated) = tokio::join!(
        join_all(ROWS.iter().map(|(d, _, _)| row(*d, 0))),
        // Opt-in compensation: the client deducts the known one-way delay.
        row(COMPENSATED_DELAY_MS, COMPENSATED_DELAY_MS),
    );
    let rows: Vec<Value> = rows.into_iter().collect::<anyhow::Result<_>>()?;
    let compensated = compensated?;
    let mut table: Vec<Vec<String>> = rows
        .iter()
        .zip(ROWS)
        .map(|(r, (_, seed_server, seed_client))| {
            vec![
                r["delay_ms"].to_string(),
                r["header"].as_str().unwrap_or("—").to_owned(),
                r["server_sees_ms"].to_string(),
                r["client_left_ms"].to_string(),
                r["request_chunks"].to_string(),
                format!("{seed_server} / {seed_client}"),
            ]
        })
        .collect();
    table.push(vec![
        format!(
            "{} (client allowance {} ms)",
            compensated["delay_ms"], compensated["transit_allowance_ms"]
        ),
        compensated["header"].as_str().unwrap_or("—").to_owned(),
        compensated["server_sees_ms"].to_string(),
        compensated["client_left_ms"].to_string(),
        compensated["request_chunks"].to_string(),
        "—".to_owned(),
    ]);
    Ok(Outcome {
        title: "drift: 1 s budget through the capture proxy, each client → server chunk delayed".into(),
        json: json!({ "budget_ms": BUDGET.as_millis() as u64, "rows": rows, "compensated": compensated }),
        columns: vec![
            "delay ms",
            "grpc-timeout received",
            "server sees ms",
            "client really has ms",
            "c→s chunks",
            "seed server / client",
        ],
        rows: table,
        notes: vec![
            "relative timeouts need no clock sync, but transit time is not deducted: every hop should keep a reserve".into(),
            "last row: ClientDeadlineLayer::transit_allowance(100 ms) deducts the known one-way delay, so server and client agree again".into(),
            "ours differs from the seed's client column by the delay itself: our proxy adds a true one-way delay, so the request arrives 1 × delay late; \
             the seed's proxy slept before each chunk in turn and its request queued behind another chunk, arriving ≈ 2 × delay late (its own note: 100 ms → ≈200 ms). \
             Same law either way: the server sees the full budget, the client has the budget less the transit time".into(),
        ],
    })
}
