//! Workers that are real processes, so that a crash is a process dying:
//! this test binary run again, running one test that plays the worker.

use std::ffi::OsStr;
use std::process::{Child, Command, Stdio};

/// Runs the test `test` (its path in this binary, `module::name`) in a
/// process of its own, with `env` set (which tells it to play its part),
/// its stdout piped to the caller.
pub(crate) fn spawn(test: &str, env: &[(&str, &OsStr)]) -> Child {
    Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|err| panic!("{test} must start as a process of its own: {err}"))
}
