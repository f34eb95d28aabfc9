//! The PostgreSQL store: one table shared by workers on any number of hosts.
//!
//! - **Claim**: `UPDATE … WHERE id = (SELECT id … WHERE state = 'queued'
//!   ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)`: two workers never take
//!   the same job, and neither waits for the other's row lock.
//! - **Lease**: a claimed job carries `lease_until`, set from the *database
//!   server's* clock (`clock_timestamp()`), so workers on hosts whose clocks
//!   disagree still agree on when a lease expires. The worker renews it every
//!   third of its length while the job runs.
//! - **Recovery**: before each claim, jobs still `running` whose lease has
//!   expired are re-queued if idempotent and marked `interrupted` otherwise.
//!   A worker renewing at the same moment either wins the row lock first
//!   (the lease is then fresh again and the row no longer matches) or finds
//!   the claim gone and stops the job.
//! - **End**: recorded only if the claim still stands (same worker, same
//!   attempt), so a worker that was paused past its lease cannot overwrite
//!   another worker's attempt.
//!
//! Every statement is committed when its future returns (autocommit); with
//! PostgreSQL's default `synchronous_commit = on`, an accepted job survives
//! the database server crashing too.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use grpc_deadline_jobs::postgres::{PgStore, PgStoreOptions};
//! use grpc_deadline_jobs::{JobQueue, Worker};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let options = PgStoreOptions::default().lease(Duration::from_secs(10));
//! let store = PgStore::connect("postgresql://postgres@127.0.0.1:5432/postgres", options).await?;
//! let queue = JobQueue::new(store);
//! queue.submit("send-receipt", b"order 42", false).await?;
//! // On every worker host, the same table:
//! let worker = Worker::start(queue.clone(), |job| async move { Ok(()) });
//! queue.wait_idle().await;
//! worker.shutdown().await;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::time::Duration;

use super::{Job, JobId, JobState, Store};
use grpc_deadline::Scope;
use grpc_deadline_db::Error;
use grpc_deadline_db::postgres::PgPool;

/// How long one statement of the queue may take before it is stopped.
const STATEMENT_LIMIT: Duration = Duration::from_secs(10);

/// How a [`PgStore`] is set up: the defaults, changed step by step.
///
/// ```
/// use std::time::Duration;
/// use grpc_deadline_jobs::postgres::PgStoreOptions;
/// let options = PgStoreOptions::default().table("receipts").lease(Duration::from_secs(10));
/// # let _ = options;
/// ```
#[derive(Debug, Clone)]
pub struct PgStoreOptions {
    table: String,
    lease: Duration,
    connections: usize,
}

impl PgStoreOptions {
    /// The table the jobs live in (created if absent): lowercase letters,
    /// digits and `_`, starting with a letter or `_`, at most 63 bytes.
    /// Default `tonic_deadline_jobs` (the name it had before the crate
    /// was renamed, kept so that an existing queue is found).
    pub fn table(mut self, name: &str) -> Self {
        self.table = name.to_owned();
        self
    }

    /// How long a claim stands without renewal (default 30 s). A dead
    /// worker's job is recovered this long after its last renewal; a live
    /// worker renews every third of it.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Connections in the store's pool (default 4).
    pub fn connections(mut self, connections: usize) -> Self {
        self.connections = connections;
        self
    }
}

impl Default for PgStoreOptions {
    fn default() -> Self {
        Self {
            table: "tonic_deadline_jobs".to_owned(),
            lease: Duration::from_secs(30),
            connections: 4,
        }
    }
}

/// Jobs in one PostgreSQL table, shared by every worker that connects to
/// it. See the [module docs](self). Cheap to clone.
///
/// ```no_run
/// # async fn run() -> Result<(), grpc_deadline_db::Error> {
/// use grpc_deadline_jobs::JobQueue;
/// use grpc_deadline_jobs::postgres::{PgStore, PgStoreOptions};
/// let options = PgStoreOptions::default().table("receipts");
/// let store = PgStore::connect("postgres://localhost/app", options).await?;
/// let queue = JobQueue::new(store);
/// # let _ = queue;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    table: String,
    lease: Duration,
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("table", &self.table)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// Whether `name` can be used as a table name without quoting.
fn valid_table(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
        && name.len() <= 63
}

fn state_of(name: &str) -> Result<JobState, Error> {
    JobState::parse(name).ok_or_else(|| Error::database(format!("unknown job state {name:?}")))
}

impl PgStore {
    /// Connects to `url` and creates the table and its index if absent
    /// (under an advisory lock, so that workers starting together do not
    /// race).
    ///
    /// # Errors
    ///
    /// An invalid table name or lease, or the database could not be reached
    /// or set up.
    pub async fn connect(url: &str, options: PgStoreOptions) -> Result<Self, Error> {
        if !valid_table(&options.table) {
            return Err(Error::database(format!(
                "invalid table name {:?}",
                options.table
            )));
        }
        if options.lease < Duration::from_millis(30) {
            return Err(Error::database("a lease must be at least 30 ms"));
        }
        let store = Self {
            pool: PgPool::connect(url, options.connections.max(1))?,
            table: options.table,
            lease: options.lease,
        };
        let t = &store.table;
        let mut conn = store.pool.acquire(&store.scope()).await?;
        conn.begin().await?;
        conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[t])
            .await?;
        conn.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                 id BIGSERIAL PRIMARY KEY,
                 kind TEXT NOT NULL,
                 payload BYTEA NOT NULL,
                 idempotent BOOLEAN NOT NULL,
                 state TEXT NOT NULL DEFAULT 'queued',
                 attempts INTEGER NOT NULL DEFAULT 0,
                 worker TEXT,
                 lease_until TIMESTAMPTZ,
                 error TEXT
             );
             CREATE INDEX IF NOT EXISTS {t}_state ON {t} (state, id);"
        ))
        .await?;
        conn.commit().await?;
        Ok(store)
    }

    /// The table the jobs live in.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The pool the store's statements run on (for leak checks).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The scope of one statement of the queue's own: not the caller's (a
    /// write, once started, completes), but bounded.
    fn scope(&self) -> Scope {
        Scope::background().with_timeout(STATEMENT_LIMIT)
    }

    fn lease_secs(&self) -> f64 {
        self.lease.as_secs_f64()
    }

    /// Re-queues (idempotent) or interrupts (others) the running jobs whose
    /// lease has expired; returns how many.
    async fn recover(&self) -> Result<u64, Error> {
        let t = &self.table;
        let mut conn = self.pool.acquire(&self.scope()).await?;
        // Under READ COMMITTED a row renewed concurrently is re-checked
        // after its lock is released: its fresh lease no longer matches.
        let recovered = conn
            .execute(
                &format!(
                    "UPDATE {t} SET state = CASE WHEN idempotent THEN 'queued' ELSE 'interrupted' END,
                         error = 'lease expired: its worker stopped renewing'
                     WHERE state = 'running' AND lease_until < clock_timestamp()"
                ),
                &[],
            )
            .await?;
        if recovered > 0 {
            tracing::warn!(recovered, table = %t, "jobs recovered from an expired lease");
        }
        Ok(recovered)
    }
}

impl Store for PgStore {
    async fn insert(
        &self,
        kind: String,
        payload: Vec<u8>,
        idempotent: bool,
    ) -> Result<JobId, Error> {
        let t = &self.table;
        let mut conn = self.pool.acquire(&self.scope()).await?;
        let rows = conn
            .query(
                &format!(
                    "INSERT INTO {t} (kind, payload, idempotent) VALUES ($1, $2, $3) RETURNING id"
                ),
                &[&kind, &payload, &idempotent],
            )
            .await?;
        rows.first()
            .map(|r| r.get(0))
            .ok_or_else(|| Error::database("INSERT returned no id"))
    }

    async fn state(&self, id: JobId) -> Result<Option<JobState>, Error> {
        let t = &self.table;
        let mut conn = self.pool.acquire(&self.scope()).await?;
        let rows = conn
            .query(&format!("SELECT state FROM {t} WHERE id = $1"), &[&id])
            .await?;
        rows.first().map(|r| state_of(r.get(0))).transpose()
    }

    async fn list(&self) -> Result<Vec<(JobId, JobState, u32)>, Error> {
        let t = &self.table;
        let mut conn = self.pool.acquire(&self.scope()).await?;
        let rows = conn
            .query(
                &format!("SELECT id, state, attempts FROM {t} ORDER BY id"),
                &[],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let attempts: i32 = r.get(2);
                Ok((r.get(0), state_of(r.get(1))?, attempts.max(0) as u32))
            })
            .collect()
    }

    async fn pending(&self) -> Result<u64, Error> {
        let t = &self.table;
        let mut conn = self.pool.acquire(&self.scope()).await?;
        let rows = conn
            .query(
                &format!("SELECT count(*) FROM {t} WHERE state IN ('queued', 'running')"),
                &[],
            )
            .await?;
        let n: i64 = rows.first().map_or(0, |r| r.get(0));
        Ok(n.max(0) as u64)
    }

    async fn claim(&self, worker: &str) -> Result<Option<Job>, Error> {
        self.recover().await?;
        let t = &self.table;
        let mut conn = self.pool.acquire(&self.scope()).await?;
        let rows = conn
            .query(
                &format!(
                    "UPDATE {t} SET state = 'running', attempts = attempts + 1, worker = $1,
                         lease_until = clock_timestamp() + make_interval(secs => $2)
                     WHERE id = (SELECT id FROM {t} WHERE state = 'queued' ORDER BY id LIMIT 1
                                 FOR UPDATE SKIP LOCKED)
                     RETURNING id, kind, payload, idempotent, attempts"
                ),
                &[&worker, &self.lease_secs()],
            )
            .await?;
        Ok(rows.first().map(|r| {
            let attempts: i32 = r.get(4);
            Job::new(
                r.get(0),
                r.get(1),
                r.get(2),
                r.get(3),
                attempts.max(0) as u32,
            )
        }))
    }

    async fn renew(&self, worker: &str, job: &Job) -> Result<bool, Error> {
        let t = &self.table;
        let attempt = i32::try_from(job.attempt).unwrap_or(i32::MAX);
        let mut conn = self.pool.acquire(&self.scope()).await?;
        let renewed = conn
            .execute(
                &format!(
                    "UPDATE {t} SET lease_until = clock_timestamp() + make_interval(secs => $4)
                     WHERE id = $1 AND attempts = $2 AND worker = $3 AND state = 'running'"
                ),
                &[&job.id, &attempt, &worker, &self.lease_secs()],
            )
            .await?;
        Ok(renewed == 1)
    }

    async fn finish(
        &self,
        worker: &str,
        job: &Job,
        state: JobState,
        error: Option<String>,
    ) -> Result<bool, Error> {
        let t = &self.table;
        let attempt = i32::try_from(job.attempt).unwrap_or(i32::MAX);
        let mut conn = self.pool.acquire(&self.scope()).await?;
        // Also when the lease had just expired but nobody claimed the job
        // again (`queued` or `interrupted` with our attempt): this attempt's
        // end is then the truth.
        let finished = conn
            .execute(
                &format!(
                    "UPDATE {t} SET state = $4, error = $5, lease_until = NULL
                     WHERE id = $1 AND attempts = $2 AND worker = $3
                       AND state IN ('running', 'queued', 'interrupted')"
                ),
                &[&job.id, &attempt, &worker, &state.as_str(), &error],
            )
            .await?;
        Ok(finished == 1)
    }

    fn renew_every(&self) -> Option<Duration> {
        Some(self.lease / 3)
    }
}

#[cfg(test)]
mod tests {
    use super::valid_table;

    #[test]
    fn table_names_are_plain_identifiers() {
        for ok in ["jobs", "_jobs", "tonic_deadline_jobs", "j2"] {
            assert!(valid_table(ok), "{ok} must be accepted");
        }
        for bad in [
            "",
            "2jobs",
            "Jobs",
            "jobs;drop",
            "a b",
            "jöbs",
            &"a".repeat(64),
        ] {
            assert!(!valid_table(bad), "{bad:?} must be refused");
        }
    }
}
