//! A [sqlx] SQLite pool whose statements stop when the scope ends.
//!
//! sqlx runs each SQLite connection on a worker thread of its own; dropping a
//! query future does not stop the statement there — the worker steps it to
//! its end, and the connection's next statement waits behind it. Here every
//! connection taken from the pool
//!
//! 1. waits through a deadline-aware [`Admission`] and then sqlx's own pool,
//!    both racing the scope (queue time spends the budget);
//! 2. gets a SQLite *progress handler* watching the scope (one round trip to
//!    the worker per connection taken): once the scope ends, or the call's
//!    future is dropped, the running statement fails with `SQLITE_INTERRUPT`
//!    within 1000 virtual-machine steps;
//! 3. when the scope ends mid-statement, the statement's own future is polled
//!    on until the worker reports the interrupt, and a `ROLLBACK` makes sure
//!    no transaction of the stopped call stays open. Only then does the call
//!    return, with the connection idle.
//!
//! # What sqlx does not allow
//!
//! `sqlite3_interrupt` needs the raw handle and `unsafe` code; sqlx's safe
//! progress handler gives the same result a few steps later. Neither stops a
//! statement that waits for a lock in SQLite's busy handler: it waits up to
//! the connection's `busy_timeout` (5 s by default here) before it can see
//! the scope.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use grpc_deadline::Scope;
//! use grpc_deadline_db::sqlx_sqlite::SqlxSqlitePool;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let pool = SqlxSqlitePool::open_in_memory(1).expect("in-memory databases open");
//! let scope = Scope::background().with_timeout(Duration::from_millis(50));
//! let endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) \
//!                SELECT count(*) FROM c";
//! let mut conn = pool.acquire(&scope).await.expect("a connection");
//! let err = conn.fetch_all(sqlx::query(endless)).await.expect_err("cannot finish in 50 ms");
//! assert_eq!(err.code(), grpc_deadline::Code::DeadlineExceeded);
//! # }
//! ```
//!
//! # Invariants
//!
//! 1. A progress handler left on a connection after its call is inert: it
//!    stops a statement only while the call that installed it is active.
//! 2. The admission permit of a connection is released only after the
//!    connection has been handed back to sqlx.

use std::fmt;
use std::future::Future;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions,
    SqliteQueryResult, SqliteRow,
};
use sqlx::{Executor, Sqlite};

use super::{BoxQuery, DEFAULT_SIZE, Error, PoolStats, admission_for, spawn_cleanup, sqlx_size};
use grpc_deadline::admission::{Admission, Permit};
use grpc_deadline::scope::{Cause, Scope};

pub use sqlx;

/// How many SQLite virtual-machine steps run between two looks at the scope.
const PROGRESS_STEPS: i32 = 1000;

/// How long a stopped statement may take to end before its connection is
/// closed instead of reused.
const STOP_LIMIT: Duration = Duration::from_secs(5);

/// SQLite's result code for an interrupted statement.
const SQLITE_INTERRUPT: &str = "9";

/// A pool of sqlx SQLite connections behind a deadline-aware queue. Cheap to
/// clone. See the [module docs](self).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), grpc_deadline_db::Error> {
/// use grpc_deadline_db::sqlx_sqlite::SqlxSqlitePool;
/// let pool = SqlxSqlitePool::open_in_memory(2)?;
/// assert_eq!(pool.stats().max_size, 2);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SqlxSqlitePool {
    shared: Arc<Shared>,
}

struct Shared {
    pool: sqlx::SqlitePool,
    admission: Admission,
    cancels: AtomicU64,
    discarded: AtomicU64,
    cleanups_running: AtomicU64,
}

impl fmt::Debug for SqlxSqlitePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxSqlitePool")
            .field("stats", &self.stats())
            .finish()
    }
}

/// Configures a [`SqlxSqlitePool`]; [`build`](Self::build) freezes it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), grpc_deadline_db::Error> {
/// use std::time::Duration;
/// use grpc_deadline_db::sqlx_sqlite::{SqlxSqlitePool, sqlx};
///
/// let connect = sqlx::sqlite::SqliteConnectOptions::new()
///     .filename("orders.db")
///     .create_if_missing(true)
///     .busy_timeout(Duration::from_millis(500));
/// let pool = SqlxSqlitePool::builder(connect).size(4).build()?;
/// assert_eq!(pool.stats().max_size, 4);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build`"]
pub struct SqlxSqlitePoolBuilder {
    connect: SqliteConnectOptions,
    pool: SqlitePoolOptions,
    size: usize,
    admission: Option<Admission>,
}

impl SqlxSqlitePoolBuilder {
    /// The most connections the pool opens (default 10). It replaces the
    /// `max_connections` of [`pool_options`](Self::pool_options).
    pub fn size(mut self, size: usize) -> Self {
        self.size = size;
        self
    }

    /// sqlx's own pool options (lifetimes, timeouts, hooks); their
    /// `max_connections` is replaced by [`size`](Self::size).
    pub fn pool_options(mut self, options: SqlitePoolOptions) -> Self {
        self.pool = options;
        self
    }

    /// Waits for connections through `admission` instead of the default
    /// adaptive-LIFO queue. It must have one permit per connection.
    pub fn admission(mut self, admission: Admission) -> Self {
        self.admission = Some(admission);
        self
    }

    /// The pool; connections open on first use.
    ///
    /// # Errors
    ///
    /// A size of zero or beyond sqlx's `u32`, or an admission whose permits
    /// differ from the size.
    pub fn build(self) -> Result<SqlxSqlitePool, Error> {
        let admission = admission_for(self.size, self.admission)?;
        let size = sqlx_size(self.size)?;
        Ok(SqlxSqlitePool {
            shared: Arc::new(Shared {
                pool: self
                    .pool
                    .max_connections(size)
                    .connect_lazy_with(self.connect),
                admission,
                cancels: AtomicU64::new(0),
                discarded: AtomicU64::new(0),
                cleanups_running: AtomicU64::new(0),
            }),
        })
    }
}

impl SqlxSqlitePool {
    /// A builder for a pool connecting with `connect`.
    pub fn builder(connect: SqliteConnectOptions) -> SqlxSqlitePoolBuilder {
        SqlxSqlitePoolBuilder {
            connect,
            pool: SqlitePoolOptions::new(),
            size: DEFAULT_SIZE,
            admission: None,
        }
    }

    /// At most `size` connections to the database file at `path` (created if
    /// absent), in WAL mode with a 5 s busy timeout, opened on first use.
    ///
    /// # Errors
    ///
    /// The size is refused (as in [`SqlxSqlitePoolBuilder::build`]).
    pub fn open(path: impl AsRef<Path>, size: usize) -> Result<Self, Error> {
        let options = SqliteConnectOptions::new()
            .filename(path.as_ref())
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(5));
        Self::builder(options).size(size).build()
    }

    /// `size` independent in-memory databases (for tests and computed
    /// queries).
    ///
    /// # Errors
    ///
    /// The size is refused (as in [`SqlxSqlitePoolBuilder::build`]).
    pub fn open_in_memory(size: usize) -> Result<Self, Error> {
        let options = SqliteConnectOptions::from_str("sqlite::memory:").map_err(Error::database)?;
        Self::builder(options)
            // Keep every connection: an in-memory database dies with it.
            .pool_options(
                SqlitePoolOptions::new()
                    .idle_timeout(None)
                    .max_lifetime(None),
            )
            .size(size)
            .build()
    }

    /// Counters: connections open and idle, callers queued, interrupts.
    pub fn stats(&self) -> PoolStats {
        let pool = &self.shared.pool;
        PoolStats {
            max_size: pool.options().get_max_connections() as usize,
            size: pool.size() as usize,
            idle: pool.num_idle(),
            queued: self.shared.admission.stats().queued,
            cancels: self.shared.cancels.load(Ordering::Relaxed),
            cancels_failed: 0,
            discarded: self.shared.discarded.load(Ordering::Relaxed),
            cleanups_running: self.shared.cleanups_running.load(Ordering::Relaxed),
        }
    }

    /// The admission queue in front of the connections.
    pub fn admission(&self) -> &Admission {
        &self.shared.admission
    }

    /// Waits for a connection under `scope` and arms its progress handler;
    /// its statements run under the same scope.
    ///
    /// # Errors
    ///
    /// Not admitted (the scope ended while waiting, not enough time left),
    /// or sqlx could not give a connection.
    ///
    /// # Cancellation safety
    ///
    /// Safe: dropping the future leaves the queue or returns the connection.
    pub async fn acquire(&self, scope: &Scope) -> Result<SqlxSqliteConn, Error> {
        let permit = self.shared.admission.acquire(scope).await?;
        // Run to its end on a task of its own, so that a connection sqlx is
        // opening when the scope ends is not abandoned but returned to the
        // pool, before the permit is released.
        let pool = self.shared.pool.clone();
        let watch = Arc::new(Watch {
            scope: scope.clone(),
            active: AtomicBool::new(true),
            dropped: AtomicBool::new(false),
        });
        let watched = watch.clone();
        #[allow(clippy::disallowed_methods)] // the pool's own work, not the request's
        let mut pending = tokio::spawn(async move {
            let arm = async {
                let mut conn = pool.acquire().await?;
                conn.lock_handle()
                    .await?
                    .set_progress_handler(PROGRESS_STEPS, move || !watched.stops());
                Ok::<_, sqlx::Error>(conn)
            };
            (arm.await, permit)
        });
        let (conn, permit) = tokio::select! {
            biased;
            joined = &mut pending => joined.map_err(Error::database)?,
            cause = scope.ended() => {
                // The connection the task may still arm must not be stopped
                // by this scope later.
                watch.active.store(false, Ordering::Release);
                return Err(Error::ended(cause));
            }
        };
        let conn = conn.map_err(Error::database)?;
        Ok(SqlxSqliteConn {
            conn: Some(conn),
            permit: Some(permit),
            watch,
            shared: self.shared.clone(),
            dirty: false,
        })
    }
}

/// What a connection's progress handler looks at.
struct Watch {
    scope: Scope,
    /// The call that armed the handler still holds the connection.
    active: AtomicBool,
    /// A statement's future was dropped before its end.
    dropped: AtomicBool,
}

impl Watch {
    /// Whether the running statement must stop. Runs on sqlx's worker
    /// thread, every [`PROGRESS_STEPS`] steps.
    fn stops(&self) -> bool {
        self.active.load(Ordering::Acquire)
            && (self.dropped.load(Ordering::Acquire) || self.scope.is_ended())
    }
}

/// Marks a statement as abandoned if its future is dropped before its end.
struct DropMark<'a> {
    watch: &'a Watch,
    armed: bool,
}

impl Drop for DropMark<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.watch.dropped.store(true, Ordering::Release);
        }
    }
}

/// A pooled connection bound to the scope it was taken under.
///
/// Dropping it returns the connection to the pool — after waiting, on a
/// background task, for a statement whose call was dropped to stop.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), grpc_deadline_db::Error> {
/// use grpc_deadline_db::sqlx_sqlite::{SqlxSqlitePool, sqlx};
/// let pool = SqlxSqlitePool::open_in_memory(1)?;
/// let mut conn = pool.acquire(&grpc_deadline::Scope::current()).await?;
/// conn.execute(sqlx::query("CREATE TABLE t (x INTEGER)")).await?;
/// let done = conn.execute(sqlx::query("INSERT INTO t VALUES (1), (2)")).await?;
/// assert_eq!(done.rows_affected(), 2);
/// # Ok(())
/// # }
/// ```
pub struct SqlxSqliteConn {
    conn: Option<PoolConnection<Sqlite>>,
    permit: Option<Permit>,
    watch: Arc<Watch>,
    shared: Arc<Shared>,
    /// A statement was started and its end not yet seen.
    dirty: bool,
}

impl fmt::Debug for SqlxSqliteConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxSqliteConn")
            .field("scope", &self.watch.scope)
            .finish_non_exhaustive()
    }
}

fn is_interrupt(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code == SQLITE_INTERRUPT)
}

/// Waits until the connection is idle after a stopped or abandoned
/// statement, and rolls back what the stopped call may have left open.
async fn clean(conn: &mut SqliteConnection) -> Result<(), Error> {
    // The worker runs commands in order: this one starts only after the
    // stopped statement has ended. Outside a transaction ROLLBACK fails
    // harmlessly.
    match tokio::time::timeout(STOP_LIMIT, conn.execute("ROLLBACK")).await {
        Ok(_) => Ok(()),
        Err(_) => Err(Error::database("sqlite statement did not stop")),
    }
}

impl SqlxSqliteConn {
    fn parts(&mut self) -> Result<(&mut PoolConnection<Sqlite>, &Watch, &Shared), Error> {
        let conn = self
            .conn
            .as_mut()
            .ok_or_else(|| Error::database("connection already released"))?;
        Ok((conn, &self.watch, &self.shared))
    }

    async fn begin(&mut self) -> Result<(), Error> {
        self.watch.scope.check()?;
        if self.dirty {
            let (conn, ..) = self.parts()?;
            if let Err(err) = clean(conn).await {
                self.discard();
                return Err(err);
            }
        }
        self.watch.dropped.store(false, Ordering::Release);
        self.dirty = true;
        Ok(())
    }

    async fn statement<T>(
        watch: &Watch,
        shared: &Shared,
        work: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Outcome<T> {
        let mut mark = DropMark { watch, armed: true };
        let mut work = std::pin::pin!(work);
        let cause = tokio::select! {
            biased;
            out = &mut work => {
                mark.armed = false;
                return Outcome::Finished(out);
            }
            cause = watch.scope.ended() => cause,
        };
        // The progress handler sees the end within a few steps; let the
        // worker report it, so the connection is idle when we return.
        let drained = tokio::time::timeout(STOP_LIMIT, &mut work).await.is_ok();
        mark.armed = false;
        if drained {
            shared.cancels.fetch_add(1, Ordering::Relaxed);
        }
        Outcome::Stopped { cause, drained }
    }

    async fn finish<T>(&mut self, outcome: Outcome<T>) -> Result<T, Error> {
        match outcome {
            Outcome::Finished(Ok(out)) => {
                self.dirty = false;
                Ok(out)
            }
            Outcome::Finished(Err(err)) => {
                match self.watch.scope.cause() {
                    // The handler saw the end before our own race did.
                    Some(cause) if is_interrupt(&err) => {
                        self.shared.cancels.fetch_add(1, Ordering::Relaxed);
                        let (conn, ..) = self.parts()?;
                        let cleaned = clean(conn).await;
                        self.after_clean(cleaned);
                        Err(Error::ended(cause))
                    }
                    _ => {
                        self.dirty = false;
                        Err(Error::database(err))
                    }
                }
            }
            Outcome::Stopped { cause, drained } => {
                if drained {
                    let (conn, ..) = self.parts()?;
                    let cleaned = clean(conn).await;
                    self.after_clean(cleaned);
                } else {
                    self.discard();
                }
                Err(Error::ended(cause))
            }
        }
    }

    fn after_clean(&mut self, cleaned: Result<(), Error>) {
        match cleaned {
            Ok(()) => self.dirty = false,
            Err(err) => {
                tracing::warn!(error = %err, "closing a connection that could not be cleaned");
                self.discard();
            }
        }
    }

    /// Closes the connection instead of returning it.
    fn discard(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            self.shared.discarded.fetch_add(1, Ordering::Relaxed);
            conn.close_on_drop();
        }
        drop(self.permit.take());
    }

    /// Runs `work` — any sqlx code on the connection — under the
    /// connection's scope (see the module docs).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use grpc_deadline_db::sqlx_sqlite::SqlxSqlitePool;
    /// let pool = SqlxSqlitePool::open_in_memory(1).unwrap();
    /// let mut conn = pool.acquire(&grpc_deadline::Scope::current()).await.unwrap();
    /// let (n,): (i64,) = conn
    ///     .run(|c| Box::pin(async move { sqlx::query_as("SELECT 41 + 1").fetch_one(c).await }))
    ///     .await
    ///     .unwrap();
    /// assert_eq!(n, 42);
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The scope ended (the statement was interrupted), or SQLite's own
    /// error.
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future interrupts the statement; the connection is
    /// cleaned when it is used again or dropped.
    pub async fn run<T, F>(&mut self, work: F) -> Result<T, Error>
    where
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxQuery<'c, T>,
    {
        self.begin().await?;
        let (conn, watch, shared) = self.parts()?;
        let outcome = Self::statement(watch, shared, work(conn)).await;
        self.finish(outcome).await
    }

    /// Runs `query` under the connection's scope and returns its rows.
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    pub async fn fetch_all<'q, E>(&mut self, query: E) -> Result<Vec<SqliteRow>, Error>
    where
        E: sqlx::Execute<'q, Sqlite> + 'q,
    {
        self.begin().await?;
        let (conn, watch, shared) = self.parts()?;
        let outcome = Self::statement(watch, shared, conn.fetch_all(query)).await;
        self.finish(outcome).await
    }

    /// Runs `query` under the connection's scope and returns what it changed.
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    pub async fn execute<'q, E>(&mut self, query: E) -> Result<SqliteQueryResult, Error>
    where
        E: sqlx::Execute<'q, Sqlite> + 'q,
    {
        self.begin().await?;
        let (conn, watch, shared) = self.parts()?;
        let outcome = Self::statement(watch, shared, conn.execute(query)).await;
        self.finish(outcome).await
    }
}

/// How a statement raced its scope.
enum Outcome<T> {
    Finished(Result<T, sqlx::Error>),
    Stopped { cause: Cause, drained: bool },
}

impl Drop for SqlxSqliteConn {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        let permit = self.permit.take();
        let watch = self.watch.clone();
        if !self.dirty {
            watch.active.store(false, Ordering::Release); // the handler goes inert,
            drop(conn); // the connection back to sqlx's pool,
            drop(permit); // then the next caller may take it
            return;
        }
        // Dropped mid-statement: the handler stops it (the drop mark is
        // set); wait for that on a task of its own, then release.
        watch.dropped.store(true, Ordering::Release);
        let shared = self.shared.clone();
        let cleanup = async move {
            if let Err(err) = clean(&mut conn).await {
                tracing::warn!(error = %err, "closing a connection that could not be cleaned");
                shared.discarded.fetch_add(1, Ordering::Relaxed);
                conn.close_on_drop();
            }
            watch.active.store(false, Ordering::Release);
            drop(conn);
            drop(permit);
            shared.cleanups_running.fetch_sub(1, Ordering::Relaxed);
        };
        spawn_cleanup(&self.shared.cleanups_running, cleanup);
    }
}
