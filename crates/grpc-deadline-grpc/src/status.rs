//! The one table from why a call ended to the status its caller reads.

use grpc::{StatusCodeError, StatusError};
use grpc_deadline::{Cause, Code};

/// The `grpc` crate's code for one of gRPC's codes (the two number them
/// alike, as the spec does); `None` for `OK`, which the crate keeps out of
/// its error codes.
///
/// ```
/// use grpc::StatusCodeError;
/// use grpc_deadline::Code;
/// use grpc_deadline_grpc::code_of;
/// assert_eq!(code_of(Code::DeadlineExceeded), Some(StatusCodeError::DeadlineExceeded));
/// assert_eq!(code_of(Code::Ok), None);
/// ```
pub fn code_of(code: Code) -> Option<StatusCodeError> {
    (code != Code::Ok).then(|| StatusCodeError::from(code as i32))
}

/// The name gRPC gives a `grpc` crate status code (`DEADLINE_EXCEEDED`).
///
/// ```
/// assert_eq!(grpc_deadline_grpc::code_name(grpc::StatusCodeError::Cancelled), "CANCELLED");
/// ```
pub fn code_name(code: StatusCodeError) -> &'static str {
    Code::from_i32(code as i32).name()
}

/// The status of a call that ended because `cause` ended its scope or its
/// deadline passed: `DEADLINE_EXCEEDED` or `CANCELLED`, never `UNKNOWN`.
pub(crate) fn ended(cause: Cause, sent: bool) -> StatusError {
    // The core's table; a cause is never OK.
    let code = StatusCodeError::from(cause.code() as i32);
    let message = match (cause, sent) {
        (Cause::DeadlineExceeded, false) => {
            "deadline exceeded before the call was sent: nothing was sent".to_owned()
        }
        (Cause::DeadlineExceeded, true) => "deadline exceeded".to_owned(),
        (cause, false) => format!("call not sent: its scope had ended ({cause})"),
        (cause, true) => format!("call cancelled: its scope ended ({cause})"),
    };
    StatusError::new(code, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_maps_to_deadline_exceeded_or_cancelled_never_unknown() {
        for cause in Cause::ALL {
            for sent in [false, true] {
                let code = ended(cause, sent).code();
                let expected = match cause {
                    Cause::DeadlineExceeded => StatusCodeError::DeadlineExceeded,
                    _ => StatusCodeError::Cancelled,
                };
                assert_eq!(code, expected, "{cause} must map as gRPC defines it");
            }
        }
    }

    #[test]
    fn every_code_keeps_its_number_across_the_two_crates() {
        assert_eq!(code_of(Code::Ok), None, "OK is no error code");
        for n in 1..=16 {
            let code = Code::from_i32(n);
            let theirs = code_of(code).expect("every code but OK is an error code");
            assert_eq!(theirs as i32, n, "{} must keep its number", code.name());
            assert_eq!(code_name(theirs), code.name());
        }
    }
}
