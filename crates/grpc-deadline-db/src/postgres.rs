//! A PostgreSQL pool whose statements stop *on the server* when the scope
//! ends.
//!
//! Dropping a `tokio-postgres` future only stops the client waiting; the
//! server runs the statement to its end and the connection stays busy. Here
//! every statement
//!
//! 1. waits for a connection through a deadline-aware
//!    [`Admission`] (queue time spends the budget);
//! 2. is sent with `SET statement_timeout` = the scope's remaining budget
//!    (pipelined with the statement, no extra round trip), so the server
//!    stops on its own at the deadline even if nothing else reaches it;
//! 3. when the scope ends first (deadline, caller cancel, or the call being
//!    dropped), gets a cancel request: the server stops it with SQLSTATE
//!    57014. The connection is then checked (a `SELECT 1` that can only run
//!    once the server has finished the stopped statement) and goes back to
//!    the pool healthy — or is discarded if the check fails. A transaction
//!    opened with [`PgConn::begin`] and not finished is rolled back before the
//!    connection is reused.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use grpc_deadline::Scope;
//! use grpc_deadline_db::postgres::PgPool;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = PgPool::connect("postgresql://postgres@127.0.0.1:5432/postgres", 8)?;
//! let scope = Scope::background().with_timeout(Duration::from_millis(200));
//! let mut conn = pool.acquire(&scope).await?;
//! let err = conn.query("SELECT pg_sleep(5)", &[]).await.expect_err("stopped at 200 ms");
//! assert_eq!(err.code(), grpc_deadline::Code::DeadlineExceeded);
//! # Ok(())
//! # }
//! ```
//!
//! # Invariants
//!
//! 1. A connection goes back to the pool only when no statement of ours is
//!    running on it and no transaction we opened is open; otherwise it is
//!    cleaned (cancel, rollback, check) first, or discarded.
//! 2. The admission permit of a connection is released only after the
//!    connection is back in the pool (or discarded).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use deadpool_postgres;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
pub use tokio_postgres;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row};

use super::{DEFAULT_SIZE, Error, PoolStats, admission_for, spawn_cleanup, statement_timeout_ms};
use grpc_deadline::admission::{Admission, Permit};
use grpc_deadline::scope::{Cause, Scope};

/// How long cleaning a stopped connection may take before it is discarded.
const CLEANUP_LIMIT: Duration = Duration::from_secs(5);

/// A pool of PostgreSQL connections (no TLS: loopback and trusted networks)
/// behind a deadline-aware queue. Cheap to clone. See the [module docs](self).
///
/// ```
/// # fn main() -> Result<(), grpc_deadline_db::Error> {
/// use grpc_deadline_db::postgres::PgPool;
/// // Connections open on first use.
/// let pool = PgPool::connect("postgresql://postgres@127.0.0.1:5432/postgres", 8)?;
/// assert_eq!(pool.stats().max_size, 8);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PgPool {
    shared: Arc<Shared>,
}

struct Shared {
    pool: Pool,
    config: tokio_postgres::Config,
    admission: Admission,
    cancel_requests: bool,
    cancels: AtomicU64,
    cancels_failed: AtomicU64,
    discarded: AtomicU64,
    cleanups_running: AtomicU64,
}

impl fmt::Debug for PgPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgPool")
            .field("stats", &self.stats())
            .finish()
    }
}

/// Configures a [`PgPool`]; [`build`](Self::build) freezes it.
///
/// ```
/// # fn main() -> Result<(), grpc_deadline_db::Error> {
/// use grpc_deadline_db::postgres::{PgPool, tokio_postgres};
///
/// let config: tokio_postgres::Config = "host=127.0.0.1 user=postgres".parse().expect("valid");
/// // Behind a pooler in transaction mode, where cancel requests go astray.
/// let pool = PgPool::builder(config).size(4).cancel_requests(false).build()?;
/// assert_eq!(pool.stats().max_size, 4);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build`"]
pub struct PgPoolBuilder {
    config: tokio_postgres::Config,
    size: usize,
    cancel_requests: bool,
    admission: Option<Admission>,
}

impl PgPoolBuilder {
    /// The most connections the pool opens (default 10).
    pub fn size(mut self, size: usize) -> Self {
        self.size = size;
        self
    }

    /// Whether a statement whose scope ends gets a cancel request (on by
    /// default). Turn it off where cancel requests cannot reach the server
    /// (some poolers in transaction mode): statements then stop through
    /// their `statement_timeout` alone.
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
    /// A size of zero, or an admission whose permits differ from the size.
    pub fn build(self) -> Result<PgPool, Error> {
        let admission = admission_for(self.size, self.admission)?;
        let manager = Manager::from_config(
            self.config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(self.size)
            .build()
            .map_err(Error::database)?;
        Ok(PgPool {
            shared: Arc::new(Shared {
                pool,
                config: self.config,
                admission,
                cancel_requests: self.cancel_requests,
                cancels: AtomicU64::new(0),
                cancels_failed: AtomicU64::new(0),
                discarded: AtomicU64::new(0),
                cleanups_running: AtomicU64::new(0),
            }),
        })
    }
}

impl PgPool {
    /// A pool of at most `size` connections to `url` (a `postgresql://` URL
    /// or a `key=value` string), opened on first use.
    ///
    /// # Errors
    ///
    /// The URL does not parse, or `size` is zero.
    pub fn connect(url: &str, size: usize) -> Result<Self, Error> {
        let config: tokio_postgres::Config = url.parse().map_err(Error::database)?;
        Self::builder(config).size(size).build()
    }

    /// A builder for a pool connecting with `config`.
    pub fn builder(config: tokio_postgres::Config) -> PgPoolBuilder {
        PgPoolBuilder {
            config,
            size: DEFAULT_SIZE,
            cancel_requests: true,
            admission: None,
        }
    }

    /// Counters: connections open and idle, callers queued, cancels sent.
    pub fn stats(&self) -> PoolStats {
        let status = self.shared.pool.status();
        PoolStats {
            max_size: status.max_size,
            size: status.size,
            idle: status.available,
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
    /// Not admitted (scope ended while waiting, not enough time left), or
    /// the connection could not be opened.
    ///
    /// # Cancellation safety
    ///
    /// Safe: dropping the future leaves the queue or returns the connection.
    pub async fn acquire(&self, scope: &Scope) -> Result<PgConn, Error> {
        let permit = self.shared.admission.acquire(scope).await?;
        let object = tokio::select! {
            biased;
            cause = scope.ended() => return Err(Error::ended(cause)),
            object = self.shared.pool.get() => object.map_err(Error::database)?,
        };
        Ok(PgConn {
            object: Some(object),
            permit: Some(permit),
            scope: scope.clone(),
            shared: self.shared.clone(),
            in_flight: false,
            in_transaction: false,
        })
    }
}

/// A pooled connection bound to the scope it was taken under.
///
/// Dropping it returns the connection to the pool — after cancelling a
/// statement still running on the server and rolling back a transaction left
/// open, on a background task, if the call was dropped mid-way.
///
/// ```no_run
/// # async fn run(pool: grpc_deadline_db::postgres::PgPool) -> Result<(), grpc_deadline_db::Error> {
/// let mut conn = pool.acquire(&grpc_deadline::Scope::current()).await?;
/// conn.begin().await?;
/// conn.execute("UPDATE stock SET n = n - 1 WHERE item = $1", &[&42_i64]).await?;
/// conn.commit().await?; // rolled back instead if the scope ends first
/// # Ok(())
/// # }
/// ```
pub struct PgConn {
    object: Option<Object>,
    permit: Option<Permit>,
    scope: Scope,
    shared: Arc<Shared>,
    /// A statement was sent and its end not yet seen.
    in_flight: bool,
    /// A transaction opened with `begin` is open.
    in_transaction: bool,
}

impl fmt::Debug for PgConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgConn")
            .field("scope", &self.scope)
            .field("in_transaction", &self.in_transaction)
            .finish_non_exhaustive()
    }
}

impl PgConn {
    fn client(&self) -> Result<&Client, Error> {
        self.object
            .as_deref()
            .map(|wrapper| &**wrapper)
            .ok_or_else(|| Error::database("connection already released"))
    }

    /// Runs one statement under the connection's scope (see the module docs).
    async fn statement(&mut self, op: Op<'_>) -> Result<Done, Error> {
        self.scope.check()?;
        if self.in_flight {
            // A previous call on this connection was dropped mid-statement.
            let cause = self.scope.cause().unwrap_or(Cause::Cancelled);
            self.stop(cause).await?;
        }
        let set = format!(
            "SET statement_timeout = {}",
            statement_timeout_ms(&self.scope)
        );
        let scope = self.scope.clone();
        self.in_flight = true;
        let outcome = {
            let client = self.client()?;
            let work = async {
                // Both go out back to back: one round trip.
                let (set, out) = tokio::join!(client.batch_execute(&set), op.run(client));
                set?;
                out
            };
            tokio::select! {
                biased;
                out = work => Ok(out),
                cause = scope.ended() => Err(cause),
            }
        };
        match outcome {
            Ok(Ok(out)) => {
                self.mark_idle();
                Ok(out)
            }
            Ok(Err(err)) => {
                self.mark_idle();
                match (scope.cause(), err.code()) {
                    // The server stopped it for us: its statement_timeout
                    // fired at the deadline, or our cancel arrived.
                    (Some(cause), Some(code))
                        if *code == tokio_postgres::error::SqlState::QUERY_CANCELED =>
                    {
                        Err(Error::ended(cause))
                    }
                    _ => Err(Error::database(err)),
                }
            }
            Err(cause) => Err(Error::ended(cause)),
        }
    }

    fn mark_idle(&mut self) {
        self.in_flight = false;
    }

    /// Cancels the statement in flight (if cancel requests are on), waits
    /// until the server has finished it, and rolls back our transaction.
    ///
    /// The cleaning runs on a task of its own and finishes even if this call
    /// is dropped: a cancel request cut off half-way could land on the next
    /// caller's statement, and a connection taken back before its statement
    /// stopped would hand that caller a busy backend.
    async fn stop(&mut self, cause: Cause) -> Result<(), Error> {
        let Some(object) = self.object.take() else {
            return Ok(());
        };
        let permit = self.permit.take();
        let cleaned = clean_then_release(
            &self.shared,
            object,
            permit,
            self.in_flight,
            self.in_transaction,
            Some(cause),
        );
        match cleaned.await {
            Ok(Ok((object, permit))) => {
                self.in_flight = false;
                self.in_transaction = false;
                self.object = Some(object);
                self.permit = permit;
                Ok(())
            }
            Ok(Err(err)) => Err(err),
            Err(_) => Err(Error::database(
                "the connection's cleanup could not run (no Tokio runtime)",
            )),
        }
    }

    /// Runs a query under the connection's scope.
    ///
    /// # Errors
    ///
    /// The scope ended (the statement was stopped on the server), or the
    /// database's own error.
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future leaves the statement to be cancelled when the
    /// connection is used again or dropped; nothing runs on for long on the
    /// server either way, thanks to its `statement_timeout`.
    pub async fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        let out = self.statement(Op::Query(sql, params)).await;
        match self.after(out).await? {
            Done::Rows(rows) => Ok(rows),
            _ => Err(Error::database("unexpected statement result")),
        }
    }

    /// Runs a statement under the connection's scope and returns the number
    /// of rows it changed.
    ///
    /// # Errors
    ///
    /// As [`query`](Self::query).
    pub async fn execute(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error> {
        let out = self.statement(Op::Execute(sql, params)).await;
        match self.after(out).await? {
            Done::Count(n) => Ok(n),
            _ => Err(Error::database("unexpected statement result")),
        }
    }

    /// Runs semicolon-separated statements (simple query protocol).
    ///
    /// # Errors
    ///
    /// As [`query`](Self::query).
    pub async fn batch_execute(&mut self, sql: &str) -> Result<(), Error> {
        let out = self.statement(Op::Batch(sql)).await;
        self.after(out).await.map(|_| ())
    }

    /// Opens a transaction that is rolled back if the connection is released
    /// (or the scope ends) before [`commit`](Self::commit).
    ///
    /// # Errors
    ///
    /// As [`query`](Self::query).
    pub async fn begin(&mut self) -> Result<(), Error> {
        self.batch_execute("BEGIN").await?;
        self.in_transaction = true;
        Ok(())
    }

    /// Commits the transaction opened with [`begin`](Self::begin).
    ///
    /// # Errors
    ///
    /// As [`query`](Self::query); the transaction is then rolled back.
    pub async fn commit(&mut self) -> Result<(), Error> {
        let out = self.batch_execute("COMMIT").await;
        if out.is_ok() {
            self.in_transaction = false;
        }
        out
    }

    /// Rolls back the transaction opened with [`begin`](Self::begin).
    ///
    /// # Errors
    ///
    /// As [`query`](Self::query).
    pub async fn rollback(&mut self) -> Result<(), Error> {
        let out = self.batch_execute("ROLLBACK").await;
        if out.is_ok() {
            self.in_transaction = false;
        }
        out
    }

    /// After a statement: if the scope ended while it ran, make sure the
    /// server has stopped it before the caller sees the error.
    async fn after<T>(&mut self, out: Result<T, Error>) -> Result<T, Error> {
        if let Err(err) = &out
            && let Some(cause) = err.cause()
            && (self.in_flight || self.in_transaction)
        {
            let _ = self.stop(cause).await;
        }
        out
    }
}

/// One statement, in one of the three forms we send.
enum Op<'q> {
    Query(&'q str, &'q [&'q (dyn ToSql + Sync)]),
    Execute(&'q str, &'q [&'q (dyn ToSql + Sync)]),
    Batch(&'q str),
}

enum Done {
    Rows(Vec<Row>),
    Count(u64),
    Batch,
}

impl Op<'_> {
    async fn run(self, client: &Client) -> Result<Done, tokio_postgres::Error> {
        match self {
            Op::Query(sql, params) => client.query(sql, params).await.map(Done::Rows),
            Op::Execute(sql, params) => client.execute(sql, params).await.map(Done::Count),
            Op::Batch(sql) => client.batch_execute(sql).await.map(|()| Done::Batch),
        }
    }
}

/// What [`clean_then_release`] hands back: the connection and its permit,
/// clean, or why the connection was discarded.
type Cleaned = Result<(Object, Option<Permit>), Error>;

/// Cleans the connection on a task of its own (see [`clean`]) and hands it
/// back through the receiver; if nobody waits any more, returns it to the
/// pool and then releases its permit. A connection that cannot be cleaned is
/// discarded, with a WARN.
fn clean_then_release(
    shared: &Arc<Shared>,
    object: Object,
    permit: Option<Permit>,
    in_flight: bool,
    in_transaction: bool,
    cause: Option<Cause>,
) -> tokio::sync::oneshot::Receiver<Cleaned> {
    let (reply, cleaned) = tokio::sync::oneshot::channel();
    let shared = shared.clone();
    let running = &shared.cleanups_running;
    let cleanup = {
        let shared = shared.clone();
        async move {
            let out = match clean(&shared, &object, in_flight, in_transaction).await {
                Ok(()) => Ok((object, permit)),
                Err(err) => {
                    match cause {
                        Some(cause) => {
                            tracing::warn!(%cause, error = %err, "discarding a connection that could not be cleaned")
                        }
                        None => {
                            tracing::warn!(error = %err, "discarding a connection that could not be cleaned")
                        }
                    }
                    shared.discarded.fetch_add(1, Ordering::Relaxed);
                    drop(Object::take(object));
                    drop(permit);
                    Err(err)
                }
            };
            if let Err(Ok((object, permit))) = reply.send(out) {
                drop(object); // back to the pool first,
                drop(permit); // then the next caller may take it
            }
            shared.cleanups_running.fetch_sub(1, Ordering::Relaxed);
        }
    };
    spawn_cleanup(running, cleanup);
    cleaned
}

/// Makes a connection safe to reuse: cancel what runs, wait for the server to
/// finish it, roll back our transaction.
async fn clean(
    shared: &Shared,
    client: &Client,
    in_flight: bool,
    in_transaction: bool,
) -> Result<(), Error> {
    if in_flight && shared.cancel_requests {
        shared.cancels.fetch_add(1, Ordering::Relaxed);
        let sent = tokio::time::timeout(CLEANUP_LIMIT, send_cancel(&shared.config, client)).await;
        if !matches!(sent, Ok(Ok(()))) {
            shared.cancels_failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "cancel request not delivered; the statement stops at its statement_timeout (the budget it started with)"
            );
        }
    }
    let check = async {
        // Queued behind the stopped statement: answers only once the server
        // is done with it. A late cancel may hit this check instead; retry once.
        let sql = if in_transaction {
            "ROLLBACK"
        } else {
            "SELECT 1"
        };
        match client.batch_execute(sql).await {
            Err(err) if err.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) => {
                client.batch_execute(sql).await
            }
            other => other,
        }
    };
    match tokio::time::timeout(CLEANUP_LIMIT, check).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) => Err(Error::database(err)),
        Err(_) => Err(Error::database("connection did not become idle")),
    }
}

/// Sends a cancel request for `client`'s backend and returns once the server
/// has closed the cancel connection — that is, once it has signalled the
/// backend. (`CancelToken::cancel_query` returns as soon as the request is
/// written, so its signal could land on a later statement of the next user.)
async fn send_cancel(config: &tokio_postgres::Config, client: &Client) -> Result<(), Error> {
    use tokio_postgres::config::Host;
    let token = client.cancel_token();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    match config.get_hosts().first() {
        Some(Host::Tcp(host)) => {
            let stream = tokio::net::TcpStream::connect((host.as_str(), port))
                .await
                .map_err(Error::database)?;
            token
                .cancel_query_raw(WaitForClose(stream), NoTls)
                .await
                .map_err(Error::database)
        }
        #[cfg(unix)]
        Some(Host::Unix(dir)) => {
            let path = dir.join(format!(".s.PGSQL.{port}"));
            let stream = tokio::net::UnixStream::connect(path)
                .await
                .map_err(Error::database)?;
            token
                .cancel_query_raw(WaitForClose(stream), NoTls)
                .await
                .map_err(Error::database)
        }
        _ => token.cancel_query(NoTls).await.map_err(Error::database),
    }
}

/// A stream whose shutdown completes only when the peer has closed its side.
struct WaitForClose<S>(S);

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WaitForClose<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite
    for WaitForClose<S>
{
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::{Poll, ready};
        ready!(std::pin::Pin::new(&mut self.0).poll_shutdown(cx))?;
        let mut scratch = [0u8; 64];
        loop {
            let mut buf = tokio::io::ReadBuf::new(&mut scratch);
            match ready!(std::pin::Pin::new(&mut self.0).poll_read(cx, &mut buf)) {
                Ok(()) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Ok(()) => {}
                // A reset also means the server is done with the request.
                Err(_) => return Poll::Ready(Ok(())),
            }
        }
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        let Some(object) = self.object.take() else {
            return;
        };
        let permit = self.permit.take();
        if !self.in_flight && !self.in_transaction {
            drop(object); // back to the pool first,
            drop(permit); // then the next caller may take it
            return;
        }
        // Dropped mid-statement or mid-transaction: clean on a task of its
        // own, then release. The caller is gone; the connection is not.
        drop(clean_then_release(
            &self.shared,
            object,
            permit,
            self.in_flight,
            self.in_transaction,
            None,
        ));
    }
}
