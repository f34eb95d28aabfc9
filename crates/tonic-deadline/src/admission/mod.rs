//! Admission that counts queue time: a deadline-aware semaphore for any
//! scarce resource (workers, database connections, rate tokens), and a server
//! concurrency limit built on it.
//!
//! The semaphore is the core's ([`grpc_deadline::admission`]), re-exported
//! here: it needs no gRPC stack, so the database pools and the job queue
//! stand on the core alone. The server layer, [`AdmissionLayer`], is
//! tonic-deadline's.
//!
//! Time spent waiting for a permit is spent from the caller's budget,
//! so the queue itself obeys the caller's [`Scope`]:
//!
//! 1. a caller whose scope has ended is refused without queueing;
//! 2. work that cannot finish in time is refused *before* it takes the
//!    resource: each permit measures how long it was held, an exponentially
//!    weighted moving average (EWMA) of those times is the expected service
//!    time, and a caller with less time left than that is turned away — at
//!    arrival, when it would be granted, and at the moment its remaining
//!    budget drops below the estimate while it waits;
//! 3. a waiter whose scope ends (deadline or cancel) leaves the queue at once,
//!    wherever it stands, instead of waiting to reach the head;
//! 4. under overload the queue serves the *newest* waiter first
//!    ([`Discipline::AdaptiveLifo`], the default): fresh work still has the
//!    time to be useful, while work that already waited long is the most
//!    likely to be abandoned by its caller. While the queue is calm it is
//!    first-in-first-out, so nobody is starved when there is no overload.
//!    [`Discipline`] compares the three under overload.
//!
//! How it differs from `tokio::sync::Semaphore` and tower's `ConcurrencyLimit`:
//! those queue strictly first-in-first-out, know nothing about deadlines, and
//! hand a permit to whoever reaches the head — under overload, mostly to
//! callers who already gave up, so the resource stays busy with stale work
//! and goodput collapses.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tonic_deadline::Scope;
//! use tonic_deadline::admission::{Admission, Reason};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let connections = Admission::new(1);
//! let request = Scope::background().with_timeout(Duration::from_millis(100));
//! let held = connections.acquire(&request).await.expect("a free permit is granted at once");
//!
//! // A second caller queues; its queue time spends its budget, and it
//! // leaves the queue when that budget is gone.
//! let late = Scope::background().with_timeout(Duration::from_millis(30));
//! let refused = connections.acquire(&late).await.expect_err("the permit is never freed in time");
//! assert_eq!(refused.reason(), Reason::Ended(tonic_deadline::Cause::DeadlineExceeded));
//! assert_eq!(tonic::Status::from(refused).code(), tonic::Code::DeadlineExceeded);
//! drop(held);
//! assert_eq!(connections.stats().in_use, 0, "dropping the permit releases it");
//! # }
//! ```
//!
//! # Invariants
//!
//! 1. `in_use + free == permits` at all times; a [`Permit`] is the only way to
//!    hold one, and dropping it (on every path, cancellation included)
//!    releases it or hands it straight to a waiter.
//! 2. A permit is never handed to a waiter whose scope has ended or whose
//!    remaining budget is below the expected service time.
//! 3. A waiter is in the queue exactly while its `acquire` future is alive
//!    and not yet answered; dropping the future removes the entry.

mod limit;
pub(crate) mod observer;

pub use grpc_deadline::admission::{Admission, Discipline, Permit, Reason, Refused, Stats};
pub use limit::{AdmissionLayer, Admitted, AdmittedBody};

use crate::scope::Scope;

/// The scope a request runs under: the one the server layer put in the
/// request's extensions, else the task's current scope.
fn scope_of<B>(request: &http::Request<B>) -> Scope {
    request
        .extensions()
        .get::<Scope>()
        .cloned()
        .unwrap_or_else(Scope::current)
}
