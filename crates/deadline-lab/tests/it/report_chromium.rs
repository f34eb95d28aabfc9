//! The demo's HTML report renders in a real browser: headless Chromium loads
//! it from a file (no network) and every chart is laid out with its bars.
//!
//! Needs Debian's `chromium`, so it is only built with the `chromium-tests`
//! feature (`scripts/test-all` installs the browser and enables it through
//! `--all-features`); there a missing browser fails this test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use deadline_lab::page::{self, Step};
use deadline_lab::registry::Experiment;
use deadline_lab::report::Outcome;
use deadline_lab::{bench, experiments};

/// A result's printed table, as the demo makes it.
fn table<E: Experiment>(result: anyhow::Result<E>) -> anyhow::Result<Outcome> {
    result.map(|result| result.outcome())
}

fn chromium() -> Option<PathBuf> {
    let candidates = ["chromium", "chromium-browser", "google-chrome"];
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .flat_map(|dir| candidates.iter().map(move |c| dir.join(c)))
        .chain([PathBuf::from("/usr/bin/chromium")])
        .find(|p| p.is_file())
}

fn headless(browser: &Path, profile: &Path) -> Command {
    let mut cmd = Command::new(browser);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--virtual-time-budget=5000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_charts_render_in_headless_chromium() {
    let browser = chromium().expect(
        "the report test needs chromium on PATH or at /usr/bin/chromium: \
         install it with `apt-get update && apt-get install -y chromium` (scripts/test-all does)",
    );

    // Real measurements for the charts (the quick experiments), in this
    // process: the report renders their outcomes.
    let alone = crate::common::alone_async().await;
    let mut steps = Vec::new();
    let (chain, im, drift, propagation, handler) = tokio::join!(
        experiments::chain::measure(Duration::from_millis(100)),
        experiments::im::measure(),
        experiments::drift::measure(),
        experiments::propagation::measure(),
        experiments::handler::measure(),
    );
    let shop = experiments::shop::measure().await;
    let waterfall = experiments::waterfall::run_exe(crate::common::debug_lab()).await;
    // Short windows: the plot needs every variant at every load, not a
    // precise figure.
    let overload = bench::overload::measure(bench::overload::Load {
        window: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    // What follows times nothing: the other runs may go on meanwhile.
    drop(alone);
    for (name, outcome) in [
        ("waterfall", table(waterfall)),
        ("chain", table(chain)),
        ("im", table(im)),
        ("drift", table(drift)),
        ("propagation", table(propagation)),
        ("handler", table(handler)),
        ("shop", table(shop)),
        ("bench overload", table(overload)),
    ] {
        steps.push(Step {
            name: name.to_owned(),
            outcome: outcome.map_err(|e| format!("{e:#}")),
            seconds: 0.0,
        });
    }
    for step in &steps {
        assert!(
            step.outcome.is_ok(),
            "{} must run: {:?}",
            step.name,
            step.outcome
        );
    }
    let page = page::render(&steps, 1.0);
    let dir = std::env::temp_dir().join(format!("deadline-lab-report-{}", std::process::id()));
    let profile = dir.join("profile");
    std::fs::create_dir_all(&profile).expect("a temp folder");
    let report = dir.join("report.html");
    std::fs::write(&report, &page).expect("the report must be written");

    let out = headless(&browser, &profile)
        .arg("--dump-dom")
        .arg(format!("file://{}", report.display()))
        .output()
        .expect("chromium must start");
    let dom = String::from_utf8_lossy(&out.stdout);
    let expected_charts = page.matches("<svg class=\"chart\"").count();
    assert!(
        expected_charts >= 7,
        "the report must draw every chart: {expected_charts}"
    );
    assert!(
        dom.contains(&format!(
            "data-charts-rendered=\"{expected_charts}/{expected_charts}\""
        )),
        "every chart must be laid out with its bars in Chromium (status {}): {}",
        out.status,
        dom.lines()
            .find(|l| l.contains("data-charts-rendered"))
            .unwrap_or("no data-charts-rendered attribute: the page script did not run")
    );
    for chart in [
        "chain",
        "im-normal",
        "im-stall",
        "drift",
        "completions",
        "shop",
        "waterfall-normal",
        "waterfall-route-stalls",
        "overload",
    ] {
        assert!(
            dom.contains(&format!("data-chart=\"{chart}\"")),
            "the {chart} chart must be in the rendered page"
        );
    }
    // The overload plot: a line per variant with a point per offered load,
    // laid out by the browser.
    let levels = bench::overload::Load::default().levels.len();
    let plot = dom
        .split("<svg ")
        .find(|svg| svg.contains("data-chart=\"overload\""))
        .and_then(|svg| svg.split('>').next())
        .expect("the overload plot must be in the rendered page");
    assert!(
        plot.contains(&format!("data-points=\"{}\"", 4 * levels)),
        "the browser must lay out 4 variants × {levels} loads as points: <svg {plot}>"
    );
    assert!(
        !plot.contains("data-content=\"0x0\""),
        "the plot's content must have a size: <svg {plot}>"
    );

    let shot = dir.join("report.png");
    let status = headless(&browser, &profile)
        .arg("--window-size=1100,2400")
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", report.display()))
        .status()
        .expect("chromium must start");
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(
        status.success() && size > 10_000,
        "a screenshot of the report must be taken ({size} bytes)"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
