//! The IM delivery chain with the seed's per-hop budgets: what each hop had on
//! entry and what it handed on, for a normal request, one where route
//! stalls, and one that reaches logic without a deadline.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;
use tonic_deadline::Scope;

use crate::experiments::status_name;
use crate::pb::{PushReq, Trace};
use crate::report::{Outcome, ms};
use crate::systems::im::{self, CLIENT_BUDGET};
use crate::systems::trace::Journal;

/// Work of route and push in a normal request.
const NORMAL_MS: u64 = 5;
/// Route's work when it stalls (far beyond any budget).
const STALL_MS: u64 = 5_000;

fn to_ms(us: i64) -> Value {
    if us < 0 {
        Value::Null
    } else {
        json!((us as f64 / 100.0).round() / 10.0)
    }
}

/// Groups journal records per service: entry budget, header, grants, work.
pub fn hops(records: &[Trace], order: &[&str]) -> Vec<Value> {
    order
        .iter()
        .filter_map(|service| {
            let mine: Vec<&Trace> = records.iter().filter(|t| t.service == *service).collect();
            let entry = mine.iter().find(|t| t.target.is_empty())?;
            let gave: Vec<Value> = mine
                .iter()
                .filter(|t| !t.target.is_empty() && t.target != "(work)")
                .map(|t| json!({ "to": t.target, "ms": to_ms(t.remaining_us), "at_ms": to_ms(t.at_us), "outcome": t.outcome }))
                .collect();
            let work = mine
                .iter()
                .find(|t| t.target == "(work)")
                .map(|t| json!({ "outcome": t.outcome, "at_ms": to_ms(t.at_us) }));
            Some(json!({
                "service": service,
                "entry_ms": to_ms(entry.remaining_us),
                "header": entry.header,
                "gave": gave,
                "work": work,
            }))
        })
        .collect()
}

async fn case(
    journal: &Journal,
    call: impl Future<Output = Result<tonic::Response<crate::pb::PushResp>, tonic::Status>>,
) -> Value {
    journal.take();
    let started = Instant::now();
    let result = call.await;
    let client_ms = ms(started.elapsed());
    // Let the cancelled hops record how their work ended.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let records = journal.take();
    json!({
        "status": status_name(&result),
        "client_ms": client_ms,
        "hops": hops(&records, &im::ROLES.iter().rev().copied().collect::<Vec<_>>()),
    })
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
pub async fn run() -> anyhow::Result<Outcome> {
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
    let stall = case(
        &journal,
        Scope::background()
            .with_timeout(CLIENT_BUDGET)
            .enter(client.push(push(STALL_MS))),
    )
    .await;
    let no_deadline = case(&journal, logic_client.push(push(NORMAL_MS))).await;

    let seed = |service: &str| match service {
        "gateway" => "800 → logic 500",
        "logic" => "500 (own 500 if none) → route 200, push left − 50",
        "route" => "200",
        "push" => "left − 50",
        _ => "",
    };
    let mut rows = Vec::new();
    for (name, case) in [
        ("normal", &normal),
        ("route stalls", &stall),
        ("logic, no deadline", &no_deadline),
    ] {
        for hop in case["hops"].as_array().into_iter().flatten() {
            let service = hop["service"].as_str().unwrap_or_default();
            let gave: Vec<String> = hop["gave"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|g| {
                    format!(
                        "{} {} ({})",
                        g["to"].as_str().unwrap_or_default(),
                        g["ms"],
                        g["outcome"].as_str().unwrap_or_default()
                    )
                })
                .collect();
            let work = hop["work"]["outcome"]
                .as_str()
                .map(|o| format!("{o} at {} ms", hop["work"]["at_ms"]));
            rows.push(vec![
                name.to_owned(),
                service.to_owned(),
                hop["entry_ms"].to_string(),
                hop["header"]
                    .as_str()
                    .filter(|h| !h.is_empty())
                    .unwrap_or("(none)")
                    .to_owned(),
                if gave.is_empty() {
                    work.unwrap_or_default()
                } else {
                    gave.join(", ")
                },
                seed(service).to_owned(),
            ]);
        }
        rows.push(vec![
            String::new(),
            "→ client".to_owned(),
            format!(
                "{} after {} ms",
                case["status"].as_str().unwrap_or_default(),
                case["client_ms"]
            ),
            String::new(),
            String::new(),
            String::new(),
        ]);
    }
    Ok(Outcome {
        title: "im: gateway → logic → route / push, client budget 800 ms; ms on entry and ms handed on".into(),
        json: json!({ "client_budget_ms": CLIENT_BUDGET.as_millis() as u64, "normal": normal, "route_stall": stall, "no_deadline": no_deadline }),
        columns: vec!["case", "service", "entry ms", "grpc-timeout", "gave downstream ms (status) / own work", "seed budget"],
        rows,
        notes: vec![
            "every hop hands on strictly less than it had: gateway caps logic at 500, logic caps route at 200 and keeps 50 for itself".into(),
            "when route stalls, route's own scope ends at its 200 ms and logic answers DEADLINE_EXCEEDED long before the client's 800 ms".into(),
        ],
    })
}
