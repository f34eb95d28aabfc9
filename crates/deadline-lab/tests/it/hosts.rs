//! Across hosts: every service in a network namespace of its own, with
//! one-way latency on every link.
//!
//! Needs root and iproute2, so it is only built with the `netns-tests`
//! feature (`scripts/test-all` installs iproute2 and enables it through
//! `--all-features`); there, a machine where namespaces cannot be made fails
//! these tests.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use deadline_lab::experiments::hosts::{COMPENSATED_EXCESS_MAX_MS, Hosts, ONE_WAY_MS};
use deadline_lab::netns::namespaces_of;

/// How much more than the link's latency a hop may gain on this loaded
/// two-core machine (processes and proxies on the way).
const SLACK_MS: f64 = 10.0;

/// The release lab, for the runs that measure transit (built on a blocking
/// thread: the first build takes minutes).
async fn lab() -> Command {
    #[allow(clippy::disallowed_methods)] // builds the release lab, no request
    let exe = tokio::task::spawn_blocking(crate::common::release_lab)
        .await
        .expect("the release lab must be built");
    Command::new(exe)
}

#[tokio::test]
async fn deadline_excess_is_the_one_way_transit_and_compensation_removes_it() {
    let mut lab = lab().await;
    let _alone = crate::common::alone_async().await;
    let child = lab
        .args(["experiment", "hosts", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("deadline-lab must start");
    let pid = child.id();
    let out = child.wait_with_output().expect("deadline-lab must finish");
    assert!(
        out.status.success(),
        "experiment hosts must run here (as root, with iproute2): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hosts: Hosts =
        serde_json::from_slice(&out.stdout).expect("--json must print the Hosts result");

    assert_eq!(
        hosts.rows.len(),
        2 * ONE_WAY_MS.len() * (3 + 4),
        "every hop of the chain (3) and the IM system (4), at each latency, without and with compensation"
    );
    for system in ["chain", "im"] {
        for ms in ONE_WAY_MS {
            for compensation in [false, true] {
                assert!(
                    hosts.rows.iter().any(|r| r.system == system
                        && r.one_way_ms == ms
                        && r.compensation == compensation),
                    "{system} at {ms} ms, compensation {compensation}, must be measured"
                );
            }
        }
    }
    for row in &hosts.rows {
        assert!(
            row.namespace.contains(&format!("-{pid}-")) && row.namespace.ends_with(&row.hop),
            "each hop must run in its own namespace named after the run's pid: {row:?}"
        );
        let one_way = row.one_way_ms as f64;
        if row.compensation {
            // What compensation leaves is processing (in
            // processes that share two cores with the rest of the suite): the
            // best call shows it without the machine in the way, the median
            // must still have lost most of the transit.
            assert!(
                row.deadline_excess_min_ms <= COMPENSATED_EXCESS_MAX_MS,
                "with compensation a hop must gain at most {COMPENSATED_EXCESS_MAX_MS} ms over its parent in its best call: {row:?}"
            );
            // The links' delay is a userspace proxy when netem is missing:
            // its timers run late on a loaded machine, in both runs alike.
            // What the same hop gained beyond the one-way transit without
            // compensation is that lateness (and processing), measured in
            // this run; compensation must remove at least half the transit
            // on top of it.
            let late = hosts
                .rows
                .iter()
                .find(|r| {
                    !r.compensation
                        && r.system == row.system
                        && r.hop == row.hop
                        && r.one_way_ms == row.one_way_ms
                })
                .map_or(0.0, |r| (r.deadline_excess_ms - one_way).max(0.0));
            assert!(
                row.deadline_excess_ms <= one_way / 2.0 + late,
                "and at most half the one-way transit in the median call, beyond the \
                 {late:.2} ms the uncompensated run gained over the transit: {row:?}"
            );
            // Half a round trip measured on a busy machine can exceed the
            // true one-way transit; losing it a second time would not.
            assert!(
                row.deadline_excess_ms > -(one_way + COMPENSATED_EXCESS_MAX_MS),
                "and must not lose the transit twice: {row:?}"
            );
        } else {
            assert!(
                row.deadline_excess_ms >= one_way - 0.01,
                "without compensation a hop gains at least the one-way latency: {row:?}"
            );
            assert!(
                row.deadline_excess_ms <= one_way + SLACK_MS,
                "and not much more: {row:?}"
            );
        }
    }
    let distinct: std::collections::BTreeSet<&str> =
        hosts.rows.iter().map(|r| r.namespace.as_str()).collect();
    assert_eq!(
        distinct.len(),
        2 * ONE_WAY_MS.len() * (3 + 4) / 2,
        "one namespace per service and latency"
    );
    assert!(
        namespaces_of(pid)
            .await
            .expect("ip netns list must work")
            .is_empty(),
        "every namespace the run made must be gone"
    );
}

#[tokio::test]
async fn an_interrupted_run_removes_its_namespaces() {
    let mut lab = lab().await;
    let _alone = crate::common::alone_async().await;
    let child = lab
        .args(["experiment", "hosts", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("deadline-lab must start");
    let pid = child.id();
    let mut made = Vec::new();
    for _ in 0..200 {
        made = namespaces_of(pid).await.expect("ip netns list must work");
        if made.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        !made.is_empty(),
        "the run must have made namespaces before it is interrupted"
    );
    let raw = rustix::process::Pid::from_raw(i32::try_from(pid).expect("a pid fits i32"))
        .expect("a live pid");
    rustix::process::kill_process(raw, rustix::process::Signal::INT)
        .expect("SIGINT must be delivered");
    let out = child.wait_with_output().expect("deadline-lab must finish");
    assert!(
        !out.status.success(),
        "an interrupted run must not report success"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("interrupted"),
        "it must say it was interrupted: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        namespaces_of(pid).await.expect("ip netns list must work"),
        Vec::<String>::new(),
        "an interrupted run must remove every namespace it made"
    );
}

#[test]
fn without_root_the_experiment_fails_with_a_clear_message() {
    // As an unprivileged user (this test runs as root, as CI does). The
    // build may sit under a directory only root can enter (a checkout in
    // `mktemp -d`), so nobody runs a copy in a directory it can read.
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("the directory must be opened to every user");
    let lab = dir.path().join("deadline-lab");
    std::fs::copy(crate::common::debug_lab(), &lab).expect("the lab must be copied");
    let out = Command::new("runuser")
        .args(["-u", "nobody", "--"])
        .arg(&lab)
        .args(["experiment", "hosts", "--json"])
        .output()
        .expect("runuser must start (util-linux)");
    assert!(
        !out.status.success(),
        "without root the experiment must fail, never skip"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("needs root") && stderr.contains("ip netns"),
        "the failure must say what it needs: {stderr}"
    );
    assert!(out.stdout.is_empty(), "and must print no result");
}
