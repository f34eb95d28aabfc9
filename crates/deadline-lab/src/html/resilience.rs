//! The report's retry and hedging section: the latency CDF with and
//! without hedging, and the retry cases and the storm as charts and tables.

use std::fmt::Write as _;

use super::{escape, plain_table};
use crate::bench::retry_storm::Storm;
use crate::experiments::hedge::HedgeRows;
use crate::experiments::retry::RetryCases;

/// Stroke colours of the CDF's lines, in the order of the bar series.
const STROKES: [&str; 4] = ["#e76f51", "#2a9d8f", "#8ab17d", "#6d597a"];

/// How far up the tail a quantile is: 0 at p0, 1 at p90, 2 at p99, 3 at
/// p99.9, so the tail hedging changes gets as much room as the body.
fn tail_depth(q: f64) -> f64 {
    -(1.0 - q.min(0.999)).log10()
}

/// The latency CDF of every hedging variant: milliseconds on a log scale
/// across, the quantile down the tail (p50, p90, p99, p99.9) upwards.
pub(super) fn cdf_chart(hedge: &HedgeRows) -> String {
    const W: f64 = 760.0;
    const H: f64 = 340.0;
    const LEFT: f64 = 56.0;
    const RIGHT: f64 = 20.0;
    const TOP: f64 = 34.0;
    const BOTTOM: f64 = 84.0;
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let max = hedge
        .rows
        .iter()
        .flat_map(|r| r.cdf_ms.iter().copied().chain([r.p999_ms]))
        .fold(10.0_f64, f64::max);
    let hi = max.log10().ceil().max(1.0);
    let x = |ms: f64| LEFT + ms.max(1.0).log10() / hi * plot_w;
    let y = |q: f64| TOP + (1.0 - tail_depth(q) / 3.0) * plot_h;
    let title = format!(
        "Latency CDF, {} calls, {:.0} % of answers slow: without and with hedging",
        hedge.calls,
        hedge.slow_share * 100.0
    );
    let mut svg = format!(
        r#"<svg class="chart" data-chart="hedge-cdf" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{t}"><text class="title" x="0" y="18">{t}</text>"#,
        t = escape(&title)
    );
    let base = TOP + plot_h;
    let _ = write!(
        svg,
        r#"<line class="axis" x1="{LEFT}" x2="{x2}" y1="{base}" y2="{base}"/><line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{base}"/>"#,
        x2 = W - RIGHT
    );
    let mut decade = 1.0;
    while decade <= 10f64.powf(hi) {
        let _ = write!(
            svg,
            r#"<text class="label" x="{:.1}" y="{}" text-anchor="middle">{} ms</text>"#,
            x(decade),
            base + 16.0,
            decade
        );
        decade *= 10.0;
    }
    for (q, name) in [(0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (0.999, "p99.9")] {
        let _ = write!(
            svg,
            r#"<line class="axis" stroke-dasharray="3 3" x1="{LEFT}" x2="{x2}" y1="{yy:.1}" y2="{yy:.1}"/><text class="label" x="{lx}" y="{ty:.1}" text-anchor="end">{name}</text>"#,
            x2 = W - RIGHT,
            yy = y(q),
            lx = LEFT - 4.0,
            ty = y(q) + 4.0,
        );
    }
    for (i, row) in hedge.rows.iter().enumerate() {
        let n = row.cdf_ms.len().saturating_sub(1).max(1) as f64;
        // The 101 quantiles up to p99, then p99.9 (p100 is off the scale).
        let points: Vec<String> = row
            .cdf_ms
            .iter()
            .enumerate()
            .map(|(k, ms)| (k as f64 / n, *ms))
            .filter(|(q, _)| *q < 0.9995)
            .chain([(0.999, row.p999_ms)])
            .map(|(q, ms)| format!("{:.1},{:.1}", x(ms), y(q)))
            .collect();
        let stroke = STROKES[i % STROKES.len()];
        let _ = write!(
            svg,
            r#"<polyline class="cdf" fill="none" stroke="{stroke}" stroke-width="2.5" points="{}"><title>{}: p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms</title></polyline>"#,
            points.join(" "),
            escape(&row.variant),
            row.p50_ms,
            row.p99_ms,
            row.p999_ms
        );
        let label = format!(
            "{} (p99 {:.0} ms, p99.9 {:.0} ms)",
            row.variant, row.p99_ms, row.p999_ms
        );
        let (lx, ly) = (
            LEFT + 340.0 * (i % 2) as f64,
            H - 42.0 + 20.0 * (i / 2) as f64,
        );
        let _ = write!(
            svg,
            r#"<rect class="bar" style="fill:{stroke}" x="{lx}" y="{ry}" width="12" height="12"/><text class="legend" x="{tx}" y="{ly}">{l}</text>"#,
            ry = ly - 10.0,
            tx = lx + 16.0,
            l = escape(&label)
        );
    }
    svg.push_str("</svg>");
    svg
}

/// Goodput per storm variant as bars, with the 90 % goal marked.
fn storm_chart(storm: &Storm) -> String {
    const W: f64 = 760.0;
    const LABEL: f64 = 170.0;
    const ROW: f64 = 30.0;
    const TOP: f64 = 34.0;
    let plot = W - LABEL - 230.0;
    let max = storm.rows.iter().map(|r| r.goodput).fold(1.0_f64, f64::max);
    let height = TOP + ROW * storm.rows.len() as f64 + 26.0;
    let title = format!(
        "Retry storm: goodput at {:.0} of {:.0} req/s, {:.0} % of calls failing downstream",
        storm.offered_rps,
        storm.capacity_rps,
        storm.failing_share * 100.0
    );
    let mut svg = format!(
        r#"<svg class="chart" data-chart="retry-storm" viewBox="0 0 {W} {height}" width="{W}" height="{height}" role="img" aria-label="{t}"><text class="title" x="0" y="18">{t}</text>"#,
        t = escape(&title)
    );
    for (i, row) in storm.rows.iter().enumerate() {
        let y = TOP + ROW * i as f64;
        let w = (row.goodput.max(0.0) / max * plot).max(1.0);
        let _ = write!(
            svg,
            r#"<text class="label" x="{x}" y="{ty}" text-anchor="end">{label}</text><rect class="bar{s}" x="{LABEL}" y="{y}" width="{w:.1}" height="20" rx="2"><title>{label}: {g:.0} % of capacity</title></rect><text class="value" x="{vx:.1}" y="{ty}">{g:.0} % of capacity, {a:.2} attempts per call</text>"#,
            x = LABEL - 8.0,
            ty = y + 15.0,
            label = escape(&row.variant),
            s = if row.variant.starts_with("naive") {
                " s1"
            } else {
                ""
            },
            g = row.goodput * 100.0,
            a = row.amplification,
            vx = LABEL + w + 6.0,
        );
    }
    let goal = LABEL + 0.9 / max * plot;
    let _ = write!(
        svg,
        r#"<line class="seed" x1="{goal:.1}" x2="{goal:.1}" y1="{TOP}" y2="{y2}"/><text class="legend" x="{LABEL}" y="{ly}">┃ the goal: 90 % of capacity</text></svg>"#,
        y2 = height - 26.0,
        ly = height - 6.0
    );
    svg
}

/// The whole section: CDF, hedge table, storm goodput bars, retry cases.
pub fn section(
    retry: Option<&RetryCases>,
    hedge: Option<&HedgeRows>,
    storm: Option<&Storm>,
) -> String {
    let mut html = String::from("<h2>Retries and hedging inside one deadline</h2><section>");
    if let Some(hedge) = hedge {
        html.push_str(&cdf_chart(hedge));
        let rows: Vec<Vec<String>> = hedge
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.variant.clone(),
                    format!("{:.1}", r.p50_ms),
                    format!("{:.1}", r.p99_ms),
                    format!("{:.1}", r.p999_ms),
                    format!("{:.1} %", r.extra_load * 100.0),
                    format!("{} / {}", r.losers_cancelled_on_server, r.losers),
                    r.after_deadline.to_string(),
                ]
            })
            .collect();
        html.push_str(&plain_table(
            &[
                "variant",
                "p50 ms",
                "p99 ms",
                "p99.9 ms",
                "extra load",
                "losers reset on server",
                "after deadline",
            ],
            &rows,
        ));
    }
    if let Some(storm) = storm {
        html.push_str(&storm_chart(storm));
    }
    if let Some(retry) = retry {
        let rows: Vec<Vec<String>> = retry
            .cases
            .iter()
            .map(|c| {
                let join = |v: &[f64]| {
                    v.iter()
                        .map(|x| format!("{x:.0}"))
                        .collect::<Vec<_>>()
                        .join(" / ")
                };
                vec![
                    c.case.clone(),
                    c.status.clone(),
                    c.attempts.to_string(),
                    join(&c.attempt_starts_ms),
                    join(&c.attempt_budgets_ms),
                    format!("{:.1}", c.client_ms),
                ]
            })
            .collect();
        html.push_str("<h3>retry cases</h3>");
        html.push_str(&plain_table(
            &[
                "case",
                "status",
                "attempts",
                "attempt starts ms",
                "budget on the wire ms",
                "client ms",
            ],
            &rows,
        ));
    }
    html.push_str("</section>");
    html
}
