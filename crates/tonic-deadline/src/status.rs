//! The one table from scope causes to gRPC statuses.
//!
//! Every place that turns an ended scope into a status — the server's timer,
//! the client's race, a handler's `scope.check()?` — goes through
//! [`status_for`], so a deadline is `DEADLINE_EXCEEDED` everywhere and a
//! cancel is `CANCELLED` everywhere. Messages are fixed texts (R-15); the
//! details of which request and how much budget was left go to logs.

use std::fmt;

use tonic::{Code, Status};

use crate::scope::Cause;

/// The code for each cause. Exhaustive on purpose: a new cause must pick one.
pub(crate) fn code_for(cause: Cause) -> Code {
    match cause {
        Cause::DeadlineExceeded => Code::DeadlineExceeded,
        Cause::Cancelled | Cause::CallerCancelled | Cause::Completed => Code::Cancelled,
    }
}

/// The status reported for a scope that ended with `cause`.
///
/// ```
/// use tonic_deadline::{Cause, status::status_for};
/// let status = status_for(Cause::DeadlineExceeded);
/// assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
/// assert_eq!(status.message(), "deadline exceeded");
/// ```
pub fn status_for(cause: Cause) -> Status {
    Status::new(code_for(cause), cause.to_string())
}

/// The error of work stopped because its scope ended.
///
/// Converts into [`tonic::Status`] with the right code, so `?` in a handler is
/// always correct — the Go pitfall of returning `ctx.Err()` and answering
/// `UNKNOWN` has no Rust equivalent here.
///
/// ```
/// use tonic_deadline::{Cause, Ended};
/// fn handler_step(ended: Ended) -> Result<(), tonic::Status> {
///     Err(ended)?
/// }
/// # let scope = tonic_deadline::Scope::background();
/// # scope.cancel();
/// let status = handler_step(scope.check().unwrap_err()).unwrap_err();
/// assert_eq!(status.code(), tonic::Code::Cancelled);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    cause: Cause,
}

impl Ended {
    pub(crate) const fn new(cause: Cause) -> Self {
        Self { cause }
    }

    /// Why the scope ended.
    pub fn cause(&self) -> Cause {
        self.cause
    }
}

impl fmt::Display for Ended {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "scope ended: {}", self.cause)
    }
}

impl std::error::Error for Ended {}

impl From<Ended> for Status {
    fn from(ended: Ended) -> Status {
        status_for(ended.cause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_maps_to_deadline_or_cancelled_never_unknown() {
        let table = [
            (Cause::DeadlineExceeded, Code::DeadlineExceeded),
            (Cause::Cancelled, Code::Cancelled),
            (Cause::CallerCancelled, Code::Cancelled),
            (Cause::Completed, Code::Cancelled),
        ];
        for (cause, code) in table {
            assert_eq!(Status::from(Ended::new(cause)).code(), code, "{cause}");
        }
    }

    #[test]
    fn ended_boxed_as_error_is_recognised_by_tonic() {
        let boxed: Box<dyn std::error::Error + Send + Sync> =
            Box::new(Status::from(Ended::new(Cause::DeadlineExceeded)));
        assert_eq!(
            Status::from_error(boxed).code(),
            Code::DeadlineExceeded,
            "a status crossing a service boundary as BoxError must keep its code"
        );
    }
}
