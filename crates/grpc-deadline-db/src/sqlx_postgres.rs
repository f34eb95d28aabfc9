//! A [sqlx] PostgreSQL pool whose statements stop *on the server* when the
//! scope ends.
//!
//! Dropping a sqlx query future does not stop the query: the server runs it
//! to its end, and the connection's next query waits behind it (sqlx drains
//! the abandoned answer first). Here
//!
//! 1. [`SqlxPgPool::acquire`] waits for a connection through a
//!    deadline-aware [`Admission`] and then sqlx's own pool, both racing the
//!    scope (queue time spends the budget);
//! 2. the first statement on the acquired connection is preceded by
//!    `set_config('statement_timeout', …)` with the scope's remaining budget,
//!    so the server stops on its own even if nothing else reaches it (a
//!    backstop: see below);
//! 3. when the scope ends before a statement does (deadline, caller cancel),
//!    the statement gets
//!    `pg_cancel_backend` for its backend from a side connection: the server
//!    stops it with SQLSTATE 57014. The statement's own future is then
//!    polled on until sqlx has read the server's answer, so the connection
//!    stays in step with the protocol, and a `ROLLBACK` (a no-op outside a
//!    transaction) makes sure no transaction of the stopped call stays open.
//!    Only then does the call return.
//!
//! If the call itself is dropped mid-statement, the connection is cleaned the
//! same way on a task of its own before it goes back to the pool.
//!
//! # What sqlx does not allow, and what it costs
//!
//! - sqlx 0.9 reads the connection's cancel key (`BackendKeyData`) but keeps
//!   it private, so the protocol's cancel request cannot be sent. The cancel
//!   goes through `pg_cancel_backend(pid)` on a *side pool* (one connection
//!   kept open, at most two) instead. It needs the same role as
//!   the pool, or membership in `pg_signal_backend`, and it does not work
//!   behind a pooler in transaction mode (the backend pid is not the
//!   client's); [`SqlxPgPoolBuilder::cancel_requests`] turns it off, leaving
//!   `statement_timeout` alone.
//! - sqlx has no pipelining, so setting `statement_timeout` costs a round
//!   trip of its own. The cancel request already stops a statement at the
//!   deadline, so the timeout is set once per acquired connection, before
//!   its first statement (the same round trip reads the backend pid): every
//!   statement on that connection is bounded on the server by the budget
//!   that was left then, and stopped by the cancel request at the deadline
//!   itself. A cancel request that cannot be delivered is counted
//!   ([`PoolStats::cancels_failed`](super::PoolStats::cancels_failed)) and
//!   logged at WARN; its statement then stops at that timeout, or its
//!   connection is closed after 5 s. With
//!   [`cancel_requests(false)`](SqlxPgPoolBuilder::cancel_requests) the
//!   timeout is all that stops a statement, so it is refreshed to the
//!   remaining budget before every statement: one round trip each.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use grpc_deadline::Scope;
//! use grpc_deadline_db::sqlx_postgres::SqlxPgPool;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = SqlxPgPool::connect("postgresql://postgres@127.0.0.1:5432/postgres", 8)?;
//! let scope = Scope::background().with_timeout(Duration::from_millis(200));
//! let mut conn = pool.acquire(&scope).await?;
//! let err = conn
//!     .fetch_all(sqlx::query("SELECT pg_sleep(5)"))
//!     .await
//!     .expect_err("stopped on the server at 200 ms");
//! assert_eq!(err.code(), grpc_deadline::Code::DeadlineExceeded);
//! # Ok(())
//! # }
//! ```
//!
//! # Invariants
//!
//! 1. A connection goes back to sqlx's pool only when no statement of ours
//!    runs on it and the stopped call's transaction is rolled back;
//!    otherwise it is cleaned (cancel, drain, rollback) first, or closed.
//! 2. The admission permit of a connection is released only after the
//!    connection has been handed back to sqlx (or closed).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{
    PgConnectOptions, PgConnection, PgPoolOptions, PgQueryResult, PgRow, Postgres,
};
use sqlx::{Executor, Row};

use super::{
    BoxQuery, DEFAULT_SIZE, Error, PoolStats, admission_for, spawn_cleanup, sqlx_size,
    statement_timeout_ms,
};
use grpc_deadline::admission::{Admission, Permit};
use grpc_deadline::scope::{Cause, Scope};

pub use sqlx;

/// How long a stopped statement may take to end, and a stopped connection to
/// be cleaned, before the connection is closed instead.
const CLEANUP_LIMIT: Duration = Duration::from_secs(5);

/// Connections of the side pool that sends `pg_cancel_backend`.
const SIDE_CONNECTIONS: u32 = 2;

/// SQLSTATE `query_canceled`: a cancel request or `statement_timeout`.
const QUERY_CANCELED: &str = "57014";

/// A pool of sqlx PostgreSQL connections behind a deadline-aware queue.
/// Cheap to clone. See the [module docs](self).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), grpc_deadline_db::Error> {
/// use grpc_deadline_db::sqlx_postgres::SqlxPgPool;
/// // Connections open on first use.
/// let pool = SqlxPgPool::connect("postgresql://postgres@127.0.0.1:5432/postgres", 8)?;
/// assert_eq!(pool.stats().max_size, 8);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SqlxPgPool {
    shared: Arc<Shared>,
}

struct Shared {
    pool: sqlx::PgPool,
    side: Option<sqlx::PgPool>,
    admission: Admission,
    cancels: AtomicU64,
    cancels_failed: AtomicU64,
    discarded: AtomicU64,
    cleanups_running: AtomicU64,
}

impl fmt::Debug for SqlxPgPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxPgPool")
            .field("stats", &self.stats())
            .finish()
    }
}

/// Configures a [`SqlxPgPool`]; [`build`](Self::build) freezes it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), grpc_deadline_db::Error> {
/// use std::time::Duration;
/// use grpc_deadline_db::sqlx_postgres::{SqlxPgPool, sqlx};
///
/// let connect: sqlx::postgres::PgConnectOptions =
///     "postgresql://postgres@127.0.0.1:5432/postgres".parse().expect("valid");
/// let pool = SqlxPgPool::builder(connect)
///     .size(4)
///     .pool_options(sqlx::postgres::PgPoolOptions::new().idle_timeout(Duration::from_secs(60)))
///     .build()?;
/// assert_eq!(pool.stats().max_size, 4);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build`"]
pub struct SqlxPgPoolBuilder {
    connect: PgConnectOptions,
    pool: PgPoolOptions,
    size: usize,
    cancel_requests: bool,
    admission: Option<Admission>,
}

impl SqlxPgPoolBuilder {
    /// The most connections the pool opens (default 10). It replaces the
    /// `max_connections` of [`pool_options`](Self::pool_options).
    pub fn size(mut self, size: usize) -> Self {
        self.size = size;
        self
    }

    /// sqlx's own pool options (lifetimes, timeouts, hooks); their
    /// `max_connections` is replaced by [`size`](Self::size). The default
    /// differs from sqlx's in one point: no test before every acquire (the
    /// `statement_timeout` round trip before a connection's first statement
    /// tests it anyway).
    pub fn pool_options(mut self, options: PgPoolOptions) -> Self {
        self.pool = options;
        self
    }

    /// Whether a statement whose scope ends gets `pg_cancel_backend` (on by
    /// default). Turn it off where it cannot reach the backend (a pooler in
    /// transaction mode, a role without the right to signal): statements
    /// then stop through their `statement_timeout` alone, refreshed before
    /// every statement (one round trip each).
    pub fn cancel_requests(mut self, on: bool) -> Self {
        self.cancel_requests = on;
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
    pub fn build(self) -> Result<SqlxPgPool, Error> {
        let admission = admission_for(self.size, self.admission)?;
        let size = sqlx_size(self.size)?;
        let side = self.cancel_requests.then(|| {
            PgPoolOptions::new()
                .max_connections(SIDE_CONNECTIONS)
                // Kept open, so a cancel costs one round trip, not a connect.
                .min_connections(1)
                .acquire_timeout(CLEANUP_LIMIT)
                .connect_lazy_with(self.connect.clone())
        });
        let pool = self
            .pool
            .max_connections(size)
            .connect_lazy_with(self.connect);
        Ok(SqlxPgPool {
            shared: Arc::new(Shared {
                pool,
                side,
                admission,
                cancels: AtomicU64::new(0),
                cancels_failed: AtomicU64::new(0),
                discarded: AtomicU64::new(0),
                cleanups_running: AtomicU64::new(0),
            }),
        })
    }
}

impl SqlxPgPool {
    /// A pool of at most `size` connections to `url`, opened on first use.
    ///
    /// # Errors
    ///
    /// The URL does not parse, or the size is refused (as in
    /// [`SqlxPgPoolBuilder::build`]).
    pub fn connect(url: &str, size: usize) -> Result<Self, Error> {
        let connect: PgConnectOptions = url.parse().map_err(Error::database)?;
        Self::builder(connect).size(size).build()
    }

    /// A builder for a pool connecting with `connect`.
    pub fn builder(connect: PgConnectOptions) -> SqlxPgPoolBuilder {
        SqlxPgPoolBuilder {
            connect,
            pool: default_options(),
            size: DEFAULT_SIZE,
            cancel_requests: true,
            admission: None,
        }
    }

    /// Counters: connections open and idle, callers queued, cancels sent.
    pub fn stats(&self) -> PoolStats {
        let pool = &self.shared.pool;
        PoolStats {
            max_size: pool.options().get_max_connections() as usize,
            size: pool.size() as usize,
            idle: pool.num_idle(),
            queued: self.shared.admission.stats().queued,
            cancels: self.shared.cancels.load(Ordering::Relaxed),
            cancels_failed: self.shared.cancels_failed.load(Ordering::Relaxed),
            discarded: self.shared.discarded.load(Ordering::Relaxed),
            cleanups_running: self.shared.cleanups_running.load(Ordering::Relaxed),
        }
    }

    /// The admission queue in front of the connections.
    pub fn admission(&self) -> &Admission {
        &self.shared.admission
    }

    /// Waits for a connection under `scope`; its statements run under the
    /// same scope.
    ///
    /// # Errors
    ///
    /// Not admitted (the scope ended while waiting, not enough time left),
    /// or sqlx could not give a connection.
    ///
    /// # Cancellation safety
    ///
    /// Safe: dropping the future leaves the queue.
    pub async fn acquire(&self, scope: &Scope) -> Result<SqlxPgConn, Error> {
        let permit = self.shared.admission.acquire(scope).await?;
        // sqlx abandons a connection it is opening (or testing) when its
        // acquire future is dropped; under tight budgets a pool would then
        // never open one. So the acquire runs to its end on a task of its
        // own, which returns an unwanted connection to the pool and only
        // then releases the permit.
        let pool = self.shared.pool.clone();
        #[allow(clippy::disallowed_methods)] // the pool's own work, not the request's
        let mut pending = tokio::spawn(async move { (pool.acquire().await, permit) });
        let (conn, permit) = tokio::select! {
            biased;
            joined = &mut pending => joined.map_err(Error::database)?,
            cause = scope.ended() => return Err(Error::ended(cause)),
        };
        Ok(SqlxPgConn {
            conn: Some(conn.map_err(Error::database)?),
            permit: Some(permit),
            scope: scope.clone(),
            shared: self.shared.clone(),
            pid: None,
            timeout_set: false,
            dirty: false,
        })
    }
}

/// A pooled connection bound to the scope it was taken under.
///
/// Dropping it returns the connection to the pool — after stopping a
/// statement still running on the server, on a background task, if a call
/// was dropped mid-way.
///
/// ```no_run
/// # async fn run(pool: grpc_deadline_db::sqlx_postgres::SqlxPgPool) -> Result<(), grpc_deadline_db::Error> {
/// use grpc_deadline_db::sqlx_postgres::sqlx;
/// let mut conn = pool.acquire(&grpc_deadline::Scope::current()).await?;
/// conn.execute(sqlx::query("UPDATE stock SET n = n - 1 WHERE item = $1").bind(42_i64)).await?;
/// let rows = conn.fetch_all(sqlx::query("SELECT n FROM stock")).await?;
/// # let _ = rows;
/// # Ok(())
/// # }
/// ```
pub struct SqlxPgConn {
    conn: Option<PoolConnection<Postgres>>,
    permit: Option<Permit>,
    scope: Scope,
    shared: Arc<Shared>,
    /// The backend's process id, once a statement has read it.
    pid: Option<i32>,
    /// `statement_timeout` is set for this scope (refreshed before every
    /// statement when cancel requests are off).
    timeout_set: bool,
    /// A statement was started and its end not yet seen (its call was
    /// dropped), or a stopped call left something to clean.
    dirty: bool,
}

impl fmt::Debug for SqlxPgConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxPgConn")
            .field("scope", &self.scope)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// How a statement raced its scope.
enum Outcome<T> {
    /// It ended on its own (or the server's `statement_timeout` ended it).
    Finished(Result<T, sqlx::Error>),
    /// The scope ended first; the statement was stopped, and its future
    /// polled to its end if `drained`.
    Stopped { cause: Cause, drained: bool },
}

/// sqlx's defaults, less the test before every acquire: the
/// `statement_timeout` round trip before a connection's first statement
/// tests the connection anyway.
fn default_options() -> PgPoolOptions {
    PgPoolOptions::new().test_before_acquire(false)
}

fn is_query_canceled(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code == QUERY_CANCELED)
}

impl Shared {
    /// Asks the server to stop whatever backend `pid` runs: a signal, sent
    /// from a side connection, that returns once it is delivered.
    async fn cancel(&self, pid: i32) {
        let Some(side) = &self.side else { return };
        self.cancels.fetch_add(1, Ordering::Relaxed);
        let sent = tokio::time::timeout(
            CLEANUP_LIMIT,
            sqlx::query_scalar::<_, bool>("SELECT pg_cancel_backend($1)")
                .bind(pid)
                .fetch_one(side),
        )
        .await;
        if !matches!(sent, Ok(Ok(true))) {
            self.cancels_failed.fetch_add(1, Ordering::Relaxed);
            let why = match sent {
                Ok(Ok(_)) => "no such backend".to_owned(),
                Ok(Err(err)) => err.to_string(),
                Err(_) => "timed out".to_owned(),
            };
            tracing::warn!(
                pid,
                %why,
                "pg_cancel_backend not delivered: the statement stops only at the statement_timeout \
                 its connection got for the budget left at its first statement; if this persists, \
                 turn cancel_requests off to refresh that timeout before every statement"
            );
        }
    }

    /// Races `work` against `scope`; when the scope ends first, stops the
    /// statement on the server and polls `work` on until sqlx has read the
    /// server's answer (so the connection stays in step), at most
    /// [`CLEANUP_LIMIT`].
    async fn race<T>(
        &self,
        scope: &Scope,
        pid: Option<i32>,
        work: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Outcome<T> {
        let mut work = std::pin::pin!(work);
        let cause = tokio::select! {
            biased;
            out = &mut work => return Outcome::Finished(out),
            cause = scope.ended() => cause,
        };
        let cancel = async {
            if let Some(pid) = pid {
                self.cancel(pid).await;
            }
        };
        let (_, drained) = tokio::join!(cancel, tokio::time::timeout(CLEANUP_LIMIT, &mut work));
        Outcome::Stopped {
            cause,
            drained: drained.is_ok(),
        }
    }
}

/// Makes a connection safe to reuse after a stopped or abandoned statement:
/// stop what may still run, wait until the server is done with it, roll back.
async fn clean(shared: &Shared, conn: &mut PgConnection, pid: Option<i32>) -> Result<(), Error> {
    if let Some(pid) = pid {
        shared.cancel(pid).await;
    }
    let check = async {
        // Queued behind the stopped statement: sqlx first reads its answer,
        // so this returns only once the server is done with it. ROLLBACK is
        // a warning, not an error, outside a transaction. A late cancel may
        // land on it instead of the statement; once more, then.
        match conn.execute("ROLLBACK").await {
            Err(err) if is_query_canceled(&err) => conn.execute("ROLLBACK").await,
            other => other,
        }
    };
    match tokio::time::timeout(CLEANUP_LIMIT, check).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(err)) => Err(Error::database(err)),
        Err(_) => Err(Error::database("connection did not become idle")),
    }
}

impl SqlxPgConn {
    /// The backend's process id (`pg_backend_pid()`), once a statement ran.
    pub fn backend_pid(&self) -> Option<i32> {
        self.pid
    }

    fn connection(&mut self) -> Result<&mut PoolConnection<Postgres>, Error> {
        self.conn
            .as_mut()
            .ok_or_else(|| Error::database("connection already released"))
    }

    /// Before a statement: the scope is live, the connection clean, and the
    /// server's `statement_timeout` bounds the statement: the budget left at
    /// the connection's first statement while cancel requests stop
    /// statements at the deadline, the remaining budget otherwise.
    async fn begin(&mut self) -> Result<(), Error> {
        self.scope.check()?;
        if self.dirty {
            let cause = self.scope.cause().unwrap_or(Cause::Cancelled);
            self.stop(cause).await?;
        }
        if self.timeout_set && self.shared.side.is_some() {
            // The cancel request stops this statement at the deadline; the
            // timeout set before the first one is its backstop.
            self.dirty = true;
            return Ok(());
        }
        let timeout = statement_timeout_ms(&self.scope).to_string();
        self.dirty = true;
        let (scope, shared, pid) = (self.scope.clone(), self.shared.clone(), self.pid);
        let conn = self.connection()?;
        let set =
            sqlx::query("SELECT pg_backend_pid(), set_config('statement_timeout', $1, false)")
                .bind(timeout)
                .fetch_one(&mut **conn);
        let outcome = shared.race(&scope, pid, set).await;
        let row = self.finish(outcome).await?;
        self.pid = Some(row.try_get(0).map_err(Error::database)?);
        self.timeout_set = true;
        // The statement itself follows; until its end is seen, a dropped
        // call leaves the connection to be cleaned.
        self.dirty = true;
        Ok(())
    }

    /// After a statement: its result, or — if the scope ended — the cause,
    /// once the server has stopped and the connection is clean.
    async fn finish<T>(&mut self, outcome: Outcome<T>) -> Result<T, Error> {
        match outcome {
            Outcome::Finished(Ok(out)) => {
                self.dirty = false;
                Ok(out)
            }
            Outcome::Finished(Err(err)) => {
                self.dirty = false;
                match self.scope.cause() {
                    // The server stopped it for us: its statement_timeout
                    // fired at the deadline.
                    Some(cause) if is_query_canceled(&err) => {
                        let _ = self.stop_without_cancel(cause).await;
                        Err(Error::ended(cause))
                    }
                    _ => Err(Error::database(err)),
                }
            }
            Outcome::Stopped { cause, drained } => {
                if drained {
                    // The statement's answer is read; only the rollback and
                    // a late cancel are left.
                    let _ = self.stop_without_cancel(cause).await;
                } else {
                    self.discard(cause);
                }
                Err(Error::ended(cause))
            }
        }
    }

    /// Cancels what may run, drains, and rolls back; closes the connection
    /// if that fails.
    async fn stop(&mut self, cause: Cause) -> Result<(), Error> {
        let pid = self.pid;
        self.clean_with(cause, pid).await
    }

    async fn stop_without_cancel(&mut self, cause: Cause) -> Result<(), Error> {
        self.clean_with(cause, None).await
    }

    async fn clean_with(&mut self, cause: Cause, pid: Option<i32>) -> Result<(), Error> {
        let shared = self.shared.clone();
        let conn = self.connection()?;
        match clean(&shared, conn, pid).await {
            Ok(()) => {
                self.dirty = false;
                Ok(())
            }
            Err(err) => {
                tracing::warn!(%cause, error = %err, "closing a connection that could not be cleaned");
                self.discard(cause);
                Err(err)
            }
        }
    }

    /// Closes the connection instead of returning it, after one more cancel
    /// for whatever it may still run.
    fn discard(&mut self, cause: Cause) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        tracing::warn!(%cause, "closing a connection whose statement did not stop");
        self.shared.discarded.fetch_add(1, Ordering::Relaxed);
        conn.close_on_drop();
        let (shared, pid, permit) = (self.shared.clone(), self.pid, self.permit.take());
        let running = &self.shared.cleanups_running;
        spawn_cleanup(running, async move {
            if let Some(pid) = pid {
                shared.cancel(pid).await;
            }
            drop(conn);
            drop(permit);
            shared.cleanups_running.fetch_sub(1, Ordering::Relaxed);
        });
    }

    /// Runs `work` — any sqlx code on the connection — under the
    /// connection's scope (see the module docs).
    ///
    /// ```no_run
    /// # async fn run(pool: grpc_deadline_db::sqlx_postgres::SqlxPgPool) -> Result<(), grpc_deadline_db::Error> {
    /// let scope = grpc_deadline::Scope::current();
    /// let mut conn = pool.acquire(&scope).await?;
    /// let (n,): (i64,) = conn
    ///     .run(|c| Box::pin(async move { sqlx::query_as("SELECT 41 + 1").fetch_one(c).await }))
    ///     .await?;
    /// assert_eq!(n, 42);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The scope ended (the statement was stopped on the server), or the
    /// database's own error.
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future leaves the statement to be stopped when the
    /// connection is used again or dropped; nothing runs on for long on the
    /// server either way, thanks to its `statement_timeout`.
    pub async fn run<T, F>(&mut self, work: F) -> Result<T, Error>
    where
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxQuery<'c, T>,
    {
        self.begin().await?;
        let (scope, shared, pid) = (self.scope.clone(), self.shared.clone(), self.pid);
        let conn = self.connection()?;
        let outcome = shared.race(&scope, pid, work(conn)).await;
        self.finish(outcome).await
    }

    /// Runs `query` under the connection's scope and returns its rows.
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    pub async fn fetch_all<'q, E>(&mut self, query: E) -> Result<Vec<PgRow>, Error>
    where
        E: sqlx::Execute<'q, Postgres> + 'q,
    {
        self.begin().await?;
        let (scope, shared, pid) = (self.scope.clone(), self.shared.clone(), self.pid);
        let conn = self.connection()?;
        let outcome = shared.race(&scope, pid, conn.fetch_all(query)).await;
        self.finish(outcome).await
    }

    /// Runs `query` under the connection's scope and returns what it changed.
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    pub async fn execute<'q, E>(&mut self, query: E) -> Result<PgQueryResult, Error>
    where
        E: sqlx::Execute<'q, Postgres> + 'q,
    {
        self.begin().await?;
        let (scope, shared, pid) = (self.scope.clone(), self.shared.clone(), self.pid);
        let conn = self.connection()?;
        let outcome = shared.race(&scope, pid, conn.execute(query)).await;
        self.finish(outcome).await
    }
}

impl Drop for SqlxPgConn {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        let permit = self.permit.take();
        if !self.dirty {
            drop(conn); // back to sqlx's pool first,
            drop(permit); // then the next caller may take it
            return;
        }
        // Dropped mid-statement: clean on a task of its own, then release.
        // The caller is gone; the connection is not.
        let (shared, pid) = (self.shared.clone(), self.pid);
        spawn_cleanup(&self.shared.cleanups_running, async move {
            if let Err(err) = clean(&shared, &mut conn, pid).await {
                tracing::warn!(error = %err, "closing a connection that could not be cleaned");
                shared.discarded.fetch_add(1, Ordering::Relaxed);
                conn.close_on_drop();
                if let Some(pid) = pid {
                    shared.cancel(pid).await;
                }
            }
            drop(conn);
            drop(permit);
            shared.cleanups_running.fetch_sub(1, Ordering::Relaxed);
        });
    }
}
