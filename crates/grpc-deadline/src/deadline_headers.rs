//! The HTTP headers that carry a deadline, as pure functions: which ones we
//! read, their formats, and which wins when several arrive.
//!
//! | header | sent by | format |
//! |---|---|---|
//! | `grpc-timeout` | gRPC-Web and Connect's gRPC-Web mode | 1–8 digits and a unit of `H M S m u n` ([`timeout_header`]) |
//! | `connect-timeout-ms` | Connect protocol (unary and streaming over HTTP) | 1–10 digits, milliseconds |
//! | `x-envoy-expected-rq-timeout-ms` | Envoy, the time it will wait for this request | 1–10 digits, milliseconds |
//! | `request-timeout` | any HTTP client; no standard defines it, so this is ours | seconds: 1–10 digits, optionally `.` and 1–9 more |
//!
//! **Precedence: the tightest wins.** Every accepted header present is read;
//! the budget is the smallest of them. Each names a deadline that someone in
//! front of us enforces, so none may be exceeded, and no header is trusted
//! over another. A header sent twice, or one that breaks its format, makes
//! the request malformed — the caller asked for a deadline we cannot know.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use grpc_deadline::deadline_headers::DeadlineHeader;
//!
//! let value = http::HeaderValue::from_static("250");
//! assert_eq!(DeadlineHeader::EnvoyExpectedTimeoutMs.decode(&value), Ok(Duration::from_millis(250)));
//! assert_eq!(DeadlineHeader::RequestTimeout.encode(Duration::from_millis(1500)), "1.500");
//! assert!(DeadlineHeader::ConnectTimeoutMs.decode(&http::HeaderValue::from_static("1.5")).is_err());
//! ```

use std::fmt;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::timeout_header;

/// One HTTP header that can carry a request's deadline.
///
/// ```
/// use std::time::Duration;
/// use grpc_deadline::deadline_headers::DeadlineHeader;
/// let envoy = DeadlineHeader::EnvoyExpectedTimeoutMs;
/// let value = envoy.encode(Duration::from_millis(250));
/// assert_eq!(value, "250");
/// assert_eq!(envoy.decode(&value), Ok(Duration::from_millis(250)));
/// assert_eq!(DeadlineHeader::GrpcTimeout.as_str(), "grpc-timeout");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeadlineHeader {
    /// `grpc-timeout`, as gRPC writes it (gRPC-Web, Connect in gRPC-Web mode).
    GrpcTimeout,
    /// `connect-timeout-ms`: the Connect protocol's timeout in milliseconds.
    ConnectTimeoutMs,
    /// `x-envoy-expected-rq-timeout-ms`: how long Envoy, in front of us,
    /// waits for this request.
    EnvoyExpectedTimeoutMs,
    /// `request-timeout`: seconds, with an optional fraction (`0.25`).
    RequestTimeout,
}

impl DeadlineHeader {
    /// Every header, in the order of the table above.
    pub const ALL: [DeadlineHeader; 4] = [
        DeadlineHeader::GrpcTimeout,
        DeadlineHeader::ConnectTimeoutMs,
        DeadlineHeader::EnvoyExpectedTimeoutMs,
        DeadlineHeader::RequestTimeout,
    ];

    /// The header's name, lowercase.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeadlineHeader::GrpcTimeout => "grpc-timeout",
            DeadlineHeader::ConnectTimeoutMs => "connect-timeout-ms",
            DeadlineHeader::EnvoyExpectedTimeoutMs => "x-envoy-expected-rq-timeout-ms",
            DeadlineHeader::RequestTimeout => "request-timeout",
        }
    }

    /// The header's name.
    pub fn name(self) -> HeaderName {
        HeaderName::from_static(self.as_str())
    }

    /// Decodes one value of this header.
    ///
    /// # Errors
    ///
    /// [`MalformedDeadline`] naming the header, the value and what is wrong.
    pub fn decode(self, value: &HeaderValue) -> Result<Duration, MalformedDeadline> {
        let bytes = value.as_bytes();
        let malformed = |why: &str| MalformedDeadline {
            header: self,
            message: format!(
                "malformed {} {:?}: {why}",
                self.as_str(),
                String::from_utf8_lossy(bytes)
            ),
        };
        match self {
            DeadlineHeader::GrpcTimeout => {
                if !bytes.iter().all(u8::is_ascii_graphic) {
                    return Err(malformed(
                        "holds bytes other than visible ASCII (spaces, control or non-ASCII bytes)",
                    ));
                }
                timeout_header::decode(bytes).map_err(|err| MalformedDeadline {
                    header: self,
                    message: err.to_string(),
                })
            }
            DeadlineHeader::ConnectTimeoutMs | DeadlineHeader::EnvoyExpectedTimeoutMs => {
                let ms = digits(bytes).ok_or_else(|| {
                    malformed("must be 1 to 10 ASCII digits (whole milliseconds)")
                })?;
                Ok(Duration::from_millis(ms))
            }
            DeadlineHeader::RequestTimeout => seconds(bytes).ok_or_else(|| {
                malformed("must be seconds: 1 to 10 digits, optionally '.' and 1 to 9 more")
            }),
        }
    }

    /// Encodes `budget` in this header's format, rounded *up* in its unit
    /// (as gRPC does), so the receiver never sees less than was left.
    pub fn encode(self, budget: Duration) -> HeaderValue {
        let text = match self {
            DeadlineHeader::GrpcTimeout => timeout_header::encode(budget),
            DeadlineHeader::ConnectTimeoutMs | DeadlineHeader::EnvoyExpectedTimeoutMs => {
                ceil_ms(budget).to_string()
            }
            DeadlineHeader::RequestTimeout => {
                let ms = ceil_ms(budget);
                format!("{}.{:03}", ms / 1000, ms % 1000)
            }
        };
        HeaderValue::try_from(text).expect("an encoded budget is ASCII digits")
    }
}

impl fmt::Display for DeadlineHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whole milliseconds, rounded up, capped at ten digits.
fn ceil_ms(budget: Duration) -> u128 {
    budget.as_nanos().div_ceil(1_000_000).min(9_999_999_999)
}

/// 1–10 ASCII digits.
fn digits(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > 10 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        bytes
            .iter()
            .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0')),
    )
}

/// `1*10DIGIT ["." 1*9DIGIT]` seconds.
fn seconds(bytes: &[u8]) -> Option<Duration> {
    let (whole, fraction) = match bytes.iter().position(|&b| b == b'.') {
        Some(dot) => (&bytes[..dot], Some(&bytes[dot + 1..])),
        None => (bytes, None),
    };
    let secs = digits(whole)?;
    let nanos = match fraction {
        None => 0,
        Some(f) if !f.is_empty() && f.len() <= 9 && f.iter().all(u8::is_ascii_digit) => {
            let n = f.iter().fold(0u32, |n, &d| n * 10 + u32::from(d - b'0'));
            n * 10u32.pow(9 - f.len() as u32)
        }
        Some(_) => return None,
    };
    Some(Duration::new(secs, nanos))
}

/// A deadline header that breaks its format, or one sent twice.
///
/// Its `Display` names the header and the value, ready for a `400` body.
/// As a gRPC status it is [`INTERNAL`](crate::Code::Internal)
/// ([`code`](MalformedDeadline::code)), what gRPC maps a `400` to and what
/// a malformed `grpc-timeout` gets. With the `tonic` feature it converts
/// into that `tonic::Status`, that text as the message; boxed (through
/// tonic's `Status::from_error`), a fixed message.
///
/// ```
/// use http::HeaderValue;
/// use grpc_deadline::deadline_headers::DeadlineHeader;
/// let err = DeadlineHeader::ConnectTimeoutMs
///     .decode(&HeaderValue::from_static("soon"))
///     .unwrap_err();
/// assert_eq!(err.header(), DeadlineHeader::ConnectTimeoutMs);
/// assert_eq!(err.code(), grpc_deadline::Code::Internal);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedDeadline {
    header: DeadlineHeader,
    message: String,
}

impl MalformedDeadline {
    /// The header that was malformed.
    pub fn header(&self) -> DeadlineHeader {
        self.header
    }

    /// The code a gRPC server answers it with: `INTERNAL`.
    pub const fn code(&self) -> crate::Code {
        crate::Code::Internal
    }
}

impl fmt::Display for MalformedDeadline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// With the `tonic` feature, the status a boxed `MalformedDeadline` names
/// as its source, so tonic's `Status::from_error` answers `INTERNAL`, not
/// `UNKNOWN`.
impl std::error::Error for MalformedDeadline {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        #[cfg(feature = "tonic")]
        return Some(malformed_status());
        #[cfg(not(feature = "tonic"))]
        None
    }
}

/// The status a boxed [`MalformedDeadline`] names as its source.
#[cfg(feature = "tonic")]
fn malformed_status() -> &'static tonic::Status {
    static MALFORMED: std::sync::LazyLock<tonic::Status> =
        std::sync::LazyLock::new(|| tonic::Status::internal("malformed deadline header"));
    &MALFORMED
}

/// `INTERNAL`, naming the header and the offending value (feature `tonic`).
///
/// ```
/// use grpc_deadline::deadline_headers::DeadlineHeader;
/// let malformed = DeadlineHeader::ConnectTimeoutMs
///     .decode(&http::HeaderValue::from_static("soon"))
///     .unwrap_err();
/// assert_eq!(tonic::Status::from(malformed).code(), tonic::Code::Internal);
/// ```
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl From<MalformedDeadline> for tonic::Status {
    fn from(malformed: MalformedDeadline) -> tonic::Status {
        tonic::Status::new(malformed.code().into(), malformed.to_string())
    }
}

/// The budget the `accepted` headers of a request ask for: the smallest one
/// present, `None` when none is.
///
/// # Errors
///
/// The first malformed or duplicated accepted header.
pub fn read(
    headers: &HeaderMap,
    accepted: &[DeadlineHeader],
) -> Result<Option<Duration>, MalformedDeadline> {
    let mut tightest: Option<Duration> = None;
    for &header in accepted {
        let mut values = headers.get_all(header.as_str()).iter();
        let Some(value) = values.next() else { continue };
        if values.next().is_some() {
            return Err(MalformedDeadline {
                header,
                message: format!("malformed {header}: header was sent more than once"),
            });
        }
        let budget = header.decode(value)?;
        tightest = Some(tightest.map_or(budget, |t| t.min(budget)));
    }
    Ok(tightest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn value(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).expect("test values are valid header values")
    }

    #[cfg(feature = "tonic")]
    #[test]
    fn a_malformed_deadline_header_answers_internal_boxed_or_not() {
        let malformed = DeadlineHeader::RequestTimeout
            .decode(&value("soon"))
            .expect_err("no digits");
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(malformed.clone());
        assert_eq!(
            tonic::Status::from(malformed).code(),
            tonic::Code::Internal,
            "converted, a malformed header must answer INTERNAL"
        );
        assert_eq!(
            tonic::Status::from_error(boxed).code(),
            tonic::Code::Internal,
            "boxed, its source must still answer INTERNAL, not UNKNOWN"
        );
    }

    #[test]
    fn each_header_decodes_its_own_format() {
        let table = [
            (
                DeadlineHeader::GrpcTimeout,
                "250m",
                Duration::from_millis(250),
            ),
            (
                DeadlineHeader::ConnectTimeoutMs,
                "250",
                Duration::from_millis(250),
            ),
            (
                DeadlineHeader::EnvoyExpectedTimeoutMs,
                "15000",
                Duration::from_secs(15),
            ),
            (
                DeadlineHeader::RequestTimeout,
                "0.25",
                Duration::from_millis(250),
            ),
            (
                DeadlineHeader::RequestTimeout,
                "30",
                Duration::from_secs(30),
            ),
            (
                DeadlineHeader::RequestTimeout,
                "1.000000001",
                Duration::new(1, 1),
            ),
            (DeadlineHeader::ConnectTimeoutMs, "0", Duration::ZERO),
        ];
        for (header, text, want) in table {
            assert_eq!(header.decode(&value(text)), Ok(want), "{header}: {text}");
        }
    }

    #[test]
    fn malformed_values_are_refused_with_a_message_naming_the_header() {
        let table = [
            (DeadlineHeader::GrpcTimeout, "1a"),
            (DeadlineHeader::GrpcTimeout, " 1S"),
            (DeadlineHeader::ConnectTimeoutMs, "1.5"),
            (DeadlineHeader::ConnectTimeoutMs, "-1"),
            (DeadlineHeader::ConnectTimeoutMs, "12345678901"),
            (DeadlineHeader::EnvoyExpectedTimeoutMs, ""),
            (DeadlineHeader::EnvoyExpectedTimeoutMs, "10ms"),
            (DeadlineHeader::RequestTimeout, "1."),
            (DeadlineHeader::RequestTimeout, ".5"),
            (DeadlineHeader::RequestTimeout, "1.0000000001"),
            (DeadlineHeader::RequestTimeout, "1s"),
            (DeadlineHeader::RequestTimeout, "+1"),
        ];
        for (header, text) in table {
            let err = header
                .decode(&value(text))
                .expect_err("a malformed value must be refused");
            assert_eq!(err.header(), header);
            assert!(
                err.to_string().contains(header.as_str()),
                "the message must name the header: {err}"
            );
        }
    }

    #[test]
    fn the_tightest_header_wins_and_duplicates_are_malformed() {
        let mut headers = HeaderMap::new();
        assert_eq!(read(&headers, &DeadlineHeader::ALL), Ok(None));
        headers.insert("grpc-timeout", value("5S"));
        headers.insert("x-envoy-expected-rq-timeout-ms", value("300"));
        headers.insert("request-timeout", value("2"));
        assert_eq!(
            read(&headers, &DeadlineHeader::ALL),
            Ok(Some(Duration::from_millis(300)))
        );
        assert_eq!(
            read(&headers, &[DeadlineHeader::GrpcTimeout]),
            Ok(Some(Duration::from_secs(5))),
            "headers not accepted are not read"
        );
        headers.append("request-timeout", value("1"));
        assert!(read(&headers, &DeadlineHeader::ALL).is_err());
    }

    #[test]
    fn encode_rounds_up_in_the_header_unit() {
        let budget = Duration::from_micros(249_001);
        assert_eq!(DeadlineHeader::ConnectTimeoutMs.encode(budget), "250");
        assert_eq!(DeadlineHeader::EnvoyExpectedTimeoutMs.encode(budget), "250");
        assert_eq!(DeadlineHeader::RequestTimeout.encode(budget), "0.250");
        assert_eq!(DeadlineHeader::GrpcTimeout.encode(budget), "249001u");
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..24)) {
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                for header in DeadlineHeader::ALL {
                    let _ = header.decode(&value);
                }
            }
        }

        #[test]
        fn encode_then_decode_never_loses_time(ms in 0u64..10_000_000_000) {
            let budget = Duration::from_millis(ms);
            for header in DeadlineHeader::ALL {
                let back = header.decode(&header.encode(budget)).expect("our encoding decodes");
                prop_assert!(back >= budget, "{}: {:?} < {:?}", header, back, budget);
            }
        }
    }
}
