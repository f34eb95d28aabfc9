//! Admission that counts queue time: a deadline-aware semaphore for any
//! scarce resource (workers, database connections, rate tokens).
//!
//! Time spent waiting for a permit is spent from the caller's budget,
//! so the queue itself obeys the caller's [`Scope`](crate::Scope):
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
//! It needs no gRPC stack: a refusal names its gRPC [`Code`]
//! ([`Refused::code`]), and with the `tonic` feature converts into
//! `tonic::Status`. tonic-deadline re-exports this module as
//! `tonic_deadline::admission`, beside a server concurrency limit built on
//! it.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use grpc_deadline::{Cause, Code, Scope};
//! use grpc_deadline::admission::{Admission, Reason};
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
//! assert_eq!(refused.reason(), Reason::Ended(Cause::DeadlineExceeded));
//! assert_eq!(refused.code(), Code::DeadlineExceeded);
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

mod queue;

use std::fmt;

pub use queue::{Admission, Discipline, Permit, Stats};

use crate::Code;
use crate::scope::{Cause, Ended};

/// Why a caller was not given a permit.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use grpc_deadline::{Cause, Scope};
/// use grpc_deadline::admission::{Admission, Reason};
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
/// Answers the right gRPC code ([`Refused::code`]): an ended scope as its
/// cause (`DEADLINE_EXCEEDED` or `CANCELLED`), work that could not finish in
/// time as `DEADLINE_EXCEEDED` (the deadline cannot be met, and saying so
/// early lets the caller use what is left), a full queue as
/// `RESOURCE_EXHAUSTED`. With the `tonic` feature it converts into that
/// `tonic::Status`, boxed or not.
///
/// ```
/// use grpc_deadline::{Cause, Code, Scope};
/// use grpc_deadline::admission::{Admission, Reason};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let scope = Scope::background();
/// scope.cancel();
/// let refused = Admission::new(4).acquire(&scope).await.unwrap_err();
/// assert_eq!(refused.reason(), Reason::Ended(Cause::Cancelled));
/// assert_eq!(refused.code(), Code::Cancelled);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    reason: Reason,
}

impl Refused {
    /// A refusal for `reason`, for a queue or pool of your own that refuses
    /// as [`Admission`] does.
    ///
    /// ```
    /// use grpc_deadline::Code;
    /// use grpc_deadline::admission::{Reason, Refused};
    /// assert_eq!(Refused::new(Reason::QueueFull).code(), Code::ResourceExhausted);
    /// ```
    pub const fn new(reason: Reason) -> Self {
        Self { reason }
    }

    /// Why the caller was refused.
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// The gRPC code a caller is answered with: the cause of an ended
    /// scope, `DEADLINE_EXCEEDED` for work that could not finish in time,
    /// `RESOURCE_EXHAUSTED` for a full queue.
    ///
    /// ```
    /// use grpc_deadline::Code;
    /// use grpc_deadline::admission::{Reason, Refused};
    /// assert_eq!(Refused::new(Reason::WouldNotFinish).code(), Code::DeadlineExceeded);
    /// ```
    pub fn code(&self) -> Code {
        match self.reason {
            Reason::Ended(cause) => cause.code(),
            Reason::WouldNotFinish => Code::DeadlineExceeded,
            Reason::QueueFull => Code::ResourceExhausted,
        }
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

/// A refusal for an ended scope names that scope's [`Ended`] as its source,
/// so whoever walks the chain for an `Ended` finds it. With the `tonic`
/// feature every other refusal names its `tonic::Status`, so a `Refused`
/// boxed by `?` still answers the right code through tonic's
/// `Status::from_error`, not `UNKNOWN`.
impl std::error::Error for Refused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self.reason {
            Reason::Ended(cause) => Some(Ended::of(cause)),
            #[cfg(feature = "tonic")]
            _ => Some(tonic_status(self)),
            #[cfg(not(feature = "tonic"))]
            _ => None,
        }
    }
}

/// The status of a refusal, made once per kind: what a [`Refused`]
/// converts into, and what one that is not an ended scope names as its
/// source.
#[cfg(feature = "tonic")]
fn tonic_status(refused: &Refused) -> &'static tonic::Status {
    static OVERLOADED: std::sync::LazyLock<tonic::Status> =
        std::sync::LazyLock::new(|| tonic::Status::resource_exhausted("overloaded"));
    match refused.reason {
        Reason::Ended(cause) => crate::tonic_status::of(cause),
        Reason::WouldNotFinish => crate::tonic_status::of(Cause::DeadlineExceeded),
        Reason::QueueFull => &OVERLOADED,
    }
}

/// `DEADLINE_EXCEEDED`, `CANCELLED` or `RESOURCE_EXHAUSTED`
/// ([`Refused::code`]), with a fixed message (feature `tonic`).
///
/// ```
/// use grpc_deadline::admission::{Reason, Refused};
/// let refused = Refused::new(Reason::QueueFull);
/// assert_eq!(tonic::Status::from(refused).code(), tonic::Code::ResourceExhausted);
/// ```
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl From<Refused> for tonic::Status {
    fn from(refused: Refused) -> tonic::Status {
        tonic_status(&refused).clone()
    }
}

impl From<Ended> for Refused {
    fn from(ended: Ended) -> Self {
        Refused::new(Reason::Ended(ended.cause()))
    }
}

#[cfg(test)]
mod tests;
