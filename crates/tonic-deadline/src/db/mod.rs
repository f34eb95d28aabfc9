//! Databases that stop when the request's scope ends.
//!
//! Dropping a query future is not cancellation: the database keeps working
//! for a caller who is gone, and holds a connection while it does. The pools
//! here make the cancellation reach the database itself:
//!
//! - [`sqlite`] (feature `sqlite`, the embedded default): each query runs on
//!   a blocking thread and is interrupted (`sqlite3_interrupt`, plus a
//!   progress handler that watches the scope between statements) the moment
//!   the scope ends; the connection is back in the pool, ready for the next
//!   caller, before the call returns.
//! - [`postgres`] (feature `postgres`): when the scope ends a cancel request
//!   stops the running statement on the server (SQLSTATE 57014), and every
//!   statement also carries a `statement_timeout` derived from the remaining
//!   budget, so the server stops on its own even if the cancel request is
//!   lost. The connection is checked and goes back to the pool healthy.
//!
//! Both wait for a connection through an [`Admission`](crate::admission::Admission),
//! so time spent waiting for a connection spends the caller's budget, and a
//! caller that cannot finish in time is refused before it takes one.

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "sqlx-postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx-postgres")))]
pub mod sqlx_postgres;
#[cfg(feature = "sqlx-sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx-sqlite")))]
pub mod sqlx_sqlite;

use std::fmt;
use std::sync::Arc;

use crate::BoxError;
use crate::admission::Refused;
use crate::scope::Cause;
use crate::status::status_for;

/// The error of a pooled query.
///
/// Converts into [`tonic::Status`]: a refusal or an ended scope as the
/// matching deadline/cancel status, a database error as `INTERNAL` with a
/// fixed text (the details go to the log).
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use tonic_deadline::db::sqlite::SqlitePool;
/// let pool = SqlitePool::open_in_memory(1).unwrap();
/// let scope = tonic_deadline::Scope::background();
/// scope.cancel();
/// let err = pool.run_in(&scope, |c| c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0))).await.unwrap_err();
/// assert_eq!(tonic::Status::from(err).code(), tonic::Code::Cancelled);
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
    /// The database's error, and the `INTERNAL` status it answers, which
    /// holds the error as its own source.
    Database(Arc<dyn std::error::Error + Send + Sync>, tonic::Status),
}

impl Error {
    pub(crate) fn ended(cause: Cause) -> Self {
        Self {
            kind: Kind::Ended(cause),
        }
    }

    pub(crate) fn database(err: impl Into<BoxError>) -> Self {
        let err: Arc<dyn std::error::Error + Send + Sync> = Arc::from(err.into());
        let mut status = tonic::Status::internal("database error");
        status.set_source(err.clone());
        Self {
            kind: Kind::Database(err, status),
        }
    }

    /// Why the scope ended, when the query was stopped (or never started)
    /// because of it.
    pub fn cause(&self) -> Option<Cause> {
        match &self.kind {
            Kind::Ended(cause) => Some(*cause),
            Kind::NotAdmitted(refused) => match refused.reason() {
                crate::admission::Reason::Ended(cause) => Some(cause),
                _ => None,
            },
            Kind::Database(..) => None,
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
            Kind::Database(err, _) => Some(err.as_ref()),
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

impl From<crate::Ended> for Error {
    fn from(ended: crate::Ended) -> Self {
        Self::ended(ended.cause())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::NotAdmitted(refused) => refused.fmt(f),
            Kind::Ended(cause) => write!(f, "query stopped: {cause}"),
            Kind::Database(err, _) => write!(f, "database error: {err}"),
        }
    }
}

/// Every kind names its status in its source chain, so an `Error` boxed by
/// `?` answers the same code through tonic's `Status::from_error` as through
/// `From`: a refusal is its [`Refused`], a stopped query the
/// [`Ended`](crate::Ended) of its cause, a database failure an `INTERNAL`
/// status whose own source is the database's error (so that error is still
/// in the chain, one step further, and in [`Error::database_error`]).
impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::NotAdmitted(refused) => Some(refused),
            Kind::Ended(cause) => Some(crate::Ended::of(*cause)),
            Kind::Database(_, status) => Some(status),
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(err: Error) -> tonic::Status {
        match err.kind {
            Kind::NotAdmitted(refused) => refused.into(),
            Kind::Ended(cause) => status_for(cause),
            Kind::Database(err, status) => {
                tracing::warn!(error = %err, "database error");
                status
            }
        }
    }
}
