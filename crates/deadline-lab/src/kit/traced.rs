//! One call traced through a chain, read back from an OTLP receiver as
//! spans: each hop from entry to exit, the budget it had, what it handed on
//! and how it ended; drawn as text bars and as an SVG waterfall.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use opentelemetry::trace::TraceContextExt;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic_deadline::Scope;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::html::chart::escape;
use crate::kit::calls::status_name;
use crate::otlp::{Received, Receiver};
use crate::report::ms;

/// How long route's blocking lookup takes when it stalls: past its 200 ms
/// cap, inside the client's 800 ms.
pub const STALL_MS: u64 = 400;
/// How long to wait for a case's spans to reach the receiver.
const COLLECT_WITHIN: Duration = Duration::from_secs(10);
/// Columns of the printed bar: one per this many milliseconds.
pub const BAR_MS: f64 = 20.0;

/// One traced request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Case {
    /// `normal` or `route stalls`.
    pub case: String,
    /// The W3C trace id (hex) every span of the request carries.
    pub trace_id: String,
    /// The status the client got.
    pub status: String,
    /// When the client got it, in milliseconds from the call.
    pub client_ms: f64,
    /// Every span, parents before children, siblings by start.
    pub spans: Vec<Hop>,
    /// The ledger the client received with its status, the root's line
    /// first (empty when the call succeeded): the same call as the ledger
    /// tells it.
    #[serde(default)]
    pub ledger: Vec<String>,
}

/// One span of the waterfall. Times are milliseconds from the request's
/// first span.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hop {
    /// Who: a service (`gateway`), a call (`gateway → logic`), or work
    /// (`route: blocking work`).
    pub service: String,
    /// `server`, `client` or `internal`.
    pub kind: String,
    /// The span's name (`lab.v1.Route/GetRoute`, `blocking work`).
    pub name: String,
    /// The span id (hex).
    pub span_id: String,
    /// The parent's span id; `None` for the request's root.
    pub parent: Option<String>,
    /// Nesting depth (the root is 0).
    pub depth: usize,
    /// When the span started.
    pub start_ms: f64,
    /// When it ended.
    pub end_ms: f64,
    /// The budget it had on entry: a server's after its own default and
    /// maximum, a call's what its caller's scope had left; `None`: no
    /// deadline.
    pub budget_on_entry_ms: Option<f64>,
    /// What a call wrote in `grpc-timeout`.
    pub granted_ms: Option<f64>,
    /// The cap above a call ([`Scope::with_timeout`] tighter than its parent), if any.
    pub cap_ms: Option<f64>,
    /// Whether that cap set the call's deadline.
    pub cap_bound: bool,
    /// The reserve kept back above a call ([`Scope::reserve`]), if any.
    pub reserve_ms: Option<f64>,
    /// Whether that reserve set the call's deadline.
    pub reserve_bound: bool,
    /// Where this span's deadline fell (start + budget on entry).
    pub deadline_ms: Option<f64>,
    /// The gRPC status (`OK`, `DEADLINE_EXCEEDED`, …), or for work `OK` /
    /// `RAN ON`.
    pub outcome: String,
    /// Why a server's scope ended.
    pub cause: Option<String>,
    /// The span ended after its scope (its parent's deadline) had ended.
    pub outlived_parent_deadline: bool,
    /// By how much it outlived that deadline.
    pub outlived_ms: Option<f64>,
}

/// The IM service a gRPC service name belongs to.
fn im_service(rpc_service: &str) -> &str {
    match rpc_service.rsplit('.').next().unwrap_or(rpc_service) {
        "Gateway" => "gateway",
        "Logic" => "logic",
        "Route" => "route",
        "Pusher" => "push",
        other => other,
    }
}

fn kind(span: &Received) -> &'static str {
    // OTLP's SpanKind: 2 server, 3 client.
    match span.span.kind {
        2 => "server",
        3 => "client",
        _ => "internal",
    }
}

/// The spans of one trace as a waterfall: parents before children.
pub fn hops(spans: &[Received]) -> Vec<Hop> {
    let t0 = spans
        .iter()
        .map(|s| s.span.start_time_unix_nano)
        .min()
        .unwrap_or(0);
    let at = |nanos: u64| (nanos.saturating_sub(t0) as f64 / 1e5).round() / 10.0;
    let by_id: HashMap<String, &Received> = spans.iter().map(|s| (s.span_id(), s)).collect();
    let server_of = |span: &Received| -> Option<String> {
        // The nearest server span at or above `span`: whose work it is.
        let mut node = Some(span);
        while let Some(s) = node {
            if kind(s) == "server" {
                return s.text("rpc.service").map(|r| im_service(r).to_owned());
            }
            node = s.parent().and_then(|p| by_id.get(&p).copied());
        }
        None
    };
    let label = |span: &Received| -> String {
        let caller = || {
            span.parent()
                .and_then(|p| by_id.get(&p).copied())
                .and_then(server_of)
                .unwrap_or_else(|| "client".to_owned())
        };
        match kind(span) {
            "server" => server_of(span).unwrap_or_default(),
            "client" => format!(
                "{} → {}",
                caller(),
                im_service(span.text("rpc.service").unwrap_or_default())
            ),
            _ if span.span.name == "blocking work" => format!("{}: blocking work", caller()),
            _ => "client".to_owned(),
        }
    };
    // Depth-first from the roots (spans whose parent is not in the trace).
    let mut children: HashMap<Option<String>, Vec<&Received>> = HashMap::new();
    for span in spans {
        let parent = span.parent().filter(|p| by_id.contains_key(p));
        children.entry(parent).or_default().push(span);
    }
    for list in children.values_mut() {
        list.sort_by_key(|s| s.span.start_time_unix_nano);
    }
    let mut out = Vec::new();
    let mut stack: Vec<(&Received, usize)> = children
        .get(&None)
        .map(|roots| roots.iter().rev().map(|s| (*s, 0)).collect())
        .unwrap_or_default();
    while let Some((span, depth)) = stack.pop() {
        let start_ms = at(span.span.start_time_unix_nano);
        let budget = span
            .number("budget_on_entry_ms")
            .or_else(|| span.number("scope_remaining_ms"));
        let outlived = span.flag("outlived_parent_deadline").unwrap_or(false);
        let outcome = match span.text("outcome") {
            Some(outcome) => outcome.to_owned(),
            None if span.span.name == "blocking work" && outlived => "RAN ON".to_owned(),
            None if kind(span) == "server" => "(none)".to_owned(),
            None => "OK".to_owned(),
        };
        out.push(Hop {
            service: label(span),
            kind: kind(span).to_owned(),
            name: span.span.name.clone(),
            span_id: span.span_id(),
            parent: span.parent(),
            depth,
            start_ms,
            end_ms: at(span.span.end_time_unix_nano),
            budget_on_entry_ms: budget,
            granted_ms: span.number("granted_ms"),
            cap_ms: span.number("cap_ms"),
            cap_bound: span.flag("cap_bound").unwrap_or(false),
            reserve_ms: span.number("reserve_ms"),
            reserve_bound: span.flag("reserve_bound").unwrap_or(false),
            deadline_ms: budget.map(|b| ((start_ms + b) * 10.0).round() / 10.0),
            outcome,
            cause: span.text("cause").map(str::to_owned),
            outlived_parent_deadline: outlived,
            outlived_ms: span.number("outlived_ms"),
        });
        if let Some(kids) = children.get(&Some(span.span_id())) {
            stack.extend(kids.iter().rev().map(|s| (*s, depth + 1)));
        }
    }
    out
}

/// Makes `call` under a root span and a scope of `budget`, and reads its
/// trace back from `receiver` (at least `want` spans): the case `name`,
/// with the status the call ended with and the ledger it carried.
///
/// # Errors
///
/// When spans are not exported, or fewer than `want` arrive.
pub async fn traced<T>(
    receiver: &Receiver,
    name: &str,
    budget: Duration,
    want: usize,
    call: impl Future<Output = Result<T, tonic::Status>>,
) -> anyhow::Result<Case> {
    let root = tracing::info_span!(
        target: "deadline_lab",
        "request",
        case = name,
        budget_on_entry_ms = budget.as_secs_f64() * 1000.0,
    );
    let trace_id = root.context().span().span_context().trace_id();
    if trace_id == opentelemetry::trace::TraceId::INVALID {
        anyhow::bail!("spans are not exported: install crate::otlp::Telemetry first");
    }
    let trace_id = trace_id.to_string();
    let t = Instant::now();
    let result = Scope::background()
        .with_timeout(budget)
        .enter(call)
        .instrument(root)
        .await;
    let client_ms = ms(t.elapsed());
    let spans = receiver
        .trace(&trace_id, COLLECT_WITHIN, |s| s.len() >= want)
        .await;
    anyhow::ensure!(
        spans.len() >= want,
        "{name}: {} of {want} spans reached the receiver at {}",
        spans.len(),
        receiver.url()
    );
    let status = status_name(&result).to_owned();
    let ledger = result
        .as_ref()
        .err()
        .map(tonic_deadline::ledger::Ledger::lines)
        .unwrap_or_default();
    let mut spans = hops(&spans);
    // The request's root is the client itself: it ended with the answer.
    for hop in spans.iter_mut().filter(|h| h.parent.is_none()) {
        hop.outcome.clone_from(&status);
    }
    Ok(Case {
        case: name.to_owned(),
        trace_id,
        status,
        client_ms,
        spans,
        ledger,
    })
}

/// A text bar: `█` from start to end, `|` at the deadline, one column per
/// `BAR_MS`.
pub fn bar(hop: &Hop, width: usize) -> String {
    let col = |ms: f64| ((ms / BAR_MS).round().max(0.0) as usize).min(width);
    let (from, to) = (
        col(hop.start_ms),
        col(hop.end_ms).max(col(hop.start_ms) + 1),
    );
    let deadline = hop.deadline_ms.map(col);
    (0..=width)
        .map(|i| {
            if Some(i) == deadline {
                '|'
            } else if i >= from && i < to {
                '█'
            } else {
                ' '
            }
        })
        .collect::<String>()
        .trim_end()
        .to_owned()
}

// The chart's width, its label column, a row's height and its top margin.
const W: f64 = 960.0;
const LABEL: f64 = 230.0;
const ROW: f64 = 24.0;
const TOP: f64 = 44.0;

/// The chart name of a case: `waterfall-normal`, `waterfall-route-stalls`.
fn chart_name(case: &str) -> String {
    format!("waterfall-{}", case.replace(' ', "-"))
}

/// The chart of one traced call whose client had `budget_ms`: each span a
/// bar from entry to exit on a shared time axis, its deadline a line, the
/// caps and reserves on the way marked, and a cross where a budget ran out.
pub fn chart(case: &Case, budget_ms: f64) -> String {
    let span_ms = case
        .spans
        .iter()
        .map(|h| h.end_ms)
        .fold(budget_ms, f64::max)
        .max(1.0);
    let x = |ms: f64| LABEL + (ms.max(0.0) / span_ms) * (W - LABEL - 20.0);
    let height = TOP + ROW * case.spans.len() as f64 + 30.0;
    let title = format!(
        "{}: {} after {} ms (trace {})",
        case.case, case.status, case.client_ms, case.trace_id
    );
    let mut svg = format!(
        r#"<svg class="chart" data-kind="waterfall" data-chart="{name}" viewBox="0 0 {W} {height}" width="{W}" height="{height}" role="img" aria-label="{t}"><text class="title" x="0" y="18">{t}</text>"#,
        name = chart_name(&case.case),
        t = escape(&title),
    );
    // The time axis, and the client's deadline across every row.
    let bottom = TOP + ROW * case.spans.len() as f64;
    let _ = write!(
        svg,
        r#"<line class="axis" x1="{l}" y1="{bottom}" x2="{r}" y2="{bottom}"/>"#,
        l = x(0.0),
        r = x(span_ms),
    );
    let mut tick = 0.0;
    while tick <= span_ms {
        let _ = write!(
            svg,
            r#"<text class="label" x="{tx}" y="{ty}" text-anchor="middle">{tick:.0}</text>"#,
            tx = x(tick),
            ty = bottom + 16.0,
        );
        tick += 100.0;
    }
    let _ = write!(
        svg,
        r#"<line class="deadline client" x1="{dx}" y1="{y1}" x2="{dx}" y2="{bottom}"><title>the client's deadline: {budget_ms} ms</title></line><text class="legend" x="{dx}" y="{ly}" text-anchor="end">client deadline {budget_ms:.0} ms</text>"#,
        dx = x(budget_ms),
        y1 = TOP - 10.0,
        ly = TOP - 14.0,
    );
    for (row, hop) in case.spans.iter().enumerate() {
        svg.push_str(&hop_row(hop, TOP + ROW * row as f64, &x));
    }
    svg.push_str("</svg>");
    svg
}

fn hop_row(hop: &Hop, y: f64, x: &dyn Fn(f64) -> f64) -> String {
    let mut g = String::new();
    let kind = if hop.outlived_parent_deadline {
        "outlived"
    } else if hop.outcome == "OK" {
        "ok"
    } else {
        "failed"
    };
    let _ = write!(
        g,
        r#"<text class="label" x="{lx}" y="{ty}">{label}</text>"#,
        lx = 4.0 + 12.0 * hop.depth as f64,
        ty = y + 15.0,
        label = escape(&hop.service),
    );
    let (x0, x1) = (x(hop.start_ms), x(hop.end_ms).max(x(hop.start_ms) + 2.0));
    let _ = write!(
        g,
        r#"<rect class="bar hop {kind}" data-service="{s}" x="{x0:.1}" y="{by}" width="{w:.1}" height="{h}"><title>{s}: {start:.1} → {end:.1} ms, {outcome}</title></rect>"#,
        s = escape(&hop.service),
        by = y + 4.0,
        w = x1 - x0,
        h = ROW - 8.0,
        start = hop.start_ms,
        end = hop.end_ms,
        outcome = escape(&hop.outcome),
    );
    if let Some(deadline) = hop.deadline_ms {
        let _ = write!(
            g,
            r#"<line class="deadline" x1="{dx:.1}" y1="{y}" x2="{dx:.1}" y2="{y2}"><title>{s}'s deadline: {deadline:.1} ms</title></line>"#,
            dx = x(deadline),
            y2 = y + ROW,
            s = escape(&hop.service),
        );
    }
    if let Some(cap) = hop.cap_ms.filter(|_| hop.cap_bound) {
        let _ = write!(
            g,
            r#"<text class="mark cap" x="{cx:.1}" y="{cy}" text-anchor="middle">cap {cap:.0}</text>"#,
            cx = x(hop.start_ms + cap),
            cy = y + 2.0,
        );
    }
    if let (Some(reserve), Some(deadline)) = (
        hop.reserve_ms.filter(|_| hop.reserve_bound),
        hop.deadline_ms,
    ) {
        // What the caller kept back: after this call's deadline, up to its own.
        let _ = write!(
            g,
            r#"<rect class="reserve" x="{rx:.1}" y="{ry}" width="{rw:.1}" height="{rh}"><title>reserve {reserve:.0} ms kept by the caller</title></rect><text class="mark reserve" x="{tx:.1}" y="{ty}">reserve {reserve:.0}</text>"#,
            rx = x(deadline),
            ry = y + 4.0,
            rw = x(deadline + reserve) - x(deadline),
            rh = ROW - 8.0,
            tx = x(deadline + reserve) + 3.0,
            ty = y + 15.0,
        );
    }
    if hop.outcome == "DEADLINE_EXCEEDED" || hop.outlived_parent_deadline {
        // Where the budget ended (or, for work that ran on, where it stopped).
        let _ = write!(
            g,
            r#"<text class="mark end" x="{ex:.1}" y="{ey}" text-anchor="middle">✕</text>"#,
            ex = x1,
            ey = y + 16.0,
        );
    }
    if hop.outlived_parent_deadline {
        let _ = write!(
            g,
            r#"<text class="mark outlived" x="{tx:.1}" y="{ty}">ran on {by} ms past its deadline</text>"#,
            tx = x1 + 10.0,
            ty = y + 15.0,
            by = hop
                .outlived_ms
                .map_or_else(|| "?".to_owned(), |v| format!("{v:.0}")),
        );
    }
    g
}

/// The styles of the waterfall charts.
pub const STYLE: &str = r#"
svg[data-kind=waterfall] .bar.hop.ok{fill:#2a9d8f}svg[data-kind=waterfall] .bar.hop.failed{fill:#e9c46a}svg[data-kind=waterfall] .bar.hop.outlived{fill:#e63946}
svg[data-kind=waterfall] .deadline{stroke:#1d2330;stroke-width:2}svg[data-kind=waterfall] .deadline.client{stroke:#b91c1c;stroke-dasharray:4 3}
svg[data-kind=waterfall] .reserve{fill:#8ab17d;opacity:.45}svg[data-kind=waterfall] .mark{font-size:11px;fill:#3a4250}svg[data-kind=waterfall] .mark.end{font-size:14px;fill:#b91c1c}
svg[data-kind=waterfall] .mark.outlived{fill:#b91c1c;font-weight:600}
"#;
