//! Databases that stop when the request's scope ends.
//!
//! The pools stand on the core, [`grpc_deadline`]: a query runs under a
//! [`Scope`](grpc_deadline::Scope), whichever stack's layer made it (a
//! tonic-deadline server layer, the `grpc` crate's interceptor in
//! grpc-deadline-grpc, or `Scope::background().with_timeout(..)` in a job
//! runner). No gRPC stack is compiled in; the feature `tonic` adds the
//! conversion of every [`Error`] into `tonic::Status`.
//!
//! Dropping a query future is not cancellation: the database keeps working
//! for a caller who is gone, and holds a connection while it does. The pools
//! here make the cancellation reach the database itself:
//!
//! - [`sqlite`] (feature `sqlite`, the embedded default): each query runs on
//!   a blocking thread and is interrupted (`sqlite3_interrupt`, plus a
//!   progress handler that watches the scope between statements) the moment
//!   the scope ends; the connection is idle again, ready for its next query,
//!   before the call returns.
//! - [`postgres`] (feature `postgres`): when the scope ends a cancel request
//!   stops the running statement on the server (SQLSTATE 57014), and every
//!   statement also carries a `statement_timeout` derived from the remaining
//!   budget, so the server stops on its own even if the cancel request is
//!   lost. The connection is checked and goes back to the pool healthy.
//! - [`sqlx_postgres`] and [`sqlx_sqlite`] (features `sqlx-postgres`,
//!   `sqlx-sqlite`): the same guarantees for [sqlx](https://docs.rs/sqlx)
//!   connections, within what sqlx allows (each module says what that is).
//!
//! # One shape
//!
//! Every pool is used the same way:
//!
//! - built by `connect(url, size)` or `open(path, size)` (and
//!   `open_in_memory(size)` for SQLite), or configured step by step with
//!   `builder(..)`: `size(n)`, `admission(..)`, then `build()`; sizes are
//!   `usize`, and every constructor fails with [`Error`];
//! - `pool.acquire(&scope).await?` waits for a connection under a scope
//!   and gives a connection whose statements run under that scope; dropping
//!   it returns the connection to the pool (cleaned first if a call on it
//!   was dropped mid-way);
//! - `pool.stats()` reports [`PoolStats`], `pool.admission()` is the queue
//!   in front of the connections;
//! - every failure is an [`Error`], which names the gRPC code it answers
//!   ([`Error::code`]) and, with the feature `tonic`, converts into the
//!   right `tonic::Status`, boxed or not.
//!
//! Every pool waits for a connection through an
//! [`Admission`](grpc_deadline::admission::Admission), so time spent waiting for a connection spends the caller's budget, and a caller
//! that cannot finish in time is refused before it takes one.
//!
//! # Example
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), grpc_deadline_db::Error> {
//! use std::time::Duration;
//! use grpc_deadline::Scope;
//! use grpc_deadline_db::sqlite::SqlitePool;
//!
//! let pool = SqlitePool::open_in_memory(2)?;
//! let scope = Scope::background().with_timeout(Duration::from_secs(1));
//! let mut conn = pool.acquire(&scope).await?;
//! let n = conn.run(|c| c.query_row("SELECT 41 + 1", [], |r| r.get::<_, i64>(0))).await?;
//! assert_eq!(n, 42);
//! drop(conn);
//! assert_eq!(pool.stats().idle, 2);
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;
#[cfg(feature = "sqlx-postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx-postgres")))]
pub mod sqlx_postgres;
#[cfg(feature = "sqlx-sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx-sqlite")))]
pub mod sqlx_sqlite;

use std::fmt;
use std::sync::Arc;

use grpc_deadline::admission::{Reason, Refused};
use grpc_deadline::{Cause, Code, Ended};

/// An error of any kind, as a database driver hands it over.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The error of a pooled query.
///
/// Says which gRPC code it answers ([`Error::code`]): a refusal or an
/// ended scope the matching deadline/cancel code (a full queue
/// `RESOURCE_EXHAUSTED`), a database error `INTERNAL`. With the `tonic`
/// feature it converts into that `tonic::Status`, boxed or not, a
/// database error with a fixed text (the details go to the log).
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use grpc_deadline::{Cause, Code, Scope};
/// use grpc_deadline_db::sqlite::SqlitePool;
/// let pool = SqlitePool::open_in_memory(1).unwrap();
/// let scope = Scope::background();
/// scope.cancel();
/// let err = pool.acquire(&scope).await.unwrap_err();
/// assert_eq!(err.cause(), Some(Cause::Cancelled));
/// assert_eq!(err.code(), Code::Cancelled);
/// # }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
#[derive(Debug)]
pub struct Error {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    NotAdmitted(Refused),
    Ended(Cause),
    /// The database's error, and (with the `tonic` feature) the `INTERNAL`
    /// status it answers, which holds the error as its own source.
    Database(
        Arc<dyn std::error::Error + Send + Sync>,
        #[cfg(feature = "tonic")] tonic::Status,
    ),
}

impl Error {
    pub(crate) fn ended(cause: Cause) -> Self {
        Self {
            kind: Kind::Ended(cause),
        }
    }

    /// The error of a database (or a store built on one, such as a job
    /// queue's) that failed for a reason of its own: it answers `INTERNAL`
    /// (with the `tonic` feature, a status with a fixed message), and keeps
    /// `err` as its source.
    ///
    /// ```
    /// use grpc_deadline::Code;
    /// let err = grpc_deadline_db::Error::database("INSERT returned no id");
    /// assert_eq!(err.code(), Code::Internal);
    /// ```
    pub fn database(err: impl Into<BoxError>) -> Self {
        let err: Arc<dyn std::error::Error + Send + Sync> = Arc::from(err.into());
        #[cfg(feature = "tonic")]
        let status = {
            let mut status = tonic::Status::internal("database error");
            status.set_source(err.clone());
            status
        };
        Self {
            kind: Kind::Database(
                err,
                #[cfg(feature = "tonic")]
                status,
            ),
        }
    }

    /// Why the scope ended, when the query was stopped (or never started)
    /// because of it.
    pub fn cause(&self) -> Option<Cause> {
        match &self.kind {
            Kind::Ended(cause) => Some(*cause),
            Kind::NotAdmitted(refused) => match refused.reason() {
                Reason::Ended(cause) => Some(cause),
                _ => None,
            },
            Kind::Database(..) => None,
        }
    }

    /// The gRPC code this error answers: the cause of an ended scope
    /// (`DEADLINE_EXCEEDED` or `CANCELLED`), a refusal's
    /// ([`Refused::code`]), or `INTERNAL` for the database's own errors.
    /// Every stack's status is made from it (with the `tonic` feature,
    /// `tonic::Status::from(err)` has this code).
    ///
    /// ```
    /// use grpc_deadline::Code;
    /// let err = grpc_deadline_db::Error::database("disk full");
    /// assert_eq!(err.code(), Code::Internal);
    /// ```
    pub fn code(&self) -> Code {
        match &self.kind {
            Kind::Ended(cause) => cause.code(),
            Kind::NotAdmitted(refused) => refused.code(),
            Kind::Database(..) => Code::Internal,
        }
    }

    /// The refusal, when no connection was given.
    pub fn refused(&self) -> Option<Refused> {
        match &self.kind {
            Kind::NotAdmitted(refused) => Some(*refused),
            _ => None,
        }
    }

    /// The database's own error, if that is what happened.
    pub fn database_error(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match &self.kind {
            Kind::Database(err, ..) => Some(err.as_ref()),
            _ => None,
        }
    }
}

impl From<Refused> for Error {
    fn from(refused: Refused) -> Self {
        Self {
            kind: Kind::NotAdmitted(refused),
        }
    }
}

impl From<Ended> for Error {
    fn from(ended: Ended) -> Self {
        Self::ended(ended.cause())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::NotAdmitted(refused) => refused.fmt(f),
            Kind::Ended(cause) => write!(f, "query stopped: {cause}"),
            Kind::Database(err, ..) => write!(f, "database error: {err}"),
        }
    }
}

/// Every kind names what it stands for in its source chain: a refusal is
/// its [`Refused`], a stopped query the [`Ended`] of its cause, so whoever
/// walks the chain for an `Ended` finds it. A database failure names the
/// database's error; with the `tonic` feature it names an `INTERNAL`
/// status whose own source is the database's error (so that error is
/// still in the chain, one step further, and in [`Error::database_error`]),
/// and an `Error` boxed by `?` answers the same code through tonic's
/// `Status::from_error` as through `From`.
impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::NotAdmitted(refused) => Some(refused),
            Kind::Ended(cause) => Some(Ended::of(*cause)),
            #[cfg(feature = "tonic")]
            Kind::Database(_, status) => Some(status),
            #[cfg(not(feature = "tonic"))]
            Kind::Database(err) => Some(err.as_ref()),
        }
    }
}

/// The status of [`Error::code`]; an ended scope's or a refusal's with the
/// core's fixed message, a database error's `"database error"` (the
/// details go to the log).
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl From<Error> for tonic::Status {
    fn from(err: Error) -> tonic::Status {
        match err.kind {
            Kind::NotAdmitted(refused) => refused.into(),
            Kind::Ended(cause) => grpc_deadline::tonic_status::of(cause).clone(),
            Kind::Database(err, status) => {
                tracing::warn!(error = %err, "database error");
                status
            }
        }
    }
}

/// Counters of a pool, the same for every pool of this module: for metrics
/// and leak checks.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # fn main() -> Result<(), grpc_deadline_db::Error> {
/// use grpc_deadline_db::PoolStats;
/// use grpc_deadline_db::sqlite::SqlitePool;
///
/// let pool = SqlitePool::open_in_memory(2)?;
/// let stats: PoolStats = pool.stats();
/// assert_eq!((stats.max_size, stats.idle, stats.queued), (2, 2, 0));
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// The most connections the pool opens.
    pub max_size: usize,
    /// Connections open right now.
    pub size: usize,
    /// Open connections idle in the pool right now.
    pub idle: usize,
    /// Callers waiting for a connection right now.
    pub queued: usize,
    /// Statements the pool stopped on the database because their scope
    /// ended: PostgreSQL cancel requests (`pg_cancel_backend` for sqlx) and
    /// SQLite interrupts. The PostgreSQL pools also count the cancel
    /// requests they send for calls dropped mid-statement.
    pub cancels: u64,
    /// Cancel requests that could not be delivered (PostgreSQL only); the
    /// statement then stopped at its `statement_timeout`, or its connection
    /// was closed.
    pub cancels_failed: u64,
    /// Connections closed because they could not be cleaned.
    pub discarded: u64,
    /// Connections being cleaned after a call dropped mid-statement.
    pub cleanups_running: u64,
}

/// The future a `run` closure of the sqlx connections returns:
/// [`SqlxPgConn::run`](sqlx_postgres::SqlxPgConn::run) and
/// [`SqlxSqliteConn::run`](sqlx_sqlite::SqlxSqliteConn::run).
///
/// ```
/// # #[cfg(feature = "sqlx-sqlite")]
/// # mod example {
/// use grpc_deadline_db::BoxQuery;
/// use grpc_deadline_db::sqlx_sqlite::sqlx;
///
/// fn answer<'c>(c: &'c mut sqlx::SqliteConnection) -> BoxQuery<'c, (i64,)> {
///     Box::pin(async move { sqlx::query_as("SELECT 42").fetch_one(c).await })
/// }
/// # }
/// ```
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite")))
)]
pub type BoxQuery<'c, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, sqlx::Error>> + Send + 'c>>;

/// A builder's size when none is given.
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "sqlx-postgres",
    feature = "sqlx-sqlite"
))]
pub(crate) const DEFAULT_SIZE: usize = 10;

/// The admission in front of a pool of `size` connections: `given`, which
/// must have one permit per connection, or an adaptive-LIFO queue.
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "sqlx-postgres",
    feature = "sqlx-sqlite"
))]
pub(crate) fn admission_for(
    size: usize,
    given: Option<grpc_deadline::admission::Admission>,
) -> Result<grpc_deadline::admission::Admission, Error> {
    if size == 0 {
        return Err(Error::database("a pool needs at least one connection"));
    }
    match given {
        None => Ok(grpc_deadline::admission::Admission::new(size)),
        Some(admission) if admission.stats().permits == size => Ok(admission),
        Some(admission) => Err(Error::database(format!(
            "the admission has {} permits for a pool of {size} connections: give it one per connection",
            admission.stats().permits
        ))),
    }
}

/// A pool size as sqlx counts it.
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
pub(crate) fn sqlx_size(size: usize) -> Result<u32, Error> {
    u32::try_from(size).map_err(|_| {
        Error::database(format!(
            "a pool of {size} connections is too large for sqlx"
        ))
    })
}

/// The statement timeout for what is left of `scope`: whole milliseconds,
/// rounded up, at least 1 (0 would mean "no timeout"); 0 (none) without a
/// deadline.
#[cfg(any(feature = "postgres", feature = "sqlx-postgres"))]
pub(crate) fn statement_timeout_ms(scope: &grpc_deadline::Scope) -> u128 {
    match scope.remaining() {
        None => 0,
        Some(left) => left.as_micros().div_ceil(1000).max(1),
    }
}

/// Runs the clean-up of a connection dropped mid-statement on the current
/// runtime, counted in `running` until it ends (`cleanup` takes one off
/// `running` when it is done), or warns that it cannot: outside a runtime
/// only the database's own limits (a `statement_timeout`) stop what still
/// runs.
#[cfg(any(
    feature = "postgres",
    feature = "sqlx-postgres",
    feature = "sqlx-sqlite"
))]
pub(crate) fn spawn_cleanup(
    running: &std::sync::atomic::AtomicU64,
    cleanup: impl std::future::Future<Output = ()> + Send + 'static,
) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            running.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // The pool's own work, not the request's.
            runtime.spawn(cleanup);
        }
        Err(_) => tracing::warn!(
            "a pooled connection was dropped mid-statement outside a runtime, where it cannot be cleaned"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use grpc_deadline::Scope;
    use grpc_deadline::admission::Admission;

    /// `err` and each error in its source chain.
    fn chain<'a>(
        err: &'a (dyn std::error::Error + 'static),
    ) -> Vec<&'a (dyn std::error::Error + 'static)> {
        std::iter::successors(Some(err), |e| e.source()).collect()
    }

    /// A kind of error: its name, how to make one, the code it answers.
    type Case = (String, Box<dyn Fn() -> Error>, Code);

    /// Every kind of error, with the code it must answer.
    fn every_kind() -> Vec<Case> {
        let mut kinds: Vec<Case> = Cause::ALL
            .into_iter()
            .map(|cause| {
                let make: Box<dyn Fn() -> Error> = Box::new(move || Error::ended(cause));
                (format!("stopped by {cause}"), make, cause.code())
            })
            .collect();
        let scope = Scope::background();
        scope.cancel();
        let refused = Admission::new(1)
            .try_acquire(&scope)
            .expect_err("an ended scope is refused");
        kinds.push((
            "not admitted".into(),
            Box::new(move || Error::from(refused)),
            Code::Cancelled,
        ));
        kinds.push((
            "database".into(),
            Box::new(|| Error::database(std::io::Error::other("disk full"))),
            Code::Internal,
        ));
        kinds
    }

    #[test]
    fn an_error_answers_its_cause_its_refusal_or_internal() {
        for (name, make, code) in every_kind() {
            assert_eq!(make().code(), code, "{name}");
        }
        let err = Error::database(std::io::Error::other("disk full"));
        assert!(
            chain(&err)
                .iter()
                .any(|e| e.downcast_ref::<std::io::Error>().is_some()),
            "the database's own error must stay in the source chain"
        );
        assert!(err.database_error().is_some());
        let stopped = Error::ended(Cause::Cancelled);
        assert!(
            chain(&stopped)
                .iter()
                .any(|e| e.downcast_ref::<Ended>().map(Ended::cause) == Some(Cause::Cancelled)),
            "a walker looking for Ended must find it behind a stopped query"
        );
    }

    /// Converted and boxed by `?` (through tonic's `Status::from_error`),
    /// every kind answers the same code as [`Error::code`].
    #[cfg(feature = "tonic")]
    #[test]
    fn an_error_answers_the_same_tonic_status_converted_or_boxed() {
        for (name, make, code) in every_kind() {
            let code = tonic::Code::from(code);
            assert_eq!(
                tonic::Status::from(make()).code(),
                code,
                "{name}: converted"
            );
            let boxed: BoxError = Box::new(make());
            assert_eq!(
                tonic::Status::from_error(boxed).code(),
                code,
                "{name}: boxed"
            );
        }
    }

    #[cfg(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "sqlx-postgres",
        feature = "sqlx-sqlite"
    ))]
    #[test]
    fn a_pool_refuses_zero_connections_and_an_admission_of_another_size() {
        let zero = admission_for(0, None).expect_err("a pool of nothing");
        assert!(zero.to_string().contains("at least one"), "{zero}");
        let mismatch = admission_for(4, Some(Admission::new(2))).expect_err("2 permits for 4");
        assert!(
            mismatch.to_string().contains("2 permits for a pool of 4"),
            "the error must say what does not match: {mismatch}"
        );
        assert_eq!(
            admission_for(4, Some(Admission::new(4)))
                .expect("one permit per connection")
                .stats()
                .permits,
            4
        );
        assert_eq!(admission_for(3, None).expect("default").stats().permits, 3);
    }
}
