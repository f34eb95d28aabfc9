//! The IM delivery chain with the seed's per-hop budgets: what each hop had on
//! entry and what it handed on, for a normal request, one where route
//! stalls, and one that reaches logic without a deadline.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic_deadline::Scope;

use crate::kit::calls::{status_name, without_deadline};
use crate::kit::journal::{Hop, cell, find, hops};
use crate::html::chart::{self, Bar};
use crate::html::{Part, Section};
use crate::pb::PushReq;
use crate::registry::{Experiment, NoArgs, Spans};
use crate::report::{Outcome, ms};
use crate::systems::im::{self, CLIENT_BUDGET};
use crate::systems::trace::Journal;

/// Work of route and push in a normal request.
const NORMAL_MS: u64 = 5;
/// Route's work when it stalls (far beyond any budget).
const STALL_MS: u64 = 5_000;

/// One request through the chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// What the client got.
    pub status: String,
    /// When, after the call began.
    pub client_ms: f64,
    /// Every hop that recorded its entry, gateway first.
    pub hops: Vec<Hop>,
}

impl Case {
    /// The hop of `service`, if it was reached.
    pub fn hop(&self, service: &str) -> Option<&Hop> {
        find(&self.hops, service)
    }
}

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Im {
    /// The client's budget.
    pub client_budget_ms: u64,
    /// A normal request.
    pub normal: Case,
    /// Route stalls far beyond its cap.
    pub route_stall: Case,
    /// A request that reaches logic without a deadline.
    pub no_deadline: Case,
}

async fn case(
    journal: &Journal,
    call: impl Future<Output = Result<tonic::Response<crate::pb::PushResp>, tonic::Status>>,
) -> Case {
    journal.take();
    let started = Instant::now();
    let result = call.await;
    let client_ms = ms(started.elapsed());
    // Let the cancelled hops record how their work ended.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let records = journal.take();
    Case {
        status: status_name(&result).to_owned(),
        client_ms,
        hops: hops(
            &records,
            &im::ROLES.iter().rev().copied().collect::<Vec<_>>(),
        ),
    }
}

fn push(route_ms: u64) -> PushReq {
    PushReq {
        uid: 1,
        text: "hi".into(),
        route_ms,
        push_ms: NORMAL_MS,
        route_blocks: false,
    }
}

/// Runs the three cases on one in-process chain.
///
/// # Errors
///
/// When the chain cannot be started or warmed.
pub async fn measure() -> anyhow::Result<Im> {
    let journal = Journal::new();
    let started = im::start("127.0.0.1:0", &journal).await?;
    let addr = |role: &str| started.iter().find(|s| s.role == role).map(|s| s.addr);
    let gateway = addr("gateway").ok_or_else(|| anyhow::anyhow!("gateway started"))?;
    let logic = addr("logic").ok_or_else(|| anyhow::anyhow!("logic started"))?;
    let mut client = im::client(gateway).await?;
    let mut logic_client = im::logic_client(logic).await?;
    // Warm every connection of the chain.
    Scope::background()
        .with_timeout(CLIENT_BUDGET)
        .enter(client.push(push(0)))
        .await?;

    let normal = case(
        &journal,
        Scope::background()
            .with_timeout(CLIENT_BUDGET)
            .enter(client.push(push(NORMAL_MS))),
    )
    .await;
    let route_stall = case(
        &journal,
        Scope::background()
            .with_timeout(CLIENT_BUDGET)
            .enter(client.push(push(STALL_MS))),
    )
    .await;
    let no_deadline = case(
        &journal,
        without_deadline(logic_client.push(push(NORMAL_MS))),
    )
    .await;
    Ok(Im {
        client_budget_ms: CLIENT_BUDGET.as_millis() as u64,
        normal,
        route_stall,
        no_deadline,
    })
}

impl Experiment for Im {
    const NAME: &'static str = "im";
    const LIGHT: bool = true;
    const ABOUT: &'static str = "The IM chain's per-hop budgets, normal and with route stalling";
    const PRINTS: &'static str =
        "the IM chain's per-hop budgets (800 → 500 → 200 / left − 50), normal, with route stalling, and without a deadline";
    const SECTION: Option<Section> = Some(Section::BudgetPerHop);
    type Args = NoArgs;

    async fn run(_: NoArgs, _: Spans) -> anyhow::Result<Self> {
        measure().await
    }

    fn outcome(&self) -> Outcome {
        let seed = |service: &str| match service {
            "gateway" => "800 → logic 500",
            "logic" => "500 (own 500 if none) → route 200, push left − 50",
            "route" => "200",
            "push" => "left − 50",
            _ => "",
        };
        let mut rows = Vec::new();
        for (name, case) in [
            ("normal", &self.normal),
            ("route stalls", &self.route_stall),
            ("logic, no deadline", &self.no_deadline),
        ] {
            for hop in &case.hops {
                let gave: Vec<String> = hop
                    .gave
                    .iter()
                    .map(|g| format!("{} {} ({})", g.to, cell(g.ms), g.outcome))
                    .collect();
                let work = hop
                    .work
                    .as_ref()
                    .map(|w| format!("{} at {} ms", w.outcome, cell(w.at_ms)));
                rows.push(vec![
                    name.to_owned(),
                    hop.service.clone(),
                    cell(hop.entry_ms),
                    if hop.header.is_empty() {
                        "(none)".to_owned()
                    } else {
                        hop.header.clone()
                    },
                    if gave.is_empty() {
                        work.unwrap_or_default()
                    } else {
                        gave.join(", ")
                    },
                    seed(&hop.service).to_owned(),
                ]);
            }
            rows.push(vec![
                String::new(),
                "→ client".to_owned(),
                format!("{} after {} ms", case.status, case.client_ms),
                String::new(),
                String::new(),
                String::new(),
            ]);
        }
        Outcome {
            title: "im: gateway → logic → route / push, client budget 800 ms; ms on entry and ms handed on".into(),
            json: crate::report::to_json(self),
            columns: vec!["case", "service", "entry ms", "grpc-timeout", "gave downstream ms (status) / own work", "seed budget"],
            rows,
            notes: vec![
                "every hop hands on strictly less than it had: gateway caps logic at 500, logic caps route at 200 and keeps 50 for itself".into(),
                "when route stalls, route's own scope ends at its 200 ms and logic answers DEADLINE_EXCEEDED long before the client's 800 ms".into(),
            ],
        }
    }

    fn report(&self, _: &Outcome) -> Vec<Part> {
        vec![
            Part::new(chart::hbars(
                "im-normal",
                "IM chain, normal request: budget on entry and handed on (client 800 ms)",
                "ms",
                &bars(&self.normal),
            )),
            Part::new(chart::hbars(
                "im-stall",
                "IM chain, route stalls: route's 200 ms cap ends it; logic answers early",
                "ms",
                &bars(&self.route_stall),
            )),
        ]
    }
}

/// A case's budgets as bars: each hop's on entry (beside the seed's) and
/// what it handed on.
fn bars(case: &Case) -> Vec<Bar> {
    let seed = |service: &str| match service {
        "gateway" => Some(800.0),
        "logic" => Some(500.0),
        "route" => Some(200.0),
        _ => None,
    };
    let mut bars = Vec::new();
    for hop in &case.hops {
        if let Some(entry) = hop.entry_ms {
            let work = hop
                .work
                .as_ref()
                .map(|w| format!("own work: {}", w.outcome))
                .unwrap_or_default();
            bars.push(
                Bar::new(
                    format!("{} on entry", hop.service),
                    entry,
                    seed(&hop.service),
                )
                .note(work),
            );
        }
        for gave in &hop.gave {
            if let Some(ms) = gave.ms {
                bars.push(
                    Bar::new(format!("  {} → {}", hop.service, gave.to), ms, None)
                        .note(gave.outcome.clone()),
                );
            }
        }
    }
    bars
}
