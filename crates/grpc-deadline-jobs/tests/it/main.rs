//! The job queue against real processes: a worker killed mid-job leaves
//! the job to be taken again, never lost and never run twice at once. On
//! SQLite, and on PostgreSQL with the feature `postgres-tests` (a live
//! server at `TONIC_DEADLINE_PG_URL`; `scripts/test-all` starts one).

#[cfg(any(feature = "sqlite", feature = "postgres-tests"))]
mod child;

#[cfg(feature = "postgres-tests")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sigkill;
