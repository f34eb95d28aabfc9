//! The demo's report: one self-contained HTML file (inline CSS, inline SVG
//! charts, no external resources). Its [`Section`]s are drawn by the
//! experiments themselves
//! ([`Experiment::report`](crate::registry::Experiment::report)), each from
//! its result read back from its JSON and from the table it printed; the
//! page lays them out in the demo's order ([`crate::catalog`]), and then
//! every table.
//!
//! Every chart is an `<svg class="chart">`. A few lines of inline script
//! stamp each chart, once laid out, with its rendered size
//! (`data-rendered="W×H"`) and the number of bars drawn, so a headless
//! browser's DOM dump shows that the charts really rendered.

use std::fmt::Write as _;

use crate::catalog;
use crate::html::chart::{self, escape};
use crate::html::{Drawn, Section};
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
        catalog::entries()
            .position(|e| e.step() == name)
            .unwrap_or(usize::MAX)
    };
    listed.sort_by_key(|l| position(l.name()));
    listed
}

/// What the step measures, as the registry says, if it knows the step.
fn about(step: &str) -> String {
    catalog::by_step(step).map_or_else(String::new, |e| {
        format!("<p class=\"muted\">{}</p>", escape(e.about))
    })
}

/// The report's sections, each with what its experiments drew in it: a
/// line for each that failed or was skipped, then their parts, in the
/// demo's order.
fn sections(listed: &[Listed<'_>]) -> String {
    let mut notes: Vec<(Section, String)> = Vec::new();
    let mut drawn: Vec<(Section, Drawn)> = Vec::new();
    for listed in listed {
        let Some(entry) = catalog::by_step(listed.name()) else {
            continue;
        };
        let name = escape(listed.name());
        match listed {
            Listed::Skipped(s) => notes.extend(entry.section.map(|section| {
                let note = format!(
                    "<p class=\"skipped\">{name}: skipped ({})</p>",
                    escape(&s.needs)
                );
                (section, note)
            })),
            Listed::Ran(Step {
                outcome: Err(e), ..
            }) => {
                notes.extend(entry.section.map(|section| {
                    let note = format!("<p class=\"failed\">{name}: failed ({})</p>", escape(e));
                    (section, note)
                }));
            }
            Listed::Ran(Step {
                outcome: Ok(table), ..
            }) => {
                for part in entry.report(table) {
                    if let Some(section) = part.section.or(entry.section) {
                        drawn.push((section, part.drawn));
                    }
                }
            }
        }
    }
    let mut html = String::new();
    for section in Section::ALL {
        let mut body: String = notes
            .iter()
            .filter(|(s, _)| *s == section)
            .map(|(_, note)| note.as_str())
            .collect();
        let mut bars = Vec::new();
        for (_, part) in drawn.iter().filter(|(s, _)| *s == section) {
            match part {
                Drawn::Html(part) => body.push_str(part),
                Drawn::Bars(groups) => bars.extend(groups.iter().cloned()),
            }
        }
        if !bars.is_empty() {
            body.extend(section.chart(&bars));
        }
        if body.is_empty() {
            continue;
        }
        let _ = write!(
            html,
            "<h2>{}</h2><section>{}{body}</section>",
            escape(section.heading()),
            section.intro()
        );
    }
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

    let listed = in_demo_order(steps, skipped);
    body.push_str(&sections(&listed));

    body.push_str("<h2>Every table</h2>");
    for listed in listed {
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
                body.push_str(&chart::table(outcome));
            }
            Err(e) => {
                let _ = write!(body, "<p class=\"failed\">failed: {}</p>", escape(e));
            }
        }
        body.push_str("</section>");
    }

    let styles: String = catalog::entries().map(|e| e.style).collect();
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><title>deadline-lab report</title><style>{STYLE}{styles}</style></head><body><main>{body}</main><script>{SCRIPT}</script></body></html>\n"
    )
}
