//! `grpc-timeout` as a server receives it, for budgets from 50 ms to 100 h.

use std::time::Duration;

use probe::CallRequest;
use serde_json::json;
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::report::Outcome;
use crate::systems::chain::{Hop, Plan};
use crate::{experiments::layered_client, net};

/// The budgets of the seed, with grpc-go's header for each.
const ROWS: [(&str, Option<Duration>, &str); 7] = [
    ("50ms", Some(Duration::from_millis(50)), "49994167n"),
    ("1s", Some(Duration::from_secs(1)), "999978u"),
    ("5s", Some(Duration::from_secs(5)), "4999984u"),
    ("1m30s", Some(Duration::from_secs(90)), "89999969u"),
    ("2h", Some(Duration::from_secs(2 * 3600)), "7200000m"),
    ("100h", Some(Duration::from_secs(100 * 3600)), "360000S"),
    ("none", None, "(absent)"),
];

/// Runs the experiment.
pub async fn run() -> anyhow::Result<Outcome> {
    let server = Hop::new("server", Plan::default(), None);
    let addr = net::serve(
        "127.0.0.1:0",
        server.routes(),
        Some(ServerDeadlineLayer::new()),
    )
    .await?;
    let mut client = layered_client(addr).await?;
    let mut rows = Vec::new();
    let mut json_rows = Vec::new();
    for (label, timeout, seed) in ROWS {
        let scope = match timeout {
            Some(t) => Scope::background().with_timeout(t),
            None => Scope::background(),
        };
        let reply = scope
            .enter(client.call(CallRequest::default()))
            .await?
            .into_inner();
        let header = reply
            .hops
            .first()
            .map(|h| h.header.clone())
            .filter(|h| !h.is_empty());
        rows.push(vec![
            label.to_owned(),
            header.clone().unwrap_or_else(|| "(absent)".to_owned()),
            seed.to_owned(),
        ]);
        json_rows.push(json!({ "timeout": label, "header": header, "seed": seed }));
    }
    Ok(Outcome {
        title: "wire: grpc-timeout as received by the server (call made right after the timeout is set)".into(),
        json: json!({ "rows": json_rows }),
        columns: vec!["timeout", "ours", "grpc-go (seed)"],
        rows,
        notes: vec!["ours is the remaining budget at the moment the headers are written, finest unit that fits 8 digits".into()],
    })
}
