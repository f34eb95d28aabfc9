//! The tests of tonic-deadline's PostgreSQL pools and job queue against a
//! live server, in one binary.
//!
//! Built only with the `live` feature, which `scripts/test-all` turns on
//! (through `--all-features`) after starting a throwaway server and exporting
//! its address as `TONIC_DEADLINE_PG_URL`. `peers` reads these declarations
//! to say what a build without the feature left out.

mod peers;

#[cfg(feature = "live")]
mod db_postgres;
#[cfg(feature = "live")]
mod db_sqlx_postgres;
#[cfg(feature = "live")]
mod jobs_postgres;
