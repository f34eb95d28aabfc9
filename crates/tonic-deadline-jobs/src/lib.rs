//! Renamed: this crate is now [`grpc_deadline_jobs`], which stands on the
//! core (`grpc-deadline`) and needs no gRPC stack. Everything is
//! re-exported here, under the same paths, with grpc-deadline-jobs' `tonic`
//! feature on (the stores' `Error` converts into `tonic::Status`, as it
//! did), for one release.
//!
//! Depend on `grpc-deadline-jobs` instead, with the feature `tonic` if you
//! convert its errors into `tonic::Status`:
//!
//! ```toml
//! grpc-deadline-jobs = { version = "0.1", features = ["sqlite", "tonic"] }
//! ```
//!
//! and write `grpc_deadline_jobs::` for `tonic_deadline_jobs::`.
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use tonic_deadline_jobs::{JobQueue, JobState};
//! let dir = tempfile::tempdir().unwrap();
//! // The same type under its old path.
//! let queue: grpc_deadline_jobs::JobQueue = JobQueue::open(dir.path().join("jobs.db")).unwrap();
//! let id = queue.submit("send-receipt", b"order 42", true).await.unwrap();
//! assert_eq!(queue.state(id).await.unwrap(), Some(JobState::Queued));
//! # }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```

pub use grpc_deadline_jobs::*;
