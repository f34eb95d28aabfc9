//! Admission that counts queue time: a deadline-aware semaphore for any
//! scarce resource (workers, database connections, rate tokens), and a server
//! concurrency limit built on it.
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
mod queue;

use std::fmt;
use std::sync::LazyLock;

pub use limit::{AdmissionLayer, Admitted, AdmittedBody};
pub use queue::{Admission, Discipline, Permit, Stats};

use crate::scope::{Cause, Scope};
use crate::status::cause_status;

/// Why a caller was not given a permit.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use tonic_deadline::{Cause, Scope};
/// use tonic_deadline::admission::{Admission, Reason};
/// let scope = Scope::background();
/// scope.cancel();
/// let refused = Admission::new(4).try_acquire(&scope).unwrap_err();
/// assert_eq!(refused.reason(), Reason::Ended(Cause::Cancelled));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The caller's scope ended (before or while it waited).
    Ended(Cause),
    /// The caller has less time left than the observed service time: the work
    /// could not finish before its deadline, so it is not started.
    WouldNotFinish,
    /// The queue is at its configured bound.
    QueueFull,
}

/// The error of [`Admission::acquire`]: the caller gets no permit.
///
/// Converts into the right [`tonic::Status`]: an ended scope as its cause
/// (`DEADLINE_EXCEEDED` or `CANCELLED`), work that could not finish in time
/// as `DEADLINE_EXCEEDED` (the deadline cannot be met, and saying so early
/// lets the caller use what is left), a full queue as `RESOURCE_EXHAUSTED`.
///
/// ```
/// use tonic_deadline::admission::{Admission, Reason};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let scope = tonic_deadline::Scope::background();
/// scope.cancel();
/// let refused = Admission::new(4).acquire(&scope).await.unwrap_err();
/// assert_eq!(refused.reason(), Reason::Ended(tonic_deadline::Cause::Cancelled));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    reason: Reason,
}

impl Refused {
    pub(crate) const fn new(reason: Reason) -> Self {
        Self { reason }
    }

    /// Why the caller was refused.
    pub fn reason(&self) -> Reason {
        self.reason
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason {
            Reason::Ended(cause) => write!(f, "not admitted: {cause}"),
            Reason::WouldNotFinish => {
                f.write_str("not admitted: the work could not finish in time")
            }
            Reason::QueueFull => f.write_str("not admitted: queue full"),
        }
    }
}

impl Refused {
    /// The status of this refusal, made once per kind.
    fn status(&self) -> &'static tonic::Status {
        static OVERLOADED: LazyLock<tonic::Status> =
            LazyLock::new(|| tonic::Status::resource_exhausted("overloaded"));
        match self.reason {
            Reason::Ended(cause) => cause_status(cause),
            Reason::WouldNotFinish => cause_status(Cause::DeadlineExceeded),
            Reason::QueueFull => &OVERLOADED,
        }
    }
}

/// A refusal names what it stands for as its source: the [`Ended`](crate::Ended)
/// of a scope that ended (whose own source is its status), else its status.
/// So a `Refused` boxed by `?` still answers the right code through tonic's
/// `Status::from_error`, not `UNKNOWN`.
impl std::error::Error for Refused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self.reason {
            Reason::Ended(cause) => Some(crate::Ended::of(cause)),
            _ => Some(self.status()),
        }
    }
}

impl From<Refused> for tonic::Status {
    fn from(refused: Refused) -> tonic::Status {
        refused.status().clone()
    }
}

impl From<crate::Ended> for Refused {
    fn from(ended: crate::Ended) -> Self {
        Refused::new(Reason::Ended(ended.cause()))
    }
}

/// The scope a request runs under: the one the server layer put in the
/// request's extensions, else the task's current scope.
fn scope_of<B>(request: &http::Request<B>) -> Scope {
    request
        .extensions()
        .get::<Scope>()
        .cloned()
        .unwrap_or_else(Scope::current)
}

#[cfg(test)]
mod tests;
