//! What travels on the wire, and nothing else: the `grpc-timeout` codec,
//! the status headers and the names of gRPC's status codes. The bottom of
//! the crate: it imports nothing of it.

#[cfg(any(feature = "server", feature = "channel"))]
pub(crate) mod frames;
#[cfg(feature = "server")]
pub(crate) mod hpack;
pub mod timeout_header;

use http::{HeaderMap, HeaderName};
use tonic::Code;

/// The debug data of the GOAWAY a reset guard sends when it closes a
/// connection for a reset flood: the client layer names the cause from it.
pub(crate) const FLOOD_GO_AWAY: &str = "too many streams reset long before their deadlines";

/// `grpc-status`, made once: a lookup by a `&str` parses the name first.
pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// `grpc-message`, made once.
pub(crate) const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// The `grpc-status` in `headers` (response headers of a trailers-only
/// answer, or trailers), if any.
pub(crate) fn status_code(headers: &HeaderMap) -> Option<Code> {
    let value = headers.get(GRPC_STATUS)?;
    let n: i32 = value.to_str().ok()?.parse().ok()?;
    Some(Code::from_i32(n))
}

/// Every code, under its name in the gRPC spec.
const NAMES: [(&str, Code); 17] = [
    ("OK", Code::Ok),
    ("CANCELLED", Code::Cancelled),
    ("UNKNOWN", Code::Unknown),
    ("INVALID_ARGUMENT", Code::InvalidArgument),
    ("DEADLINE_EXCEEDED", Code::DeadlineExceeded),
    ("NOT_FOUND", Code::NotFound),
    ("ALREADY_EXISTS", Code::AlreadyExists),
    ("PERMISSION_DENIED", Code::PermissionDenied),
    ("RESOURCE_EXHAUSTED", Code::ResourceExhausted),
    ("FAILED_PRECONDITION", Code::FailedPrecondition),
    ("ABORTED", Code::Aborted),
    ("OUT_OF_RANGE", Code::OutOfRange),
    ("UNIMPLEMENTED", Code::Unimplemented),
    ("INTERNAL", Code::Internal),
    ("UNAVAILABLE", Code::Unavailable),
    ("DATA_LOSS", Code::DataLoss),
    ("UNAUTHENTICATED", Code::Unauthenticated),
];

/// The code named as in the gRPC spec (`"UNAVAILABLE"`); case-insensitive,
/// as grpc-java accepts it. Service config names codes this way.
#[cfg(any(test, feature = "service-config"))]
pub(crate) fn code_from_name(name: &str) -> Option<Code> {
    NAMES
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|&(_, code)| code)
}

/// The gRPC spec's name of `code` (`DEADLINE_EXCEEDED`).
pub(crate) fn code_name(code: Code) -> &'static str {
    NAMES
        .iter()
        .find(|(_, c)| *c == code)
        .map_or("UNKNOWN", |&(n, _)| n)
}

#[cfg(test)]
mod tests {
    use super::{code_from_name, code_name};

    #[test]
    fn every_code_name_reads_back_as_its_code() {
        for n in 0..=16 {
            let code = tonic::Code::from_i32(n);
            assert_eq!(code_from_name(code_name(code)), Some(code), "{code:?}");
        }
        assert_eq!(
            code_from_name("unavailable"),
            Some(tonic::Code::Unavailable)
        );
        assert_eq!(code_from_name("NOT_A_CODE"), None);
    }
}
