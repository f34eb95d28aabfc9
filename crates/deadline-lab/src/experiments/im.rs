//! The IM delivery chain with the seed's per-hop budgets: what each hop had on
//! entry and what it handed on, for a normal request, one where route
//! stalls, and one that reaches logic without a deadline.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic_deadline::Scope;

use crate::experiments::{status_name, without_deadline};
use crate::html::chart::{self, Bar};
use crate::html::{Part, Section};
use crate::pb::{PushReq, Trace};
use crate::registry::{Experiment, NoArgs, Spans};
use crate::report::{Outcome, ms};
use crate::systems::im::{self, CLIENT_BUDGET};
use crate::systems::trace::Journal;

/// Work of route and push in a normal request.
const NORMAL_MS: u64 = 5;
/// Route's work when it stalls (far beyond any budget).
const STALL_MS: u64 = 5_000;

/// A journal's microseconds as milliseconds with one decimal; `None` for
/// the journal's -1 (no deadline).
fn to_ms(us: i64) -> Option<f64> {
    (us >= 0).then(|| (us as f64 / 100.0).round() / 10.0)
}

/// `—` for a missing figure, the figure otherwise.
pub fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "—".to_owned(), |v| v.to_string())
}

/// A budget one hop handed to a downstream call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grant {
    /// The downstream service.
    pub to: String,
    /// The budget granted; `None` without a deadline.
    pub ms: Option<f64>,
    /// When, after the hop's entry.
    pub at_ms: Option<f64>,
    /// The status of the downstream call.
    pub outcome: String,
}

/// How a hop's own work ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Work {
    /// `completed`, or the cause that stopped it.
    pub outcome: String,
    /// When, after the hop's entry.
    pub at_ms: Option<f64>,
}

/// What one service recorded: its budget on entry, what it handed on, how
/// its own work ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hop {
    /// The service.
    pub service: String,
    /// The remaining budget on entry; `None` without a deadline.
    pub entry_ms: Option<f64>,
    /// The `grpc-timeout` header as received (empty when absent).
    pub header: String,
    /// The budgets it handed to its downstream calls.
    pub gave: Vec<Grant>,
    /// Its own work, if it did any.
    pub work: Option<Work>,
}

impl Hop {
    /// What this hop handed to `to`, if it called it.
    pub fn gave_to(&self, to: &str) -> Option<&Grant> {
        self.gave.iter().find(|g| g.to == to)
    }
}

/// The hop of `service` in `hops`.
pub fn find<'a>(hops: &'a [Hop], service: &str) -> Option<&'a Hop> {
    hops.iter().find(|h| h.service == service)
}

/// Groups journal records per service: entry budget, header, grants, work.
pub fn hops(records: &[Trace], order: &[&str]) -> Vec<Hop> {
    order
        .iter()
        .filter_map(|service| {
            let mine: Vec<&Trace> = records.iter().filter(|t| t.service == *service).collect();
            let entry = mine.iter().find(|t| t.target.is_empty())?;
            let gave = mine
                .iter()
                .filter(|t| !t.target.is_empty() && t.target != "(work)")
                .map(|t| Grant {
                    to: t.target.clone(),
                    ms: to_ms(t.remaining_us),
                    at_ms: to_ms(t.at_us),
                    outcome: t.outcome.clone(),
                })
                .collect();
            let work = mine.iter().find(|t| t.target == "(work)").map(|t| Work {
                outcome: t.outcome.clone(),
                at_ms: to_ms(t.at_us),
            });
            Some(Hop {
                service: (*service).to_owned(),
                entry_ms: to_ms(entry.remaining_us),
                header: entry.header.clone(),
                gave,
                work,
            })
        })
        .collect()
}

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
