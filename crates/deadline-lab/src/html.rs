//! The demo's report: one self-contained HTML file (inline CSS, inline SVG
//! charts, no external resources) built from the experiments' JSON.
//!
//! Every chart is an `<svg class="chart">`. A few lines of inline script
//! stamp each chart, once laid out, with its rendered size
//! (`data-rendered="W×H"`) and the number of bars drawn, so a headless
//! browser's DOM dump shows that the charts really rendered.

mod resilience;
mod waterfall;

use std::fmt::Write as _;

use serde_json::Value;

use crate::experiments::faults::Faults;
use crate::experiments::hosts::Hosts;
use crate::experiments::proxy::Proxy;
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
    fn new(label: impl Into<String>, value: f64, seed: Option<f64>) -> Self {
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

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
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
    let _ = write!(
        svg,
        r#"<line class="seed" x1="{lx}" x2="{x2}" y1="{y}" y2="{y}"/><text class="legend" x="{tx}" y="{ty}">the seed's figure</text></svg>"#,
        x2 = lx + 14.0,
        y = H - 16.0,
        tx = lx + 18.0,
        ty = H - 12.0,
    );
    svg
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

fn chain_chart(json: &Value) -> Option<String> {
    const SEED: [f64; 3] = [999.9, 899.2, 798.6];
    let hops = json["hops"].as_array()?;
    let bars: Vec<Bar> = hops
        .iter()
        .zip(SEED)
        .map(|(h, seed)| {
            Bar::new(
                h["service"].as_str().unwrap_or("?"),
                num(&h["remaining_ms"]).unwrap_or(0.0),
                Some(seed),
            )
            .note(format!(
                "grpc-timeout {}",
                h["header"].as_str().unwrap_or("")
            ))
        })
        .collect();
    Some(hbars(
        "chain",
        "Chain A → B → C: remaining budget on entry (1 s client budget, 100 ms per hop)",
        "ms",
        &bars,
    ))
}

fn im_bars(case: &Value) -> Vec<Bar> {
    let seed = |service: &str| match service {
        "gateway" => Some(800.0),
        "logic" => Some(500.0),
        "route" => Some(200.0),
        _ => None,
    };
    let mut bars = Vec::new();
    for hop in case["hops"].as_array().into_iter().flatten() {
        let service = hop["service"].as_str().unwrap_or("?");
        if let Some(entry) = num(&hop["entry_ms"]) {
            let work = hop["work"]["outcome"]
                .as_str()
                .map(|o| format!("own work: {o}"))
                .unwrap_or_default();
            bars.push(Bar::new(format!("{service} on entry"), entry, seed(service)).note(work));
        }
        for gave in hop["gave"].as_array().into_iter().flatten() {
            if let Some(ms) = num(&gave["ms"]) {
                bars.push(
                    Bar::new(
                        format!("  {service} → {}", gave["to"].as_str().unwrap_or("?")),
                        ms,
                        None,
                    )
                    .note(gave["outcome"].as_str().unwrap_or("").to_owned()),
                );
            }
        }
    }
    bars
}

fn drift_chart(json: &Value) -> Option<String> {
    const SEED: [(f64, f64); 3] = [(999.0, 999.0), (999.0, 798.0), (999.0, 598.0)];
    let rows = json["rows"].as_array()?;
    let groups: Vec<Group> = rows
        .iter()
        .zip(SEED)
        .map(|(r, (ss, sc))| {
            (
                format!("{} ms delay", r["delay_ms"]),
                vec![
                    (num(&r["server_sees_ms"]).unwrap_or(0.0), Some(ss)),
                    (num(&r["client_left_ms"]).unwrap_or(0.0), Some(sc)),
                ],
            )
        })
        .collect();
    Some(grouped(
        "drift",
        "Relative timeouts: what the server sees vs what the client really has left (1 s budget)",
        "ms",
        &["server sees", "client really has"],
        &groups,
    ))
}

fn completions_chart(propagation: Option<&Value>, handler: Option<&Value>) -> Option<String> {
    let mut groups = Vec::new();
    if let Some(p) = propagation {
        groups.push((
            "B, propagate".to_owned(),
            vec![(num(&p["propagate"]["b_completed"])?, Some(0.0))],
        ));
        groups.push((
            "C, propagate".to_owned(),
            vec![(num(&p["propagate"]["c_completed"])?, Some(0.0))],
        ));
        groups.push((
            "B, detached".to_owned(),
            vec![(num(&p["detached"]["b_completed"])?, Some(1.0))],
        ));
        groups.push((
            "C, detached".to_owned(),
            vec![(num(&p["detached"]["c_completed"])?, Some(1.0))],
        ));
    }
    if let Some(h) = handler {
        groups.push((
            "handler watches".to_owned(),
            vec![(num(&h["watching"]["completed"])?, Some(0.0))],
        ));
        groups.push((
            "handler ignores".to_owned(),
            vec![(num(&h["ignoring"]["completed"])?, Some(1.0))],
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

fn typed<T: serde::de::DeserializeOwned>(json: Option<&Value>) -> Option<T> {
    json.and_then(|j| serde_json::from_value(j.clone()).ok())
}

fn wire_block(title: &str, lines: &[Value]) -> String {
    let mut html = format!("<h3>{}</h3><pre class=\"wire\">", escape(title));
    for line in lines {
        let line = line.as_str().unwrap_or_default();
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
pre.wire{background:#111827;color:#d1d5db;padding:10px;border-radius:6px;overflow-x:auto;font-size:12px}
pre.wire .rst{color:#f87171}pre.wire .timeout{color:#fbbf24}pre.wire .status{color:#34d399}
.failed{color:#b91c1c}.muted{color:#667}
"#;

/// Stamps every chart with its laid-out size and bar count once rendered.
const SCRIPT: &str = r#"
window.addEventListener('load', function () {
  var charts = document.querySelectorAll('svg.chart'), ok = 0;
  charts.forEach(function (svg) {
    var box = svg.getBoundingClientRect(), bbox = svg.getBBox();
    var bars = svg.querySelectorAll('rect.bar').length;
    svg.setAttribute('data-rendered', Math.round(box.width) + 'x' + Math.round(box.height));
    svg.setAttribute('data-content', Math.round(bbox.width) + 'x' + Math.round(bbox.height));
    svg.setAttribute('data-bars', bars);
    if (box.width > 0 && box.height > 0 && bbox.width > 0 && bars > 0) ok++;
  });
  document.body.setAttribute('data-charts-rendered', ok + '/' + charts.length);
});
"#;

/// Resident memory through the soak, what it left behind, and the jobs
/// that survived a killed worker.
fn resources_section(body: &mut String, soak: Option<&Value>, jobs: Option<&Value>) {
    body.push_str("<h2>Nothing left behind</h2><section>");
    if let Some(soak) = soak {
        let mb = |k: &str| num(&soak[k]).unwrap_or(0.0);
        let bars = vec![
            Bar::new("start", mb("rss_start_mb"), None),
            Bar::new("after warm-up", mb("rss_after_warmup_mb"), None),
            Bar::new("end", mb("rss_end_mb"), None).note(format!(
                "{:+.1} MB after warm-up",
                mb("rss_growth_after_warmup_mb")
            )),
        ];
        body.push_str(&hbars(
            "soak-rss",
            &format!(
                "Soak, {} calls with 1-50 ms deadlines and client cancels: resident memory",
                soak["calls"]
            ),
            "MB",
            &bars,
        ));
        let _ = write!(
            body,
            "<p>Left after the last call: {} tasks, {} admission permits, {} database connections; {} unexpected statuses.</p>",
            soak["tasks_leaked"],
            soak["permits_held"],
            soak["db_conns_held"],
            soak["unexpected_status"]
        );
    }
    if let Some(jobs) = jobs {
        let _ = write!(
            body,
            "<p>Jobs on PostgreSQL, {} worker processes, {} killed with SIGKILL mid-job: {} accepted, {} lost, {} non-idempotent run twice; the killed job was {} after {} ms.</p>",
            jobs["workers"],
            jobs["killed"],
            jobs["accepted"],
            jobs["lost"],
            jobs["duplicated_non_idempotent"],
            escape(jobs["killed_job"]["state"].as_str().unwrap_or("?")),
            jobs["killed_job"]["recovered_after_ms"]
        );
    }
    body.push_str("</section>");
}

/// Renders the report for the finished demo `steps`.
pub fn render(steps: &[Step], wall_seconds: f64) -> String {
    let mut body = String::new();
    let _ = write!(
        body,
        "<h1>deadline-lab report</h1><p class=\"muted\">Every figure measured on real tonic services over loopback in one process; {} steps in {:.1} s. Dark ticks mark the seeds' figures: grpc-go's measurements, and the per-hop budgets the seeds prescribe.</p>",
        steps.len(),
        wall_seconds
    );

    body.push_str("<h2>Budget per hop</h2><section>");
    if let Some(chart) = find(steps, "chain").and_then(chain_chart) {
        body.push_str(&chart);
    }
    if let Some(im) = find(steps, "im") {
        body.push_str(&hbars(
            "im-normal",
            "IM chain, normal request: budget on entry and handed on (client 800 ms)",
            "ms",
            &im_bars(&im["normal"]),
        ));
        body.push_str(&hbars(
            "im-stall",
            "IM chain, route stalls: route's 200 ms cap ends it; logic answers early",
            "ms",
            &im_bars(&im["route_stall"]),
        ));
    }
    if let Some(shop) = find(steps, "shop") {
        let bars = vec![
            Bar::new(
                "inventory (propagated)",
                num(&shop["inventory_budget_ms"]).unwrap_or(0.0),
                Some(900.0),
            ),
            Bar::new(
                "pricing (propagated)",
                num(&shop["pricing_budget_ms"]).unwrap_or(0.0),
                num(&shop["expected_pricing_ms"]),
            )
            .note("≈ 250 − 50 reserve"),
            Bar::new(
                "cache (capped)",
                num(&shop["cache_budget_ms"]).unwrap_or(0.0),
                num(&shop["cache_cap_ms"]),
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
    if let Some(chart) = find(steps, "edge").and_then(edge_charts) {
        body.push_str(&chart);
    }
    body.push_str("</section>");

    body.push_str("<h2>Transit time is not deducted</h2><section>");
    if let Some(chart) = find(steps, "drift").and_then(drift_chart) {
        body.push_str(&chart);
    }
    body.push_str("</section>");

    body.push_str("<h2>0 vs 1: work after the client gave up</h2><section>");
    if let Some(chart) = completions_chart(find(steps, "propagation"), find(steps, "handler")) {
        body.push_str(&chart);
    }
    body.push_str("</section>");

    let hosts = typed::<Hosts>(find(steps, "hosts"));
    let proxy = typed::<Proxy>(find(steps, "proxy"));
    let faults = typed::<Faults>(find(steps, "faults"));
    if hosts.is_some() || proxy.is_some() || faults.is_some() {
        body.push_str("<h2>Across hosts, proxies and faults</h2><section>");
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

    let retry = typed(find(steps, "retry"));
    let hedge = typed(find(steps, "hedge"));
    let storm = typed(find(steps, "bench retry-storm"));
    if retry.is_some() || hedge.is_some() || storm.is_some() {
        body.push_str(&resilience::section(
            retry.as_ref(),
            hedge.as_ref(),
            storm.as_ref(),
        ));
    }

    if let Some(w) = typed::<crate::experiments::waterfall::Waterfall>(find(steps, "waterfall")) {
        body.push_str(&waterfall::section(&w));
    }

    body.push_str("<h2>On the wire</h2><section><p class=\"muted\">Frames decoded by the capture proxy (HPACK-decoded headers; RST_STREAM with its error code).</p>");
    if let Some(h) = find(steps, "handler")
        && let Some(lines) = h["watching"]["wire"].as_array()
    {
        body.push_str(&wire_block(
            "handler, 150 ms budget: the server's DEADLINE_EXCEEDED and the client's RST_STREAM",
            lines,
        ));
    }
    if let Some(d) = find(steps, "drift") {
        for row in d["rows"].as_array().into_iter().flatten() {
            if let Some(lines) = row["wire"].as_array() {
                body.push_str(&wire_block(
                    &format!("drift, {} ms injected delay", row["delay_ms"]),
                    lines,
                ));
            }
        }
    }
    if let Some(e) = find(steps, "expired") {
        let _ = write!(
            body,
            "<h3>expired call</h3><p>{} frames on the wire for a call whose deadline had passed (status {}).</p>",
            e["frames"],
            escape(e["status"].as_str().unwrap_or("?"))
        );
    }
    body.push_str("</section>");

    resources_section(&mut body, find(steps, "bench soak"), find(steps, "jobs"));

    body.push_str("<h2>Every table</h2>");
    for step in steps {
        let _ = write!(
            body,
            "<section><h3>{} <span class=\"muted\">({:.1} s)</span></h3>",
            escape(&step.name),
            step.seconds
        );
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
fn edge_charts(json: &Value) -> Option<String> {
    let edge: crate::experiments::edge::Edge = serde_json::from_value(json.clone()).ok()?;
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
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_inline_svg_with_bars_and_seed_ticks() {
        let svg = hbars(
            "t",
            "A <title>",
            "ms",
            &[Bar::new("A", 999.9, Some(999.0)), Bar::new("B", 0.0, None)],
        );
        assert!(svg.starts_with("<svg class=\"chart\""));
        assert_eq!(svg.matches("class=\"bar\"").count(), 2, "one bar per row");
        assert_eq!(svg.matches("class=\"seed\"").count(), 1, "a tick per seed");
        assert!(svg.contains("A &lt;title&gt;"), "text must be escaped");
    }

    #[test]
    fn edge_charts_draw_every_layer_from_the_typed_result() {
        use crate::experiments::edge::{Edge, LAYERS, LayerRow, PlainSqlx, PoolAfter, SqlxCosts};
        let edge = Edge {
            rows: LAYERS
                .iter()
                .map(|l| LayerRow {
                    layer: (*l).to_owned(),
                    remaining_on_entry_ms: Some(899.0),
                    stopped_ms: Some(301.0),
                    stopped_on_server: true,
                    cause: None,
                })
                .collect(),
            edge_budget_ms: 900.0,
            client_gave_up_ms: 300.0,
            pool: PoolAfter {
                size: 1,
                idle: 1,
                max_size: 2,
                cancels_sent: 1,
                discarded: 0,
                whole: true,
                queries_still_active: 0,
            },
            plain_sqlx: PlainSqlx {
                query_ms: 2000.0,
                dropped_at_ms: 300.0,
                still_active_after_drop: true,
                next_query_waited_ms: 1700.0,
            },
            sqlx_costs: SqlxCosts {
                plain_statement_us: 50.0,
                scoped_statement_us: 140.0,
                extra_us: 90.0,
            },
        };
        let json = serde_json::to_value(&edge).expect("serialises");
        let html = edge_charts(&json).expect("a typed result renders");
        assert_eq!(
            html.matches("class=\"bar\"").count(),
            8,
            "two charts, one bar per layer"
        );
        assert!(html.contains("sqlx query") && html.contains("kept running"));
    }

    #[test]
    fn hosts_and_faults_get_their_own_tables() {
        use crate::experiments::{faults, hosts};
        let hosts = hosts::Hosts {
            delay_by: "netem".into(),
            netem_error: String::new(),
            rows: [false, true]
                .map(|compensation| hosts::Row {
                    system: "chain".into(),
                    hop: "A".into(),
                    parent: "client".into(),
                    namespace: "dlab-1-0-A".into(),
                    one_way_ms: 20,
                    compensation,
                    deadline_excess_ms: if compensation { 0.7 } else { 20.9 },
                    deadline_excess_min_ms: 0.5,
                    deadline_excess_max_ms: 21.0,
                    remaining_ms: 999.0,
                    header: "999000u".into(),
                })
                .into(),
        };
        let faults = faults::Faults {
            cases: vec![faults::Case {
                case: "downstream killed".into(),
                status: "UNAVAILABLE".into(),
                message: String::new(),
                detected_ms: 2.0,
                deadline_ms: 2000.0,
                answered_ms: 102.0,
                upstream_scope_ended: true,
                leaked: 0,
                permits_held: 0,
                tasks_running: 0,
            }],
        };
        let step = |name: &str, json: Value| Step {
            name: name.into(),
            outcome: Ok(Outcome {
                title: name.into(),
                json,
                columns: Vec::new(),
                rows: Vec::new(),
                notes: Vec::new(),
            }),
            seconds: 0.0,
        };
        let html = render(
            &[
                step("hosts", serde_json::to_value(&hosts).expect("serializable")),
                step(
                    "faults",
                    serde_json::to_value(&faults).expect("serializable"),
                ),
            ],
            1.0,
        );
        assert!(html.contains("Across hosts, proxies and faults"));
        assert!(
            html.contains("dlab-1-0-A"),
            "the hosts table must list the namespaces"
        );
        assert!(
            html.contains("data-chart=\"hosts\""),
            "and chart the excess"
        );
        assert!(
            html.contains("<td>downstream killed</td><td>UNAVAILABLE</td>"),
            "the faults table must list each case and its status"
        );
    }

    #[test]
    fn report_needs_nothing_from_the_network() {
        let html = render(&[], 0.0);
        for external in ["http://", "https://", "<link", "src="] {
            assert!(
                !html.contains(external),
                "the report must be self-contained: {external}"
            );
        }
    }
}
