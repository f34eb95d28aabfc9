//! A call whose deadline passed 1 s ago: answered locally, zero frames sent.

use std::collections::BTreeMap;
use std::time::Duration;

use testkit::CallRequest;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::capture::Capture;
use crate::kit::calls::layered_client;
use crate::html::chart;
use crate::html::{Part, Section};
use crate::net;
use crate::registry::{Experiment, NoArgs, Spans};
use crate::report::{Outcome, code_name};
use crate::systems::chain::{Hop, Plan};

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Expired {
    /// What the client got.
    pub status: String,
    /// How long the call took.
    pub elapsed_ms: f64,
    /// Frames the client sent for the call.
    pub frames: usize,
    /// Those frames by type.
    pub frame_kinds: BTreeMap<String, u32>,
}

/// Makes the call over an open connection and counts its frames.
///
/// # Errors
///
/// When the server or the capture proxy cannot be started, or the clock is
/// too young to hold a deadline 1 s in the past.
pub async fn measure() -> anyhow::Result<Expired> {
    let server = Hop::new("server", Plan::default(), None);
    let addr = net::serve(
        "127.0.0.1:0",
        server.routes(),
        Some(ServerDeadlineLayer::new()),
    )
    .await?;
    let capture = Capture::start(addr).await?;
    // The connection is open and has carried one call before we measure.
    let mut client = layered_client(capture.addr()).await?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = capture.frames().len();

    let past = Instant::now()
        .checked_sub(Duration::from_secs(1))
        .ok_or_else(|| anyhow::anyhow!("the clock is too young to hold a past deadline"))?;
    let scope = Scope::root(Some(past));
    let started = Instant::now();
    let result = scope.enter(client.call(CallRequest::default())).await;
    let elapsed = started.elapsed();
    tokio::time::sleep(Duration::from_millis(100)).await;

    let after = capture.frames();
    let new = &after[before.min(after.len())..];
    let mut kinds = BTreeMap::new();
    for frame in new {
        *kinds.entry(frame.kind_name().to_owned()).or_insert(0u32) += 1;
    }
    let status = match &result {
        Ok(_) => "OK",
        Err(status) => code_name(status.code()),
    };
    Ok(Expired {
        status: status.to_owned(),
        elapsed_ms: (elapsed.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0,
        frames: new.len(),
        frame_kinds: kinds,
    })
}

impl Experiment for Expired {
    const NAME: &'static str = "expired";
    const LIGHT: bool = true;
    const ABOUT: &'static str = "An already-expired call: status, time, frames on the wire";
    const PRINTS: &'static str = "status, time and HTTP/2 frames of an already-expired call";
    const SECTION: Option<Section> = Some(Section::OnTheWire);
    type Args = NoArgs;

    async fn run(_: NoArgs, _: Spans) -> anyhow::Result<Self> {
        measure().await
    }

    fn outcome(&self) -> Outcome {
        Outcome {
            title: "expired: a call with a deadline 1 s in the past, over an open connection".into(),
            json: crate::report::to_json(self),
            columns: vec!["status", "elapsed ms", "frames on the wire", "seed"],
            rows: vec![vec![
                self.status.clone(),
                format!("{:.3}", self.elapsed_ms),
                self.frames.to_string(),
                "DEADLINE_EXCEEDED, 0.0 ms, 0 frames".to_owned(),
            ]],
            notes: vec!["frames are counted by a TCP proxy that parses every HTTP/2 frame header the client sends".into()],
        }
    }

    fn report(&self, table: &Outcome) -> Vec<Part> {
        vec![Part::new(format!(
            "<h3>expired call</h3>{}",
            chart::rows(table)
        ))]
    }
}
