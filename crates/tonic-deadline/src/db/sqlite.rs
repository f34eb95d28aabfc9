//! A SQLite pool whose queries stop when the scope ends.
//!
//! Each query runs on tokio's blocking pool with a connection taken from the
//! pool through a deadline-aware [`Admission`]. When the scope ends (deadline,
//! caller cancel, or the call's future being dropped) the running statement
//! is interrupted with `sqlite3_interrupt`, and a progress handler stops any
//! statement that starts later; the call returns once the connection is back
//! in the pool, so the next caller can use it at once.
//!
//! How it differs from wrapping `spawn_blocking` in `tokio::time::timeout`:
//! the timeout returns, but the query runs on, holding its connection and a
//! blocking thread for as long as it takes.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tonic_deadline::Scope;
//! use tonic_deadline::db::sqlite::SqlitePool;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let pool = SqlitePool::open_in_memory(2).expect("in-memory databases open");
//! let scope = Scope::background().with_timeout(Duration::from_millis(50));
//! // Far more than 50 ms of work: stopped on the database at the deadline.
//! let endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) \
//!                SELECT count(*) FROM c";
//! let err = pool
//!     .run_in(&scope, move |c| c.query_row(endless, [], |r| r.get::<_, i64>(0)))
//!     .await
//!     .expect_err("the query cannot finish in 50 ms");
//! assert_eq!(tonic::Status::from(err).code(), tonic::Code::DeadlineExceeded);
//! assert_eq!(pool.stats().idle, 2, "the connection is back in the pool");
//! # }
//! ```
//!
//! # Invariants
//!
//! 1. A connection is either idle in the pool or owned by exactly one
//!    running query; it is returned to the pool before that query's permit
//!    is released, so a permit always finds an idle connection. An
//!    interrupt reaches a connection only while the query it was meant for
//!    still owns it.
//! 2. When [`run_in`](SqlitePool::run_in) returns because the scope ended,
//!    the query has already stopped and its connection is idle — unless the
//!    closure's own Rust code ignores the scope, in which case it is counted
//!    in the server layer's [`Metrics`](crate::observe::Metrics) when it finally returns.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

pub use rusqlite;
use rusqlite::Connection;
use tokio::time::Instant;
use tracing::Instrument;

use super::Error;
use crate::admission::{Admission, Permit};
use crate::scope::{Scope, note_if_outlived};

/// How many SQLite virtual-machine steps run between two looks at the scope.
const PROGRESS_STEPS: i32 = 1000;

/// How long a query may take to stop after the interrupt before it counts as
/// work that outlived its scope.
const STOP_GRACE: Duration = Duration::from_millis(50);

/// A pool of SQLite connections behind a deadline-aware queue. Cheap to
/// clone. See the [module docs](self).
#[derive(Clone)]
pub struct SqlitePool {
    shared: Arc<Shared>,
}

struct Shared {
    admission: Admission,
    idle: Mutex<Vec<Connection>>,
    size: usize,
    interrupted: AtomicU64,
}

impl Shared {
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Connection>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Counters of a [`SqlitePool`], for metrics and leak checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Connections in the pool.
    pub size: usize,
    /// Connections idle right now.
    pub idle: usize,
    /// Callers waiting for a connection right now.
    pub queued: usize,
    /// Queries interrupted because their scope ended.
    pub interrupted: u64,
}

impl fmt::Debug for SqlitePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlitePool")
            .field("stats", &self.stats())
            .finish()
    }
}

impl SqlitePool {
    /// A pool over `connections` (all to the same database, typically), with
    /// an adaptive-LIFO admission queue.
    ///
    /// # Panics
    ///
    /// If `connections` is empty.
    pub fn new(connections: Vec<Connection>) -> Self {
        let admission = Admission::new(connections.len());
        Self::with_admission(connections, admission)
    }

    /// A pool over `connections` whose callers wait through `admission`
    /// (for another queue discipline or a seeded service time). The
    /// admission must have exactly one permit per connection.
    ///
    /// # Panics
    ///
    /// If the admission's permits differ from the number of connections.
    pub fn with_admission(connections: Vec<Connection>, admission: Admission) -> Self {
        assert_eq!(
            admission.stats().permits,
            connections.len(),
            "one permit per connection"
        );
        Self {
            shared: Arc::new(Shared {
                admission,
                size: connections.len(),
                idle: Mutex::new(connections),
                interrupted: AtomicU64::new(0),
            }),
        }
    }

    /// `size` connections to the database file at `path` (created if
    /// absent), in WAL mode with a 5 s busy timeout.
    ///
    /// # Errors
    ///
    /// Opening or configuring a connection failed.
    pub fn open(path: impl AsRef<Path>, size: usize) -> rusqlite::Result<Self> {
        let mut connections = Vec::with_capacity(size);
        for _ in 0..size.max(1) {
            let conn = Connection::open(path.as_ref())?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.busy_timeout(Duration::from_secs(5))?;
            connections.push(conn);
        }
        Ok(Self::new(connections))
    }

    /// `size` independent in-memory databases (useful for tests and for
    /// read-only computed queries).
    ///
    /// # Errors
    ///
    /// Opening a connection failed.
    pub fn open_in_memory(size: usize) -> rusqlite::Result<Self> {
        let connections = (0..size.max(1))
            .map(|_| Connection::open_in_memory())
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(Self::new(connections))
    }

    /// Counters: connections idle, callers queued, queries interrupted.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            size: self.shared.size,
            idle: self.shared.idle().len(),
            queued: self.shared.admission.stats().queued,
            interrupted: self.shared.interrupted.load(Ordering::Relaxed),
        }
    }

    /// The admission queue in front of the connections.
    pub fn admission(&self) -> &Admission {
        &self.shared.admission
    }

    /// Runs `query` under the current scope (see [`run_in`](Self::run_in)).
    ///
    /// # Errors
    ///
    /// As [`run_in`](Self::run_in).
    pub async fn run<T, F>(&self, query: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        self.run_in(&Scope::current(), query).await
    }

    /// Waits for a connection under `scope`, then runs `query` with it on a
    /// blocking thread; stops the query on the database when the scope ends.
    ///
    /// # Errors
    ///
    /// Not admitted (scope ended while waiting, not enough time left, queue
    /// full), stopped because the scope ended, or SQLite's own error.
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future stops the query as if the scope had ended, and the
    /// connection returns to the pool as soon as SQLite has stopped.
    pub async fn run_in<T, F>(&self, scope: &Scope, query: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let permit = self.shared.admission.acquire(scope).await?;
        let conn = self.shared.idle().pop();
        let Some(conn) = conn else {
            // Invariant 1 makes this unreachable; fail safe rather than panic.
            return Err(Error::database(
                "sqlite pool: no idle connection for a permit",
            ));
        };
        let lease = Lease {
            conn: Some(conn),
            permit: Some(permit),
            shared: self.shared.clone(),
        };
        // The query's own scope: ended with the caller's, and also when this
        // future is dropped.
        let watched = scope.child();
        let _stop_on_drop = StopOnDrop(watched.clone());
        // The interrupt is delivered only while this call still owns the
        // connection: the blocking thread takes the handle away, under the
        // lock, before the connection goes back to the pool. Otherwise a late
        // interrupt could stop the *next* caller's query on it.
        let interrupt = Arc::new(Mutex::new(Some(lease.connection().get_interrupt_handle())));
        let ended_at: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
        let span = tracing::Span::current();
        // The query watches `watched` itself and is interrupted when it ends.
        #[allow(clippy::disallowed_methods)]
        let mut handle = tokio::task::spawn_blocking({
            let watched = watched.clone();
            let ended_at = ended_at.clone();
            let interrupt = interrupt.clone();
            move || {
                let _span = span.enter();
                let mut lease = lease;
                let out = lease.run(&watched, query);
                if let Some(at) = ended_at.get()
                    && at.elapsed() > STOP_GRACE
                {
                    note_if_outlived(&watched, "sqlite query");
                }
                interrupt.lock().unwrap_or_else(|p| p.into_inner()).take();
                drop(lease); // connection back, then permit released
                out
            }
        });
        tokio::select! {
            biased;
            joined = &mut handle => {
                let out = finish(joined);
                match (&out, watched.cause()) {
                    // The progress handler saw the end first.
                    (Err(err), Some(cause)) if is_interrupt(err) => {
                        self.shared.interrupted.fetch_add(1, Ordering::Relaxed);
                        Err(Error::ended(cause))
                    }
                    _ => out,
                }
            }
            cause = watched.ended() => {
                let _ = ended_at.set(Instant::now());
                if let Some(handle) = interrupt.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                    handle.interrupt();
                }
                self.shared.interrupted.fetch_add(1, Ordering::Relaxed);
                // SQLite stops within a few VM steps; wait for it, so the
                // connection is idle again when we return.
                match tokio::time::timeout(STOP_GRACE, &mut handle)
                    .instrument(tracing::Span::current())
                    .await
                {
                    Ok(joined) => {
                        if let Err(panic) = joined {
                            std::panic::resume_unwind(panic.into_panic());
                        }
                    }
                    Err(_) => tracing::warn!(
                        %cause,
                        "sqlite query still running after the interrupt; it keeps its connection until it returns"
                    ),
                }
                Err(Error::ended(cause))
            }
        }
    }
}

fn finish<T>(joined: Result<rusqlite::Result<T>, tokio::task::JoinError>) -> Result<T, Error> {
    match joined {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(err)) => Err(Error::database(err)),
        Err(err) => std::panic::resume_unwind(err.into_panic()),
    }
}

fn is_interrupt(err: &Error) -> bool {
    err.database_error()
        .and_then(|e| e.downcast_ref::<rusqlite::Error>())
        .and_then(rusqlite::Error::sqlite_error_code)
        == Some(rusqlite::ErrorCode::OperationInterrupted)
}

/// Ends the query's scope when the call's future goes away.
struct StopOnDrop(Scope);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
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
            // next caller.
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
