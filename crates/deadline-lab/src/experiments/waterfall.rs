//! Where one request's budget went: one request through the IM chain,
//! traced. Every hop's spans arrive at a real OTLP receiver in this process
//! (and at `--otlp-endpoint` too, when given); the waterfall is drawn from
//! what the receiver got: each span from entry to exit, the budget it had,
//! what it handed on, and how it ended.
//!
//! Two cases: `normal`, and `route stalls` — route's lookup is stuck in a
//! blocking call that never checks its scope. Route's server answers at
//! its 200 ms cap and its span ends there; the blocking work runs on, and
//! its span, closing after its parent's deadline, is flagged
//! `outlived_parent_deadline`: the lost cancellation, visible in the trace.

use serde::{Deserialize, Serialize};
use tonic_deadline::Scope;

use crate::html::{Part, Section};
use crate::html::chart::escape;
use crate::kit::traced::{self, BAR_MS, Case, STALL_MS, bar, chart, traced};
use crate::otlp::Receiver;
use crate::pb::PushReq;
use crate::registry::{Experiment, NoArgs, Spans};
use crate::report::Outcome;
use crate::systems::im::{self, CLIENT_BUDGET};
use crate::systems::trace::Journal;

/// Work of route and push in a normal request.
const NORMAL_MS: u64 = 5;
/// The experiment's result, shared by the table, `--json`, the report and
/// the tests.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Waterfall {
    /// The client's budget, in milliseconds.
    pub client_budget_ms: f64,
    /// One traced request per case.
    pub cases: Vec<Case>,
}

fn push(route_ms: u64, route_blocks: bool) -> PushReq {
    PushReq {
        uid: 1,
        text: "hi".into(),
        route_ms,
        push_ms: NORMAL_MS,
        route_blocks,
    }
}

/// How many spans a case makes: the request's root, and per hop a call and
/// a server span; a stall adds route's blocking work and never reaches push.
fn expected_spans(stalls: bool) -> usize {
    if stalls { 8 } else { 9 }
}

/// Runs both cases on one in-process chain whose spans go to `receiver`.
///
/// # Errors
///
/// When the chain cannot start, or spans are not exported to `receiver`
/// (the process's subscriber must export there: [`crate::otlp::Telemetry`]).
pub async fn measure(receiver: &Receiver) -> anyhow::Result<Waterfall> {
    let journal = Journal::new();
    let started =
        im::start_with_reserve("127.0.0.1:0", &journal, Some(crate::systems::REPLY_RESERVE))
            .await?;
    let gateway = crate::systems::addr_of(&started, "gateway")?;
    let mut client = im::client(gateway).await?;
    // Warm every connection of the chain (untraced: no root span).
    Scope::background()
        .with_timeout(CLIENT_BUDGET)
        .enter(client.push(push(0, false)))
        .await?;
    let mut cases = Vec::new();
    for (name, route_ms, stalls) in [
        ("normal", NORMAL_MS, false),
        ("route stalls", STALL_MS, true),
    ] {
        let case = traced(
            receiver,
            name,
            CLIENT_BUDGET,
            expected_spans(stalls),
            client.push(push(route_ms, stalls)),
        )
        .await?;
        journal.take();
        cases.push(case);
    }
    Ok(Waterfall {
        client_budget_ms: CLIENT_BUDGET.as_secs_f64() * 1000.0,
        cases,
    })
}

/// Runs `deadline-lab experiment waterfall --json` (the binary at `exe`) as
/// a child process, so that its spans (and their cost) stay out of this
/// process.
///
/// # Errors
///
/// When the child fails or prints something else than the result.
pub async fn run_exe(exe: &std::path::Path) -> anyhow::Result<Waterfall> {
    let out = tokio::process::Command::new(exe)
        .args(["experiment", "waterfall", "--json"])
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "experiment waterfall failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

impl Experiment for Waterfall {
    const NAME: &'static str = "waterfall";
    const LIGHT: bool = true;
    const ABOUT: &'static str = "One request through the IM chain, traced: every hop's span, budget and outcome, normal and with route stalling";
    const PRINTS: &'static str =
        "one request through the IM chain, traced over OTLP and drawn as a timeline: every hop's span with its budget on entry, what it granted, its cap or reserve and its outcome, normal and with route stalling (see [Traces](traces.md))";
    const COLLECTS_SPANS: bool = true;
    const SECTION: Option<Section> = Some(Section::Waterfall);
    const STYLE: &'static str = traced::STYLE;
    type Args = NoArgs;

    async fn run(_: NoArgs, spans: Spans) -> anyhow::Result<Self> {
        match spans {
            Spans::ChildProcess => run_exe(&crate::process::lab_exe()?).await,
            Spans::Collected(receiver) => {
                let receiver = receiver.ok_or_else(|| {
                    anyhow::anyhow!(
                        "the waterfall collects its spans with its own OTLP receiver; none runs"
                    )
                })?;
                measure(&receiver).await
            }
        }
    }

    fn outcome(&self) -> Outcome {
        let width = (self.client_budget_ms / BAR_MS) as usize;
        let mut rows = Vec::new();
        for case in &self.cases {
            for hop in &case.spans {
                let limit = match (hop.cap_ms, hop.reserve_ms) {
                    (Some(c), _) if hop.cap_bound => format!("cap {c:.0}"),
                    (_, Some(r)) if hop.reserve_bound => format!("reserve {r:.0}"),
                    _ => String::new(),
                };
                let mut outcome = hop.outcome.clone();
                if hop.outlived_parent_deadline {
                    outcome += &format!(" (outlived its deadline by {} ms)", opt(hop.outlived_ms));
                }
                rows.push(vec![
                    case.case.clone(),
                    format!("{}{}", "  ".repeat(hop.depth), hop.service),
                    format!("{:.1}", hop.start_ms),
                    format!("{:.1}", hop.end_ms),
                    opt(hop.budget_on_entry_ms),
                    opt(hop.granted_ms),
                    limit,
                    outcome,
                    bar(hop, width),
                ]);
            }
            for line in &case.ledger {
                rows.push(vec![
                    String::new(),
                    "  ledger".to_owned(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    line.clone(),
                    String::new(),
                ]);
            }
            rows.push(vec![
                String::new(),
                format!("→ client: {} after {} ms", case.status, case.client_ms),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                format!("trace {}", case.trace_id),
                String::new(),
            ]);
        }
        Outcome {
            title: format!(
                "waterfall: one request through the IM chain, traced over OTLP (client budget {} ms; bar: {} ms a column, | the hop's deadline)",
                self.client_budget_ms, BAR_MS
            ),
            json: crate::report::to_json(self),
            columns: vec![
                "case", "span", "start ms", "end ms", "budget on entry", "granted", "limit", "outcome", "0 → 800 ms",
            ],
            rows,
            notes: vec![
                "every hop is a child span with its own id, parented through the traceparent its caller's call span wrote".into(),
                format!("route stalls: route's lookup blocks for {STALL_MS} ms and ignores its scope; route answers at its 200 ms cap, its blocking work runs on and is flagged"),
                "ledger: the lines the client received with the same call's DEADLINE_EXCEEDED, the root's first (experiment ledger runs it many times)".into(),
            ],
        }
    }

    /// A chart per case, each with the ledger its call brought back.
    fn report(&self, _: &Outcome) -> Vec<Part> {
        let mut out = String::from(
            "<p class=\"muted\">One request through the IM chain, traced over OTLP: every hop a span with its own id, parented through the W3C traceparent its caller's call wrote. Bars run from entry to exit; a dark line is the hop's deadline, the dashed red line the client's; caps and reserves are marked; ✕ is where a budget ended. A red bar ran on after its parent's deadline.</p>",
        );
        for case in &self.cases {
            out.push_str(&chart(case, self.client_budget_ms));
            if !case.ledger.is_empty() {
                out.push_str(&format!(
                    "<p class=\"muted\">The ledger the client received with this call's status, the root's line first:</p><pre>{}</pre>",
                    escape(&case.ledger.join("\n"))
                ));
            }
        }
        vec![Part::new(out)]
    }
}
