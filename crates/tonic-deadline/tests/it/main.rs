//! The integration tests, in one binary so that the shared helpers in
//! `common` and the crate's dev-dependencies are compiled and linked once:
//! one module per concern. Modules that need a feature are declared behind
//! it here.
//!
//! One test keeps a binary of its own: `tests/logs.rs` (see there why).

mod common;

mod admission_layer;
mod cancellation;
mod failures;
mod observe;
mod peers;
mod plain_tonic_baseline;
mod propagation;
#[cfg(feature = "server")]
mod reset_guards;
mod round_trip;
mod scope_tree;
mod seams;
mod wait_for_ready;
mod wire;

#[cfg(feature = "sqlite")]
mod db_sqlite;
#[cfg(feature = "sqlx-sqlite")]
mod db_sqlx_sqlite;
#[cfg(all(feature = "reqwest", feature = "http"))]
mod http_client;
#[cfg(feature = "http")]
mod http_server;
#[cfg(feature = "jobs")]
mod jobs_sigkill;

// Built only with the `postgres-tests` feature, which `scripts/test-all`
// turns on (through `--all-features`) after starting a throwaway server and
// exporting its address as `TONIC_DEADLINE_PG_URL`. `peers` reads these
// declarations to say what a build without the feature left out.
#[cfg(feature = "postgres-tests")]
mod db_postgres;
#[cfg(all(feature = "postgres-tests", feature = "sqlx-postgres"))]
mod db_sqlx_postgres;
#[cfg(feature = "postgres-tests")]
mod jobs_postgres;
