//! Job workers on a shared PostgreSQL queue: each job records its real
//! effect — a `start` row, `job_ms` of work, an `end` row — in a table
//! beside the queue's, so that runs can be counted from the database alone,
//! whichever host ran them.
//!
//! `deadline-lab serve jobs-worker --pg-url URL --name NAME` runs one worker
//! until killed; its first line is `ready NAME`.

use std::time::Duration;

use grpc_deadline_db::postgres::PgPool;
use grpc_deadline_db::postgres::tokio_postgres::Row;
use grpc_deadline_db::postgres::tokio_postgres::types::ToSql;
use grpc_deadline_jobs::postgres::{PgStore, PgStoreOptions};
use grpc_deadline_jobs::{Job, JobQueue, Worker};
use tonic_deadline::Scope;

/// Where the jobs live and how a worker runs them.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The PostgreSQL server.
    pub url: String,
    /// The queue's table; the effects go to `<table>_effects`.
    pub table: String,
    /// A claim stands this long without renewal.
    pub lease: Duration,
    /// How long each job works between its two effects.
    pub job_time: Duration,
}

impl Setup {
    /// Connects, creating the queue's table and the effects table if absent.
    ///
    /// # Errors
    ///
    /// The server cannot be reached or set up.
    pub async fn open(&self) -> anyhow::Result<(JobQueue<PgStore>, PgPool)> {
        let options = PgStoreOptions::default()
            .table(&self.table)
            .lease(self.lease);
        let store = PgStore::connect(&self.url, options).await?;
        let effects = PgPool::connect(&self.url, 2)?;
        query(
            &effects,
            &format!(
                    "CREATE TABLE IF NOT EXISTS {}_effects (job BIGINT NOT NULL, attempt INT NOT NULL, \
                     worker TEXT NOT NULL, phase TEXT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())",
                    self.table
                ),
                &[],
            )
            .await?;
        Ok((JobQueue::new(store), effects))
    }
}

/// One statement on a connection of `pool`, under the current scope.
///
/// # Errors
///
/// As [`PgConn::query`](grpc_deadline_db::postgres::PgConn::query).
pub async fn query(
    pool: &PgPool,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, grpc_deadline_db::Error> {
    pool.acquire(&Scope::current())
        .await?
        .query(sql, params)
        .await
}

async fn effect(
    pool: &PgPool,
    table: &str,
    job: &Job,
    worker: &str,
    phase: &str,
) -> Result<(), String> {
    let attempt = i32::try_from(job.attempt).unwrap_or(i32::MAX);
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

/// Starts a worker named `name` (the name its effects carry).
pub fn start_worker(
    setup: &Setup,
    queue: &JobQueue<PgStore>,
    effects: &PgPool,
    name: &str,
) -> Worker {
    let (pool, table, name, work) = (
        effects.clone(),
        setup.table.clone(),
        name.to_owned(),
        setup.job_time,
    );
    Worker::start(queue.clone(), move |job| {
        let (pool, table, name) = (pool.clone(), table.clone(), name.clone());
        async move {
            effect(&pool, &table, &job, &name, "start").await?;
            tokio::time::sleep(work).await;
            effect(&pool, &table, &job, &name, "end").await
        }
    })
}

/// Runs one worker until the process is stopped; prints `ready NAME` once
/// it is taking jobs.
///
/// # Errors
///
/// The server cannot be reached or set up.
pub async fn serve_worker(setup: Setup, name: &str) -> anyhow::Result<()> {
    let (queue, effects) = setup.open().await?;
    let worker = start_worker(&setup, &queue, &effects, name);
    println!("ready {name}");
    tokio::signal::ctrl_c().await?;
    worker.shutdown().await;
    Ok(())
}
