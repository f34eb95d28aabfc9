//! The conversions into tonic's types, with the `tonic` feature.
//!
//! Only the crate that defines a type, or the one that defines the trait,
//! may write `From<Ended> for tonic::Status`; this crate defines
//! [`Ended`], so the conversion that makes `scope.check()?` answer the right
//! status in a tonic handler lives here. Everything else about tonic is
//! tonic-deadline's.
//!
//! ```
//! use grpc_deadline::Scope;
//!
//! fn handler_step(scope: &Scope) -> Result<(), tonic::Status> {
//!     scope.check()?; // DEADLINE_EXCEEDED or CANCELLED, never UNKNOWN
//!     Ok(())
//! }
//! let scope = Scope::background();
//! scope.cancel();
//! assert_eq!(handler_step(&scope).unwrap_err().code(), tonic::Code::Cancelled);
//! ```

use std::sync::LazyLock;

use tonic::Status;

use crate::deadline_headers::MalformedDeadline;
use crate::{Cause, Code, Ended, timeout_header::MalformedTimeout};

/// The status of each cause, made once: what [`Ended`] converts into, and
/// what it names as its [`source`](std::error::Error::source), so tonic's
/// `Status::from_error` finds the same code and a fixed message.
///
/// ```
/// use grpc_deadline::{Cause, tonic_status};
/// let status = tonic_status::of(Cause::DeadlineExceeded);
/// assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
/// assert_eq!(status.message(), "deadline exceeded");
/// ```
pub fn of(cause: Cause) -> &'static Status {
    static STATUSES: LazyLock<[Status; 4]> = LazyLock::new(|| {
        Cause::ALL.map(|cause| Status::new(cause.code().into(), cause.to_string()))
    });
    &STATUSES[cause.index()]
}

/// The status a boxed [`MalformedTimeout`] names as its source.
pub(crate) fn malformed_timeout() -> &'static Status {
    static MALFORMED: LazyLock<Status> =
        LazyLock::new(|| Status::internal("malformed grpc-timeout"));
    &MALFORMED
}

/// The status a boxed [`MalformedDeadline`] names as its source.
pub(crate) fn malformed_deadline() -> &'static Status {
    static MALFORMED: LazyLock<Status> =
        LazyLock::new(|| Status::internal("malformed deadline header"));
    &MALFORMED
}

/// `INTERNAL`, naming the header and the offending value.
impl From<MalformedDeadline> for Status {
    fn from(malformed: MalformedDeadline) -> Status {
        Status::new(malformed.code().into(), malformed.to_string())
    }
}

impl From<Ended> for Status {
    fn from(ended: Ended) -> Status {
        of(ended.cause()).clone()
    }
}

/// `INTERNAL`, naming the header and the offending value.
impl From<MalformedTimeout> for Status {
    fn from(malformed: MalformedTimeout) -> Status {
        Status::new(malformed.code().into(), malformed.to_string())
    }
}

impl From<Code> for tonic::Code {
    fn from(code: Code) -> tonic::Code {
        tonic::Code::from_i32(code as i32)
    }
}

impl From<tonic::Code> for Code {
    fn from(code: tonic::Code) -> Code {
        Code::from_i32(code as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_converts_both_ways_with_its_number() {
        for n in 0..=16 {
            let ours = Code::from_i32(n);
            let theirs = tonic::Code::from(ours);
            assert_eq!(theirs as i32, n, "{ours:?}");
            assert_eq!(Code::from(theirs), ours);
        }
    }

    #[test]
    fn an_ended_scope_answers_its_causes_code_boxed_or_not() {
        for cause in Cause::ALL {
            let code = tonic::Code::from(cause.code());
            assert_eq!(Status::from(Ended::new(cause)).code(), code, "{cause}");
            let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(Ended::new(cause));
            assert_eq!(Status::from_error(boxed).code(), code, "{cause}, boxed");
        }
    }

    #[test]
    fn a_malformed_timeout_answers_internal_boxed_or_not() {
        let malformed = crate::timeout_header::decode(b"1x").expect_err("x is no unit");
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(malformed.clone());
        assert_eq!(Status::from(malformed).code(), tonic::Code::Internal);
        assert_eq!(Status::from_error(boxed).code(), tonic::Code::Internal);
    }
}
