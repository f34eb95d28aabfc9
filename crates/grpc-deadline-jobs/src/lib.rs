//! Durable hand-off of background work: the job is written to a database
//! before the handler replies, then run by a [`Worker`] with a lifecycle of
//! its own.
//!
//! A task spawned from a handler belongs to the request and stops with it
//! ([`Scope::spawn`]); [`detach`](grpc_deadline::detach) escapes but is lost if the
//! process dies. When work must outlive the request *and* survive a crash,
//! hand it over: [`JobQueue::submit`] returns only once the job is committed,
//! so a reply sent after it never promises work that a crash could lose.
//!
//! Two stores keep the jobs, behind one [`Store`] trait and one queue and
//! worker for both:
//!
//! - [`SqliteStore`] (feature `sqlite`): one file, one process at a time (WAL,
//!   `synchronous = FULL`). A crash is recovered when the file is opened
//!   again.
//! - [`PgStore`](postgres::PgStore) (feature `postgres`): one table
//!   shared by workers on any number of hosts. Workers claim jobs with
//!   `FOR UPDATE SKIP LOCKED`, and hold each claimed job under a *lease*
//!   that they renew while the job runs; a worker that dies stops renewing,
//!   and once the lease has expired (by the database server's clock, so the
//!   hosts need no clock sync) any other worker recovers the job.
//!
//! # Delivery
//!
//! 1. A job is claimed (marked `running`, attempt counted) durably before
//!    it starts.
//! 2. A job whose worker died mid-way — found `running` when the SQLite file
//!    is reopened, or `running` with an expired lease on PostgreSQL — goes
//!    back to `queued` and runs again if it is idempotent; any other job is
//!    marked `interrupted` and never runs twice: it may have had its effect,
//!    and only the job can say whether running it again is safe.
//! 3. Jobs that were accepted but not started are run later: none is lost.
//! 4. A worker records a job's end only while its claim still stands (same
//!    attempt, same worker). A worker that finds its lease lost stops the
//!    job's scope.
//!
//! # Example
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use grpc_deadline_jobs::{JobQueue, JobState, Worker};
//!
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
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use grpc_deadline::Scope;
use grpc_deadline_db::Error;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::SqliteStore;

/// How often an idle worker looks for jobs submitted by another process.
const POLL: Duration = Duration::from_millis(50);

/// The identity of an accepted job.
///
/// ```
/// use grpc_deadline_jobs::{Job, JobId};
/// let id: JobId = 42;
/// let job = Job::new(id, "send-receipt".to_owned(), Vec::new(), true, 1);
/// assert_eq!(job.id, 42);
/// ```
pub type JobId = i64;

/// Where a job is in its life.
///
/// ```
/// use grpc_deadline_jobs::JobState;
/// assert_eq!(JobState::Interrupted.as_str(), "interrupted");
/// assert_eq!(JobState::parse("done"), Some(JobState::Done));
/// ```
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
    /// A non-idempotent job whose worker died (or lost its lease) mid-way:
    /// not run again.
    Interrupted,
}

impl JobState {
    /// The state's name as stored (`queued`, `running`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
            JobState::Interrupted => "interrupted",
        }
    }

    /// The state stored as `name`, if it is one.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
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
///
/// ```
/// use grpc_deadline_jobs::Job;
/// // What a `Store` claims, and what a worker's function receives.
/// let job = Job::new(7, "send-receipt".to_owned(), b"order 42".to_vec(), true, 1);
/// assert_eq!((job.id, job.kind.as_str(), job.attempt), (7, "send-receipt", 1));
/// ```
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

impl Job {
    /// A job as read back from a store.
    pub fn new(id: JobId, kind: String, payload: Vec<u8>, idempotent: bool, attempt: u32) -> Self {
        Self {
            id,
            kind,
            payload,
            idempotent,
            attempt,
        }
    }
}

/// Where a [`JobQueue`] keeps its jobs, durably. Implemented by
/// [`SqliteStore`] and [`PgStore`](postgres::PgStore); the queue and the
/// [`Worker`] hold the rules (refusal of ended callers, wake-ups, leases
/// renewed while a job runs, what a stopped job becomes), a store only
/// reads and writes.
///
/// Every write must be durable when its future returns `Ok`.
///
/// ```
/// use grpc_deadline_jobs::{JobQueue, Store};
///
/// // Code that works over any store.
/// async fn backlog<S: Store>(queue: &JobQueue<S>) -> u64 {
///     queue.pending().await.unwrap_or(0)
/// }
/// ```
pub trait Store: Send + Sync + 'static {
    /// Writes a new `queued` job; returns its id.
    fn insert(
        &self,
        kind: String,
        payload: Vec<u8>,
        idempotent: bool,
    ) -> impl Future<Output = Result<JobId, Error>> + Send;

    /// The state of job `id`, if it exists.
    fn state(&self, id: JobId) -> impl Future<Output = Result<Option<JobState>, Error>> + Send;

    /// Every job with its state and attempt count, in id order.
    fn list(&self) -> impl Future<Output = Result<Vec<(JobId, JobState, u32)>, Error>> + Send;

    /// How many jobs are queued or running.
    fn pending(&self) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Marks the oldest queued job `running` for `worker`, counts the
    /// attempt, and returns it; `None` when nothing is queued. A store with
    /// leases first recovers the jobs whose lease has expired.
    fn claim(&self, worker: &str) -> impl Future<Output = Result<Option<Job>, Error>> + Send;

    /// Extends `worker`'s lease on `job`; `false` if the claim is gone.
    fn renew(&self, worker: &str, job: &Job) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Records how `worker`'s attempt at `job` ended; `false` (and nothing
    /// written) if the claim is gone.
    fn finish(
        &self,
        worker: &str,
        job: &Job,
        state: JobState,
        error: Option<String>,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// How often a worker renews the lease of a running job; `None` for a
    /// store without leases.
    fn renew_every(&self) -> Option<Duration>;
}

/// A durable job queue over a [`Store`] (with the `sqlite` feature, SQLite
/// unless said otherwise). Cheap to clone.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use grpc_deadline_jobs::{JobQueue, JobState};
/// let dir = tempfile::tempdir().unwrap();
/// let queue = JobQueue::open(dir.path().join("jobs.db")).expect("opens");
/// let id = queue.submit("send-receipt", b"order 42", true).await.expect("accepted");
/// assert_eq!(queue.state(id).await.expect("reads"), Some(JobState::Queued));
/// # }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
#[cfg(feature = "sqlite")]
pub struct JobQueue<S = SqliteStore> {
    shared: Arc<Shared<S>>,
}

/// A durable job queue over a [`Store`]. Cheap to clone.
///
/// ```
/// use grpc_deadline_jobs::{JobQueue, Store};
///
/// // Code that works over any store.
/// async fn backlog<S: Store>(queue: &JobQueue<S>) -> u64 {
///     queue.pending().await.unwrap_or(0)
/// }
/// ```
// Without the `sqlite` feature there is no SQLite store to default to.
#[cfg(not(feature = "sqlite"))]
pub struct JobQueue<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for JobQueue<S> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

struct Shared<S> {
    store: S,
    submitted: Notify,
    finished: Notify,
    workers: AtomicU64,
}

impl<S> fmt::Debug for JobQueue<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobQueue").finish_non_exhaustive()
    }
}

#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
impl JobQueue<SqliteStore> {
    /// Opens (or creates) the queue in the SQLite file at `path` and
    /// recovers from a crash: jobs left `running` are re-queued if
    /// idempotent, marked `interrupted` otherwise.
    ///
    /// # Errors
    ///
    /// SQLite could not open or set up the file.
    pub fn open(
        path: impl AsRef<std::path::Path>,
    ) -> grpc_deadline_db::sqlite::rusqlite::Result<Self> {
        Ok(Self::new(SqliteStore::open(path)?))
    }
}

impl<S: Store> JobQueue<S> {
    /// A queue over `store`.
    pub fn new(store: S) -> Self {
        Self {
            shared: Arc::new(Shared {
                store,
                submitted: Notify::new(),
                finished: Notify::new(),
                workers: AtomicU64::new(0),
            }),
        }
    }

    /// The store the jobs are kept in.
    pub fn store(&self) -> &S {
        &self.shared.store
    }

    /// Accepts a job: returns once it is committed. Refused without writing
    /// if the current scope has already ended (the caller is gone).
    ///
    /// # Errors
    ///
    /// The scope had ended, or the store failed; then nothing was accepted.
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
        let shared = self.shared.clone();
        // On a task of its own, so that a dropped caller does not cut the
        // write in half.
        #[allow(clippy::disallowed_methods)] // the write must finish even if the caller goes
        let id = tokio::spawn(async move { shared.store.insert(kind, payload, idempotent).await })
            .await
            .map_err(Error::database)??;
        self.shared.submitted.notify_waiters();
        Ok(id)
    }

    /// The state of job `id`, if it exists.
    ///
    /// # Errors
    ///
    /// The store failed.
    pub async fn state(&self, id: JobId) -> Result<Option<JobState>, Error> {
        self.shared.store.state(id).await
    }

    /// Every job with its state and attempt count, in id order.
    ///
    /// # Errors
    ///
    /// The store failed.
    pub async fn list(&self) -> Result<Vec<(JobId, JobState, u32)>, Error> {
        self.shared.store.list().await
    }

    /// How many jobs are queued or running.
    ///
    /// # Errors
    ///
    /// The store failed.
    pub async fn pending(&self) -> Result<u64, Error> {
        self.shared.store.pending().await
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

    /// A name for a new worker of this queue, unique across processes and
    /// hosts for all practical purposes: process id, wall-clock start, and
    /// a counter of this queue.
    fn worker_name(&self) -> String {
        let n = self.shared.workers.fetch_add(1, Ordering::Relaxed);
        // The wall clock only makes the name unique; nothing is timed by it.
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{}-{started:x}-{n}", std::process::id())
    }
}

/// Runs the jobs of a [`JobQueue`] one at a time, each under a child of the
/// worker's own scope (no request's deadline reaches it).
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use grpc_deadline_jobs::{JobQueue, JobState, Worker};
/// let dir = tempfile::tempdir().unwrap();
/// let queue = JobQueue::open(dir.path().join("jobs.db")).expect("opens");
/// let id = queue.submit("send-receipt", b"order 42", true).await.expect("accepted");
/// let worker = Worker::start(queue.clone(), |job| async move {
///     assert_eq!(job.kind, "send-receipt");
///     Ok(())
/// });
/// queue.wait_idle().await;
/// worker.shutdown().await;
/// assert_eq!(queue.state(id).await.unwrap(), Some(JobState::Done));
/// # }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
#[derive(Debug)]
pub struct Worker {
    name: String,
    scope: Scope,
    task: tokio::task::JoinHandle<()>,
}

/// How one attempt at a job ended, as the worker saw it.
enum Ending {
    Finished(JobState, Option<String>),
    /// The lease was lost: another worker may own the job now.
    LeaseLost,
}

impl Worker {
    /// Starts a worker that runs each job with `run`. A job returning
    /// `Err(message)` is marked `failed` with the message.
    pub fn start<S, F, Fut>(queue: JobQueue<S>, run: F) -> Worker
    where
        S: Store,
        F: Fn(Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        // The worker's lifecycle is its own: a root scope, ended by shutdown.
        let scope = Scope::background();
        let name = queue.worker_name();
        #[allow(clippy::disallowed_methods)] // the worker runs in its own root scope
        let task = tokio::spawn({
            let (scope, name) = (scope.clone(), name.clone());
            async move {
                while !scope.is_ended() {
                    let submitted = queue.shared.submitted.notified();
                    let job = match queue.shared.store.claim(&name).await {
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
                    let ending = attempt(&queue, &name, &scope, &run, &job).await;
                    match ending {
                        Ending::Finished(state, error) => {
                            match queue.shared.store.finish(&name, &job, state, error).await {
                                Ok(true) => {}
                                Ok(false) => tracing::warn!(
                                    id = job.id,
                                    "a job's claim was lost before its end was recorded"
                                ),
                                Err(err) => {
                                    tracing::warn!(id = job.id, error = %err, "could not record a job's end")
                                }
                            }
                        }
                        Ending::LeaseLost => tracing::warn!(
                            id = job.id,
                            "a job's lease was lost while it ran; it was stopped"
                        ),
                    }
                    queue.shared.finished.notify_waiters();
                }
            }
        });
        Worker { name, scope, task }
    }

    /// This worker's name, as stored with the jobs it claims.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Stops the worker: the running job's scope is cancelled, and the call
    /// returns once its end is recorded.
    pub async fn shutdown(self) {
        self.scope.cancel();
        let _ = self.task.await;
    }
}

/// Runs one attempt at `job` under a child of the worker's scope, renewing
/// its lease while it runs (if the store has leases).
async fn attempt<S, F, Fut>(
    queue: &JobQueue<S>,
    name: &str,
    scope: &Scope,
    run: &F,
    job: &Job,
) -> Ending
where
    S: Store,
    F: Fn(Job) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let job_scope = scope.child();
    let work = job_scope.run(run(job.clone()));
    tokio::pin!(work);
    let mut lease_lost = false;
    let outcome = loop {
        let Some(every) = queue.shared.store.renew_every() else {
            break work.await;
        };
        tokio::select! {
            biased;
            outcome = &mut work => break outcome,
            () = tokio::time::sleep(every), if !lease_lost => {
                match queue.shared.store.renew(name, job).await {
                    Ok(true) => {}
                    Ok(false) => {
                        // Another worker may run it now (if idempotent), or
                        // it was marked interrupted: stop our attempt.
                        lease_lost = true;
                        job_scope.cancel();
                    }
                    // The lease may still stand; the database decides when
                    // it expires, and `finish` tells.
                    Err(err) => tracing::warn!(id = job.id, error = %err, "could not renew a job's lease"),
                }
            }
        }
    };
    if lease_lost {
        return Ending::LeaseLost;
    }
    match outcome {
        Ok(Ok(())) => Ending::Finished(JobState::Done, None),
        Ok(Err(message)) => Ending::Finished(JobState::Failed, Some(message)),
        // Stopped by shutdown: the same rule as a crash.
        Err(ended) if job.idempotent => Ending::Finished(JobState::Queued, Some(ended.to_string())),
        Err(ended) => Ending::Finished(JobState::Interrupted, Some(ended.to_string())),
    }
}
