//! What the report draws with: inline SVG charts (horizontal bars, grouped
//! bars, lines), an experiment's own table, and frames on the wire. Each
//! experiment draws its part of the report with these.

use std::fmt::Write as _;

use crate::report::Outcome;

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

    /// With `note` shown right of the value.
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }
}

/// Milliseconds as a chart labels them: whole when whole, else to a tenth.
pub fn fmt_ms(v: f64) -> String {
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

/// An experiment's own table, as it prints it: its columns and rows, and
/// its notes under them.
pub fn table(outcome: &Outcome) -> String {
    let mut html = rows(outcome);
    html.push_str(&notes(&outcome.notes));
    html
}

/// An experiment's columns and rows, as it made them, without its notes.
pub fn rows(outcome: &Outcome) -> String {
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
    html
}

/// Notes under a table, one paragraph each.
pub fn notes(notes: &[String]) -> String {
    notes
        .iter()
        .map(|note| format!(r#"<p class="note">{}</p>"#, escape(note)))
        .collect()
}

/// Frames on the wire as the capture proxy printed them, under `title`:
/// resets, deadlines and statuses picked out.
pub fn wire_block(title: &str, lines: &[String]) -> String {
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
