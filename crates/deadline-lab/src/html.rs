//! The demo's report: one self-contained HTML file (inline CSS, inline SVG
//! charts, no external resources) built from the experiments' results, each
//! read back from its JSON into the experiment's own result type.
//!
//! Every chart is an `<svg class="chart">`. A few lines of inline script
//! stamp each chart, once laid out, with its rendered size
//! (`data-rendered="W×H"`) and the number of bars drawn, so a headless
//! browser's DOM dump shows that the charts really rendered.

pub mod resilience;
pub mod waterfall;

use std::fmt::Write as _;

use serde_json::Value;

use crate::bench::overload::Overload;
use crate::bench::soak::Soak;
use crate::experiments::amplification::{self, Amplification};
use crate::experiments::chain::Chain;
use crate::experiments::drift::Drift;
use crate::experiments::expired::Expired;
use crate::experiments::faults::Faults;
use crate::experiments::handler::Handler;
use crate::experiments::hosts::Hosts;
use crate::experiments::im::{self, Im};
use crate::experiments::jobs::JobsRun;
use crate::experiments::metastable::{self, Metastable};
use crate::experiments::propagation::Propagation;
use crate::experiments::proxy::Proxy;
use crate::experiments::rapid_reset::RapidReset;
use crate::experiments::shop::Shop;
use crate::report::Outcome;

/// One finished step of the demo.
#[derive(Debug)]
pub struct Step {
    /// The step's name (`chain`, `drift`, `bench overhead`, …).
    pub name: String,
    /// Its result, or why it failed.
    pub outcome: Result<Outcome, String>,
    /// Seconds it took.
    pub seconds: f64,
}

impl Step {
    fn json(&self) -> Option<&Value> {
        self.outcome.as_ref().ok().map(|o| &o.json)
    }
}

/// A step the demo did not run: an optional tool it needs is missing.
#[derive(Debug, Clone)]
pub struct Skipped {
    /// The step's name.
    pub name: String,
    /// What it needs and how to get it (`needs nginx: apt-get install nginx`).
    pub needs: String,
}

/// A step of the report's list of tables: run (done or failed) or skipped.
#[derive(Debug, Clone, Copy)]
enum Listed<'a> {
    Ran(&'a Step),
    Skipped(&'a Skipped),
}

impl Listed<'_> {
    fn name(&self) -> &str {
        match self {
            Listed::Ran(step) => &step.name,
            Listed::Skipped(skipped) => &skipped.name,
        }
    }
}

/// The steps that ran and those skipped, in the demo's order (steps the
/// registry does not know keep their order, after the others).
fn in_demo_order<'a>(steps: &'a [Step], skipped: &'a [Skipped]) -> Vec<Listed<'a>> {
    let mut listed: Vec<Listed<'a>> = steps
        .iter()
        .map(Listed::Ran)
        .chain(skipped.iter().map(Listed::Skipped))
        .collect();
    let position = |name: &str| {
        crate::registry::entries()
            .position(|e| e.step() == name)
            .unwrap_or(usize::MAX)
    };
    listed.sort_by_key(|l| position(l.name()));
    listed
}

/// What the step measures, as the registry says, if it knows the step.
fn about(step: &str) -> String {
    crate::registry::by_step(step).map_or_else(String::new, |e| {
        format!("<p class=\"muted\">{}</p>", escape(e.about))
    })
}

/// A line for each of `names` that was skipped.
fn skipped_notes(skipped: &[Skipped], names: &[&str]) -> String {
    skipped
        .iter()
        .filter(|s| names.contains(&s.name.as_str()))
        .map(|s| {
            format!(
                "<p class=\"skipped\">{}: skipped ({})</p>",
                escape(&s.name),
                escape(&s.needs)
            )
        })
        .collect()
}

/// Escapes text for HTML.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// One bar: a label, our value, the seed's value if it gives one.
#[derive(Debug, Clone)]
pub struct Bar {
    /// Shown left of the bar.
    pub label: String,
    /// Our measurement.
    pub value: f64,
    /// The seed's figure, drawn as a tick.
    pub seed: Option<f64>,
    /// Shown right of the value.
    pub note: String,
}

impl Bar {
    /// A bar of `value`, with the seed's figure as a tick when there is one.
    pub fn new(label: impl Into<String>, value: f64, seed: Option<f64>) -> Self {
        Self {
            label: label.into(),
            value,
            seed,
            note: String::new(),
        }
    }

    fn note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }
}

fn fmt_ms(v: f64) -> String {
    if v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A horizontal bar chart; the seed's figure is a dark tick on each bar.
pub fn hbars(name: &str, title: &str, unit: &str, bars: &[Bar]) -> String {
    const W: f64 = 760.0;
    const LABEL: f64 = 210.0;
    const ROW: f64 = 30.0;
    const TOP: f64 = 34.0;
    let plot = W - LABEL - 250.0;
    let max = bars
        .iter()
        .flat_map(|b| [b.value, b.seed.unwrap_or(0.0)])
        .fold(1.0_f64, f64::max);
    let height = TOP + ROW * bars.len() as f64 + 26.0;
    let mut svg = format!(
        r#"<svg class="chart" data-chart="{name}" viewBox="0 0 {W} {height}" width="{W}" height="{height}" role="img" aria-label="{t}">"#,
        t = escape(title)
    );
    let _ = write!(
        svg,
        r#"<text class="title" x="0" y="18">{}</text>"#,
        escape(title)
    );
    for (i, bar) in bars.iter().enumerate() {
        let y = TOP + ROW * i as f64;
        let w = (bar.value.max(0.0) / max * plot).max(1.0);
        let _ = write!(
            svg,
            r#"<text class="label" x="{x}" y="{ty}" text-anchor="end">{label}</text><rect class="bar" x="{LABEL}" y="{y}" width="{w:.1}" height="20" rx="2"><title>{label}: {v} {unit}</title></rect><text class="value" x="{vx:.1}" y="{ty}">{v} {unit}{note}</text>"#,
            x = LABEL - 8.0,
            ty = y + 15.0,
            label = escape(&bar.label),
            v = fmt_ms(bar.value),
            vx = LABEL + w + 6.0,
            note = if bar.note.is_empty() {
                String::new()
            } else {
                format!("  {}", escape(&bar.note))
            },
        );
        if let Some(seed) = bar.seed {
            let sx = LABEL + seed.max(0.0) / max * plot;
            let _ = write!(
                svg,
                r#"<line class="seed" x1="{sx:.1}" x2="{sx:.1}" y1="{y1}" y2="{y2}"><title>seed: {s} {unit}</title></line>"#,
                y1 = y - 3.0,
                y2 = y + 23.0,
                s = fmt_ms(seed),
            );
        }
    }
    let _ = write!(
        svg,
        r#"<text class="legend" x="{LABEL}" y="{ly}"><tspan class="k-ours">■</tspan> ours   <tspan class="k-seed">┃</tspan> the seed's figure</text></svg>"#,
        ly = height - 6.0
    );
    svg
}

/// One group of a grouped chart: its label and, per series, our value and
/// the seed's (if any).
pub type Group = (String, Vec<(f64, Option<f64>)>);

/// Vertical grouped bars: for each group, one bar per series; seed ticks.
pub fn grouped(name: &str, title: &str, unit: &str, series: &[&str], groups: &[Group]) -> String {
    const W: f64 = 760.0;
    const H: f64 = 300.0;
    const LEFT: f64 = 50.0;
    const TOP: f64 = 34.0;
    const BOTTOM: f64 = 60.0;
    let plot_h = H - TOP - BOTTOM;
    let max = groups
        .iter()
        .flat_map(|(_, v)| v.iter().flat_map(|(a, b)| [*a, b.unwrap_or(0.0)]))
        .fold(1.0_f64, f64::max);
    let group_w = (W - LEFT - 10.0) / groups.len().max(1) as f64;
    let bar_w = (group_w * 0.7 / series.len().max(1) as f64).min(70.0);
    let mut svg = format!(
        r#"<svg class="chart" data-chart="{name}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{t}"><text class="title" x="0" y="18">{t}</text>"#,
        t = escape(title)
    );
    let base = TOP + plot_h;
    let _ = write!(
        svg,
        r#"<line class="axis" x1="{LEFT}" x2="{W}" y1="{base}" y2="{base}"/><text class="label" x="{lx}" y="{ty}" text-anchor="end">{m}</text><text class="label" x="{lx}" y="{base}" text-anchor="end">0</text>"#,
        lx = LEFT - 6.0,
        ty = TOP + 10.0,
        m = fmt_ms(max),
    );
    for (g, (label, values)) in groups.iter().enumerate() {
        let gx = LEFT + group_w * g as f64 + group_w * 0.15;
        for (s, (value, seed)) in values.iter().enumerate() {
            let x = gx + bar_w * s as f64;
            let h = (value.max(0.0) / max * plot_h).max(1.0);
            let _ = write!(
                svg,
                r#"<rect class="bar s{s}" x="{x:.1}" y="{y:.1}" width="{bw:.1}" height="{h:.1}"><title>{label} {series}: {v} {unit}</title></rect><text class="value" x="{cx:.1}" y="{vy:.1}" text-anchor="middle">{v}</text>"#,
                y = base - h,
                bw = bar_w - 4.0,
                label = escape(label),
                series = escape(series.get(s).copied().unwrap_or("")),
                v = fmt_ms(*value),
                cx = x + (bar_w - 4.0) / 2.0,
                vy = base - h - 4.0,
            );
            if let Some(seed) = seed {
                let sy = base - seed.max(0.0) / max * plot_h;
                let _ = write!(
                    svg,
                    r#"<line class="seed" x1="{x1:.1}" x2="{x2:.1}" y1="{sy:.1}" y2="{sy:.1}"><title>seed: {sv} {unit}</title></line>"#,
                    x1 = x - 2.0,
                    x2 = x + bar_w - 2.0,
                    sv = fmt_ms(*seed),
                );
            }
        }
        let _ = write!(
            svg,
            r#"<text class="label" x="{x:.1}" y="{y}" text-anchor="middle">{l}</text>"#,
            x = gx + bar_w * values.len() as f64 / 2.0,
            y = base + 18.0,
            l = escape(label)
        );
    }
    let mut lx = LEFT;
    for (s, name) in series.iter().enumerate() {
        let _ = write!(
            svg,
            r#"<rect class="bar s{s}" x="{lx}" y="{y}" width="12" height="12"/><text class="legend" x="{tx}" y="{ty}">{n}</text>"#,
            y = H - 22.0,
            tx = lx + 16.0,
            ty = H - 12.0,
            n = escape(name)
        );
        lx += 30.0 + 8.0 * name.chars().count() as f64;
    }
    if groups
        .iter()
        .any(|(_, v)| v.iter().any(|(_, seed)| seed.is_some()))
    {
        let _ = write!(
            svg,
            r#"<line class="seed" x1="{lx}" x2="{x2}" y1="{y}" y2="{y}"/><text class="legend" x="{tx}" y="{ty}">the seed's figure</text>"#,
            x2 = lx + 14.0,
            y = H - 16.0,
            tx = lx + 18.0,
            ty = H - 12.0,
        );
    }
    svg.push_str("</svg>");
    svg
}

/// One line of a line chart: its name and one value per x position.
pub type Series = (String, Vec<f64>);

/// A line chart over categorical x positions (evenly spaced, labelled
/// `xs`), one line with a point per value for each series; `goals` are
/// (x index, value) pairs drawn as dark ticks, like the seed's figures.
pub fn lines(
    name: &str,
    title: &str,
    y_unit: &str,
    xs: &[String],
    series: &[Series],
    goals: &[(usize, f64)],
) -> String {
    const W: f64 = 760.0;
    const H: f64 = 320.0;
    const LEFT: f64 = 50.0;
    const RIGHT: f64 = 200.0;
    const TOP: f64 = 34.0;
    const BOTTOM: f64 = 44.0;
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .chain(goals.iter().map(|(_, g)| *g))
        .fold(1.0_f64, f64::max);
    let x = |i: usize| {
        if xs.len() < 2 {
            LEFT + plot_w / 2.0
        } else {
            LEFT + 20.0 + (plot_w - 40.0) * i as f64 / (xs.len() - 1) as f64
        }
    };
    let y = |v: f64| TOP + plot_h - v.max(0.0) / max * plot_h;
    let base = TOP + plot_h;
    let mut svg = format!(
        r#"<svg class="chart" data-chart="{name}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{t}"><text class="title" x="0" y="18">{t}</text>"#,
        t = escape(title)
    );
    for step in 0..=4 {
        let v = max * f64::from(step) / 4.0;
        let _ = write!(
            svg,
            r#"<line class="grid" x1="{LEFT}" x2="{x2}" y1="{gy:.1}" y2="{gy:.1}"/><text class="label" x="{lx}" y="{ty:.1}" text-anchor="end">{v:.2}</text>"#,
            x2 = LEFT + plot_w,
            gy = y(v),
            lx = LEFT - 6.0,
            ty = y(v) + 4.0,
        );
    }
    let _ = write!(
        svg,
        r#"<line class="axis" x1="{LEFT}" x2="{x2}" y1="{base}" y2="{base}"/>"#,
        x2 = LEFT + plot_w
    );
    for (i, label) in xs.iter().enumerate() {
        let _ = write!(
            svg,
            r#"<text class="label" x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            x(i),
            base + 18.0,
            escape(label)
        );
    }
    for &(i, goal) in goals {
        let _ = write!(
            svg,
            r#"<line class="seed" x1="{x1:.1}" x2="{x2:.1}" y1="{gy:.1}" y2="{gy:.1}"><title>goal at {l}: {goal} {y_unit}</title></line>"#,
            x1 = x(i) - 12.0,
            x2 = x(i) + 12.0,
            gy = y(goal),
            l = escape(xs.get(i).map_or("", String::as_str)),
        );
    }
    for (s, (label, values)) in series.iter().enumerate() {
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v)))
            .collect();
        let _ = write!(
            svg,
            r#"<polyline class="line s{s}" points="{}"><title>{}</title></polyline>"#,
            points.join(" "),
            escape(label)
        );
        for (i, v) in values.iter().enumerate() {
            let _ = write!(
                svg,
                r#"<circle class="point s{s}" cx="{:.1}" cy="{:.1}" r="4"><title>{} at {}: {v:.3} {y_unit}</title></circle>"#,
                x(i),
                y(*v),
                escape(label),
                escape(xs.get(i).map_or("", String::as_str)),
            );
        }
        let ly = TOP + 10.0 + 22.0 * s as f64;
        let _ = write!(
            svg,
            r#"<line class="line s{s}" x1="{lx}" x2="{lx2}" y1="{ly}" y2="{ly}"/><text class="legend" x="{tx}" y="{ty}">{}</text>"#,
            escape(label),
            lx = W - RIGHT + 16.0,
            lx2 = W - RIGHT + 40.0,
            tx = W - RIGHT + 46.0,
            ty = ly + 4.0,
        );
    }
    if !goals.is_empty() {
        let ly = TOP + 10.0 + 22.0 * series.len() as f64;
        let _ = write!(
            svg,
            r#"<line class="seed" x1="{lx}" x2="{lx2}" y1="{ly}" y2="{ly}"/><text class="legend" x="{tx}" y="{ty}">goal for ours</text>"#,
            lx = W - RIGHT + 16.0,
            lx2 = W - RIGHT + 40.0,
            tx = W - RIGHT + 46.0,
            ty = ly + 4.0,
        );
    }
    svg.push_str("</svg>");
    svg
}

/// `bench overload`: goodput over offered load, one line per variant, with
/// the goals (0.90 at 2×, 0.80 at 4×) as ticks.
fn overload_plot(o: &Overload) -> String {
    let xs: Vec<String> = o
        .rows
        .iter()
        .map(|r| format!("{}× ({:.0} req/s)", r.offered_x, r.offered_rps))
        .collect();
    let series: Vec<Series> = Overload::VARIANTS
        .iter()
        .enumerate()
        .map(|(v, name)| {
            (
                (*name).to_owned(),
                o.rows.iter().map(|r| r.goodputs()[v]).collect(),
            )
        })
        .collect();
    let goals: Vec<(usize, f64)> = o
        .rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match r.offered_x {
            2 => Some((i, 0.90)),
            4 => Some((i, 0.80)),
            _ => None,
        })
        .collect();
    let mut html = lines(
        "overload",
        &format!(
            "Goodput (OK before the {} ms deadline ÷ capacity) over offered load; capacity {:.0} req/s",
            o.deadline_ms, o.capacity_rps
        ),
        "of capacity",
        &xs,
        &series,
        &goals,
    );
    let _ = write!(
        html,
        r#"<p class="note">a pool of {} connections × {} ms queries; {} s open-loop windows per variant and load</p>"#,
        o.connections, o.query_ms, o.window_s
    );
    html
}

/// `experiment amplification`: attempts that reached the failing leaf per
/// call made at the root, every case and stack.
fn amplification_chart(a: &Amplification) -> String {
    let groups: Vec<Group> = amplification::CASES
        .iter()
        .map(|case| {
            let values = amplification::STACKS
                .iter()
                .map(|stack| {
                    let at_leaf = a
                        .row(case, stack)
                        .map_or(0.0, |r| r.attempts_at_leaf_per_root);
                    ((at_leaf * 100.0).round() / 100.0, None)
                })
                .collect();
            ((*case).to_owned(), values)
        })
        .collect();
    grouped(
        "amplification",
        "Attempts at the failing leaf per call at the root: client → A → B → C, maxAttempts 3 on each",
        "attempts",
        &amplification::STACKS,
        &groups,
    )
}

/// `experiment metastable`: goodput second by second through the trigger,
/// one chart per trigger, plain and ours, beside the load offered.
fn metastable_plots(m: &Metastable) -> String {
    let [before, during, _] = m.timeline_s;
    let mut html = String::new();
    for trigger in metastable::TRIGGERS {
        let rows: Vec<&metastable::Row> = metastable::STACKS
            .iter()
            .filter_map(|stack| m.row(stack, trigger))
            .collect();
        let Some(seconds) = rows.iter().map(|r| r.goodput.len()).max() else {
            continue;
        };
        // Each figure is the second that starts at its label.
        let xs: Vec<String> = (0..seconds).map(|s| format!("{s} s")).collect();
        let mut series: Vec<Series> = rows
            .iter()
            .map(|r| (r.stack.clone(), r.goodput.clone()))
            .collect();
        if let Some(first) = rows.first() {
            series.push((
                "offered".to_owned(),
                first.offered.iter().map(|o| o / m.capacity_rps).collect(),
            ));
        }
        let what = if trigger == "capacity" {
            "capacity cut to 20 %"
        } else {
            "twice the load"
        };
        html.push_str(&lines(
            &format!("metastable-{trigger}"),
            &format!(
                "Goodput ÷ capacity, each second from its start: {what} from {before:.1} s to {:.1} s",
                before + during
            ),
            "of capacity",
            &xs,
            &series,
            &[],
        ));
    }
    html
}

/// `experiment ledger`: per stall case, how often the ledger reached the
/// root and named the stalled hop, one ledger as the root received it, and
/// one call traced: its waterfall beside the ledger it brought back.
fn ledger_section(result: &crate::experiments::ledger::LedgerResult) -> String {
    let mut html = String::from(
        "<h2>Where the budget went: the ledger</h2><section><p class=\"muted\">The ledger a root caller receives with a DEADLINE_EXCEEDED: every hop's line, the root's first. For each case one more call is traced over OTLP; its waterfall is drawn from the spans every hop exported, and under it is the ledger the same call brought back.</p>",
    );
    let mut outcome = crate::registry::Experiment::outcome(result);
    // The first note explains the columns; the rest print the examples and
    // traced calls as text, drawn here instead.
    outcome.notes.truncate(1);
    html.push_str(&table(&outcome));
    for row in &result.rows {
        html.push_str(&format!(
            "<h3>{}</h3><pre>{}\n{}</pre>",
            escape(&row.case),
            escape(&row.example),
            escape(&row.example_lines.join("\n"))
        ));
        if let Some(case) = &row.traced {
            let budget_ms = case
                .spans
                .first()
                .and_then(|h| h.budget_on_entry_ms)
                .unwrap_or(case.client_ms);
            html.push_str(&waterfall::chart(case, budget_ms));
            html.push_str(&format!(
                "<p class=\"muted\">The ledger this traced call brought back:</p><pre>{}</pre>",
                escape(&case.ledger.join("\n"))
            ));
        }
    }
    html.push_str("</section>");
    html
}

fn table(outcome: &Outcome) -> String {
    let mut html = String::from("<table><thead><tr>");
    for c in &outcome.columns {
        let _ = write!(html, "<th>{}</th>", escape(c));
    }
    html.push_str("</tr></thead><tbody>");
    for row in &outcome.rows {
        html.push_str("<tr>");
        for cell in row {
            let _ = write!(html, "<td>{}</td>", escape(cell));
        }
        html.push_str("</tr>");
    }
    html.push_str("</tbody></table>");
    for note in &outcome.notes {
        let _ = write!(html, r#"<p class="note">{}</p>"#, escape(note));
    }
    html
}

fn find<'a>(steps: &'a [Step], name: &str) -> Option<&'a Value> {
    steps.iter().find(|s| s.name == name).and_then(Step::json)
}

fn chain_chart(chain: &Chain) -> String {
    const SEED: [f64; 3] = [999.9, 899.2, 798.6];
    let bars: Vec<Bar> = chain
        .hops
        .iter()
        .zip(SEED)
        .map(|(h, seed)| {
            Bar::new(&h.service, h.remaining_ms, Some(seed))
                .note(format!("grpc-timeout {}", h.header))
        })
        .collect();
    hbars(
        "chain",
        "Chain A → B → C: remaining budget on entry (1 s client budget, 100 ms per hop)",
        "ms",
        &bars,
    )
}

fn im_bars(case: &im::Case) -> Vec<Bar> {
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

fn drift_chart(drift: &Drift) -> String {
    const SEED: [(f64, f64); 3] = [(999.0, 999.0), (999.0, 798.0), (999.0, 598.0)];
    let groups: Vec<Group> = drift
        .rows
        .iter()
        .zip(SEED)
        .map(|(r, (ss, sc))| {
            (
                format!("{} ms delay", r.delay_ms),
                vec![
                    (r.server_sees_ms.unwrap_or(0.0), Some(ss)),
                    (r.client_left_ms, Some(sc)),
                ],
            )
        })
        .collect();
    grouped(
        "drift",
        "Relative timeouts: what the server sees vs what the client really has left (1 s budget)",
        "ms",
        &["server sees", "client really has"],
        &groups,
    )
}

fn completions_chart(
    propagation: Option<&Propagation>,
    handler: Option<&Handler>,
) -> Option<String> {
    let mut groups = Vec::new();
    if let Some(p) = propagation {
        let count = |n: u64| n as f64;
        groups.push((
            "B, propagate".to_owned(),
            vec![(count(p.propagate.b_completed), Some(0.0))],
        ));
        groups.push((
            "C, propagate".to_owned(),
            vec![(count(p.propagate.c_completed), Some(0.0))],
        ));
        groups.push((
            "B, detached".to_owned(),
            vec![(count(p.detached.b_completed), Some(1.0))],
        ));
        groups.push((
            "C, detached".to_owned(),
            vec![(count(p.detached.c_completed), Some(1.0))],
        ));
    }
    if let Some(h) = handler {
        groups.push((
            "handler watches".to_owned(),
            vec![(f64::from(h.watching.completed), Some(0.0))],
        ));
        groups.push((
            "handler ignores".to_owned(),
            vec![(f64::from(h.ignoring.completed), Some(1.0))],
        ));
    }
    (!groups.is_empty()).then(|| {
        grouped(
            "completions",
            "Work completed after the client gave up (0 is right; 1 is wasted work)",
            "completions",
            &["completions"],
            &groups,
        )
    })
}

/// A plain HTML table from a header row and body rows.
fn plain_table(columns: &[&str], rows: &[Vec<String>]) -> String {
    let mut html = String::from("<table><thead><tr>");
    for c in columns {
        let _ = write!(html, "<th>{}</th>", escape(c));
    }
    html.push_str("</tr></thead><tbody>");
    for row in rows {
        html.push_str("<tr>");
        for cell in row {
            let _ = write!(html, "<td>{}</td>", escape(cell));
        }
        html.push_str("</tr>");
    }
    html.push_str("</tbody></table>");
    html
}

/// The hosts experiment: a chart of each hop's excess at the largest
/// latency, without and with compensation, and the whole table.
fn hosts_section(hosts: &Hosts) -> String {
    let mut html = String::new();
    if let Some(one_way) = hosts.rows.iter().map(|r| r.one_way_ms).max() {
        let mut groups: Vec<Group> = Vec::new();
        for r in hosts
            .rows
            .iter()
            .filter(|r| r.one_way_ms == one_way && !r.compensation)
        {
            let with = hosts
                .rows
                .iter()
                .find(|c| {
                    c.compensation
                        && c.one_way_ms == one_way
                        && c.system == r.system
                        && c.hop == r.hop
                })
                .map_or(0.0, |c| c.deadline_excess_ms);
            groups.push((
                format!("{} {}", r.system, r.hop),
                vec![(r.deadline_excess_ms, None), (with, None)],
            ));
        }
        html.push_str(&grouped(
            "hosts",
            &format!("Across namespaces, {one_way} ms one-way: what each hop's deadline gains over its parent's"),
            "ms",
            &["without compensation", "with compensation"],
            &groups,
        ));
    }
    let rows: Vec<Vec<String>> = hosts
        .rows
        .iter()
        .map(|r| {
            vec![
                r.system.clone(),
                format!("{} → {}", r.parent, r.hop),
                r.namespace.clone(),
                r.one_way_ms.to_string(),
                if r.compensation { "yes" } else { "no" }.to_owned(),
                format!("{:.2}", r.deadline_excess_ms),
                format!(
                    "{:.2} … {:.2}",
                    r.deadline_excess_min_ms, r.deadline_excess_max_ms
                ),
            ]
        })
        .collect();
    html.push_str(&plain_table(
        &[
            "system",
            "parent → hop",
            "namespace",
            "one-way ms",
            "compensation",
            "deadline excess ms (median)",
            "min … max",
        ],
        &rows,
    ));
    let _ = write!(
        html,
        r#"<p class="note">latency by {}{}</p>"#,
        escape(&hosts.delay_by),
        if hosts.netem_error.is_empty() {
            String::new()
        } else {
            format!(" (netem unavailable: {})", escape(&hosts.netem_error))
        }
    );
    html
}

/// The faults experiment as a table.
fn faults_section(faults: &Faults) -> String {
    let rows: Vec<Vec<String>> = faults
        .cases
        .iter()
        .map(|c| {
            vec![
                c.case.clone(),
                c.status.clone(),
                format!("{:.1}", c.detected_ms),
                format!("{:.1}", c.answered_ms),
                format!("{:.0}", c.deadline_ms),
                if c.upstream_scope_ended { "yes" } else { "no" }.to_owned(),
                c.leaked.to_string(),
            ]
        })
        .collect();
    plain_table(
        &[
            "case",
            "status",
            "detected ms",
            "answered ms",
            "deadline ms",
            "upstream scope ended",
            "leaked",
        ],
        &rows,
    )
}

/// The rapid-reset experiment as a table: for each flood, how each server
/// cut it off and what the honest client saw.
fn rapid_reset_section(r: &RapidReset) -> String {
    let or_dash = |n: Option<u32>| n.map_or_else(|| "—".to_owned(), |n| n.to_string());
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|row| {
            vec![
                row.shape.clone(),
                row.server.clone(),
                row.cut.clone(),
                format!("{} of {}", row.connections_cut, row.connections_opened),
                or_dash(row.streams_before_cut_max),
                or_dash(row.streams_uncut_max),
                format!("{:.3}", row.honest_p50_before_ms),
                format!("{:.3}", row.honest_p50_during_ms),
                row.honest_failures.to_string(),
            ]
        })
        .collect();
    let mut html = format!(
        "<p class=\"muted\">Streams opened and reset at once, each flooding thread connecting again whenever it is cut off, {:.1} s per row; an honest client calls the health check on its own connection. Ours must cut every flooding connection within {} streams.</p>",
        r.flooding_ms / 1000.0,
        r.cut_within
    );
    html.push_str(&plain_table(
        &[
            "flood",
            "server",
            "cut",
            "connections cut",
            "streams before cut (max)",
            "uncut",
            "honest p50 before ms",
            "during ms",
            "honest failures",
        ],
        &rows,
    ));
    html
}

/// The proxy experiment's figures as a table.
fn proxy_section(p: &Proxy) -> String {
    let rows = vec![
        vec!["proxy".to_owned(), p.proxy.clone()],
        vec![
            "grpc-timeout sent → received".to_owned(),
            format!("{} → {}", p.header_sent, p.header_received),
        ],
        vec!["transit".to_owned(), format!("{:.2} ms", p.transit_ms)],
        vec![
            "client cancel → downstream scope ends".to_owned(),
            format!(
                "{:.1} ms through nginx, {:.1} ms with keepalive, {:.1} ms direct",
                p.reset_reaches_downstream_ms,
                p.keepalive.reset_reaches_downstream_ms,
                p.reset_direct_ms
            ),
        ],
        vec![
            format!(
                "grpc_read_timeout {:.0} ms, deadline {:.0} ms",
                p.read_timeout.grpc_read_timeout_ms, p.read_timeout.deadline_ms
            ),
            format!(
                "{} after {:.0} ms",
                p.read_timeout.status, p.read_timeout.answered_ms
            ),
        ],
    ];
    plain_table(&["measured", "value"], &rows)
}

/// The result of step `name`, read back into its type; `None` when the
/// step failed, did not run, or printed something else.
fn typed<T: serde::de::DeserializeOwned>(steps: &[Step], name: &str) -> Option<T> {
    find(steps, name).and_then(|j| serde_json::from_value(j.clone()).ok())
}

fn wire_block(title: &str, lines: &[String]) -> String {
    let mut html = format!("<h3>{}</h3><pre class=\"wire\">", escape(title));
    for line in lines {
        let class = if line.contains("RST_STREAM") {
            "rst"
        } else if line.contains("grpc-timeout=") {
            "timeout"
        } else if line.contains("grpc-status=") {
            "status"
        } else {
            ""
        };
        let _ = writeln!(html, "<span class=\"{class}\">{}</span>", escape(line));
    }
    html.push_str("</pre>");
    html
}

const STYLE: &str = r#"
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
main{max-width:1000px;margin:0 auto;padding:24px}
h1{font-size:26px;margin:8px 0 4px}h2{margin-top:36px;border-bottom:2px solid #dde2ea;padding-bottom:4px}
section{background:#fff;border-radius:8px;padding:16px 20px;margin:18px 0;box-shadow:0 1px 3px rgba(0,0,0,.08)}
table{border-collapse:collapse;margin:10px 0;font-size:13px}th,td{border-bottom:1px solid #e4e7ec;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#eef1f5}.note{color:#555;font-size:13px;margin:4px 0}
svg.chart{display:block;max-width:100%;height:auto;margin:10px 0}
svg .title{font-weight:600;font-size:14px;fill:#1d2330}svg .label,svg .value,svg .legend{font-size:12px;fill:#3a4250}
svg .bar{fill:#2a9d8f}svg .bar.s1{fill:#e76f51}svg .bar.s2{fill:#8ab17d}svg .seed{stroke:#1d2330;stroke-width:3}svg .axis{stroke:#999}
svg .k-ours{fill:#2a9d8f}svg .k-seed{fill:#1d2330}
svg .grid{stroke:#e4e7ec}svg .line{fill:none;stroke-width:2.5}svg .line.s0{stroke:#6b7280}svg .line.s1{stroke:#e76f51}svg .line.s2{stroke:#8ab17d}svg .line.s3{stroke:#2a9d8f}
svg .point.s0{fill:#6b7280}svg .point.s1{fill:#e76f51}svg .point.s2{fill:#8ab17d}svg .point.s3{fill:#2a9d8f}
pre.wire{background:#111827;color:#d1d5db;padding:10px;border-radius:6px;overflow-x:auto;font-size:12px}
pre.wire .rst{color:#f87171}pre.wire .timeout{color:#fbbf24}pre.wire .status{color:#34d399}
.failed{color:#b91c1c}.skipped{color:#92400e}.muted{color:#667}
"#;

/// Stamps every chart with its laid-out size and its bar and point counts
/// once rendered; a chart counts as rendered with at least one of either.
const SCRIPT: &str = r#"
window.addEventListener('load', function () {
  var charts = document.querySelectorAll('svg.chart'), ok = 0;
  charts.forEach(function (svg) {
    var box = svg.getBoundingClientRect(), bbox = svg.getBBox();
    var bars = svg.querySelectorAll('rect.bar').length;
    var points = svg.querySelectorAll('circle.point').length;
    svg.setAttribute('data-rendered', Math.round(box.width) + 'x' + Math.round(box.height));
    svg.setAttribute('data-content', Math.round(bbox.width) + 'x' + Math.round(bbox.height));
    svg.setAttribute('data-bars', bars);
    svg.setAttribute('data-points', points);
    if (box.width > 0 && box.height > 0 && bbox.width > 0 && bars + points > 0) ok++;
  });
  document.body.setAttribute('data-charts-rendered', ok + '/' + charts.length);
});
"#;

/// Resident memory through the soak, what it left behind, and the jobs
/// that survived a killed worker.
fn resources_section(body: &mut String, soak: Option<&Soak>, jobs: Option<&JobsRun>) {
    body.push_str("<h2>Nothing left behind</h2><section>");
    if let Some(soak) = soak {
        let bars = vec![
            Bar::new("start", soak.rss_start_mb, None),
            Bar::new("after warm-up", soak.rss_after_warmup_mb, None),
            Bar::new("end", soak.rss_end_mb, None).note(format!(
                "{:+.1} MB after warm-up",
                soak.rss_growth_after_warmup_mb
            )),
        ];
        body.push_str(&hbars(
            "soak-rss",
            &format!(
                "Soak, {} calls with 1-50 ms deadlines and client cancels: resident memory",
                soak.calls
            ),
            "MB",
            &bars,
        ));
        let _ = write!(
            body,
            "<p>Left after the last call: {} tasks, {} admission permits, {} database connections; {} unexpected statuses.</p>",
            soak.tasks_leaked, soak.permits_held, soak.db_conns_held, soak.unexpected_status
        );
    }
    if let Some(jobs) = jobs {
        let _ = write!(
            body,
            "<p>Jobs on PostgreSQL, {} worker processes, {} killed with SIGKILL mid-job: {} accepted, {} lost, {} non-idempotent run twice; the killed job was {} after {} ms.</p>",
            jobs.workers,
            jobs.killed,
            jobs.accepted,
            jobs.lost,
            jobs.duplicated_non_idempotent,
            escape(&jobs.killed_job.state),
            jobs.killed_job.recovered_after_ms
        );
    }
    body.push_str("</section>");
}

/// Renders the report for the finished demo `steps`.
pub fn render(steps: &[Step], wall_seconds: f64) -> String {
    render_with_skipped(steps, &[], wall_seconds)
}

/// Renders the report for the finished demo `steps` and the steps it
/// `skipped`.
pub fn render_with_skipped(steps: &[Step], skipped: &[Skipped], wall_seconds: f64) -> String {
    let mut body = String::new();
    let skipped_count = if skipped.is_empty() {
        String::new()
    } else {
        format!(" ({} skipped)", skipped.len())
    };
    let _ = write!(
        body,
        "<h1>deadline-lab report</h1><p class=\"muted\">Every figure measured on real tonic services over loopback in one process; {} steps{skipped_count} in {:.1} s. Dark ticks mark the seeds' figures: grpc-go's measurements, and the per-hop budgets the seeds prescribe.</p>",
        steps.len(),
        wall_seconds
    );

    body.push_str("<h2>Budget per hop</h2><section>");
    if let Some(chain) = typed::<Chain>(steps, "chain") {
        body.push_str(&chain_chart(&chain));
    }
    if let Some(im) = typed::<Im>(steps, "im") {
        body.push_str(&hbars(
            "im-normal",
            "IM chain, normal request: budget on entry and handed on (client 800 ms)",
            "ms",
            &im_bars(&im.normal),
        ));
        body.push_str(&hbars(
            "im-stall",
            "IM chain, route stalls: route's 200 ms cap ends it; logic answers early",
            "ms",
            &im_bars(&im.route_stall),
        ));
    }
    if let Some(shop) = typed::<Shop>(steps, "shop") {
        let bars = vec![
            Bar::new(
                "inventory (propagated)",
                shop.inventory_budget_ms.unwrap_or(0.0),
                Some(900.0),
            ),
            Bar::new(
                "pricing (propagated)",
                shop.pricing_budget_ms.unwrap_or(0.0),
                Some(shop.expected_pricing_ms as f64),
            )
            .note("≈ 250 − 50 reserve"),
            Bar::new(
                "cache (capped)",
                shop.cache_budget_ms.unwrap_or(0.0),
                Some(shop.cache_cap_ms as f64),
            ),
        ];
        body.push_str(&hbars(
            "shop",
            "Shop API (900 ms): inventory took 650 ms; pricing gets what is left",
            "ms",
            &bars,
        ));
    }
    body.push_str("</section>");

    body.push_str("<h2>Beyond tonic: HTTP edge → gRPC → SQL, and → reqwest</h2><section>");
    if let Some(edge) = typed(steps, "edge") {
        body.push_str(&edge_charts(&edge));
    }
    body.push_str("</section>");

    body.push_str("<h2>Transit time is not deducted</h2><section>");
    let drift = typed::<Drift>(steps, "drift");
    if let Some(drift) = &drift {
        body.push_str(&drift_chart(drift));
    }
    body.push_str("</section>");

    body.push_str("<h2>0 vs 1: work after the client gave up</h2><section>");
    let handler = typed::<Handler>(steps, "handler");
    let propagation = typed::<Propagation>(steps, "propagation");
    if let Some(chart) = completions_chart(propagation.as_ref(), handler.as_ref()) {
        body.push_str(&chart);
    }
    body.push_str("</section>");

    if let Some(overload) = typed::<Overload>(steps, "bench overload") {
        body.push_str("<h2>Goodput under overload</h2><section>");
        body.push_str(&overload_plot(&overload));
        body.push_str("</section>");
    }

    if let Some(m) = typed::<Metastable>(steps, "metastable") {
        body.push_str("<h2>Overload that outlives its trigger</h2><section>");
        body.push_str(&metastable_plots(&m));
        body.push_str("</section>");
    }

    let hosts = typed::<Hosts>(steps, "hosts");
    let proxy = typed::<Proxy>(steps, "proxy");
    let faults = typed::<Faults>(steps, "faults");
    let across = ["hosts", "proxy", "faults"];
    let across_skipped = skipped_notes(skipped, &across);
    if hosts.is_some() || proxy.is_some() || faults.is_some() || !across_skipped.is_empty() {
        body.push_str("<h2>Across hosts, proxies and faults</h2><section>");
        body.push_str(&across_skipped);
        if let Some(hosts) = &hosts {
            body.push_str("<h3>hosts: every service in its own network namespace</h3>");
            body.push_str(&hosts_section(hosts));
        }
        if let Some(proxy) = &proxy {
            body.push_str("<h3>proxy: nginx between two hops</h3>");
            body.push_str(&proxy_section(proxy));
        }
        if let Some(faults) = &faults {
            body.push_str("<h3>faults below a hop</h3>");
            body.push_str(&faults_section(faults));
        }
        body.push_str("</section>");
    }

    if let Some(floods) = typed::<RapidReset>(steps, "rapid-reset") {
        body.push_str("<h2>Reset floods (HTTP/2 Rapid Reset)</h2><section>");
        body.push_str(&rapid_reset_section(&floods));
        body.push_str("</section>");
    }

    if let Some(a) = typed::<Amplification>(steps, "amplification") {
        body.push_str("<h2>Retries across hops</h2><section>");
        body.push_str(&amplification_chart(&a));
        body.push_str("</section>");
    }

    let retry = typed(steps, "retry");
    let hedge = typed(steps, "hedge");
    let storm = typed(steps, "bench retry-storm");
    if retry.is_some() || hedge.is_some() || storm.is_some() {
        body.push_str(&resilience::section(
            retry.as_ref(),
            hedge.as_ref(),
            storm.as_ref(),
        ));
    }

    if let Some(w) = typed::<crate::experiments::waterfall::Waterfall>(steps, "waterfall") {
        body.push_str(&waterfall::section(&w));
    }

    if let Some(l) = typed::<crate::experiments::ledger::LedgerResult>(steps, "ledger") {
        body.push_str(&ledger_section(&l));
    }

    body.push_str("<h2>On the wire</h2><section><p class=\"muted\">Frames decoded by the capture proxy (HPACK-decoded headers; RST_STREAM with its error code).</p>");
    if let Some(h) = &handler {
        body.push_str(&wire_block(
            "handler, 150 ms budget: the server's DEADLINE_EXCEEDED and the client's RST_STREAM",
            &h.watching.wire,
        ));
    }
    for row in drift.iter().flat_map(|d| &d.rows) {
        body.push_str(&wire_block(
            &format!("drift, {} ms injected delay", row.delay_ms),
            &row.wire,
        ));
    }
    if let Some(e) = typed::<Expired>(steps, "expired") {
        let _ = write!(
            body,
            "<h3>expired call</h3><p>{} frames on the wire for a call whose deadline had passed (status {}).</p>",
            e.frames,
            escape(&e.status)
        );
    }
    body.push_str("</section>");

    resources_section(
        &mut body,
        typed::<Soak>(steps, "bench soak").as_ref(),
        typed::<JobsRun>(steps, "jobs").as_ref(),
    );

    body.push_str("<h2>Every table</h2>");
    for listed in in_demo_order(steps, skipped) {
        let step = match listed {
            Listed::Ran(step) => step,
            Listed::Skipped(s) => {
                let _ = write!(
                    body,
                    "<section data-step=\"{name}\" data-status=\"skipped\"><h3>{name} <span class=\"muted\">(skipped)</span></h3>{about}<p class=\"skipped\">skipped: {}</p></section>",
                    escape(&s.needs),
                    name = escape(&s.name),
                    about = about(&s.name),
                );
                continue;
            }
        };
        let status = if step.outcome.is_ok() {
            "done"
        } else {
            "failed"
        };
        let _ = write!(
            body,
            "<section data-step=\"{}\" data-status=\"{status}\"><h3>{} <span class=\"muted\">({:.1} s)</span></h3>",
            escape(&step.name),
            escape(&step.name),
            step.seconds
        );
        body.push_str(&about(&step.name));
        match &step.outcome {
            Ok(outcome) => {
                let _ = write!(body, "<p><b>{}</b></p>", escape(&outcome.title));
                body.push_str(&table(outcome));
            }
            Err(e) => {
                let _ = write!(body, "<p class=\"failed\">failed: {}</p>", escape(e));
            }
        }
        body.push_str("</section>");
    }

    let waterfall_style = waterfall::STYLE;
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><title>deadline-lab report</title><style>{STYLE}{waterfall_style}</style></head><body><main>{body}</main><script>{SCRIPT}</script></body></html>\n"
    )
}

/// The edge experiment: budget on entry and when each layer stopped.
pub fn edge_charts(edge: &crate::experiments::edge::Edge) -> String {
    let entry: Vec<Bar> = edge
        .rows
        .iter()
        .map(|r| Bar::new(&r.layer, r.remaining_on_entry_ms.unwrap_or(0.0), None))
        .collect();
    let stopped: Vec<Bar> = edge
        .rows
        .iter()
        .map(|r| {
            Bar::new(&r.layer, r.stopped_ms.unwrap_or(0.0), None).note(if r.stopped_on_server {
                "stopped on the server"
            } else {
                "ran on"
            })
        })
        .collect();
    let mut out = hbars(
        "edge-entry",
        &format!(
            "Budget on entry (the edge's default is {} ms)",
            fmt_ms(edge.edge_budget_ms)
        ),
        "ms",
        &entry,
    );
    out.push_str(&hbars(
        "edge-stopped",
        &format!(
            "When each layer stopped; the client gave up at {} ms",
            fmt_ms(edge.client_gave_up_ms)
        ),
        "ms",
        &stopped,
    ));
    let _ = write!(
        out,
        "<p>Pool after: {}/{} idle, {} cancel request(s), {} statement(s) still active. Plain sqlx, for contrast: a dropped query {} on the server and the next query waited {} ms.</p>",
        edge.pool.idle,
        edge.pool.size,
        edge.pool.cancels_sent,
        edge.pool.queries_still_active,
        if edge.plain_sqlx.still_active_after_drop {
            "kept running"
        } else {
            "stopped"
        },
        fmt_ms(edge.plain_sqlx.next_query_waited_ms)
    );
    out
}
