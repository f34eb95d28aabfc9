//! Long-running resources: the soak leaves nothing behind, and jobs handed
//! to PostgreSQL survive a worker killed mid-job.

use deadline_lab::bench::soak::Soak;

use crate::common::timed as lab;

/// In its own lab process, so that resident memory and the task count are the
/// soak's alone. Eight calls in flight, not the default 32: a debug build
/// with 32 queued behind C's permits answers none of its 1–50 ms deadlines
/// in time, and the soak must see answers as well as expiries.
#[test]
fn soak_leaks_no_task_permit_or_connection_and_memory_stays_flat() {
    let soak: Soak = lab(&[
        "bench",
        "soak",
        "--calls",
        "20000",
        "--max-seconds",
        "300",
        "--concurrency",
        "8",
        "--json",
    ]);
    assert_eq!(soak.calls, 20_000, "every call must be made: {soak:?}");
    assert!(soak.settled, "in-flight work must drain after each phase");
    assert_eq!(
        soak.tasks_leaked, 0,
        "no task may outlive the calls: {soak:?}"
    );
    assert_eq!(
        soak.connections_end, soak.connections_after_warmup,
        "the connections must stay the same (none closed by a protocol guard)"
    );
    assert_eq!(
        soak.permits_held, 0,
        "every admission permit must be released"
    );
    assert_eq!(
        soak.db_conns_held, 0,
        "every SQLite connection must be back in the pool"
    );
    assert_eq!(
        soak.unexpected_status, 0,
        "only OK, DEADLINE_EXCEEDED and CANCELLED may answer: {:?}",
        soak.unexpected
    );
    let deadline = soak.statuses.get("DEADLINE_EXCEEDED").copied().unwrap_or(0);
    let cancelled = soak.statuses.get("CANCELLED").copied().unwrap_or(0);
    let ok = soak.statuses.get("OK").copied().unwrap_or(0);
    assert!(
        deadline > 0 && cancelled > 0 && ok > 0 && soak.client_drops > 0,
        "the soak must exercise deadlines, cancels, drops and answers: {:?}",
        soak.statuses
    );
    assert!(
        soak.children_spawned > 0,
        "C must have spawned children under request scopes"
    );
    assert!(
        soak.rss_growth_after_warmup_mb <= 5.0,
        "resident memory must stay flat after the warm-up: {:.1} MB -> {:.1} MB",
        soak.rss_after_warmup_mb,
        soak.rss_end_mb
    );
}

#[cfg(feature = "postgres-tests")]
#[test]
fn jobs_experiment_loses_nothing_when_a_worker_is_killed_mid_job() {
    use deadline_lab::experiments::jobs::JobsRun;
    std::env::var("TONIC_DEADLINE_PG_URL").expect(
        "TONIC_DEADLINE_PG_URL must point at a PostgreSQL server (scripts/postgres starts one)",
    );
    let run: JobsRun = lab(&["experiment", "jobs", "--json"]);
    assert_eq!(run.backend, "postgres");
    assert_eq!((run.workers, run.killed), (2, 1));
    assert_eq!(run.accepted, 40);
    assert_eq!(run.lost, 0, "no accepted job may be lost: {run:?}");
    assert_eq!(
        run.duplicated_non_idempotent, 0,
        "no non-idempotent job may run twice"
    );
    assert!(
        !run.killed_job.idempotent,
        "the kill must land on a non-idempotent job"
    );
    assert_eq!(
        (run.killed_job.state.as_str(), run.killed_job.starts),
        ("interrupted", 1),
        "the killed non-idempotent job must be interrupted, not run again"
    );
    assert_eq!(run.done + run.interrupted, run.accepted);
    assert!(
        run.killed_job.recovered_after_ms >= run.lease_ms * 0.5,
        "the job must not be recovered before its lease could expire: {run:?}"
    );
    for (worker, place) in &run.placement {
        assert!(
            place.starts_with("namespace "),
            "worker {worker} must run in a network namespace of its own (the suite runs as root): {place}"
        );
    }
    assert!(
        run.starts_by_worker.len() == 2,
        "both workers must have taken jobs from the shared table: {:?}",
        run.starts_by_worker
    );
}
