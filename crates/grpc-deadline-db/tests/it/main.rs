//! The pools against real databases, in one binary: cancellation reaches
//! the query, cleanup is deterministic, and queue time spends the budget.
//! SQLite runs in-process; the PostgreSQL pools need a server, and are
//! built with the feature `postgres-tests` (`scripts/test-all` starts a
//! throwaway server and turns it on).

#[cfg(any(
    feature = "sqlite",
    feature = "sqlx-sqlite",
    feature = "postgres-tests"
))]
mod support;
mod tree;

#[cfg(feature = "sqlite")]
mod grpc_crate;
#[cfg(feature = "postgres-tests")]
mod pg;
#[cfg(feature = "postgres-tests")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "postgres-tests")]
mod sqlx_postgres;
#[cfg(feature = "sqlx-sqlite")]
mod sqlx_sqlite;
