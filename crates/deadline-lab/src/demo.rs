//! `deadline-lab demo`: every experiment and benchmark in turn, with progress
//! on stderr, every table on stdout (the seed's figure beside ours), and a
//! self-contained HTML report.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::catalog;
use crate::page::{self, Skipped, Step};
use crate::registry::{self, Entry, Missing};
use crate::report::Outcome;

/// How many light steps ([`Experiment::LIGHT`]) run at once.
///
/// [`Experiment::LIGHT`]: crate::registry::Experiment::LIGHT
const LIGHT_AT_ONCE: usize = 8;

/// Runs the demo and writes the report to `report`.
///
/// Each run of consecutive light steps starts at once, each step in a
/// process of its own (at most [`LIGHT_AT_ONCE`] at a time); every other
/// step runs alone, in this process. Tables print in the demo's order.
/// A step whose optional tool is missing is skipped, saying how to get it.
/// A step that fails is reported (on stderr, in the report) and the demo
/// goes on; once the report is written, the demo fails if any step did.
///
/// # Errors
///
/// When a step failed, or the report cannot be written.
pub async fn run(report: &Path) -> anyhow::Result<()> {
    println!("deadline-lab demo: every experiment on real tonic services over loopback\n");
    let started = Instant::now();
    let steps: Vec<&'static Entry> = catalog::demo_steps().collect();
    let total = steps.len();
    let permits = Arc::new(Semaphore::new(LIGHT_AT_ONCE));
    let mut done = Vec::with_capacity(total);
    let mut skipped = Vec::new();
    let mut next = 0;
    while next < total {
        let together = if steps[next].light {
            steps[next..].iter().take_while(|e| e.light).count()
        } else {
            1
        };
        let mut batch = Vec::with_capacity(together);
        for &entry in &steps[next..next + together] {
            batch.push(match entry.missing_tool().await {
                Some(missing) => Start::Skipped(missing),
                None if together > 1 => {
                    Start::InChild(tonic_deadline::detach(in_child(entry, permits.clone())))
                }
                None => Start::Here,
            });
        }
        for (i, (&entry, start)) in steps[next..].iter().zip(batch).enumerate() {
            let name = entry.step();
            eprintln!("[{:>2}/{total}] {name} …", next + i + 1);
            let (outcome, seconds) = match start {
                Start::Skipped(missing) => {
                    println!("{name}: skipped ({missing}; {})\n", missing.why);
                    skipped.push(Skipped {
                        name,
                        needs: missing.to_string(),
                    });
                    continue;
                }
                Start::InChild(task) => {
                    let (outcome, seconds, logged) = task.await?;
                    eprint!("{logged}");
                    (outcome, seconds)
                }
                Start::Here => {
                    let t = Instant::now();
                    let outcome = registry::quietly(entry.run_in_demo())
                        .await
                        .map_err(|e| format!("{e:#}"));
                    (outcome, t.elapsed().as_secs_f64())
                }
            };
            match &outcome {
                Ok(outcome) => {
                    eprintln!("        {name}: done in {seconds:.1} s");
                    println!("{}", outcome.table());
                }
                Err(e) => {
                    eprintln!("        {name}: FAILED after {seconds:.1} s: {e}");
                    println!("{name}: failed: {e}\n");
                }
            }
            done.push(Step {
                name,
                outcome,
                seconds,
            });
        }
        next += together;
    }
    let wall = started.elapsed().as_secs_f64();
    let path = write(report, &page::render_with_skipped(&done, &skipped, wall))?;
    let failed: Vec<&str> = done
        .iter()
        .filter(|s| s.outcome.is_err())
        .map(|s| s.name.as_str())
        .collect();
    println!("demo finished in {wall:.1} s");
    if !skipped.is_empty() {
        let names: Vec<&str> = skipped.iter().map(|s| s.name.as_str()).collect();
        println!("steps skipped: {}", names.join(", "));
    }
    println!("report: {}", path.display());
    anyhow::ensure!(
        failed.is_empty(),
        "{} of {total} steps failed: {}",
        failed.len(),
        failed.join(", ")
    );
    Ok(())
}

/// How a step of a batch is run.
enum Start {
    /// A tool it needs is missing.
    Skipped(Missing),
    /// In a child process, already started: its table (or why it failed),
    /// how long it took and what it logged.
    InChild(JoinHandle<(Result<Outcome, String>, f64, String)>),
    /// Alone, in this process, when its turn comes.
    Here,
}

/// What `deadline-lab demo-step NAME` prints: the step's result as
/// `--json` prints it, and the line on the warnings it provoked.
#[derive(Debug, Serialize, Deserialize)]
struct Printed {
    result: serde_json::Value,
    warnings: Option<String>,
}

/// Runs `entry` as a demo step in a child process once a permit is free:
/// its table (or why it failed), how long it took, and what the child
/// logged (with `RUST_LOG`, the warnings the table counts), which the demo
/// prints when the step's turn comes.
async fn in_child(
    entry: &'static Entry,
    permits: Arc<Semaphore>,
) -> (Result<Outcome, String>, f64, String) {
    let _permit = permits.acquire_owned().await;
    let t = Instant::now();
    let outcome = async {
        let exe = crate::process::lab_exe()?;
        let (printed, logged) =
            crate::process::run_logged(&exe, &["demo-step", &entry.step()]).await?;
        let printed: Printed = serde_json::from_str(&printed)?;
        let mut outcome = entry.outcome(printed.result)?;
        outcome.notes.extend(printed.warnings);
        anyhow::Ok((outcome, logged))
    }
    .await;
    let seconds = t.elapsed().as_secs_f64();
    match outcome {
        Ok((outcome, logged)) => (Ok(outcome), seconds, logged),
        Err(e) => (Err(format!("{e:#}")), seconds, String::new()),
    }
}

/// `deadline-lab demo-step NAME`: runs the demo's step `NAME` (`chain`,
/// `bench soak`) as the demo runs it and prints its result and the warnings
/// it provoked as one JSON object: how the demo runs its light steps side
/// by side, each in a process of its own.
///
/// # Errors
///
/// When there is no such step, or it fails.
pub async fn step(name: &str) -> anyhow::Result<()> {
    let entry =
        catalog::by_step(name).ok_or_else(|| anyhow::anyhow!("no demo step called {name:?}"))?;
    let quiet = crate::logs::Quiet::start();
    let outcome = entry.run_in_demo().await?;
    let printed = Printed {
        result: outcome.json,
        warnings: quiet.summary(),
    };
    println!("{}", serde_json::to_string(&printed)?);
    Ok(())
}

/// Writes `html` to `path`, creating its folder; returns the absolute path.
///
/// # Errors
///
/// When the folder or the file cannot be written.
pub fn write(path: &Path, html: &str) -> anyhow::Result<PathBuf> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, html)?;
    Ok(std::path::absolute(path)?)
}
