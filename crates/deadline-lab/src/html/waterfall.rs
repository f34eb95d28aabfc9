//! The waterfall of one traced request: each span a bar from entry to exit
//! on a shared time axis, its deadline a line, the caps and reserves on the
//! way marked, and a cross where a budget ran out.

use std::fmt::Write as _;

use crate::experiments::waterfall::{Case, Hop, Waterfall};

use super::escape;

const W: f64 = 960.0;
const LABEL: f64 = 230.0;
const ROW: f64 = 24.0;
const TOP: f64 = 44.0;

/// The chart name of a case: `waterfall-normal`, `waterfall-route-stalls`.
pub(super) fn chart_name(case: &str) -> String {
    format!("waterfall-{}", case.replace(' ', "-"))
}

/// The chart of one traced call whose client had `budget_ms`.
pub(super) fn chart(case: &Case, budget_ms: f64) -> String {
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
pub(super) const STYLE: &str = r#"
svg[data-kind=waterfall] .bar.hop.ok{fill:#2a9d8f}svg[data-kind=waterfall] .bar.hop.failed{fill:#e9c46a}svg[data-kind=waterfall] .bar.hop.outlived{fill:#e63946}
svg[data-kind=waterfall] .deadline{stroke:#1d2330;stroke-width:2}svg[data-kind=waterfall] .deadline.client{stroke:#b91c1c;stroke-dasharray:4 3}
svg[data-kind=waterfall] .reserve{fill:#8ab17d;opacity:.45}svg[data-kind=waterfall] .mark{font-size:11px;fill:#3a4250}svg[data-kind=waterfall] .mark.end{font-size:14px;fill:#b91c1c}
svg[data-kind=waterfall] .mark.outlived{fill:#b91c1c;font-weight:600}
"#;

/// The section: a chart per case.
pub fn section(waterfall: &Waterfall) -> String {
    let mut out = String::from(
        "<h2>Where the budget went</h2><section><p class=\"muted\">One request through the IM chain, traced over OTLP: every hop a span with its own id, parented through the W3C traceparent its caller's call wrote. Bars run from entry to exit; a dark line is the hop's deadline, the dashed red line the client's; caps and reserves are marked; ✕ is where a budget ended. A red bar ran on after its parent's deadline.</p>",
    );
    for case in &waterfall.cases {
        out.push_str(&chart(case, waterfall.client_budget_ms));
        if !case.ledger.is_empty() {
            out.push_str(&format!(
                "<p class=\"muted\">The ledger the client received with this call's status, the root's line first:</p><pre>{}</pre>",
                crate::html::escape(&case.ledger.join("\n"))
            ));
        }
    }
    out.push_str("</section>");
    out
}
