//! 0 vs 1: does downstream work stop when the client gives up?

use std::sync::atomic::Ordering;
use std::time::Duration;

use testkit::CallRequest;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic_deadline::Scope;

use crate::kit::calls::layered_client;
use crate::html::{Part, Section};
use crate::registry::{Experiment, NoArgs, Spans};
use crate::report::{Outcome, code_name, ms};
use crate::systems::chain::{self, Plan};

const BUDGET: Duration = Duration::from_millis(200);
const WORK: Duration = Duration::from_secs(1);
const SETTLE: Duration = Duration::from_millis(1200);

/// One chain, the call to B propagated or detached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    /// What the client got.
    pub client_status: String,
    /// When, after the call began.
    pub client_ms: f64,
    /// B's work that ran to its end (0 or 1).
    pub b_completed: u64,
    /// C's work that ran to its end (0 or 1).
    pub c_completed: u64,
}

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Propagation {
    /// The default: A's call to B carries the scope.
    pub propagate: Variant,
    /// A detaches its call to B.
    pub detached: Variant,
}

async fn variant(detach: bool) -> anyhow::Result<Variant> {
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
    Ok(Variant {
        client_status: status.to_owned(),
        client_ms,
        b_completed: done(1),
        c_completed: done(2),
    })
}

/// Runs both variants at once (they use separate chains).
///
/// # Errors
///
/// When a chain cannot be started.
pub async fn measure() -> anyhow::Result<Propagation> {
    let (propagate, detached) = tokio::join!(variant(false), variant(true));
    Ok(Propagation {
        propagate: propagate?,
        detached: detached?,
    })
}

impl Experiment for Propagation {
    const NAME: &'static str = "propagation";
    const LIGHT: bool = true;
    const ABOUT: &'static str =
        "Completions downstream after the client gives up: propagate vs detach";
    const PRINTS: &'static str = "B/C completions after the client gave up: propagate vs detach";
    const SECTION: Option<Section> = Some(Section::WorkAfterGivingUp);
    type Args = NoArgs;

    async fn run(_: NoArgs, _: Spans) -> anyhow::Result<Self> {
        measure().await
    }

    fn outcome(&self) -> Outcome {
        let row = |name: &str, v: &Variant, seed: &str| {
            vec![
                name.to_owned(),
                v.client_status.clone(),
                v.client_ms.to_string(),
                v.b_completed.to_string(),
                v.c_completed.to_string(),
                seed.to_owned(),
            ]
        };
        Outcome {
            title: "propagation: 200 ms client budget, B and C each do 1 s of work; completions counted 1.2 s after the client returns".into(),
            rows: vec![
                row("propagate (default)", &self.propagate, "0 / 0"),
                row("A detaches the call to B", &self.detached, "1 / 1"),
            ],
            json: crate::report::to_json(self),
            columns: vec!["variant", "client status", "client ms", "B completed", "C completed", "seed B / C"],
            notes: vec!["the detached variant needs an explicit `tonic_deadline::detach` in A".into()],
        }
    }

    fn report(&self, _: &Outcome) -> Vec<Part> {
        let count = |n: u64| n as f64;
        vec![Part::bars(vec![
            (
                "B, propagate".to_owned(),
                vec![(count(self.propagate.b_completed), Some(0.0))],
            ),
            (
                "C, propagate".to_owned(),
                vec![(count(self.propagate.c_completed), Some(0.0))],
            ),
            (
                "B, detached".to_owned(),
                vec![(count(self.detached.b_completed), Some(1.0))],
            ),
            (
                "C, detached".to_owned(),
                vec![(count(self.detached.c_completed), Some(1.0))],
            ),
        ])]
    }
}
