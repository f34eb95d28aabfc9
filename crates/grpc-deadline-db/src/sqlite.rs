//! A SQLite pool whose queries stop when the scope ends.
//!
//! [`SqlitePool::acquire`] waits for a connection through a deadline-aware
//! [`Admission`]; [`SqliteConn::run`] runs a query with it on tokio's
//! blocking pool. When the scope ends (deadline, caller cancel, or the `run`
//! future being dropped) the running statement is interrupted with
//! `sqlite3_interrupt`, and a progress handler stops any statement that
//! starts later; `run` returns once SQLite has stopped, so the connection is
//! idle again, ready for its next query. Dropping the [`SqliteConn`] returns
//! the connection to the pool.
//!
//! How it differs from wrapping `spawn_blocking` in `tokio::time::timeout`:
//! the timeout returns, but the query runs on, holding its connection and a
//! blocking thread for as long as it takes.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use grpc_deadline::Scope;
//! use grpc_deadline_db::sqlite::SqlitePool;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), grpc_deadline_db::Error> {
//! let pool = SqlitePool::open_in_memory(2)?;
//! let scope = Scope::background().with_timeout(Duration::from_millis(50));
//! // Far more than 50 ms of work: stopped on the database at the deadline.
//! let endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) \
//!                SELECT count(*) FROM c";
//! let mut conn = pool.acquire(&scope).await?;
//! let err = conn
//!     .run(move |c| c.query_row(endless, [], |r| r.get::<_, i64>(0)))
//!     .await
//!     .expect_err("the query cannot finish in 50 ms");
//! assert_eq!(err.code(), grpc_deadline::Code::DeadlineExceeded);
//! drop(conn);
//! assert_eq!(pool.stats().idle, 2, "the connection is back in the pool");
//! # Ok(())
//! # }
//! ```
//!
//! # Invariants
//!
//! 1. A connection is either idle in the pool or held by exactly one
//!    [`SqliteConn`] (on a blocking thread while one of its queries runs);
//!    it is returned to the pool before its permit is released, so a permit
//!    always finds an idle connection. An interrupt reaches a connection
//!    only while the query it was meant for still runs on it.
//! 2. When [`run`](SqliteConn::run) returns because the scope ended, the
//!    query has already stopped and its connection is idle — unless the
//!    closure's own Rust code ignores the scope, in which case it is logged
//!    and counted by the layer that made the scope (tonic-deadline's
//!    `Metrics`, for one) when it finally returns, the connection's next query waits for it, and
//!    dropping the `SqliteConn` returns the connection once it is done.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

pub use rusqlite;
use rusqlite::Connection;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use super::{DEFAULT_SIZE, Error, PoolStats, admission_for};
use grpc_deadline::admission::{Admission, Permit};
use grpc_deadline::scope::{Scope, note_if_outlived};

/// How many SQLite virtual-machine steps run between two looks at the scope.
const PROGRESS_STEPS: i32 = 1000;

/// How long a query may take to stop after the interrupt before it counts as
/// work that outlived its scope.
const STOP_GRACE: Duration = Duration::from_millis(50);

/// A pool of SQLite connections behind a deadline-aware queue. Cheap to
/// clone. See the [module docs](self).
///
/// ```
/// # fn main() -> Result<(), grpc_deadline_db::Error> {
/// use grpc_deadline_db::sqlite::SqlitePool;
/// let pool = SqlitePool::open_in_memory(4)?;
/// assert_eq!(pool.stats().size, 4);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SqlitePool {
    shared: Arc<Shared>,
}

struct Shared {
    admission: Admission,
    idle: Mutex<Vec<Connection>>,
    size: usize,
    cancels: AtomicU64,
    cleanups_running: AtomicU64,
}

impl Shared {
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Connection>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl fmt::Debug for SqlitePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlitePool")
            .field("stats", &self.stats())
            .finish()
    }
}

/// Configures a [`SqlitePool`]; [`build`](Self::build) opens its
/// connections and freezes it.
///
/// ```
/// # fn main() -> Result<(), grpc_deadline_db::Error> {
/// use grpc_deadline::admission::Admission;
/// use grpc_deadline_db::sqlite::{SqlitePool, rusqlite};
///
/// let pool = SqlitePool::builder(|| {
///     let conn = rusqlite::Connection::open_in_memory()?;
///     conn.pragma_update(None, "foreign_keys", "ON")?;
///     Ok(conn)
/// })
/// .size(2)
/// .admission(Admission::new(2))
/// .build()?;
/// assert_eq!(pool.stats().idle, 2);
/// # Ok(())
/// # }
/// ```
#[must_use = "a builder does nothing until `build`"]
pub struct SqlitePoolBuilder {
    open: Box<dyn FnMut() -> rusqlite::Result<Connection> + Send>,
    size: usize,
    admission: Option<Admission>,
}

impl fmt::Debug for SqlitePoolBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlitePoolBuilder")
            .field("size", &self.size)
            .field("admission", &self.admission)
            .finish_non_exhaustive()
    }
}

impl SqlitePoolBuilder {
    /// How many connections the pool holds (default 10). All are opened by
    /// [`build`](Self::build).
    pub fn size(mut self, size: usize) -> Self {
        self.size = size;
        self
    }

    /// Waits for connections through `admission` instead of the default
    /// adaptive-LIFO queue (for another queue discipline or a seeded
    /// service time). It must have one permit per connection.
    pub fn admission(mut self, admission: Admission) -> Self {
        self.admission = Some(admission);
        self
    }

    /// Opens the connections: the pool.
    ///
    /// # Errors
    ///
    /// A size of zero, an admission whose permits differ from the size, or
    /// SQLite could not open or configure a connection.
    pub fn build(mut self) -> Result<SqlitePool, Error> {
        let admission = admission_for(self.size, self.admission.take())?;
        let connections = (0..self.size)
            .map(|_| (self.open)())
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(Error::database)?;
        Ok(SqlitePool {
            shared: Arc::new(Shared {
                admission,
                size: connections.len(),
                idle: Mutex::new(connections),
                cancels: AtomicU64::new(0),
                cleanups_running: AtomicU64::new(0),
            }),
        })
    }
}

impl SqlitePool {
    /// A builder for a pool whose connections `open` makes (all to the same
    /// database, typically), called once per connection by
    /// [`build`](SqlitePoolBuilder::build).
    pub fn builder<F>(open: F) -> SqlitePoolBuilder
    where
        F: FnMut() -> rusqlite::Result<Connection> + Send + 'static,
    {
        SqlitePoolBuilder {
            open: Box::new(open),
            size: DEFAULT_SIZE,
            admission: None,
        }
    }

    /// `size` connections to the database file at `path` (created if
    /// absent), in WAL mode with a 5 s busy timeout.
    ///
    /// # Errors
    ///
    /// A size of zero, or opening or configuring a connection failed.
    pub fn open(path: impl AsRef<Path>, size: usize) -> Result<Self, Error> {
        let path = path.as_ref().to_owned();
        Self::builder(move || {
            let conn = Connection::open(&path)?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.busy_timeout(Duration::from_secs(5))?;
            Ok(conn)
        })
        .size(size)
        .build()
    }

    /// `size` independent in-memory databases (useful for tests and for
    /// read-only computed queries).
    ///
    /// # Errors
    ///
    /// A size of zero, or opening a connection failed.
    pub fn open_in_memory(size: usize) -> Result<Self, Error> {
        Self::builder(Connection::open_in_memory).size(size).build()
    }

    /// Counters: connections idle, callers queued, queries interrupted.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            max_size: self.shared.size,
            size: self.shared.size,
            idle: self.shared.idle().len(),
            queued: self.shared.admission.stats().queued,
            cancels: self.shared.cancels.load(Ordering::Relaxed),
            cancels_failed: 0,
            discarded: 0,
            cleanups_running: self.shared.cleanups_running.load(Ordering::Relaxed),
        }
    }

    /// The admission queue in front of the connections.
    pub fn admission(&self) -> &Admission {
        &self.shared.admission
    }

    /// Waits for a connection under `scope`; its queries run under the same
    /// scope.
    ///
    /// # Errors
    ///
    /// Not admitted: the scope ended while waiting, not enough time left,
    /// or the queue is full.
    ///
    /// # Cancellation safety
    ///
    /// Safe: dropping the future leaves the queue.
    pub async fn acquire(&self, scope: &Scope) -> Result<SqliteConn, Error> {
        let permit = self.shared.admission.acquire(scope).await?;
        let conn = self.shared.idle().pop();
        let Some(conn) = conn else {
            // Invariant 1 makes this unreachable; fail safe rather than panic.
            return Err(Error::database(
                "sqlite pool: no idle connection for a permit",
            ));
        };
        Ok(SqliteConn {
            lease: Some(Lease {
                conn: Some(conn),
                permit: Some(permit),
                shared: self.shared.clone(),
            }),
            running: None,
            scope: scope.clone(),
            shared: self.shared.clone(),
        })
    }
}

/// A pooled connection bound to the scope it was taken under; its queries
/// run on tokio's blocking pool.
///
/// Dropping it returns the connection to the pool — once a query whose
/// `run` call was dropped has stopped.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), grpc_deadline_db::Error> {
/// use grpc_deadline::Scope;
/// use grpc_deadline_db::sqlite::SqlitePool;
///
/// let pool = SqlitePool::open_in_memory(1)?;
/// let mut conn = pool.acquire(&Scope::current()).await?;
/// conn.run(|c| c.execute_batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (7)"))
///     .await?;
/// let x = conn.run(|c| c.query_row("SELECT x FROM t", [], |r| r.get::<_, i64>(0))).await?;
/// assert_eq!(x, 7);
/// # Ok(())
/// # }
/// ```
pub struct SqliteConn {
    /// The connection and its permit, while no query runs on it.
    lease: Option<Lease>,
    /// A query still running on the connection: its `run` call was dropped,
    /// or the query ignored the interrupt. The task hands the lease back.
    running: Option<JoinHandle<Lease>>,
    scope: Scope,
    shared: Arc<Shared>,
}

impl fmt::Debug for SqliteConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteConn")
            .field("scope", &self.scope)
            .field("running", &self.running.is_some())
            .finish_non_exhaustive()
    }
}

impl SqliteConn {
    /// Runs `query` with the connection on a blocking thread; stops it on
    /// the database when the connection's scope ends.
    ///
    /// Each `run` is a unit: a transaction `query` leaves open (because it
    /// was stopped, or failed) is rolled back before `run` returns. Use
    /// [`Connection::transaction`] within one `run`.
    ///
    /// # Errors
    ///
    /// Stopped because the scope ended, or SQLite's own error.
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future stops the query as if the scope had ended; the
    /// connection's next query (or the pool, once the `SqliteConn` is
    /// dropped) gets the connection as soon as SQLite has stopped.
    pub async fn run<T, F>(&mut self, query: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        self.scope.check()?;
        self.reclaim().await?;
        let Some(lease) = self.lease.take() else {
            return Err(Error::database("connection already released"));
        };
        // The query's own scope: ended with the connection's, and also when
        // this future is dropped.
        let watched = self.scope.child();
        let run = Arc::new(Run::default());
        let _stop_on_drop = StopOnDrop {
            scope: watched.clone(),
            run: run.clone(),
            shared: self.shared.clone(),
        };
        // The interrupt is delivered only while this query still runs on the
        // connection: the blocking thread takes the handle away, under the
        // lock, when the query returns. Otherwise a late interrupt could
        // stop the connection's *next* query.
        let interrupt = Arc::new(Mutex::new(Some(lease.connection().get_interrupt_handle())));
        let ended_at: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
        let (sent, mut out) = tokio::sync::oneshot::channel();
        let span = tracing::Span::current();
        // The query watches `watched` itself and is interrupted when it ends.
        #[allow(clippy::disallowed_methods)]
        let handle = tokio::task::spawn_blocking({
            let (watched, ended_at) = (watched.clone(), ended_at.clone());
            let (interrupt, shared) = (interrupt.clone(), self.shared.clone());
            move || {
                let _span = span.enter();
                let mut lease = lease;
                let result = lease.run(&watched, query);
                if let Some(at) = ended_at.get()
                    && at.elapsed() > STOP_GRACE
                {
                    note_if_outlived(&watched, "sqlite query");
                }
                interrupt.lock().unwrap_or_else(|p| p.into_inner()).take();
                run.finish(&shared);
                let _ = sent.send(result);
                lease // back to the connection, or to the pool if it is gone
            }
        });
        let running = self.running.insert(handle);
        let ended = tokio::select! {
            biased;
            joined = running => Ok(joined),
            cause = watched.ended() => Err(cause),
        };
        match ended {
            Ok(joined) => {
                self.returned(joined).map_err(rethrow)?;
                // The task sends its result before it hands the lease back.
                let result = out
                    .try_recv()
                    .map_err(|_| Error::database("the query returned no result"))?;
                result.map_err(|err| match watched.cause() {
                    // The progress handler saw the end first.
                    Some(cause) if is_interrupt(&err) => {
                        self.shared.cancels.fetch_add(1, Ordering::Relaxed);
                        Error::ended(cause)
                    }
                    _ => Error::database(err),
                })
            }
            Err(cause) => {
                let _ = ended_at.set(Instant::now());
                if let Some(handle) = interrupt.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                    handle.interrupt();
                }
                self.shared.cancels.fetch_add(1, Ordering::Relaxed);
                // SQLite stops within a few VM steps; wait for it, so the
                // connection is idle again when we return.
                if let Some(running) = self.running.as_mut() {
                    match tokio::time::timeout(STOP_GRACE, running)
                        .instrument(tracing::Span::current())
                        .await
                    {
                        Ok(joined) => self.returned(joined).map_err(rethrow)?,
                        Err(_) => tracing::warn!(
                            %cause,
                            "sqlite query still running after the interrupt; it keeps its connection until it returns"
                        ),
                    }
                }
                Err(Error::ended(cause))
            }
        }
    }

    /// Takes the connection back from a query that returned, or gives the
    /// task's failure (the connection went back to the pool as the query's
    /// panic unwound).
    fn returned(
        &mut self,
        joined: Result<Lease, tokio::task::JoinError>,
    ) -> Result<(), tokio::task::JoinError> {
        self.running = None;
        self.lease = Some(joined?);
        Ok(())
    }

    /// Waits, under the scope, for a query still running on the connection
    /// (its call was dropped, so it is being interrupted).
    async fn reclaim(&mut self) -> Result<(), Error> {
        let Some(running) = self.running.as_mut() else {
            return Ok(());
        };
        let joined = tokio::select! {
            biased;
            joined = running => joined,
            cause = self.scope.ended() => return Err(Error::ended(cause)),
        };
        // The caller of a query that panicked is gone: this one gets an
        // error, not the panic.
        self.returned(joined).map_err(Error::database)
    }
}

/// The panic of a query, in the caller's task; any other failure of its
/// task as an error.
fn rethrow(err: tokio::task::JoinError) -> Error {
    if err.is_panic() {
        std::panic::resume_unwind(err.into_panic());
    }
    Error::database(err)
}

fn is_interrupt(err: &rusqlite::Error) -> bool {
    err.sqlite_error_code() == Some(rusqlite::ErrorCode::OperationInterrupted)
}

/// Whether a query's call is over before the query itself.
#[derive(Default)]
struct Run {
    /// (the query returned, its call was dropped or returned first)
    state: Mutex<(bool, bool)>,
}

impl Run {
    /// The query returned; a clean-up counted for it is over.
    fn finish(&self, shared: &Shared) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.0 = true;
        if state.1 {
            shared.cleanups_running.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The call is over; if the query still runs, it counts as a clean-up.
    fn leave(&self, shared: &Shared) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !state.0 && !state.1 {
            state.1 = true;
            shared.cleanups_running.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Ends the query's scope when the call's future goes away.
struct StopOnDrop {
    scope: Scope,
    run: Arc<Run>,
    shared: Arc<Shared>,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.scope.cancel();
        self.run.leave(&self.shared);
    }
}

/// A connection taken from the pool with the permit that allowed it.
struct Lease {
    conn: Option<Connection>,
    permit: Option<Permit>,
    shared: Arc<Shared>,
}

impl Lease {
    fn connection(&self) -> &Connection {
        self.conn
            .as_ref()
            .expect("a lease holds its connection until dropped")
    }

    fn run<T, F>(&mut self, scope: &Scope, query: F) -> rusqlite::Result<T>
    where
        F: FnOnce(&mut Connection) -> rusqlite::Result<T>,
    {
        let conn = self
            .conn
            .as_mut()
            .expect("a lease holds its connection until dropped");
        let watched = AssertUnwindSafe(scope.clone());
        conn.progress_handler(PROGRESS_STEPS, Some(move || watched.is_ended()));
        let out = query(conn);
        conn.progress_handler(PROGRESS_STEPS, None::<fn() -> bool>);
        if !conn.is_autocommit() {
            // A transaction left open by a stopped query must not reach the
            // next query.
            let _ = conn.execute_batch("ROLLBACK");
        }
        out
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.shared.idle().push(conn);
        }
        drop(self.permit.take());
    }
}
