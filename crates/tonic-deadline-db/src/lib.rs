//! Renamed: this crate is now [`grpc_deadline_db`], which stands on the
//! core (`grpc-deadline`) and needs no gRPC stack. Everything is
//! re-exported here, under the same paths, with grpc-deadline-db's `tonic`
//! feature on (its `Error` converts into `tonic::Status`, as it did), for
//! one release.
//!
//! Depend on `grpc-deadline-db` instead, with the feature `tonic` if you
//! convert its errors into `tonic::Status`:
//!
//! ```toml
//! grpc-deadline-db = { version = "0.1", features = ["sqlite", "tonic"] }
//! ```
//!
//! and write `grpc_deadline_db::` for `tonic_deadline_db::`.
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # fn main() -> Result<(), tonic_deadline_db::Error> {
//! use tonic_deadline_db::sqlite::SqlitePool;
//! // The same type under its old path.
//! let pool: grpc_deadline_db::sqlite::SqlitePool = SqlitePool::open_in_memory(1)?;
//! assert_eq!(pool.stats().idle, 1);
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```

pub use grpc_deadline_db::*;
