//! What travels on the wire, and nothing else: the status headers and the
//! names of gRPC's status codes (the `grpc-timeout` codec is the core's;
//! the HTTP/2 frame walker the reset guard's). The bottom of the crate: it
//! imports nothing of it.

pub(crate) use grpc_deadline::timeout_header;

use http::{HeaderMap, HeaderName, HeaderValue};
use tonic::Code;

/// `grpc-status`, made once: a lookup by a `&str` parses the name first.
pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// `grpc-message`, made once.
pub(crate) const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// `grpc-retry-pushback-ms` (gRFC A6): how long the client should wait
/// before its next attempt; negative, not to retry.
pub(crate) const PUSHBACK: HeaderName = HeaderName::from_static(PUSHBACK_KEY);

/// Its name, as a metadata key.
pub(crate) const PUSHBACK_KEY: &str = "grpc-retry-pushback-ms";

/// `grpc-retry-pushback-ms: -1`, "do not retry".
pub(crate) const DO_NOT_RETRY: HeaderValue = HeaderValue::from_static("-1");

/// Marks a trailers-only answer that failed as not to be retried, unless
/// it carries a pushback of its own; whether it was marked here.
pub(crate) fn mark_do_not_retry(headers: &mut HeaderMap) -> bool {
    let failed = status_code(headers).is_some_and(|code| code != Code::Ok);
    if !failed || headers.contains_key(PUSHBACK) {
        return false;
    }
    headers.insert(PUSHBACK, DO_NOT_RETRY);
    true
}

/// The `grpc-status` in `headers` (response headers of a trailers-only
/// answer, or trailers), if any.
pub(crate) fn status_code(headers: &HeaderMap) -> Option<Code> {
    let value = headers.get(GRPC_STATUS)?;
    let n: i32 = value.to_str().ok()?.parse().ok()?;
    Some(Code::from_i32(n))
}

/// The code named as in the gRPC spec (`"UNAVAILABLE"`); case-insensitive,
/// as grpc-java accepts it. Service config names codes this way.
#[cfg(any(test, feature = "service-config"))]
pub(crate) fn code_from_name(name: &str) -> Option<Code> {
    grpc_deadline::Code::from_name(name).map(Code::from)
}

/// The gRPC spec's name of `code` (`DEADLINE_EXCEEDED`).
pub(crate) fn code_name(code: Code) -> &'static str {
    grpc_deadline::Code::from(code).name()
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue};

    use super::{GRPC_STATUS, PUSHBACK, code_from_name, code_name, mark_do_not_retry};

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

    #[test]
    fn only_a_failure_without_a_pushback_of_its_own_is_marked() {
        let answer = |status: Option<&'static str>, pushback: Option<&'static str>| {
            let mut headers = HeaderMap::new();
            if let Some(status) = status {
                headers.insert(GRPC_STATUS, HeaderValue::from_static(status));
            }
            if let Some(pushback) = pushback {
                headers.insert(PUSHBACK, HeaderValue::from_static(pushback));
            }
            headers
        };
        let mut failed = answer(Some("14"), None);
        assert!(mark_do_not_retry(&mut failed));
        assert_eq!(
            failed.get(PUSHBACK).map(HeaderValue::as_bytes),
            Some(&b"-1"[..])
        );
        let mut paced = answer(Some("14"), Some("150"));
        assert!(
            !mark_do_not_retry(&mut paced),
            "the server's own pushback stands"
        );
        assert_eq!(
            paced.get(PUSHBACK).map(HeaderValue::as_bytes),
            Some(&b"150"[..])
        );
        for mut unmarked in [answer(Some("0"), None), answer(None, None)] {
            assert!(
                !mark_do_not_retry(&mut unmarked),
                "an OK or a streaming head"
            );
            assert!(!unmarked.contains_key(PUSHBACK));
        }
    }
}
