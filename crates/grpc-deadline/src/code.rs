//! gRPC's status codes, under their numbers and names in the gRPC spec.

use std::fmt;

/// A gRPC status code, as the gRPC spec numbers and names it.
///
/// The core's own type, so that no stack's status type is needed to say
/// which code a [`Cause`](crate::Cause) is answered with; each stack's
/// layers convert (with the `tonic` feature: `From` both ways with
/// `tonic::Code`).
///
/// ```
/// use grpc_deadline::Code;
/// assert_eq!(Code::DeadlineExceeded as i32, 4);
/// assert_eq!(Code::from_i32(4), Code::DeadlineExceeded);
/// assert_eq!(Code::DeadlineExceeded.name(), "DEADLINE_EXCEEDED");
/// assert_eq!(Code::from_name("unavailable"), Some(Code::Unavailable));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)] // each is named as in the spec; see `name`
pub enum Code {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

/// Every code, in the order of its number, under its name in the spec.
const CODES: [(Code, &str); 17] = [
    (Code::Ok, "OK"),
    (Code::Cancelled, "CANCELLED"),
    (Code::Unknown, "UNKNOWN"),
    (Code::InvalidArgument, "INVALID_ARGUMENT"),
    (Code::DeadlineExceeded, "DEADLINE_EXCEEDED"),
    (Code::NotFound, "NOT_FOUND"),
    (Code::AlreadyExists, "ALREADY_EXISTS"),
    (Code::PermissionDenied, "PERMISSION_DENIED"),
    (Code::ResourceExhausted, "RESOURCE_EXHAUSTED"),
    (Code::FailedPrecondition, "FAILED_PRECONDITION"),
    (Code::Aborted, "ABORTED"),
    (Code::OutOfRange, "OUT_OF_RANGE"),
    (Code::Unimplemented, "UNIMPLEMENTED"),
    (Code::Internal, "INTERNAL"),
    (Code::Unavailable, "UNAVAILABLE"),
    (Code::DataLoss, "DATA_LOSS"),
    (Code::Unauthenticated, "UNAUTHENTICATED"),
];

impl Code {
    /// The code numbered `n`; a number gRPC does not define is `Unknown`,
    /// as the spec says a receiver must read it.
    pub const fn from_i32(n: i32) -> Code {
        if n >= 0 && (n as usize) < CODES.len() {
            CODES[n as usize].0
        } else {
            Code::Unknown
        }
    }

    /// The code's name in the gRPC spec (`DEADLINE_EXCEEDED`).
    pub const fn name(self) -> &'static str {
        CODES[self as usize].1
    }

    /// The code named as in the gRPC spec (`"UNAVAILABLE"`);
    /// case-insensitive, as grpc-java accepts it. Service config names
    /// codes this way.
    pub fn from_name(name: &str) -> Option<Code> {
        CODES
            .iter()
            .find(|(_, n)| n.eq_ignore_ascii_case(name))
            .map(|&(code, _)| code)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::Code;

    #[test]
    fn every_code_reads_back_from_its_number_and_its_name() {
        for n in 0..=16 {
            let code = Code::from_i32(n);
            assert_eq!(code as i32, n, "{code:?} sits at its number");
            assert_eq!(Code::from_name(code.name()), Some(code), "{code:?}");
        }
        assert_eq!(Code::from_name("unavailable"), Some(Code::Unavailable));
        assert_eq!(Code::from_name("NOT_A_CODE"), None);
    }

    #[test]
    fn a_number_grpc_does_not_define_reads_as_unknown() {
        for n in [-1, 17, i32::MAX, i32::MIN] {
            assert_eq!(Code::from_i32(n), Code::Unknown, "{n}");
        }
    }
}
