//! 0 vs 1: does downstream work stop when the client gives up?

use std::sync::atomic::Ordering;
use std::time::Duration;

use probe::CallRequest;
use serde_json::{Value, json};
use tokio::time::Instant;
use tonic_deadline::Scope;

use crate::experiments::layered_client;
use crate::report::{Outcome, code_name, ms};
use crate::systems::chain::{self, Plan};

const BUDGET: Duration = Duration::from_millis(200);
const WORK: Duration = Duration::from_secs(1);
const SETTLE: Duration = Duration::from_millis(1200);

async fn variant(detach: bool) -> anyhow::Result<Value> {
    let a = Plan {
        detach_next: detach,
        ..Plan::default()
    };
    let b = Plan {
        work: WORK,
        call_first: true,
        ..Plan::default()
    };
    let c = Plan {
        work: WORK,
        ..Plan::default()
    };
    let chain = chain::start("127.0.0.1:0", [a, b, c], false).await?;
    let mut client = layered_client(chain.entry).await?;
    let base: Vec<u64> = chain
        .completed
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .collect();
    let scope = Scope::background().with_timeout(BUDGET);
    let started = Instant::now();
    let result = scope.enter(client.call(CallRequest::default())).await;
    let client_ms = ms(started.elapsed());
    let status = match &result {
        Ok(_) => "OK",
        Err(status) => code_name(status.code()),
    };
    tokio::time::sleep(SETTLE).await;
    let done = |i: usize| chain.completed[i].load(Ordering::Relaxed) - base[i];
    Ok(json!({
        "client_status": status,
        "client_ms": client_ms,
        "b_completed": done(1),
        "c_completed": done(2),
    }))
}

/// Runs both variants at once (they use separate chains).
pub async fn run() -> anyhow::Result<Outcome> {
    let (propagate, detached) = tokio::join!(variant(false), variant(true));
    let (propagate, detached) = (propagate?, detached?);
    let row = |name: &str, v: &Value, seed: &str| {
        vec![
            name.to_owned(),
            v["client_status"].as_str().unwrap_or_default().to_owned(),
            v["client_ms"].to_string(),
            v["b_completed"].to_string(),
            v["c_completed"].to_string(),
            seed.to_owned(),
        ]
    };
    Ok(Outcome {
        title: "propagation: 200 ms client budget, B and C each do 1 s of work; completions counted 1.2 s after the client returns".into(),
        rows: vec![
            row("propagate (default)", &propagate, "0 / 0"),
            row("A detaches the call to B", &detached, "1 / 1"),
        ],
        json: json!({ "propagate": propagate, "detached": detached }),
        columns: vec!["variant", "client status", "client ms", "B completed", "C completed", "seed B / C"],
        notes: vec!["the detached variant needs an explicit `tonic_deadline::detach` in A".into()],
    })
}
