//! The job queue on PostgreSQL, shared by worker processes: three
//! workers take jobs from one table; one is killed with SIGKILL in the middle
//! of a non-idempotent job, another in the middle of an idempotent one. No
//! accepted job is lost, the non-idempotent job is never run again, the
//! idempotent one is run again by the survivor once the lease has expired.
//!
//! Needs a live server at `TONIC_DEADLINE_PG_URL` (scripts/test-all starts
//! one). The workers are this test binary run again
//! (`postgres::child_role` with `JOBS_PG_CHILD_TABLE` set), so each
//! crash is a real process dying.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::Child;
use std::time::Duration;

use grpc_deadline::Scope;
use grpc_deadline_db::postgres::PgPool;
use grpc_deadline_db::postgres::tokio_postgres::Row;
use grpc_deadline_db::postgres::tokio_postgres::types::ToSql;
use grpc_deadline_jobs::postgres::{PgStore, PgStoreOptions};
use grpc_deadline_jobs::{Job, JobQueue, JobState, Worker};
use tokio::time::Instant;

const JOBS: i64 = 60;
const JOB_TIME: Duration = Duration::from_millis(100);
const LEASE: Duration = Duration::from_millis(600);

/// The address of the test server (`scripts/postgres` starts one and
/// exports it); without one the test fails, saying so.
fn url() -> String {
    std::env::var("TONIC_DEADLINE_PG_URL").expect(
        "TONIC_DEADLINE_PG_URL must name a live PostgreSQL server: run scripts/test-all, \
         or source scripts/postgres first (these tests are built by the feature postgres-tests)",
    )
}

fn options(table: &str) -> PgStoreOptions {
    PgStoreOptions::default().table(table).lease(LEASE)
}

/// One statement on a connection of `pool`, under the current scope.
async fn query(
    pool: &PgPool,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, grpc_deadline_db::Error> {
    pool.acquire(&Scope::current())
        .await?
        .query(sql, params)
        .await
}

/// The job's real effect, a row per phase: what the checks count.
async fn effect(
    pool: &PgPool,
    table: &str,
    job: &Job,
    worker: &str,
    phase: &str,
) -> Result<(), String> {
    let attempt = job.attempt as i32;
    query(
        pool,
        &format!(
            "INSERT INTO {table}_effects (job, attempt, worker, phase) VALUES ($1, $2, $3, $4)"
        ),
        &[&job.id, &attempt, &worker, &phase],
    )
    .await
    .map(drop)
    .map_err(|e| e.to_string())
}

async fn setup(table: &str) -> (JobQueue<PgStore>, PgPool) {
    let store = PgStore::connect(&url(), options(table))
        .await
        .expect("the store must connect and create its table");
    let pool = PgPool::connect(&url(), 2).expect("the effects pool");
    query(&pool,
        &format!(
            "CREATE TABLE IF NOT EXISTS {table}_effects (job BIGINT, attempt INT, worker TEXT, phase TEXT)"
        ),
        &[],
    )
    .await
    .expect("the effects table");
    (JobQueue::new(store), pool)
}

fn start_worker(queue: &JobQueue<PgStore>, pool: &PgPool, table: &str, name: &str) -> Worker {
    let (pool, table, name) = (pool.clone(), table.to_owned(), name.to_owned());
    Worker::start(queue.clone(), move |job| {
        let (pool, table, name) = (pool.clone(), table.clone(), name.clone());
        async move {
            effect(&pool, &table, &job, &name, "start").await?;
            tokio::time::sleep(JOB_TIME).await;
            effect(&pool, &table, &job, &name, "end").await
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_role() {
    if let (Ok(table), Ok(name)) = (
        std::env::var("JOBS_PG_CHILD_TABLE"),
        std::env::var("JOBS_PG_CHILD_NAME"),
    ) {
        let (queue, pool) = setup(&table).await;
        let _worker = start_worker(&queue, &pool, &table, &name);
        println!("ready");
        // Killed by the parent; a bound in case the parent died first.
        tokio::time::sleep(Duration::from_secs(60)).await;
        return;
    }
    // Run in-process (not as a child): one job, handed over and done.
    let table = format!("jobs_pg_inproc_{}", std::process::id());
    let (queue, pool) = setup(&table).await;
    let id = queue.submit("effect", b"", false).await.expect("accepted");
    let worker = start_worker(&queue, &pool, &table, "w");
    queue.wait_idle().await;
    worker.shutdown().await;
    assert_eq!(queue.state(id).await.expect("state"), Some(JobState::Done));
    let rows = query(
        &pool,
        &format!("SELECT phase FROM {table}_effects WHERE job = $1 ORDER BY phase DESC"),
        &[&id],
    )
    .await
    .expect("effects");
    let phases: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(
        phases,
        ["start", "end"],
        "the job must have run once, whole"
    );
}

/// A worker process, killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_worker(table: &str, name: &str) -> Process {
    let mut child = crate::child::spawn(
        "postgres::child_role",
        &[
            ("JOBS_PG_CHILD_TABLE", table.as_ref()),
            ("JOBS_PG_CHILD_NAME", name.as_ref()),
        ],
    );
    let stdout = child.stdout.take().expect("piped stdout");
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.ends_with("ready"));
    assert!(ready, "worker {name} must report ready");
    Process(child)
}

/// The job `worker` is in the middle of (started, not ended), if any, and
/// whether it is idempotent.
async fn mid_job(pool: &PgPool, table: &str, worker: &str) -> Option<(i64, bool)> {
    let rows = query(
        pool,
        &format!(
            "SELECT e.job, j.idempotent FROM {table}_effects e JOIN {table} j ON j.id = e.job
                 WHERE e.worker = $1 AND e.phase = 'start' AND NOT EXISTS (
                     SELECT 1 FROM {table}_effects f
                     WHERE f.job = e.job AND f.attempt = e.attempt AND f.phase = 'end')"
        ),
        &[&worker],
    )
    .await
    .expect("effects readable");
    rows.first().map(|r| (r.get(0), r.get(1)))
}

/// Waits (bounded) until `worker` is mid-way through a job whose
/// idempotence is `idempotent`, then kills it; returns the job.
async fn kill_mid_job(
    child: &mut Process,
    pool: &PgPool,
    table: &str,
    worker: &str,
    idempotent: bool,
) -> i64 {
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some((job, kind)) = mid_job(pool, table, worker).await
            && kind == idempotent
        {
            child.0.kill().expect("SIGKILL");
            child.0.wait().expect("reaped");
            return job;
        }
        assert!(
            Instant::now() < give_up,
            "worker {worker} never ran a job with idempotent = {idempotent}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_workers_lose_no_job_and_rerun_only_the_idempotent_one() {
    let table = format!("jobs_pg_sigkill_{}", std::process::id());
    let (queue, pool) = setup(&table).await;
    let mut accepted = BTreeMap::new();
    for i in 0..JOBS {
        let idempotent = i % 2 == 0;
        let id = queue
            .submit("effect", &i.to_le_bytes(), idempotent)
            .await
            .expect("accepted");
        accepted.insert(id, idempotent);
    }
    let mut w1 = spawn_worker(&table, "w1");
    let mut w2 = spawn_worker(&table, "w2");
    let _w3 = spawn_worker(&table, "w3");

    let killed_plain = kill_mid_job(&mut w1, &pool, &table, "w1", false).await;
    let killed_idempotent = kill_mid_job(&mut w2, &pool, &table, "w2", true).await;

    // The survivor drains the queue, recovering both jobs once their lease
    // has expired.
    let drained = Scope::background().with_timeout(Duration::from_secs(60));
    drained
        .run(queue.wait_idle())
        .await
        .expect("the survivor must drain the queue within 60 s");

    let jobs: BTreeMap<i64, (JobState, u32)> = queue
        .list()
        .await
        .expect("list")
        .into_iter()
        .map(|(id, state, attempts)| (id, (state, attempts)))
        .collect();
    let rows = query(
        &pool,
        &format!("SELECT job, worker, phase FROM {table}_effects"),
        &[],
    )
    .await
    .expect("effects");
    let mut starts: BTreeMap<i64, u32> = BTreeMap::new();
    let mut ends: BTreeMap<i64, u32> = BTreeMap::new();
    let mut workers = BTreeSet::new();
    for row in &rows {
        let (job, worker, phase): (i64, String, String) = (row.get(0), row.get(1), row.get(2));
        workers.insert(worker);
        let counter = if phase == "start" {
            &mut starts
        } else {
            &mut ends
        };
        *counter.entry(job).or_default() += 1;
    }

    for (&id, &idempotent) in &accepted {
        let (state, attempts) = *jobs
            .get(&id)
            .unwrap_or_else(|| panic!("accepted job {id} was lost"));
        let started = starts.get(&id).copied().unwrap_or(0);
        match state {
            JobState::Done => assert!(
                ends.get(&id).copied().unwrap_or(0) >= 1,
                "job {id} is done but had no effect"
            ),
            JobState::Interrupted => assert_eq!(
                id, killed_plain,
                "only the killed non-idempotent job may be interrupted"
            ),
            other => panic!("accepted job {id} ended {other:?} after the drain"),
        }
        if !idempotent {
            assert!(started <= 1, "non-idempotent job {id} ran {started} times");
            assert!(
                attempts <= 1,
                "non-idempotent job {id} was attempted {attempts} times"
            );
        } else if id != killed_idempotent {
            assert_eq!(
                started, 1,
                "idempotent job {id} ran {started} times with no crash"
            );
        }
    }
    assert_eq!(
        jobs.get(&killed_plain).map(|j| j.0),
        Some(JobState::Interrupted),
        "the non-idempotent job killed mid-way must be interrupted, not run again"
    );
    assert_eq!(starts.get(&killed_plain), Some(&1));
    assert_eq!(
        jobs.get(&killed_idempotent).copied(),
        Some((JobState::Done, 2)),
        "the idempotent job killed mid-way must be run again and finish"
    );
    assert_eq!(starts.get(&killed_idempotent), Some(&2));
    assert_eq!(
        workers.len(),
        3,
        "every worker must have taken jobs from the shared table: {workers:?}"
    );
    let _ = query(&pool, &format!("DROP TABLE {table}, {table}_effects"), &[]).await;
}
