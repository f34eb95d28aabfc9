//! The pools against real databases that run in-process (SQLite), in one
//! binary: cancellation reaches the query, cleanup is deterministic, and
//! queue time spends the budget. The PostgreSQL pools are tested against a
//! real server in the lab's tests (`crates/deadline-lab/tests/it/db_*`).

#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "sqlx-sqlite")]
mod sqlx_sqlite;
