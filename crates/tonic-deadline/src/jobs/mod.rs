//! Durable hand-off of background work (R-25): the job is written to SQLite
//! before the handler replies, then run by a [`Worker`] with a lifecycle of
//! its own.
//!
//! A task spawned from a handler belongs to the request and stops with it
//! ([`Scope::spawn`]); [`detach`](crate::detach) escapes but is lost if the
//! process dies. When work must outlive the request *and* survive a crash,
//! hand it over: [`JobQueue::submit`] returns only once the job is committed
//! (WAL, `synchronous = FULL`), so a reply sent after it never promises work
//! that a crash could lose.
//!
//! # Delivery
//!
//! 1. A job is claimed (marked `running`, attempt counted) durably before
//!    it starts.
//! 2. After a crash, [`JobQueue::open`] finds jobs still marked `running`: an
//!    idempotent job goes back to `queued` and runs again; any other job is
//!    marked `interrupted` and never runs twice — it may have had its effect,
//!    and only the job can say whether running it again is safe.
//! 3. Jobs that were accepted but not started are run after the restart:
//!    none is lost.
//!
//! # Example
//!
//! ```
//! use tonic_deadline::jobs::{JobQueue, JobState, Worker};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let dir = tempfile::tempdir().unwrap();
//! let queue = JobQueue::open(dir.path().join("jobs.db")).expect("opens");
//! // In a handler: written durably before the reply.
//! let id = queue.submit("send-receipt", b"order 42", true).await.expect("accepted");
//! // Elsewhere, with its own lifecycle:
//! let worker = Worker::start(queue.clone(), |job| async move {
//!     assert_eq!(job.payload, b"order 42");
//!     Ok(())
//! });
//! queue.wait_idle().await;
//! worker.shutdown().await;
//! assert_eq!(queue.state(id).await.unwrap(), Some(JobState::Done));
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::Notify;

use crate::db::Error;
use crate::scope::Scope;

/// How often an idle worker looks for jobs submitted by another process.
const POLL: Duration = Duration::from_millis(50);

/// The identity of an accepted job.
pub type JobId = i64;

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JobState {
    /// Accepted, not started.
    Queued,
    /// Claimed by a worker.
    Running,
    /// Finished successfully.
    Done,
    /// Finished with an error (not retried).
    Failed,
    /// A non-idempotent job whose worker died mid-way: not run again.
    Interrupted,
}

impl JobState {
    fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
            JobState::Interrupted => "interrupted",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => JobState::Queued,
            "running" => JobState::Running,
            "done" => JobState::Done,
            "failed" => JobState::Failed,
            "interrupted" => JobState::Interrupted,
            _ => return None,
        })
    }
}

/// A job as a worker sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Job {
    /// Its identity.
    pub id: JobId,
    /// What to do (the worker's dispatch key).
    pub kind: String,
    /// The job's input.
    pub payload: Vec<u8>,
    /// Whether running it twice is safe.
    pub idempotent: bool,
    /// Which attempt this is (1 for the first).
    pub attempt: u32,
}

/// A durable job queue in one SQLite file. Cheap to clone.
#[derive(Clone)]
pub struct JobQueue {
    shared: Arc<Shared>,
}

struct Shared {
    conn: Mutex<Connection>,
    submitted: Notify,
    finished: Notify,
}

impl fmt::Debug for JobQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobQueue").finish_non_exhaustive()
    }
}

impl JobQueue {
    /// Opens (or creates) the queue at `path` and recovers from a crash:
    /// jobs left `running` are re-queued if idempotent, marked `interrupted`
    /// otherwise.
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
            shared: Arc::new(Shared {
                conn: Mutex::new(conn),
                submitted: Notify::new(),
                finished: Notify::new(),
            }),
        })
    }

    async fn with_conn<T, F>(&self, f: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let shared = self.shared.clone();
        // A short statement on the queue's own connection, awaited at once.
        #[allow(clippy::disallowed_methods)]
        tokio::task::spawn_blocking(move || {
            let mut conn = shared.conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut conn)
        })
        .await
        .map_err(Error::database)?
        .map_err(Error::database)
    }

    /// Accepts a job: returns once it is committed to disk. Refused without
    /// writing if the current scope has already ended (the caller is gone).
    ///
    /// # Errors
    ///
    /// The scope had ended, or SQLite failed; then nothing was accepted.
    ///
    /// # Cancellation safety
    ///
    /// Once the write has started it completes even if this future is
    /// dropped: the job may then be accepted without the caller knowing —
    /// the usual "outcome unknown" of a cancelled call.
    pub async fn submit(
        &self,
        kind: &str,
        payload: &[u8],
        idempotent: bool,
    ) -> Result<JobId, Error> {
        Scope::current().check()?;
        let (kind, payload) = (kind.to_owned(), payload.to_vec());
        let id = self
            .with_conn(move |c| {
                c.execute(
                    "INSERT INTO jobs (kind, payload, idempotent) VALUES (?1, ?2, ?3)",
                    params![kind, payload, idempotent],
                )?;
                Ok(c.last_insert_rowid())
            })
            .await?;
        self.shared.submitted.notify_waiters();
        Ok(id)
    }

    /// The state of job `id`, if it exists.
    ///
    /// # Errors
    ///
    /// SQLite failed.
    pub async fn state(&self, id: JobId) -> Result<Option<JobState>, Error> {
        self.with_conn(move |c| {
            let state: Option<String> = c
                .query_row("SELECT state FROM jobs WHERE id = ?1", [id], |r| r.get(0))
                .optional()?;
            Ok(state.and_then(|s| JobState::parse(&s)))
        })
        .await
    }

    /// Every job with its state and attempt count, in id order.
    ///
    /// # Errors
    ///
    /// SQLite failed.
    pub async fn list(&self) -> Result<Vec<(JobId, JobState, u32)>, Error> {
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

    /// How many jobs are queued or running.
    ///
    /// # Errors
    ///
    /// SQLite failed.
    pub async fn pending(&self) -> Result<u64, Error> {
        self.with_conn(|c| {
            c.query_row(
                "SELECT count(*) FROM jobs WHERE state IN ('queued', 'running')",
                [],
                |r| r.get(0),
            )
        })
        .await
    }

    /// Waits until no job is queued or running (polling, for tests and
    /// draining).
    pub async fn wait_idle(&self) {
        loop {
            let finished = self.shared.finished.notified();
            if matches!(self.pending().await, Ok(0)) {
                return;
            }
            let _ = tokio::time::timeout(POLL, finished).await;
        }
    }

    async fn claim(&self) -> Result<Option<Job>, Error> {
        self.with_conn(|c| {
            c.query_row(
                "UPDATE jobs SET state = 'running', attempts = attempts + 1
                 WHERE id = (SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1)
                 RETURNING id, kind, payload, idempotent, attempts",
                [],
                |r| {
                    Ok(Job {
                        id: r.get(0)?,
                        kind: r.get(1)?,
                        payload: r.get(2)?,
                        idempotent: r.get(3)?,
                        attempt: r.get(4)?,
                    })
                },
            )
            .optional()
        })
        .await
    }

    async fn finish(&self, id: JobId, state: JobState, error: Option<String>) -> Result<(), Error> {
        self.with_conn(move |c| {
            c.execute(
                "UPDATE jobs SET state = ?2, error = ?3 WHERE id = ?1",
                params![id, state.as_str(), error],
            )
            .map(drop)
        })
        .await?;
        self.shared.finished.notify_waiters();
        Ok(())
    }
}

/// Runs the jobs of a [`JobQueue`] one at a time, each under a child of the
/// worker's own scope (no request's deadline reaches it).
#[derive(Debug)]
pub struct Worker {
    scope: Scope,
    task: tokio::task::JoinHandle<()>,
}

impl Worker {
    /// Starts a worker that runs each job with `run`. A job returning
    /// `Err(message)` is marked `failed` with the message.
    pub fn start<F, Fut>(queue: JobQueue, run: F) -> Worker
    where
        F: Fn(Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        // The worker's lifecycle is its own: a root scope, ended by shutdown.
        let scope = Scope::background();
        #[allow(clippy::disallowed_methods)] // the worker runs in its own root scope
        let task = tokio::spawn({
            let scope = scope.clone();
            async move {
                while !scope.is_ended() {
                    let submitted = queue.shared.submitted.notified();
                    let job = match queue.claim().await {
                        Ok(Some(job)) => job,
                        Ok(None) => {
                            tokio::select! {
                                _ = scope.ended() => break,
                                () = submitted => {}
                                () = tokio::time::sleep(POLL) => {}
                            }
                            continue;
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, "job queue unavailable");
                            tokio::time::sleep(POLL).await;
                            continue;
                        }
                    };
                    let (id, idempotent) = (job.id, job.idempotent);
                    let outcome = scope.child().run(run(job)).await;
                    let (state, error) = match outcome {
                        Ok(Ok(())) => (JobState::Done, None),
                        Ok(Err(message)) => (JobState::Failed, Some(message)),
                        // Stopped by shutdown: the same rule as a crash.
                        Err(ended) if idempotent => (JobState::Queued, Some(ended.to_string())),
                        Err(ended) => (JobState::Interrupted, Some(ended.to_string())),
                    };
                    if let Err(err) = queue.finish(id, state, error).await {
                        tracing::warn!(id, error = %err, "could not record a job's end");
                    }
                }
            }
        });
        Worker { scope, task }
    }

    /// Stops the worker: the running job's scope is cancelled, and the call
    /// returns once its end is recorded.
    pub async fn shutdown(self) {
        self.scope.cancel();
        let _ = self.task.await;
    }
}
