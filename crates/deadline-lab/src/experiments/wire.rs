//! `grpc-timeout` as a server receives it, for budgets from 50 ms to 100 h.

use std::time::Duration;

use testkit::CallRequest;
use serde::{Deserialize, Serialize};
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::registry::{Experiment, NoArgs, Spans};
use crate::report::Outcome;
use crate::systems::chain::{Hop, Plan};
use crate::kit::calls::layered_client;
use crate::net;

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

/// One budget, as the server received it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    /// The budget (`50ms` … `100h`, or `none`).
    pub timeout: String,
    /// The `grpc-timeout` the server received; `None` when absent.
    pub header: Option<String>,
    /// grpc-go's header for the same budget.
    pub seed: String,
}

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wire {
    /// One row per budget.
    pub rows: Vec<Row>,
}

/// Sends one call per budget and reads the header the server received.
///
/// # Errors
///
/// When the server cannot be started or a call fails.
pub async fn measure() -> anyhow::Result<Wire> {
    let server = Hop::new("server", Plan::default(), None);
    let addr = net::serve(
        "127.0.0.1:0",
        server.routes(),
        Some(ServerDeadlineLayer::new()),
    )
    .await?;
    let mut client = layered_client(addr).await?;
    let mut rows = Vec::new();
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
        rows.push(Row {
            timeout: label.to_owned(),
            header,
            seed: seed.to_owned(),
        });
    }
    Ok(Wire { rows })
}

impl Experiment for Wire {
    const NAME: &'static str = "wire";
    const ABOUT: &'static str = "grpc-timeout on the wire for budgets from 50 ms to 100 h";
    const PRINTS: &'static str = "`grpc-timeout` as received, 50 ms … 100 h, beside grpc-go's";
    type Args = NoArgs;

    async fn run(_: NoArgs, _: Spans) -> anyhow::Result<Self> {
        measure().await
    }

    fn outcome(&self) -> Outcome {
        let rows = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.timeout.clone(),
                    r.header.clone().unwrap_or_else(|| "(absent)".to_owned()),
                    r.seed.clone(),
                ]
            })
            .collect();
        Outcome {
            title: "wire: grpc-timeout as received by the server (call made right after the timeout is set)".into(),
            json: crate::report::to_json(self),
            columns: vec!["timeout", "ours", "grpc-go (seed)"],
            rows,
            notes: vec!["ours is the remaining budget at the moment the headers are written, finest unit that fits 8 digits".into()],
        }
    }
}
