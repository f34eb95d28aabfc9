//! `deadline-lab demo`: every experiment and benchmark in turn, with progress
//! on stderr, every table on stdout (the seed's figure beside ours), and a
//! self-contained HTML report.

use std::path::{Path, PathBuf};

use tokio::time::Instant;

use crate::html::{self, Skipped, Step};
use crate::registry;

/// Runs the demo and writes the report to `report`.
///
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
    let total = registry::demo_steps().count();
    let mut done = Vec::with_capacity(total);
    let mut skipped = Vec::new();
    for (i, entry) in registry::demo_steps().enumerate() {
        let name = entry.step();
        eprintln!("[{:>2}/{total}] {name} …", i + 1);
        if let Some(missing) = entry.missing_tool().await {
            println!("{name}: skipped ({missing}; {})\n", missing.why);
            skipped.push(Skipped {
                name,
                needs: missing.to_string(),
            });
            continue;
        }
        let t = Instant::now();
        let outcome = registry::quietly(entry.run_in_demo())
            .await
            .map_err(|e| format!("{e:#}"));
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
            name,
            outcome,
            seconds,
        });
    }
    let wall = started.elapsed().as_secs_f64();
    let path = write(report, &html::render_with_skipped(&done, &skipped, wall))?;
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
