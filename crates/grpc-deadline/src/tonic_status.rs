//! tonic's types for the core's, with the `tonic` feature: the status of
//! each [`Cause`](crate::Cause) ([`of`]), and [`Code`] both ways.
//!
//! Only the crate that defines a type, or the one that defines the trait,
//! may write `From<Ended> for tonic::Status`; this crate defines
//! [`Ended`](crate::Ended), so the conversion that makes `scope.check()?`
//! answer the right status in a tonic handler is here, beside `Ended`
//! itself, as a malformed header's is beside its error (in
//! [`timeout_header`](crate::timeout_header) and
//! [`deadline_headers`](crate::deadline_headers)). Everything else about
//! tonic is tonic-deadline's.
//!
//! ```
//! use grpc_deadline::{Code, Scope};
//!
//! fn handler_step(scope: &Scope) -> Result<(), tonic::Status> {
//!     scope.check()?; // DEADLINE_EXCEEDED or CANCELLED, never UNKNOWN
//!     Ok(())
//! }
//! let scope = Scope::background();
//! scope.cancel();
//! assert_eq!(handler_step(&scope).unwrap_err().code(), tonic::Code::Cancelled);
//! assert_eq!(tonic::Code::from(Code::Unavailable), tonic::Code::Unavailable);
//! ```

use crate::code::Code;

/// The cause → status table is the scope's, where [`Ended`](crate::Ended)
/// names its status as its source.
pub use crate::scope::cause::tonic_status as of;

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
}
