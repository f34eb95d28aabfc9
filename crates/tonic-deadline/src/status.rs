//! The one table from scope causes to gRPC statuses.
//!
//! Every place that turns an ended scope into a status — the server's timer,
//! the client's race, a handler's `scope.check()?` — goes through
//! [`status_for`], so a deadline is `DEADLINE_EXCEEDED` everywhere and a
//! cancel is `CANCELLED` everywhere. Messages are fixed texts; the
//! details of which request and how much budget was left go to logs.

use std::error::Error;
use std::fmt;
use std::sync::LazyLock;

use tonic::{Code, Status};

use crate::scope::Cause;

/// `grpc-status`, made once: a lookup by a `&str` parses the name first.
pub(crate) const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");

/// `grpc-message`, made once.
pub(crate) const GRPC_MESSAGE: http::HeaderName = http::HeaderName::from_static("grpc-message");

/// The code for each cause. Exhaustive on purpose: a new cause must pick one.
pub(crate) fn code_for(cause: Cause) -> Code {
    match cause {
        Cause::DeadlineExceeded => Code::DeadlineExceeded,
        Cause::Cancelled | Cause::Abandoned | Cause::Completed => Code::Cancelled,
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

/// The statuses an [`Ended`] reports as its [`source`](Error::source), one
/// per code. Constant data, built once.
static DEADLINE_EXCEEDED: LazyLock<Status> = LazyLock::new(|| status_for(Cause::DeadlineExceeded));
static CANCELLED: LazyLock<Status> = LazyLock::new(|| status_for(Cause::Cancelled));

/// An `Ended` names its status as its source, so anything that looks for a
/// [`Status`] in an error's source chain finds the right one — tonic's own
/// `Status::from_error` included. Without it, an `Ended` that travelled as a
/// `Box<dyn Error>` (what `?` into a boxed error gives) would become
/// `UNKNOWN`.
impl Error for Ended {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        let status: &Status = match code_for(self.cause) {
            Code::DeadlineExceeded => &DEADLINE_EXCEEDED,
            _ => &CANCELLED,
        };
        Some(status)
    }
}

/// The status for any error, looking through its source chain: the first
/// [`Ended`] or [`Status`] found decides; anything else is `UNKNOWN` with
/// the error's text, as tonic does.
///
/// Use it where an error crosses into a handler's answer as a boxed error
/// (`anyhow`, `Box<dyn Error>`, a wrapper of your own): a scope that ended
/// still answers `DEADLINE_EXCEEDED` or `CANCELLED`.
///
/// ```
/// use tonic_deadline::{Scope, status::from_error};
///
/// #[derive(Debug)]
/// struct LookupFailed(tonic_deadline::Ended);
/// impl std::fmt::Display for LookupFailed {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("lookup failed") }
/// }
/// impl std::error::Error for LookupFailed {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> { Some(&self.0) }
/// }
///
/// let scope = Scope::background();
/// scope.cancel();
/// let err = LookupFailed(scope.check().unwrap_err());
/// assert_eq!(from_error(&err).code(), tonic::Code::Cancelled);
/// ```
pub fn from_error(err: &(dyn Error + 'static)) -> Status {
    let mut next = Some(err);
    while let Some(err) = next {
        if let Some(ended) = err.downcast_ref::<Ended>() {
            return Status::from(*ended);
        }
        if let Some(status) = err.downcast_ref::<Status>() {
            let mut copy = Status::new(status.code(), status.message());
            *copy.metadata_mut() = status.metadata().clone();
            return copy;
        }
        next = err.source();
    }
    Status::unknown(err.to_string())
}

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
            (Cause::Abandoned, Code::Cancelled),
            (Cause::Completed, Code::Cancelled),
        ];
        for (cause, code) in table {
            assert_eq!(Status::from(Ended::new(cause)).code(), code, "{cause}");
        }
    }

    #[test]
    fn boxed_ended_becomes_its_status_through_tonic_from_error() {
        for (cause, code) in [
            (Cause::DeadlineExceeded, Code::DeadlineExceeded),
            (Cause::Cancelled, Code::Cancelled),
            (Cause::Abandoned, Code::Cancelled),
            (Cause::Completed, Code::Cancelled),
        ] {
            let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(Ended::new(cause));
            let status = Status::from_error(boxed);
            assert_eq!(
                status.code(),
                code,
                "{cause}: an Ended boxed by `?` must not become UNKNOWN"
            );
        }
    }

    #[test]
    fn from_error_finds_ended_or_status_deep_in_the_chain() {
        #[derive(Debug)]
        struct Wrap(Box<dyn Error + Send + Sync>);
        impl fmt::Display for Wrap {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("wrapped")
            }
        }
        impl Error for Wrap {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&*self.0)
            }
        }
        let ended = Wrap(Box::new(Wrap(Box::new(Ended::new(
            Cause::DeadlineExceeded,
        )))));
        assert_eq!(from_error(&ended).code(), Code::DeadlineExceeded);
        let status = Wrap(Box::new(Status::unavailable("down")));
        assert_eq!(from_error(&status).code(), Code::Unavailable);
        assert_eq!(from_error(&status).message(), "down");
        let other = Wrap(Box::new(std::io::Error::other("disk")));
        assert_eq!(
            from_error(&other).code(),
            Code::Unknown,
            "an error that holds neither keeps tonic's answer"
        );
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
