//! `deadline-lab demo`: every experiment and benchmark in turn, with progress
//! on stderr, every table on stdout (the seed's figure beside ours), and a
//! self-contained HTML report.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use crate::html::{self, Step};
use crate::report::Outcome;
use crate::{bench, experiments};

type Run = Pin<Box<dyn Future<Output = anyhow::Result<Outcome>>>>;

/// The demo's soak: long enough to see a flat memory line, short enough to
/// keep the demo brief (`bench soak` runs 10^6).
const DEMO_SOAK_CALLS: u64 = 30_000;

fn steps() -> Vec<(&'static str, Run)> {
    vec![
        ("wire", Box::pin(experiments::wire::run())),
        (
            "chain",
            Box::pin(experiments::chain::run(Duration::from_millis(100))),
        ),
        ("propagation", Box::pin(experiments::propagation::run())),
        ("expired", Box::pin(experiments::expired::run())),
        ("handler", Box::pin(experiments::handler::run())),
        ("drift", Box::pin(experiments::drift::run())),
        ("im", Box::pin(experiments::im::run())),
        ("waterfall", Box::pin(experiments::waterfall::run_child())),
        ("shop", Box::pin(experiments::shop::run())),
        ("orders", Box::pin(experiments::orders::run())),
        ("db-cancel", Box::pin(experiments::db_cancel::run())),
        ("seams", Box::pin(experiments::seams::run())),
        ("edge", Box::pin(experiments::edge::run())),
        ("hosts", Box::pin(experiments::hosts::run())),
        ("proxy", Box::pin(experiments::proxy::run())),
        ("faults", Box::pin(experiments::faults::run())),
        ("retry", Box::pin(experiments::retry::run())),
        ("hedge", Box::pin(experiments::hedge::run())),
        (
            "jobs",
            Box::pin(async { experiments::jobs::run().await?.outcome() }),
        ),
        (
            "bench overhead",
            Box::pin(bench::overhead::run(bench::overhead::Load {
                rounds: 4,
                ..Default::default()
            })),
        ),
        (
            "bench cancel",
            Box::pin(bench::cancel::run_on_own_runtime(1000, 1)),
        ),
        (
            "bench overload",
            Box::pin(bench::overload::run(bench::overload::Load::default())),
        ),
        (
            "bench soak",
            Box::pin(async {
                let load = bench::soak::Load {
                    calls: DEMO_SOAK_CALLS,
                    max: Duration::from_secs(60),
                    ..Default::default()
                };
                bench::soak::run_on_own_runtime(load).await?.outcome()
            }),
        ),
        (
            "bench retry-storm",
            Box::pin(bench::retry_storm::run(bench::overload::Load {
                window: Duration::from_secs(2),
                ..Default::default()
            })),
        ),
    ]
}

/// Runs the demo and writes the report to `report`; returns its path.
///
/// A step that fails is reported (on stderr, in the report) and the demo goes
/// on; the demo fails only if the report cannot be written.
///
/// # Errors
///
/// When the report cannot be written.
pub async fn run(report: &Path) -> anyhow::Result<()> {
    println!("deadline-lab demo: every experiment on real tonic services over loopback\n");
    let started = Instant::now();
    let steps = steps();
    let total = steps.len();
    let mut done = Vec::with_capacity(total);
    for (i, (name, run)) in steps.into_iter().enumerate() {
        eprintln!("[{:>2}/{total}] {name} …", i + 1);
        let t = Instant::now();
        let outcome = run.await.map_err(|e| format!("{e:#}"));
        let seconds = t.elapsed().as_secs_f64();
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
            name: name.to_owned(),
            outcome,
            seconds,
        });
    }
    let wall = started.elapsed().as_secs_f64();
    let path = write(report, &html::render(&done, wall))?;
    let failed: Vec<&str> = done
        .iter()
        .filter(|s| s.outcome.is_err())
        .map(|s| s.name.as_str())
        .collect();
    println!("demo finished in {wall:.1} s");
    if !failed.is_empty() {
        println!("steps that failed: {}", failed.join(", "));
    }
    println!("report: {}", path.display());
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
