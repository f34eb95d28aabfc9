//! What the test modules share: the lab binaries, and one lock for the runs
//! that measure time.
//!
//! The tests of this binary run in parallel threads on a two-core machine.
//! A run that times things (an experiment, a bench, a system whose budgets
//! are read back) takes [`alone`] or [`alone_async`] first, so that no other
//! run's processes are part of its latency; and it runs the release build of
//! the lab, whose figures are the ones the lab reports (a debug build spends
//! milliseconds on what the release build does in microseconds).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde::de::DeserializeOwned;

/// Held by every run that measures time, one at a time. A `tokio` mutex so
/// that async tests can hold it across `.await`; it does not poison, so one
/// failed test does not fail the rest.
static TIMED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The lock of the timed runs, for a synchronous test.
pub(crate) fn alone() -> tokio::sync::MutexGuard<'static, ()> {
    TIMED.blocking_lock()
}

/// The lock of the timed runs, for an async test.
pub(crate) async fn alone_async() -> tokio::sync::MutexGuard<'static, ()> {
    TIMED.lock().await
}

/// Held by every run that counts instructions under callgrind, one at a
/// time. Their counts do not depend on the machine's load, so they run
/// beside the timed runs rather than after them, at the lowest CPU
/// priority ([`lowest_priority`]): they take only what the timed runs
/// leave.
#[cfg(feature = "callgrind-tests")]
static COUNTED: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The lock of the runs that count instructions.
#[cfg(feature = "callgrind-tests")]
pub(crate) fn counting() -> std::sync::MutexGuard<'static, ()> {
    COUNTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `program`, to be run at the lowest CPU priority (`nice -n 19`): on a
/// busy machine it waits for a free core instead of taking one from a run
/// that measures time.
#[cfg(feature = "callgrind-tests")]
pub(crate) fn lowest_priority(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut nice = Command::new("nice");
    nice.args(["-n", "19"]).arg(program);
    nice
}

/// The debug build cargo made for this test binary.
///
/// Cargo names it in `CARGO_BIN_EXE_deadline-lab`, except when the workspace
/// is compiled through a wrapper (`scripts/test-all` compiles it through
/// clippy): then it is the `deadline-lab` beside the directory this test
/// binary was built into, where cargo puts it in either case.
pub(crate) fn debug_lab() -> &'static Path {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    FOUND.get_or_init(|| match option_env!("CARGO_BIN_EXE_deadline-lab") {
        Some(path) => PathBuf::from(path),
        None => {
            let test = std::env::current_exe().expect("the test binary has a path");
            let lab = test
                .parent()
                .and_then(Path::parent)
                .expect("cargo builds tests into <profile>/deps")
                .join(format!("deadline-lab{}", std::env::consts::EXE_SUFFIX));
            assert!(
                lab.exists(),
                "cargo builds the lab beside its tests: {} is missing",
                lab.display()
            );
            lab
        }
    })
}

/// The release build of the lab, built once per test process (`cargo build
/// --release -p deadline-lab --bins` in this workspace, by plain rustc; a
/// build that is up to date costs a second).
///
/// `DEADLINE_LAB_RELEASE_TARGET_DIR` names the target directory to build it
/// in: `scripts/test-all` builds the release lab there while other tests
/// run, so this build finds it done, or waits for that build's lock.
pub(crate) fn release_lab() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let target = std::env::var_os("DEADLINE_LAB_RELEASE_TARGET_DIR")
            .or_else(|| std::env::var_os("CARGO_TARGET_DIR"))
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let status = Command::new(cargo)
            .args([
                "build",
                "--release",
                "-p",
                "deadline-lab",
                "--bins",
                "--target-dir",
            ])
            .arg(&target)
            // Built as a user builds it for the demo: with rustc, not the
            // linting wrapper the suite gives the workspace's debug build
            // (whose lints need no second, optimised pass).
            .env_remove("RUSTC_WORKSPACE_WRAPPER")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo must start to build the release lab");
        assert!(
            status.success(),
            "the release build of deadline-lab must succeed"
        );
        target.join("release/deadline-lab")
    })
}

/// Runs `exe ARGS`, which must succeed and print one JSON line, and reads
/// the line as the experiment's result type.
pub(crate) fn json<T: DeserializeOwned>(exe: &Path, args: &[&str]) -> T {
    let out = Command::new(exe)
        .args(args)
        .output()
        .expect("deadline-lab must start");
    assert!(
        out.status.success(),
        "deadline-lab {args:?} must succeed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("stdout must be UTF-8");
    assert_eq!(
        stdout.trim().lines().count(),
        1,
        "--json must print exactly one line: {stdout}"
    );
    serde_json::from_str(&stdout).expect("--json must print the experiment's result type")
}

/// Runs `ARGS` (an experiment or a bench with `--json`) on the release lab,
/// alone, and reads its result.
pub(crate) fn timed<T: DeserializeOwned>(args: &[&str]) -> T {
    let lab = release_lab();
    let _alone = alone();
    json(lab, args)
}

/// What the lab's servers keep of `budget_ms` for their answer's way back,
/// in ms: the server layer's default with the ledger
/// (`server::default_reply_reserve`). A server answers that much before
/// the deadline it was given, and its handler's scope ends then.
pub(crate) fn reserve_ms(budget_ms: f64) -> f64 {
    tonic_deadline::server::default_reply_reserve(std::time::Duration::from_secs_f64(
        budget_ms / 1e3,
    ))
    .as_secs_f64()
        * 1e3
}
