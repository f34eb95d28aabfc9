//! Ownership transfer survives a crash: the process is killed with
//! SIGKILL mid-way; after a restart no accepted job is lost, and no job runs
//! twice unless it says it is idempotent.
//!
//! The test re-runs its own binary as the child process
//! (`sigkill::child_role` with `JOBS_CHILD_DB` set), so the crash is a
//! real process dying.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::time::Duration;

use grpc_deadline_jobs::{JobQueue, JobState, Worker};

const JOBS: u64 = 60;

/// Appends one line to the effects log and syncs it: the job's real effect.
fn effect(log: &Path, line: &str) -> Result<(), String> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| e.to_string())?;
    writeln!(file, "{line}").map_err(|e| e.to_string())?;
    file.sync_all().map_err(|e| e.to_string())
}

fn start_worker(queue: &JobQueue, log: &Path) -> Worker {
    let log = log.to_owned();
    Worker::start(queue.clone(), move |job| {
        let log = log.clone();
        async move {
            effect(&log, &format!("start {}", job.id))?;
            tokio::time::sleep(Duration::from_millis(30)).await;
            effect(&log, &format!("end {}", job.id))
        }
    })
}

/// The child process: `work` accepts jobs (printing `accepted <id>` only after
/// each is durable, as a handler would reply) while a worker runs them;
/// `drain` restarts, runs what is left, and exits.
async fn child(db: &Path, log: &Path, mode: &str) {
    let queue = JobQueue::open(db).expect("the queue opens");
    let worker = start_worker(&queue, log);
    if mode == "work" {
        for i in 0..JOBS {
            let id = queue
                .submit("effect", &i.to_le_bytes(), i % 2 == 0)
                .await
                .expect("accepted");
            println!("accepted {id}");
            std::io::stdout().flush().expect("stdout");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Killed before this point by the parent.
        tokio::time::sleep(Duration::from_secs(30)).await;
    } else {
        queue.wait_idle().await;
        worker.shutdown().await;
        println!("drained");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_role() {
    if let (Ok(db), Ok(log), Ok(mode)) = (
        std::env::var("JOBS_CHILD_DB"),
        std::env::var("JOBS_CHILD_LOG"),
        std::env::var("JOBS_CHILD_MODE"),
    ) {
        child(Path::new(&db), Path::new(&log), &mode).await;
        return;
    }
    // Run in-process (not as a child): one job, handed over and done.
    let dir = tempfile::tempdir().expect("temp dir");
    let queue = JobQueue::open(dir.path().join("jobs.db")).expect("opens");
    let log = dir.path().join("effects.log");
    let id = queue.submit("effect", b"", false).await.expect("accepted");
    let worker = start_worker(&queue, &log);
    queue.wait_idle().await;
    worker.shutdown().await;
    assert_eq!(queue.state(id).await.expect("state"), Some(JobState::Done));
    let effects = std::fs::read_to_string(&log).expect("effects");
    assert_eq!(effects, format!("start {id}\nend {id}\n"));
}

fn spawn_child(db: &Path, log: &Path, mode: &str) -> std::process::Child {
    crate::child::spawn(
        "sigkill::child_role",
        &[
            ("JOBS_CHILD_DB", db.as_os_str()),
            ("JOBS_CHILD_LOG", log.as_os_str()),
            ("JOBS_CHILD_MODE", mode.as_ref()),
        ],
    )
}

#[test]
fn sigkill_mid_way_loses_no_accepted_job_and_runs_none_twice_unless_idempotent() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("jobs.db");
    let log = dir.path().join("effects.log");

    let mut child = spawn_child(&db, &log, "work");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut accepted = BTreeSet::new();
    let mut lines = BufReader::new(stdout).lines();
    // Kill it mid-way: half the jobs accepted, the worker busy with a job.
    while accepted.len() < (JOBS / 2) as usize {
        let line = lines
            .next()
            .expect("the child must keep accepting jobs")
            .expect("readable stdout");
        if let Some(id) = line.strip_prefix("accepted ") {
            accepted.insert(id.parse::<i64>().expect("an id"));
        }
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    // Whatever it printed before dying was accepted too.
    for line in lines.map_while(Result::ok) {
        if let Some(id) = line.strip_prefix("accepted ") {
            accepted.insert(id.parse::<i64>().expect("an id"));
        }
    }

    let drain = spawn_child(&db, &log, "drain");
    let out = drain
        .wait_with_output()
        .expect("the restarted worker exits");
    assert!(
        out.status.success(),
        "the restarted worker must drain cleanly"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("drained"));

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let queue = JobQueue::open(&db).expect("reopens");
    let jobs: BTreeMap<i64, (JobState, u32)> = runtime
        .block_on(queue.list())
        .expect("list")
        .into_iter()
        .map(|(id, state, attempts)| (id, (state, attempts)))
        .collect();
    let effects = std::fs::read_to_string(&log).expect("effects");
    let count = |what: &str, id: i64| {
        effects
            .lines()
            .filter(|l| *l == format!("{what} {id}"))
            .count()
    };

    assert!(accepted.len() >= (JOBS / 2) as usize);
    let mut interrupted = 0;
    for &id in &accepted {
        let (state, attempts) = jobs
            .get(&id)
            .copied()
            .unwrap_or_else(|| panic!("accepted job {id} was lost"));
        let idempotent = (id - 1) % 2 == 0; // ids start at 1, payload i = id - 1
        match state {
            JobState::Done => assert!(count("end", id) >= 1, "job {id} is done but had no effect"),
            JobState::Interrupted => {
                assert!(
                    !idempotent,
                    "an idempotent job {id} must be run again, not abandoned"
                );
                // The kill may land after the worker claimed the job and
                // before its handler wrote a line: at most once, then.
                assert!(
                    count("start", id) <= 1,
                    "job {id} was interrupted, never rerun: started {} times",
                    count("start", id)
                );
                interrupted += 1;
            }
            other => panic!("accepted job {id} ended {other:?} after the drain"),
        }
        if !idempotent {
            assert!(
                count("start", id) <= 1,
                "non-idempotent job {id} ran {} times",
                count("start", id)
            );
            assert!(
                attempts <= 1,
                "non-idempotent job {id} was attempted {attempts} times"
            );
        }
    }
    // One worker runs one job at a time: at most one job can have been caught
    // mid-way by the kill, and it was either interrupted (non-idempotent) or
    // run again (idempotent).
    let rerun = accepted
        .iter()
        .filter(|&&id| count("start", id) > 1)
        .count();
    assert!(
        interrupted + rerun <= 1,
        "only the job running at the kill may be interrupted or rerun: {interrupted} + {rerun}"
    );
    assert!(
        accepted.len() < JOBS as usize,
        "the kill must land before every job was accepted"
    );
    let done = jobs.values().filter(|(s, _)| *s == JobState::Done).count();
    assert!(
        done >= accepted.len() - 1,
        "all but at most one accepted job ran to completion"
    );
}
