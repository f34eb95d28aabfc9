//! The READMEs and `docs/` against what they describe, so that they cannot
//! go stale.
//!
//! A measured table in `docs/` is marked by the line
//! `<!-- measured: deadline-lab COMMAND -->` right above it (an HTML
//! comment, which GitHub does not show). Each one is checked here against
//! the lab: the fast experiments run (on the release lab, one timed run at a
//! time) and the table must show their cases, columns and exact outcomes;
//! the figures of every table, which are noisy, must hold the laws their
//! experiment asserts. A table from a run that takes minutes or needs a
//! peer (root, nginx, PostgreSQL, valgrind) is checked by those laws alone.
//!
//! Beside them: the metrics page against what the layers export, the lab
//! page against the lab's commands, the code the READMEs show against the
//! crate's doc tests, every relative link against its file and heading, and
//! the front door: a top-level README read in a minute, and no table cell
//! longer than a sentence.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use deadline_lab::bench::instructions::Case as InstructionCase;
use deadline_lab::bench::retry_storm::{self, Storm};
use deadline_lab::experiments::amplification::{self, Amplification};
use deadline_lab::experiments::edge;
use deadline_lab::experiments::faults::{Faults, KILL_DETECTED_WITHIN_MS};
use deadline_lab::experiments::grpc_crate::{self, GrpcCrate};
use deadline_lab::experiments::hedge::{self, HedgeRows};
use deadline_lab::experiments::hosts::{COMPENSATED_EXCESS_MAX_MS, ONE_WAY_MS};
use deadline_lab::experiments::metastable::{self, Metastable};
use deadline_lab::experiments::rapid_reset::{
    CUT_WITHIN, HONEST_P50_VS_BEFORE, HONEST_P50_VS_PLAIN, RapidReset, SERVERS, SHAPES,
};
use deadline_lab::experiments::retry::{self, RetryCases};
use deadline_lab::experiments::waterfall::Waterfall;
use deadline_lab::registry::Experiment as _;
use deadline_lab::report::Outcome;
use std::time::Duration;

use tonic_deadline::admission::{Admission, AdmissionLayer};
use tonic_deadline::client::ReadyChannel;
use tonic_deadline::observe::Metrics;
use tonic_deadline::resilience::ResilienceLayer;
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer, timeout_header};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::common::{debug_lab, timed};

/// The commands whose tables (or printed output) `docs/` shows, each checked
/// by a test below.
const CHECKED: [&str; 15] = [
    "bench instructions",
    "bench retry-storm",
    "bench soak",
    "experiment amplification",
    "experiment edge",
    "experiment faults",
    "experiment grpc-crate",
    "experiment hedge",
    "experiment honest-resets",
    "experiment hosts",
    "experiment metastable",
    "experiment proxy",
    "experiment rapid-reset",
    "experiment retry",
    "experiment waterfall",
];

/// The workspace's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A file of the repository, by its path from the root.
fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path))
        .unwrap_or_else(|e| panic!("{path} must be readable: {e}"))
}

/// The files in `dir` (from the root) whose names end with `ext`, sorted,
/// as paths from the root.
fn files(dir: &str, ext: &str) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|e| panic!("{dir} must be a directory: {e}"))
        .map(|entry| entry.expect("a directory entry").file_name())
        .filter_map(|name| name.to_str().map(str::to_owned))
        .filter(|name| name.ends_with(ext))
        .map(|name| format!("{dir}/{name}"))
        .collect();
    found.sort();
    found
}

/// The pages of `docs/`.
fn docs_pages() -> Vec<String> {
    files("docs", ".md")
}

/// Every markdown page a user reads: the READMEs, the guide, the
/// changelog and `docs/`.
fn pages() -> Vec<String> {
    let mut pages: Vec<String> = [
        "README.md",
        "crates/grpc-deadline/README.md",
        "crates/grpc-deadline-reqwest/README.md",
        "crates/grpc-deadline-grpc/README.md",
        "crates/tonic-deadline-guard/README.md",
        "crates/grpc-deadline-db/README.md",
        "crates/grpc-deadline-jobs/README.md",
        "crates/tonic-deadline-db/README.md",
        "crates/tonic-deadline-jobs/README.md",
        "crates/tonic-deadline/README.md",
        "crates/tonic-deadline/docs/propagation.md",
        "crates/tonic-deadline/CHANGELOG.md",
        "examples/README.md",
    ]
    .map(str::to_owned)
    .to_vec();
    pages.extend(docs_pages());
    pages
}

/// One fenced block of a page: its info string (`rust,no_run`) and lines.
struct Fenced {
    info: String,
    lines: Vec<String>,
}

/// The fenced code blocks of a markdown text.
fn fenced(text: &str) -> Vec<Fenced> {
    let mut blocks = Vec::new();
    let mut open: Option<Fenced> = None;
    for line in text.lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                open = Some(Fenced {
                    info: info.trim().to_owned(),
                    lines: Vec::new(),
                });
            }
            (Some(_), Some(_)) => blocks.extend(open.take()),
            (Some(block), None) => block.lines.push(line.to_owned()),
            (None, None) => {}
        }
    }
    blocks
}

/// The lines of a markdown text outside its fenced blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut inside = false;
    text.lines()
        .filter(|line| {
            if line.starts_with("```") {
                inside = !inside;
                return false;
            }
            !inside
        })
        .collect()
}

/// A markdown table: its header and its rows, cell by cell.
#[derive(Debug)]
struct Table {
    /// Where it is and what measured it, for the messages.
    name: String,
    columns: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// The cells of one table line; `\|` is a `|` inside a cell.
fn cells(line: &str) -> Vec<String> {
    line.trim()
        .trim_start_matches('|')
        .trim_end_matches('|')
        .replace("\\|", "\u{0}")
        .split('|')
        .map(|cell| cell.replace('\u{0}', "|").trim().to_owned())
        .collect()
}

impl Table {
    /// The table whose header is `lines[0]`.
    fn parse(name: String, lines: &[&str]) -> Table {
        let table: Vec<&str> = lines
            .iter()
            .take_while(|line| line.starts_with('|'))
            .copied()
            .collect();
        assert!(
            table.len() >= 3,
            "{name}: a table (header, separator, rows) must follow the marker"
        );
        Table {
            columns: cells(table[0]),
            rows: table[2..].iter().map(|line| cells(line)).collect(),
            name,
        }
    }

    /// The first cell of every row.
    fn labels(&self) -> Vec<&str> {
        self.rows.iter().map(|row| row[0].as_str()).collect()
    }

    /// The index of the column named `name`.
    fn column(&self, name: &str) -> usize {
        self.columns
            .iter()
            .position(|c| c == name)
            .unwrap_or_else(|| panic!("{}: a column {name:?} must be shown", self.name))
    }

    /// The cell of the row labelled `label` in column `column`.
    fn cell(&self, label: &str, column: &str) -> &str {
        let column = self.column(column);
        let row = self
            .rows
            .iter()
            .find(|row| row[0] == label)
            .unwrap_or_else(|| panic!("{}: a row {label:?} must be shown", self.name));
        &row[column]
    }

    /// The cell of the row whose first two cells are `first` and
    /// `second`, in column `column`.
    fn cell2(&self, first: &str, second: &str, column: &str) -> &str {
        let column = self.column(column);
        let row = self
            .rows
            .iter()
            .find(|row| row[0] == first && row.get(1).is_some_and(|c| c == second))
            .unwrap_or_else(|| panic!("{}: a row {first:?} / {second:?} must be shown", self.name));
        &row[column]
    }

    /// The first two cells of every row.
    fn labels2(&self) -> Vec<(&str, &str)> {
        self.rows
            .iter()
            .map(|row| (row[0].as_str(), row.get(1).map_or("", String::as_str)))
            .collect()
    }

    /// The figure in the row labelled `label`, column `column`.
    fn figure(&self, label: &str, column: &str) -> f64 {
        figure(self.cell(label, column))
    }

    /// Shows the rows of a run's printed table (by what names them, in its
    /// order) and only columns it prints.
    fn shows_the_rows_of(&self, run: &Outcome) {
        self.has_the_labs_columns(&run.columns);
        let labels: Vec<&str> = run.rows.iter().map(|row| row[0].as_str()).collect();
        assert_eq!(self.labels(), labels, "{}: the lab's rows", self.name);
    }

    /// Shows only columns the lab prints, in the lab's order, the first
    /// (what names a row) among them.
    fn has_the_labs_columns(&self, lab: &[&str]) {
        assert_eq!(
            self.columns[0], lab[0],
            "{}: the first column must be the lab's",
            self.name
        );
        let positions: Vec<usize> = self
            .columns
            .iter()
            .map(|c| {
                lab.iter().position(|l| l == c).unwrap_or_else(|| {
                    panic!(
                        "{}: column {c:?} must be one the lab prints: {lab:?}",
                        self.name
                    )
                })
            })
            .collect();
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "{}: the columns must be in the lab's order: {lab:?}",
            self.name
        );
    }
}

/// A figure as the docs print it: `−0.13`, `5.4 %`, `+2410`, `1 000`,
/// `105.0 ms`; of a median and its spread, `0.99 (0.98–0.99)`, the median.
fn figure(cell: &str) -> f64 {
    let cell = median_of(cell);
    let plain: String = cell
        .replace('−', "-")
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '`')
        .collect();
    let plain = plain
        .trim_end_matches('%')
        .trim_end_matches("ms")
        .trim_start_matches('+');
    plain
        .parse()
        .unwrap_or_else(|_| panic!("{cell:?} must be a figure"))
}

/// The median of a cell that shows one and its spread over the runs
/// (`0.99 (0.98–0.99)`); the cell itself if it shows one figure.
fn median_of(cell: &str) -> &str {
    cell.split_once(" (").map_or(cell, |(median, _)| median)
}

/// Whether a cell shows a median and its spread over several runs.
fn has_spread(cell: &str) -> bool {
    cell.contains(" (") && cell.ends_with(')') && cell.contains('–')
}

/// The figures of a cell that lists several (`0 / 34 / 109`).
fn figures(cell: &str, separator: char) -> Vec<f64> {
    cell.split(separator).map(figure).collect()
}

/// Each marker of `docs/`: the page, the command, and the lines after it.
fn markers() -> Vec<(String, String, Vec<String>)> {
    let mut found = Vec::new();
    for page in docs_pages() {
        let text = read(&page);
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if let Some(rest) = line.trim().strip_prefix("<!-- measured: deadline-lab ") {
                let command = rest.trim_end_matches("-->").trim().to_owned();
                let after = lines[i + 1..].iter().map(|l| (*l).to_owned()).collect();
                found.push((page.clone(), command, after));
            }
        }
    }
    found
}

/// The lines after the one marker of `command`.
fn marked(command: &str) -> (String, Vec<String>) {
    let mut found: Vec<(String, Vec<String>)> = markers()
        .into_iter()
        .filter(|(_, c, _)| c == command)
        .map(|(page, _, after)| (page, after))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "docs/ must show one table of `deadline-lab {command}`"
    );
    found.remove(0)
}

/// The table marked as measured by `command`.
fn measured_table(command: &str) -> Table {
    let (page, after) = marked(command);
    let after: Vec<&str> = after.iter().map(String::as_str).collect();
    Table::parse(format!("{page}, `deadline-lab {command}`"), &after)
}

/// The lines of the fenced block marked as printed by `command`.
fn measured_block(command: &str) -> Vec<String> {
    let (page, after) = marked(command);
    assert!(
        after.first().is_some_and(|l| l.starts_with("```")),
        "{page}: a fenced block must follow the marker of {command}"
    );
    after[1..]
        .iter()
        .take_while(|l| !l.starts_with("```"))
        .cloned()
        .collect()
}

#[test]
fn every_measured_table_in_the_docs_is_checked_against_the_lab() {
    let mut shown: Vec<String> = markers().into_iter().map(|(_, c, _)| c).collect();
    shown.sort();
    assert_eq!(
        shown, CHECKED,
        "every marked table is checked by a test here, once, and every check has its table"
    );
}

#[test]
fn docs_retry_table_shows_the_cases_and_outcomes_experiment_retry_measures() {
    let table = measured_table("experiment retry");
    let live: RetryCases = timed(&["experiment", "retry", "--json"]);
    table.shows_the_rows_of(&live.outcome());
    for case in &live.cases {
        let name = case.case.as_str();
        // What does not depend on timing must be what the lab measures now:
        // the status, the deadline, and the attempts — except where the
        // backoff, which is random, decides whether a second attempt fits.
        // The random backoff's second attempt, sent with a few
        // milliseconds to spare, may run out of them on a busy machine.
        let ran_out = name == retry::DEADLINE_ENDS_BACKOFF
            && case.attempts > 1
            && case.status == "DEADLINE_EXCEEDED";
        if !ran_out {
            assert_eq!(table.cell(name, "status"), case.status, "{name}");
        }
        let deadline = table.figure(name, "deadline ms");
        assert_eq!(deadline, case.deadline_ms, "{name}");
        let attempts = table.figure(name, "attempts");
        if name != retry::DEADLINE_ENDS_BACKOFF {
            assert_eq!(attempts, f64::from(case.attempts), "{name}");
        }
        // The figures must hold the experiment's laws: every attempt
        // carries what was left of the one deadline when it was sent.
        let starts = figures(table.cell(name, "attempt starts ms"), '/');
        let budgets = figures(table.cell(name, "budget on the wire ms"), '/');
        assert_eq!(starts.len() as f64, attempts, "{name}: a start per attempt");
        assert_eq!(
            budgets.len() as f64,
            attempts,
            "{name}: a budget per attempt"
        );
        for (start, budget) in starts.iter().zip(&budgets) {
            assert!(
                (budget - (deadline - start)).abs() <= 5.0,
                "{name}: an attempt sent at {start} ms carries what is left of {deadline} ms, not {budget}"
            );
        }
        assert!(
            table.figure(name, "client ms") <= deadline + 20.0,
            "{name}: answered by the deadline"
        );
    }
    let pushback = figures(table.cell(retry::PUSHBACK_DELAYS, "attempt starts ms"), '/');
    assert!(
        pushback[1] - pushback[0] >= 150.0,
        "the pushback's 150 ms replace the backoff: {pushback:?}"
    );
    assert!(
        table.figure(retry::NO_TIME, "client ms") < table.figure(retry::NO_TIME, "deadline ms"),
        "a doomed attempt is answered before the deadline"
    );
}

#[test]
fn docs_faults_table_shows_the_cases_and_statuses_experiment_faults_measures() {
    let table = measured_table("experiment faults");
    let live: Faults = timed(&["experiment", "faults", "--json"]);
    table.shows_the_rows_of(&live.outcome());
    for case in &live.cases {
        let name = case.case.as_str();
        assert_eq!(table.cell(name, "status"), case.status, "{name}");
        assert_eq!(
            table.figure(name, "deadline ms"),
            case.deadline_ms,
            "{name}"
        );
        assert_eq!(
            table.cell(name, "upstream scope ended"),
            "yes",
            "{name}: the upstream's scope ends"
        );
        assert_eq!(table.figure(name, "leaked"), 0.0, "{name}: nothing leaks");
    }
    assert!(
        table.figure("downstream killed", "detected ms") <= KILL_DETECTED_WITHIN_MS,
        "a dead process is detected within {KILL_DETECTED_WITHIN_MS} ms"
    );
    assert!(
        table.figure("connection cut mid-message", "answered ms")
            < table.figure("connection cut mid-message", "deadline ms") / 2.0,
        "a cut connection fails at once"
    );
    let hung = table.figure("downstream hung", "answered ms");
    let deadline = table.figure("downstream hung", "deadline ms");
    assert!(
        hung >= deadline - 1.0 && hung <= deadline + 250.0,
        "a hung downstream ends the call at its deadline: {hung} ms of {deadline}"
    );
}

#[test]
fn docs_hedge_table_holds_the_laws_experiment_hedge_asserts() {
    let table = measured_table("experiment hedge");
    let empty = HedgeRows {
        rows: Vec::new(),
        calls: hedge::CALLS,
        budget_ms: hedge::BUDGET.as_secs_f64() * 1000.0,
        slow_share: hedge::SLOW_SHARE,
    };
    table.has_the_labs_columns(&empty.outcome().columns);
    assert_eq!(
        table.labels(),
        ["none", "ours", "tower::hedge", hedge::ADAPTIVE],
        "{}: the lab's variants",
        table.name
    );
    for variant in table.labels() {
        let (p50, p99, p999) = (
            table.figure(variant, "p50 ms"),
            table.figure(variant, "p99 ms"),
            table.figure(variant, "p99.9 ms"),
        );
        assert!(p50 <= p99 && p99 <= p999, "{variant}: quantiles rise");
        assert_eq!(
            table.figure(variant, "after deadline"),
            0.0,
            "{variant}: nothing after the deadline"
        );
        let losers = table.figure(variant, "losers");
        assert_eq!(
            table.figure(variant, "ended on server"),
            losers,
            "{variant}: every loser's server scope ends"
        );
        assert!(
            table.figure(variant, "reset on server") * 2.0 >= losers,
            "{variant}: losers are reset while the server works on them"
        );
    }
    assert_eq!(
        (
            table.figure("none", "losers"),
            table.figure("none", "extra load")
        ),
        (0.0, 0.0),
        "no hedging, no losers"
    );
    let none = table.figure("none", "p99 ms");
    assert!(none >= 150.0, "without hedging the slow 5 % set the p99");
    // The demo's goals: ours cuts the p99 to at most 1/5, at most 10 % extra.
    assert!(
        table.figure("ours", "p99 ms") * 5.0 <= none,
        "hedging cuts the p99 to at most a fifth"
    );
    assert!(
        table.figure("ours", "extra load") <= 10.0,
        "at most 10 % extra load"
    );
}

#[test]
fn docs_retry_storm_table_holds_the_laws_bench_retry_storm_asserts() {
    let table = measured_table("bench retry-storm");
    let empty = Storm {
        rows: Vec::new(),
        capacity_rps: 0.0,
        offered_rps: 0.0,
        failing_share: retry_storm::FAILING_SHARE,
        deadline_ms: 100.0,
        window_s: 2.0,
    };
    table.has_the_labs_columns(&empty.outcome().columns);
    assert_eq!(
        table.labels(),
        ["no retries", "naive retries", "ours", "ours (retry budget)"],
        "{}: the lab's variants",
        table.name
    );
    for variant in table.labels() {
        let (calls, good, attempts) = (
            table.figure(variant, "calls"),
            table.figure(variant, "good"),
            table.figure(variant, "attempts"),
        );
        assert!(good <= calls && calls <= attempts, "{variant}");
        assert!(
            (table.figure(variant, "amplification") - attempts / calls).abs() <= 0.01,
            "{variant}: amplification is attempts per call"
        );
    }
    let amplification = |v: &str| table.figure(v, "amplification");
    assert!(amplification("no retries") <= 1.0);
    assert!(
        amplification("ours") <= 1.1,
        "throttling keeps retries at most 10 %"
    );
    assert!(
        amplification("ours (retry budget)") <= 1.12,
        "so does the budget"
    );
    assert!(
        amplification("naive retries") > amplification("ours"),
        "naive retries multiply the load"
    );
    assert!(
        table.figure("ours", "good") >= table.figure("naive retries", "good"),
        "ours delivers no less than the storm"
    );
    assert!(
        table.figure("ours", "goodput") >= 0.9,
        "the bench's goal: ours keeps 0.9 of capacity"
    );
}

#[test]
fn docs_amplification_table_holds_the_laws_experiment_amplification_asserts() {
    let table = measured_table("experiment amplification");
    let empty = Amplification {
        rows: Vec::new(),
        fan_in_ms: 0.0,
        runs: 0,
    };
    table.has_the_labs_columns(&empty.outcome().columns);
    let expected: Vec<(&str, &str)> = amplification::CASES
        .iter()
        .flat_map(|case| amplification::STACKS.map(|stack| (*case, stack)))
        .collect();
    assert_eq!(table.labels2(), expected, "{}: the lab's rows", table.name);
    let at = |case: &str, stack: &str, column: &str| figure(table.cell2(case, stack, column));
    let [
        outage,
        throttled,
        failures,
        fan_in,
        slow,
        replica_down,
        replica_slow,
        two_down,
        every_down,
    ] = amplification::CASES;
    assert_eq!(at(outage, "ours", "at C per root"), 3.0, "maxAttempts at C");
    assert_eq!(at(outage, "ours", "at A per root"), 1.0);
    assert_eq!(at(outage, "ours", "at B per root"), 1.0);
    assert_eq!(at(outage, "per-hop", "at C per root"), 27.0, "3 × 3 × 3");
    assert_eq!(at(outage, "edge only", "at C per root"), 3.0);
    assert!(at(throttled, "ours", "at C, first root call") <= 3.0);
    assert!(
        at(throttled, "per-hop", "at C, first root call")
            > at(throttled, "ours", "at C, first root call")
    );
    assert!(at(failures, "ours", "root OK share") >= 0.995);
    assert!(at(fan_in, "ours", "at C per root") <= 1.1);
    assert!(at(fan_in, "ours", "at C per root") < at(fan_in, "per-hop", "at C per root"));
    for stack in amplification::STACKS {
        assert!(at(slow, stack, "at C per root") <= 3.0, "{stack}");
    }
    assert_eq!(at(outage, "ours", "at C, first root call"), 3.0);
    assert!(at(throttled, "ours", "at C per root") <= 1.2);
    // Behind replicas the chain budget costs no call.
    assert!(at(replica_down, "ours", "root OK share") >= 0.99);
    assert!(
        at(replica_down, "ours", "at C per root") <= at(replica_down, "per-hop", "at C per root")
    );
    assert!(at(replica_slow, "ours", "root OK share") >= 0.98);
    assert!(at(two_down, "ours", "root OK share") >= at(two_down, "per-hop", "root OK share"));
    assert!(at(two_down, "ours", "at C per root") < at(two_down, "per-hop", "at C per root"));
    assert!(at(every_down, "ours", "at C per root") <= 3.3);
    assert_eq!(at(every_down, "ours", "root OK share"), 0.0);
}

#[test]
fn docs_metastable_table_holds_the_laws_experiment_metastable_asserts() {
    let table = measured_table("experiment metastable");
    let empty = Metastable {
        rows: Vec::new(),
        capacity_rps: 0.0,
        offered_rps: 0.0,
        timeline_s: [0.0; 3],
        runs: 0,
    };
    table.has_the_labs_columns(&empty.outcome().columns);
    let expected: Vec<(&str, &str)> = metastable::TRIGGERS
        .iter()
        .flat_map(|trigger| {
            metastable::STACKS
                .iter()
                .chain(&metastable::ABLATIONS)
                .map(|stack| (*trigger, *stack))
        })
        .collect();
    assert_eq!(table.labels2(), expected, "{}: the lab's rows", table.name);
    let recovery = |cell: &str| match median_of(cell) {
        "never" => f64::INFINITY,
        figure_ => figure(figure_),
    };
    for trigger in metastable::TRIGGERS {
        let cell = |stack: &str, column: &str| table.cell2(trigger, stack, column);
        for stack in metastable::STACKS.iter().chain(&metastable::ABLATIONS) {
            assert!(
                has_spread(cell(stack, "recovery s"))
                    && has_spread(cell(stack, "during / capacity left")),
                "{trigger} / {stack}: the median of the runs and their spread"
            );
        }
        assert!(recovery(cell("ours", "recovery s")) <= 1.0, "{trigger}");
        assert!(
            figure(cell("ours", "during / capacity left")) >= 0.85,
            "{trigger}"
        );
        assert!(
            figure(cell("ours", "work for callers gone")) <= 0.01,
            "{trigger}"
        );
        let retry_loop = "hand-written retry loop";
        assert!(
            figure(cell(retry_loop, "work for callers gone")) >= 0.1,
            "{trigger}: the loop's attempts fill the pool with work for callers gone"
        );
        assert!(
            recovery(cell(retry_loop, "recovery s")) > recovery(cell("ours", "recovery s")),
            "{trigger}: the loop stays down longer"
        );
        assert!(
            figure(cell("plain, no retries", "during / capacity left"))
                < 0.5 * figure(cell("ours", "during / capacity left")),
            "{trigger}: plain tonic without retries, FIFO, serves little during the trigger"
        );
        assert!(
            figure(cell("ours, bounded queue", "attempts/s during"))
                > figure(cell("ours", "attempts/s during")),
            "{trigger}: the bounded queue's refusals are retried"
        );
    }
}

#[test]
fn readme_quotes_the_metastable_figures_of_the_measured_table() {
    let table = measured_table("experiment metastable");
    let readme = read("README.md");
    let row = readme
        .lines()
        .find(|l| l.starts_with("| overload that outlives its trigger"))
        .expect("README.md must show the metastable row");
    let cells = cells(row);
    let recovery = |stack: &str| median_of(table.cell2("capacity", stack, "recovery s")).to_owned();
    let careful = format!("`tower::retry`: back in {} s", recovery("careful plain"));
    assert!(
        cells[1].contains("hand-written retry loop")
            && recovery("hand-written retry loop") == "never"
            && cells[1].contains(&careful),
        "README's baseline cell names each stack with the docs' figures: {:?}, want {careful:?}",
        cells[1]
    );
    let ours = format!("back in {} s", recovery("ours"));
    assert!(
        cells[2].starts_with(&ours),
        "README's cell for ours quotes the docs' figure: {:?}, want {ours:?}",
        cells[2]
    );
}

#[test]
fn docs_hosts_table_holds_the_laws_experiment_hosts_asserts() {
    // How much more than the link's latency a hop may gain on a loaded
    // two-core machine, as the experiment's own test allows.
    const SLACK_MS: f64 = 10.0;
    let table = measured_table("experiment hosts");
    let chain = table
        .columns
        .iter()
        .position(|c| c.starts_with("chain"))
        .expect("a column of the chain's hops");
    let im = table
        .columns
        .iter()
        .position(|c| c.starts_with("IM"))
        .expect("a column of the IM system's hops");
    let mut cases = Vec::new();
    for row in &table.rows {
        let one_way = figure(&row[0]);
        let compensated = row[1] != "none";
        cases.push((one_way as u64, compensated));
        let (hops_chain, hops_im) = (figures(&row[chain], ','), figures(&row[im], ','));
        assert_eq!(
            (hops_chain.len(), hops_im.len()),
            (3, 4),
            "every hop of the chain (3) and the IM system (4): {row:?}"
        );
        for excess in hops_chain.into_iter().chain(hops_im) {
            if compensated {
                assert!(
                    excess <= one_way / 2.0 && excess > -(one_way + COMPENSATED_EXCESS_MAX_MS),
                    "with compensation a hop gains at most half the one-way transit: {row:?}"
                );
            } else {
                assert!(
                    excess >= one_way - 0.01 && excess <= one_way + SLACK_MS,
                    "without compensation a hop gains the one-way transit: {row:?}"
                );
            }
        }
    }
    let expected: Vec<(u64, bool)> = ONE_WAY_MS
        .iter()
        .flat_map(|ms| [(*ms, false), (*ms, true)])
        .collect();
    assert_eq!(
        cases, expected,
        "each latency the experiment runs, without and with compensation"
    );
}

#[test]
fn docs_proxy_table_holds_the_laws_experiment_proxy_asserts() {
    let table = measured_table("experiment proxy");
    let nginx = table.columns[1].clone();
    let keepalive = table.columns[2].clone();
    assert!(
        nginx.starts_with("nginx") && keepalive.contains("keepalive"),
        "{}: nginx without and with upstream keepalive",
        table.name
    );
    let header = table.cell(&table.rows[0][0], &nginx);
    let sent_received: Vec<&str> = header.split('`').filter(|s| s.ends_with('u')).collect();
    assert!(
        sent_received.len() == 2 && sent_received[0] == sent_received[1],
        "nginx passes grpc-timeout on unchanged: {header}"
    );
    let sent =
        timeout_header::decode(sent_received[0].as_bytes()).expect("A sends a valid grpc-timeout");
    assert!(
        sent <= std::time::Duration::from_secs(1) && sent > std::time::Duration::from_millis(900),
        "A sends what is left of its 1 s budget: {header}"
    );
    assert_eq!(table.cell(&table.rows[0][0], &keepalive), "unchanged");
    for column in [&nginx, &keepalive] {
        let transit = figure(table.cell(&table.rows[1][0], column));
        assert!(
            (0.0..50.0).contains(&transit),
            "B's deadline is A's plus the transit through nginx: {transit}"
        );
    }
    for column in &table.columns[1..] {
        let cell = table.cell(&table.rows[2][0], column);
        let reset = figure(cell.split('(').next().expect("a figure"));
        assert!(
            reset < 100.0,
            "a cancel reaches B within milliseconds: {cell}"
        );
        if column != "A → B directly" {
            assert!(cell.contains("Abandoned"), "B's caller went away: {cell}");
        }
    }
}

#[test]
fn docs_edge_table_holds_the_laws_experiment_edge_asserts() {
    let table = measured_table("experiment edge");
    assert_eq!(
        table.labels(),
        edge::LAYERS,
        "{}: the lab's layers",
        table.name
    );
    let budget = edge::EDGE_BUDGET.as_secs_f64() * 1000.0;
    let gave_up = edge::CLIENT_GIVES_UP.as_secs_f64() * 1000.0;
    for layer in edge::LAYERS {
        let entry = table.figure(layer, "remaining on entry ms");
        assert!(
            entry <= budget && entry > budget - 100.0,
            "{layer} sees what is left of the edge's {budget} ms"
        );
        let stopped = table.figure(layer, "stopped at ms");
        assert!(
            stopped >= gave_up - 5.0 && stopped < gave_up + 1000.0,
            "{layer} stops when the client gives up"
        );
        assert_eq!(
            table.cell(layer, "stopped on the server"),
            "yes",
            "{layer} stops where it runs"
        );
    }
}

#[test]
fn docs_grpc_crate_table_holds_the_laws_experiment_grpc_crate_asserts() {
    let table = measured_table("experiment grpc-crate");
    let lab = GrpcCrate {
        rows: Vec::new(),
        cancels_not_reset: 0,
    }
    .outcome();
    table.has_the_labs_columns(&lab.columns);
    let pairs: Vec<(&str, &str)> = grpc_crate::CASES
        .iter()
        .flat_map(|case| {
            grpc_crate::CLIENTS
                .iter()
                .map(move |client| (*case, *client))
        })
        .collect();
    assert_eq!(table.labels2(), pairs, "{}: the lab's rows", table.name);
    let [deadline, chain, cancel] = grpc_crate::CASES;
    let wire = "grpc-timeout on the wire";
    // The crate alone: nothing sent, nothing kept.
    assert_eq!(table.cell2(deadline, "grpc", wire), "—");
    assert_eq!(table.cell2(deadline, "grpc", "status"), "OK");
    assert!(figure(table.cell2(deadline, "grpc", "elapsed ms")) >= 2000.0);
    for client in [
        "grpc + ours",
        "grpc + ours (tonic transport)",
        "tonic + ours",
    ] {
        let header = table.cell2(deadline, client, wire);
        let sent = timeout_header::decode(header.as_bytes()).expect("a valid header");
        assert!(
            sent <= grpc_crate::DEADLINE,
            "{client}: at most 500 ms: {header}"
        );
        assert_eq!(table.cell2(deadline, client, "status"), "DEADLINE_EXCEEDED");
        let elapsed = figure(table.cell2(deadline, client, "elapsed ms"));
        assert!(
            (500.0..1500.0).contains(&elapsed),
            "{client}: at the deadline"
        );
        assert_eq!(table.cell2(deadline, client, "server work stopped"), "yes");
        // The chain's budget drops by about each hop's 100 ms.
        let hops = figures(table.cell2(chain, client, "ms on entry A → B → C"), '→');
        assert!(hops[0] <= 1000.0, "{client}: A has at most the budget");
        for pair in hops.windows(2) {
            assert!(
                (100.0..400.0).contains(&(pair[0] - pair[1])),
                "{client}: {hops:?}"
            );
        }
    }
    // The crate's own transport waits for delayed ACKs on the way to C.
    let at_c = |client: &str| figures(table.cell2(chain, client, "ms on entry A → B → C"), '→')[2];
    assert!(
        at_c("grpc + ours") + 40.0 < at_c("grpc + ours (tonic transport)"),
        "the crate's transport hands C less than tonic's"
    );
    assert!(
        table
            .cell2(chain, "grpc", "ms on entry A → B → C")
            .ends_with("→ — → —"),
        "the crate alone carries no budget on"
    );
    for client in ["grpc + ours (tonic transport)", "tonic + ours"] {
        assert!(
            table
                .cell2(cancel, client, "server work stopped")
                .starts_with("yes"),
            "{client}: a cancel at the root stops C through calls over tonic's transport"
        );
    }
}

#[test]
fn docs_rapid_reset_table_holds_the_laws_experiment_rapid_reset_asserts() {
    let table = measured_table("experiment rapid-reset");
    let empty = RapidReset {
        rows: Vec::new(),
        flooding_ms: 0.0,
        cut_within: CUT_WITHIN,
        cpus_split: true,
    };
    table.has_the_labs_columns(&empty.outcome().columns);
    let server = table.column("server");
    let shown: Vec<(&str, &str)> = table
        .rows
        .iter()
        .map(|row| (row[0].as_str(), row[server].as_str()))
        .collect();
    let measured: Vec<(&str, &str)> = SHAPES
        .iter()
        .flat_map(|(shape, ..)| SERVERS.iter().map(move |server| (*shape, *server)))
        .collect();
    assert_eq!(
        shown, measured,
        "{}: every flood against every server",
        table.name
    );
    let cell = |shape: &str, of: &str, column: &str| -> &str {
        let column = table.column(column);
        let row = table
            .rows
            .iter()
            .find(|row| row[0] == shape && row[server] == of)
            .unwrap_or_else(|| panic!("{}: a row {shape}, {of}", table.name));
        &row[column]
    };
    // `—`: none.
    let count = |shape: &str, of: &str, column: &str| match cell(shape, of, column) {
        "—" => 0.0,
        shown => figure(shown),
    };
    for (shape, connections, rate) in SHAPES {
        for (ours, plain) in [("ours", "plain tonic"), ("ours, TLS", "plain tonic, TLS")] {
            assert!(
                cell(shape, ours, "cut").starts_with("GOAWAY ENHANCE_YOUR_CALM"),
                "{shape}, {ours}: says why it cuts a flood off"
            );
            let (cut, opened) = cell(shape, ours, "connections cut")
                .split_once(" of ")
                .expect("`N of M`");
            assert!(
                figure(cut) >= connections as f64 && figure(cut) <= figure(opened),
                "{shape}, {ours}: cuts every flooding connection off"
            );
            assert!(
                count(shape, ours, "streams before cut max") <= f64::from(CUT_WITHIN)
                    && count(shape, ours, "uncut") <= f64::from(CUT_WITHIN),
                "{shape}, {ours}: cuts a connection off within {CUT_WITHIN} streams"
            );
            assert!(
                figure(cell(shape, ours, "during ms"))
                    <= HONEST_P50_VS_PLAIN * figure(cell(shape, plain, "during ms")),
                "{shape}, {ours}: answers the honest client within {HONEST_P50_VS_PLAIN} × {plain}'s median"
            );
            assert!(
                figure(cell(shape, ours, "during ms"))
                    <= HONEST_P50_VS_BEFORE * figure(cell(shape, ours, "honest p50 before ms")),
                "{shape}, {ours}: answers the honest client within {HONEST_P50_VS_BEFORE} × its median before the flood"
            );
        }
        for of in SERVERS {
            assert_eq!(
                count(shape, of, "honest failures"),
                0.0,
                "{shape}, {of}: no honest call fails"
            );
        }
        let most =
            |of: &str| count(shape, of, "streams before cut max").max(count(shape, of, "uncut"));
        assert!(
            most("layer alone") <= 10.0 * most("plain tonic").max(1.0),
            "{shape}: the layer alone is no weaker than plain tonic"
        );
        if rate.is_none() {
            assert_eq!(
                (
                    cell(shape, "plain tonic", "uncut"),
                    cell(shape, "layer alone", "uncut")
                ),
                ("—", "—"),
                "{shape}: hyper's guard cuts off every connection of a flood faster than the accept loop"
            );
        }
    }
}

#[test]
fn docs_honest_resets_table_holds_the_laws_experiment_honest_resets_asserts() {
    use deadline_lab::experiments::honest_resets::{HonestResets, PATTERNS, SERVERS};
    let table = measured_table("experiment honest-resets");
    let empty = HonestResets {
        rows: Vec::new(),
        window_ms: 0.0,
        ours_never_harsher: true,
    };
    table.has_the_labs_columns(&empty.outcome().columns);
    let server = table.column("server");
    let shown: Vec<(&str, &str)> = table
        .rows
        .iter()
        .map(|row| (row[0].as_str(), row[server].as_str()))
        .collect();
    let measured: Vec<(&str, &str)> = PATTERNS
        .iter()
        .flat_map(|pattern| SERVERS.iter().map(move |server| (*pattern, *server)))
        .collect();
    assert_eq!(
        shown, measured,
        "{}: every pattern against every server",
        table.name
    );
    let failures = table.column("failures");
    let outcomes = table.column("outcomes");
    let row = |pattern: &str, of: &str| {
        table
            .rows
            .iter()
            .find(|row| row[0] == pattern && row[server] == of)
            .unwrap_or_else(|| panic!("{}: a row {pattern}, {of}", table.name))
    };
    for pattern in PATTERNS {
        let (ours, plain) = (row(pattern, "ours"), row(pattern, "plain tonic"));
        assert!(
            figure(&ours[failures]) <= figure(&plain[failures]),
            "{pattern}: ours fails no more calls than plain tonic"
        );
        let statuses = |row: &[String]| -> Vec<String> {
            row[outcomes]
                .split(", ")
                .filter_map(|o| o.rsplit_once(' ').map(|(name, _)| name.to_owned()))
                .collect()
        };
        let plain_statuses = statuses(plain);
        assert!(
            statuses(ours).iter().all(|s| plain_statuses.contains(s)
                || [
                    "OK",
                    "DEADLINE_EXCEEDED",
                    "client timeout",
                    "cancelled by the client"
                ]
                .contains(&s.as_str())),
            "{pattern}: ours sees no status plain tonic's calls did not"
        );
    }
}

#[test]
fn docs_soak_table_holds_the_laws_bench_soak_asserts() {
    let table = measured_table("bench soak");
    let measured = |figure_name: &str| table.cell(figure_name, "measured");
    let count = |figure_name: &str| figure(measured(figure_name));
    let answers: f64 = [
        "OK",
        "DEADLINE_EXCEEDED",
        "CANCELLED",
        "dropped by the client",
        "unexpected statuses",
    ]
    .map(count)
    .iter()
    .sum();
    assert_eq!(answers, count("calls"), "every call is answered once");
    let growth = count("rss growth after warm-up MB");
    assert!(
        (growth - (count("rss at end MB") - count("rss after warm-up MB"))).abs() <= 0.15,
        "the growth is the end less the warm-up"
    );
    assert_eq!(table.cell("rss growth after warm-up MB", "goal"), "<= 5");
    assert!(growth <= 5.0, "memory stays flat after the warm-up");
    let tasks = measured("tasks leaked");
    let (leaked, counts) = tasks.split_once(' ').expect("`0 (27 -> 27)`");
    let counts: Vec<f64> = counts
        .trim_matches(|c| c == '(' || c == ')')
        .split("->")
        .map(figure)
        .collect();
    assert!(
        figure(leaked) == 0.0 && counts[0] == counts[1],
        "no task leaks: {tasks}"
    );
    let connections: Vec<f64> = measured("connections to A, B, C")
        .split("->")
        .map(figure)
        .collect();
    assert_eq!(connections[0], connections[1], "no connection leaks");
    assert_eq!(count("permits held"), 0.0);
    assert_eq!(count("db connections held"), 0.0);
}

#[test]
fn docs_instruction_table_is_consistent_with_bench_instructions() {
    // Instruction counts are exact, but only for one binary: any change
    // moves them. So the table must name the bench's cases, and its
    // ratios and extras must be those of its own counts.
    let table = measured_table("bench instructions");
    let cases: Vec<&str> = InstructionCase::ALL.iter().map(|c| c.label()).collect();
    assert_eq!(table.labels(), cases, "{}: the bench's cases", table.name);
    for case in cases {
        let (ours, plain) = (table.figure(case, "ours"), table.figure(case, "plain"));
        assert!(ours > plain, "{case}: the layers cost instructions");
        assert_eq!(table.figure(case, "extra"), ours - plain, "{case}: extra");
        assert!(
            (table.figure(case, "ratio") - ours / plain).abs() <= 0.00005,
            "{case}: the ratio is ours / plain"
        );
    }
}

#[test]
fn docs_waterfall_shows_the_spans_experiment_waterfall_traces() {
    let block = measured_block("experiment waterfall");
    let live: Waterfall = timed(&["experiment", "waterfall", "--json"]);
    let names: BTreeSet<&str> = live.cases.iter().map(|c| c.case.as_str()).collect();
    // Rows are `case  span  start ms …`, columns two spaces apart or more;
    // each case ends with `→ client: STATUS after …`.
    let mut shown: Vec<(String, String)> = Vec::new();
    let mut statuses: Vec<String> = Vec::new();
    for line in &block {
        let columns: Vec<&str> = line
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        match columns.first() {
            Some(case) if names.contains(case) => {
                shown.push(((*case).to_owned(), columns[1].to_owned()));
            }
            Some(end) if end.starts_with("→ client: ") => {
                let status = end["→ client: ".len()..].split(' ').next();
                statuses.extend(status.map(str::to_owned));
            }
            _ => {}
        }
    }
    let traced: Vec<(String, String)> = live
        .cases
        .iter()
        .flat_map(|c| c.spans.iter().map(|s| (c.case.clone(), s.service.clone())))
        .collect();
    assert_eq!(shown, traced, "the spans of each case, in the lab's order");
    let answered: Vec<String> = live.cases.iter().map(|c| c.status.clone()).collect();
    assert_eq!(
        statuses, answered,
        "what the client was answered in each case"
    );
}

/// The names a metric family is exported under: counters end in `_total`.
fn exported_series(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .map(|rest| match rest.split_once(' ') {
            Some((name, "counter")) => format!("{name}_total"),
            Some((name, _)) => name.to_owned(),
            None => panic!("a TYPE line names a family and a type: {rest}"),
        })
        .collect()
}

/// Calls that make every series a `Metrics` handle has appear in its text
/// (a labelled family appears with its first series): through a server
/// layer and an admission layer of one permit and no queue, from clients
/// with the client layer, and the retry and hedging layer, on loopback.
async fn exercise_every_series(metrics: &Metrics) {
    const RETRIED: &str = r#"{"methodConfig": [{
        "name": [{"service": "grpc.health.v1.Health", "method": "Check"}],
        "retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
                        "backoffMultiplier": 1, "retryableStatusCodes": ["NOT_FOUND"]}}]}"#;
    const HEDGED: &str = r#"{"methodConfig": [{
        "name": [{"service": "grpc.health.v1.Health", "method": "Check"}],
        "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.5s",
                          "nonFatalStatusCodes": ["NOT_FOUND"]}}]}"#;
    let (_, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port must be free");
    let addr = listener.local_addr().expect("a bound address");
    tonic_deadline::detach(
        tonic::transport::Server::builder()
            .layer(ServerDeadlineLayer::new().metrics(metrics))
            .layer(AdmissionLayer::new(Admission::new(1).max_queue(0)).metrics(metrics))
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("a loopback address is an endpoint");
    let resilient = |config: &str| {
        let resilience = ResilienceLayer::from_service_config(config)
            .expect("the config must parse")
            .metrics(metrics);
        HealthClient::new(
            tower::ServiceBuilder::new()
                .layer(resilience)
                .layer(ClientDeadlineLayer::new().metrics(metrics))
                .service(ReadyChannel::lazy(&endpoint)),
        )
    };
    let mut plain = HealthClient::new(
        tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new().metrics(metrics))
            .service(ReadyChannel::lazy(&endpoint)),
    );
    let in_time = || Scope::background().with_timeout(Duration::from_secs(5));
    let check = |service: &str| HealthCheckRequest {
        service: service.to_owned(),
    };
    // An unknown service is NOT_FOUND: retried by one client, hedged by the
    // other.
    for config in [RETRIED, HEDGED] {
        let answer = in_time()
            .enter(resilient(config).check(check("unknown")))
            .await;
        assert_eq!(
            answer.expect_err("an unknown service is not found").code(),
            tonic::Code::NotFound
        );
    }
    Scope::background()
        .enter(plain.check(check("")))
        .await
        .expect("a call without a deadline is served");
    Scope::background()
        .with_timeout(Duration::ZERO)
        .enter(plain.check(check("")))
        .await
        .expect_err("an expired call is refused before it is sent");
    // The one permit, held by an open stream: a call behind it is refused,
    // with no queue to wait in.
    let watching = in_time()
        .enter(plain.watch(check("")))
        .await
        .expect("the server streams its health");
    Scope::background()
        .with_timeout(Duration::from_secs(5))
        .enter(plain.check(check("")))
        .await
        .expect_err("no permit, and no queue");
    drop(watching);
}

#[tokio::test]
async fn docs_metrics_page_lists_every_series_the_layers_export_and_no_other() {
    let page = read("docs/metrics.md");
    let lines: Vec<&str> = page.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with("| name |"))
        .expect("docs/metrics.md must list the series in a table `| name | …`");
    let table = Table::parse("docs/metrics.md".into(), &lines[header..]);
    let listed: BTreeSet<String> = table
        .rows
        .iter()
        .flat_map(|row| {
            row[0]
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    let metrics = Metrics::new();
    exercise_every_series(&metrics).await;
    let text = metrics.encode();
    let exported = exported_series(&text);
    assert_eq!(
        listed, exported,
        "docs/metrics.md lists every series a Metrics handle exports, and only those"
    );
    // The series and labels named anywhere on the page (the scrape shown,
    // the prose) are ones the layers export.
    let labels: BTreeSet<&str> = text
        .lines()
        .filter_map(|line| Some(line.split_once('{')?.1.split_once('}')?.0))
        .flat_map(|pairs| pairs.split(',').filter_map(|pair| pair.split_once('=')))
        .map(|(label, _)| label)
        .collect();
    for name in page
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("grpc_") || w.starts_with("tonic_deadline_"))
    {
        let family = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        assert!(
            exported.contains(name) || exported.contains(family) || labels.contains(name),
            "docs/metrics.md names {name}, which no layer exports"
        );
    }
}

/// The code of a block as a reader sees it: without rustdoc's hidden
/// lines (`# …`).
fn visible(block: &Fenced) -> String {
    block
        .lines
        .iter()
        .filter(|line| {
            let line = line.trim_start();
            line != "#" && !line.starts_with("# ")
        })
        .cloned()
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn code_in_the_readme_and_docs_is_compiled_by_the_crates_doc_tests() {
    // The crate's README and guide are its doc tests (`#![doc =
    // include_str!(…)]`): the code the other pages show must be theirs.
    let mut compiled = BTreeSet::new();
    for page in [
        "crates/tonic-deadline/README.md",
        "crates/tonic-deadline/docs/propagation.md",
    ] {
        for block in fenced(&read(page)) {
            let compiled_block = block.info.starts_with("rust")
                && !block.info.contains("ignore")
                && !block.info.contains("compile_fail");
            if compiled_block {
                compiled.insert(visible(&block));
            }
        }
    }
    // An excerpt (`rust,ignore`) quotes an example's code line for line.
    let examples: BTreeSet<String> = files("examples/src", ".rs")
        .into_iter()
        .flat_map(|path| {
            read(&path)
                .lines()
                .map(|l| l.trim().to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    let mut shown = 0;
    for page in ["README.md".to_owned(), "examples/README.md".to_owned()]
        .into_iter()
        .chain(docs_pages())
    {
        for block in fenced(&read(&page)) {
            if !block.info.starts_with("rust") {
                continue;
            }
            shown += 1;
            if block.info.contains("ignore") {
                for line in &block.lines {
                    let line = line.trim();
                    assert!(
                        line.is_empty() || line.starts_with("//") || examples.contains(line),
                        "{page}: an excerpt quotes an example; no example has {line:?}"
                    );
                }
            } else {
                let code = visible(&block);
                assert!(
                    compiled.contains(&code),
                    "{page}: this code must be the visible part of a doc test of \
                     crates/tonic-deadline/README.md or its guide:\n{code}"
                );
            }
        }
    }
    assert!(shown >= 3, "the README shows the quick start");
}

/// The subcommands `deadline-lab ARGS --help` lists.
fn subcommands(args: &[&str]) -> BTreeSet<String> {
    let out = Command::new(debug_lab())
        .args(args)
        .arg("--help")
        .output()
        .expect("deadline-lab must start");
    assert!(out.status.success(), "deadline-lab {args:?} --help");
    let help = String::from_utf8(out.stdout).expect("help is UTF-8");
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn docs_lab_table_shows_each_experiment_and_benchmark_as_it_declares_itself() {
    let page = read("docs/lab.md");
    let rows: Vec<String> = deadline_lab::catalog::entries()
        .map(deadline_lab::registry::Entry::doc_row)
        .collect();
    let expected = rows.join("\n");
    assert!(
        page.contains(&expected),
        "docs/lab.md's table of commands must hold, one after the other, the rows the lab's \
         entries declare (usage from their flags, and `Experiment::PRINTS`):\n{expected}"
    );
}

#[test]
fn docs_lab_page_lists_every_command_the_lab_has() {
    let page = read("docs/lab.md");
    let lines: Vec<&str> = page.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with("| command |"))
        .expect("docs/lab.md must list the commands in a table `| command | …`");
    let table = Table::parse("docs/lab.md".into(), &lines[header..]);
    let mut listed = BTreeSet::new();
    for label in table.labels() {
        let mut words = label.trim_matches('`').split_whitespace();
        let group = words.next().expect("a command");
        match words.next() {
            Some(names) if ["experiment", "bench", "serve"].contains(&group) => {
                listed.extend(names.split('|').map(|name| format!("{group} {name}")));
            }
            _ => {
                listed.insert(group.to_owned());
            }
        }
    }
    let mut commands = BTreeSet::new();
    for command in subcommands(&[]) {
        let nested = ["experiment", "bench", "serve"].contains(&command.as_str());
        if nested {
            commands.extend(
                subcommands(&[&command])
                    .into_iter()
                    .map(|name| format!("{command} {name}")),
            );
        } else {
            commands.insert(command);
        }
    }
    assert_eq!(
        listed, commands,
        "docs/lab.md lists every command of `deadline-lab`, and only those"
    );
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces
/// as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown page's headings.
fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .into_iter()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

/// The targets of a page's links, inline (`](target)`) and by reference
/// (`[name]: target`), outside code.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            targets.push(after[..end].to_owned());
            rest = &after[end..];
        }
        if let Some((name, target)) = line.split_once("]: ")
            && name.starts_with('[')
            && !name.contains(' ')
        {
            targets.push(target.trim().to_owned());
        }
    }
    targets
}

#[test]
fn every_relative_link_in_the_markdown_reaches_its_file_and_heading() {
    for page in pages() {
        let dir = Path::new(&page)
            .parent()
            .expect("a page is in a directory")
            .to_owned();
        for target in link_targets(&read(&page)) {
            // Web addresses, and rustdoc's paths to items (`crate::Scope`).
            if target.contains("://") || target.contains("::") || target.starts_with("mailto:") {
                continue;
            }
            let (path, heading) = match target.split_once('#') {
                Some((path, heading)) => (path, Some(heading)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                PathBuf::from(&page)
            } else {
                dir.join(path)
            };
            let full = root().join(&file);
            assert!(full.exists(), "{page}: the link {target} must reach a file");
            if let Some(heading) = heading {
                let text = std::fs::read_to_string(&full)
                    .unwrap_or_else(|e| panic!("{page}: {target} must be readable: {e}"));
                assert!(
                    anchors(&text).contains(heading),
                    "{page}: the link {target} must reach a heading of {}",
                    file.display()
                );
            }
        }
    }
}

/// The most the top-level README may hold: what a reader takes in within a
/// minute. The detail lives in `docs/`, behind links.
const README_MAX_CHARS: usize = 8_000;

/// The line by which the top-level README's first Rust code has begun.
const README_FIRST_RUST_BY_LINE: usize = 40;

/// The most a table cell may hold: one sentence.
const TABLE_CELL_MAX_CHARS: usize = 300;

#[test]
fn the_readme_is_read_in_a_minute() {
    let readme = read("README.md");
    let chars = readme.chars().count();
    assert!(
        chars < README_MAX_CHARS,
        "README.md must stay under {README_MAX_CHARS} characters, to be read in a minute; \
         it has {chars}: move the detail into a page of docs/ and link it"
    );
    let first_rust = readme
        .lines()
        .position(|line| line.starts_with("```rust"))
        .map(|index| index + 1)
        .expect("README.md must show the quick start's code in a ```rust block");
    assert!(
        first_rust <= README_FIRST_RUST_BY_LINE,
        "README.md's first ```rust block must start within its first \
         {README_FIRST_RUST_BY_LINE} lines, so that the code comes before the detail; \
         it starts on line {first_rust}"
    );
    assert!(
        link_targets(&readme)
            .iter()
            .any(|target| target.split('#').next() == Some("docs/chain-breaks.md")),
        "README.md must link docs/chain-breaks.md, where every way a chain breaks is told in full"
    );
}

#[test]
fn no_table_cell_in_the_readmes_or_docs_runs_over_300_characters() {
    for page in pages() {
        let text = read(&page);
        for row in prose(&text)
            .into_iter()
            .filter(|line| line.starts_with('|'))
            .map(cells)
        {
            for cell in &row {
                let chars = cell.chars().count();
                let start: String = cell.chars().take(60).collect();
                assert!(
                    chars <= TABLE_CELL_MAX_CHARS,
                    "{page}: a table cell is a sentence of at most {TABLE_CELL_MAX_CHARS} \
                     characters, its detail below the table or in a section it links to; \
                     the cell \"{start}…\" in the row {:?} has {chars}",
                    row[0]
                );
            }
        }
    }
}
