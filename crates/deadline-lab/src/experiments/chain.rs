//! Remaining budget on entry at each hop of A → B → C.

use std::time::Duration;

use testkit::CallRequest;
use serde::{Deserialize, Serialize};
use tonic_deadline::Scope;

use crate::kit::calls::layered_client;
use crate::html::chart::{self, Bar};
use crate::html::{Part, Section};
use crate::registry::{Experiment, Spans};
use crate::report::{Outcome, code_name};
use crate::systems::chain::{self, Plan};

/// Each hop's work unless `--hop-ms` says otherwise.
pub const DEFAULT_HOP_MS: u64 = 100;

/// The flags of `experiment chain`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[arg(long, default_value_t = DEFAULT_HOP_MS)]
    hop_ms: u64,
}

/// The seed's figures (grpc-go) for a 1 s budget and 100 ms hops.
const SEED_MS: [u32; 3] = [999, 898, 797];

/// What one hop had on entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hop {
    /// `A`, `B` or `C`.
    pub service: String,
    /// The remaining budget on entry.
    pub remaining_ms: f64,
    /// The `grpc-timeout` it received.
    pub header: String,
}

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chain {
    /// The client's budget.
    pub budget_ms: u64,
    /// Each hop's work.
    pub hop_ms: u64,
    /// A, B and C, in order (none when the call failed).
    pub hops: Vec<Hop>,
    /// What the client got.
    pub status: String,
}

/// Runs the chain with `hop` of work at each hop.
///
/// # Errors
///
/// When the chain cannot be started or warmed.
pub async fn measure(hop: Duration) -> anyhow::Result<Chain> {
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
    Ok(Chain {
        budget_ms: budget.as_millis() as u64,
        hop_ms: hop.as_millis() as u64,
        hops: hops
            .iter()
            .map(|h| Hop {
                service: h.service.clone(),
                remaining_ms: (h.remaining_us as f64 / 100.0).round() / 10.0,
                header: h.header.clone(),
            })
            .collect(),
        status: status.to_owned(),
    })
}

impl Experiment for Chain {
    const NAME: &'static str = "chain";
    const LIGHT: bool = true;
    const ABOUT: &'static str = "Remaining budget on entry at A, B and C";
    const PRINTS: &'static str = "remaining budget on entry at A, B, C";
    const SECTION: Option<Section> = Some(Section::BudgetPerHop);
    type Args = Args;

    async fn run(args: Args, _: Spans) -> anyhow::Result<Self> {
        measure(Duration::from_millis(args.hop_ms)).await
    }

    fn outcome(&self) -> Outcome {
        let rows = self
            .hops
            .iter()
            .enumerate()
            .map(|(i, hop)| {
                vec![
                    hop.service.clone(),
                    format!("{:.1}", hop.remaining_ms),
                    hop.header.clone(),
                    SEED_MS.get(i).map(u32::to_string).unwrap_or_default(),
                ]
            })
            .collect();
        Outcome {
            title: format!(
                "chain: remaining budget on entry, {} s client budget, {} ms of work per hop",
                self.budget_ms as f64 / 1000.0,
                self.hop_ms
            ),
            json: crate::report::to_json(self),
            columns: vec![
                "service",
                "remaining ms",
                "grpc-timeout received",
                "seed ms",
            ],
            rows,
            notes: vec![format!("status: {}", self.status)],
        }
    }

    fn report(&self, _: &Outcome) -> Vec<Part> {
        const SEED: [f64; 3] = [999.9, 899.2, 798.6];
        let bars: Vec<Bar> = self
            .hops
            .iter()
            .zip(SEED)
            .map(|(h, seed)| {
                Bar::new(&h.service, h.remaining_ms, Some(seed))
                    .note(format!("grpc-timeout {}", h.header))
            })
            .collect();
        vec![Part::new(chart::hbars(
            "chain",
            "Chain A → B → C: remaining budget on entry (1 s client budget, 100 ms per hop)",
            "ms",
            &bars,
        ))]
    }
}
