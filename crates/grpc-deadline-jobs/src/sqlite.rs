//! The SQLite store: one file, one process at a time.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use grpc_deadline_db::sqlite::rusqlite::{self, Connection, OptionalExtension, params};

use super::{Job, JobId, JobState, Store};
use grpc_deadline_db::Error;

/// Jobs in one SQLite file (WAL, `synchronous = FULL`), for one process at a
/// time: opening the file recovers the jobs a crashed process left
/// `running`. Cheap to clone.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use grpc_deadline_jobs::{JobQueue, SqliteStore};
/// let dir = tempfile::tempdir().unwrap();
/// let store = SqliteStore::open(dir.path().join("jobs.db")).expect("opens");
/// let queue = JobQueue::new(store);
/// assert_eq!(queue.pending().await.expect("reads"), 0);
/// # }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (or creates) the store at `path` and recovers from a crash:
    /// jobs left `running` are re-queued if idempotent, marked
    /// `interrupted` otherwise.
    ///
    /// # Errors
    ///
    /// SQLite could not open or set up the file.
    pub fn open(path: impl AsRef<Path>) -> rusqlite::Result<Self> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS jobs (
                 id INTEGER PRIMARY KEY AUTOINCREMENT,
                 kind TEXT NOT NULL,
                 payload BLOB NOT NULL,
                 idempotent INTEGER NOT NULL,
                 state TEXT NOT NULL DEFAULT 'queued',
                 attempts INTEGER NOT NULL DEFAULT 0,
                 error TEXT
             );
             CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state, id);",
        )?;
        let recovered = conn.execute(
            "UPDATE jobs SET state = CASE WHEN idempotent THEN 'queued' ELSE 'interrupted' END
             WHERE state = 'running'",
            [],
        )?;
        if recovered > 0 {
            tracing::warn!(recovered, "jobs found running after a restart");
        }
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    async fn with_conn<T, F>(&self, f: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let conn = self.conn.clone();
        // A short statement on the queue's own connection, awaited at once.
        #[allow(clippy::disallowed_methods)]
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut conn)
        })
        .await
        .map_err(Error::database)?
        .map_err(Error::database)
    }
}

impl Store for SqliteStore {
    async fn insert(
        &self,
        kind: String,
        payload: Vec<u8>,
        idempotent: bool,
    ) -> Result<JobId, Error> {
        self.with_conn(move |c| {
            c.execute(
                "INSERT INTO jobs (kind, payload, idempotent) VALUES (?1, ?2, ?3)",
                params![kind, payload, idempotent],
            )?;
            Ok(c.last_insert_rowid())
        })
        .await
    }

    async fn state(&self, id: JobId) -> Result<Option<JobState>, Error> {
        self.with_conn(move |c| {
            let state: Option<String> = c
                .query_row("SELECT state FROM jobs WHERE id = ?1", [id], |r| r.get(0))
                .optional()?;
            Ok(state.and_then(|s| JobState::parse(&s)))
        })
        .await
    }

    async fn list(&self) -> Result<Vec<(JobId, JobState, u32)>, Error> {
        self.with_conn(|c| {
            let mut stmt = c.prepare("SELECT id, state, attempts FROM jobs ORDER BY id")?;
            let rows = stmt.query_map([], |r| {
                let state: String = r.get(1)?;
                Ok((
                    r.get(0)?,
                    JobState::parse(&state).unwrap_or(JobState::Failed),
                    r.get(2)?,
                ))
            })?;
            rows.collect()
        })
        .await
    }

    async fn pending(&self) -> Result<u64, Error> {
        self.with_conn(|c| {
            c.query_row(
                "SELECT count(*) FROM jobs WHERE state IN ('queued', 'running')",
                [],
                |r| r.get(0),
            )
        })
        .await
    }

    async fn claim(&self, _worker: &str) -> Result<Option<Job>, Error> {
        // One process owns the file: no worker names, no leases.
        self.with_conn(|c| {
            c.query_row(
                "UPDATE jobs SET state = 'running', attempts = attempts + 1
                 WHERE id = (SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1)
                 RETURNING id, kind, payload, idempotent, attempts",
                [],
                |r| {
                    Ok(Job::new(
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                    ))
                },
            )
            .optional()
        })
        .await
    }

    async fn renew(&self, _worker: &str, _job: &Job) -> Result<bool, Error> {
        Ok(true)
    }

    async fn finish(
        &self,
        _worker: &str,
        job: &Job,
        state: JobState,
        error: Option<String>,
    ) -> Result<bool, Error> {
        let id = job.id;
        self.with_conn(move |c| {
            c.execute(
                "UPDATE jobs SET state = ?2, error = ?3 WHERE id = ?1",
                params![id, state.as_str(), error],
            )
            .map(|n| n == 1)
        })
        .await
    }

    fn renew_every(&self) -> Option<std::time::Duration> {
        None
    }
}
