//! Remaining budget on entry at each hop of A → B → C.

use std::time::Duration;

use probe::CallRequest;
use serde_json::json;
use tonic_deadline::Scope;

use crate::experiments::layered_client;
use crate::report::{Outcome, code_name};
use crate::systems::chain::{self, Plan};

/// The seed's figures (grpc-go) for a 1 s budget and 100 ms hops.
const SEED_MS: [u32; 3] = [999, 898, 797];

/// Runs the experiment with `hop` of work at each hop.
pub async fn run(hop: Duration) -> anyhow::Result<Outcome> {
    let plan = Plan {
        work: hop,
        ..Plan::default()
    };
    let chain = chain::start("127.0.0.1:0", [plan; 3], false).await?;
    let mut client = layered_client(chain.entry).await?;
    let budget = Duration::from_secs(1);
    let scope = Scope::background().with_timeout(budget);
    let reply = scope.enter(client.call(CallRequest::default())).await;
    let (status, hops) = match reply {
        Ok(reply) => ("OK", reply.into_inner().hops),
        Err(status) => (code_name(status.code()), Vec::new()),
    };
    let mut rows = Vec::new();
    let mut json_hops = Vec::new();
    for (i, hop) in hops.iter().enumerate() {
        let remaining_ms = hop.remaining_us as f64 / 1000.0;
        rows.push(vec![
            hop.service.clone(),
            format!("{remaining_ms:.1}"),
            hop.header.clone(),
            SEED_MS.get(i).map(u32::to_string).unwrap_or_default(),
        ]);
        json_hops.push(json!({
            "service": hop.service,
            "remaining_ms": (remaining_ms * 10.0).round() / 10.0,
            "header": hop.header,
        }));
    }
    Ok(Outcome {
        title: format!(
            "chain: remaining budget on entry, 1 s client budget, {} ms of work per hop",
            hop.as_millis()
        ),
        json: json!({ "budget_ms": budget.as_millis() as u64, "hop_ms": hop.as_millis() as u64, "hops": json_hops, "status": status }),
        columns: vec![
            "service",
            "remaining ms",
            "grpc-timeout received",
            "seed ms",
        ],
        rows,
        notes: vec![format!("status: {status}")],
    })
}
