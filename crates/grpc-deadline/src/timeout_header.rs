//! The `grpc-timeout` header: encode and decode, as pure functions.
//!
//! The wire format is 1–8 ASCII digits followed by one unit letter
//! (`H` hours, `M` minutes, `S` seconds, `m` milliseconds, `u` microseconds,
//! `n` nanoseconds). Both directions follow grpc-go exactly, so a Rust hop and a
//! Go hop write and accept the same bytes.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use grpc_deadline::timeout_header::{decode, encode};
//!
//! // The finest unit whose value, rounded up, fits in 8 digits.
//! assert_eq!(encode(Duration::from_millis(50)), "50000000n");
//! assert_eq!(encode(Duration::from_secs(1)), "1000000u");
//! assert_eq!(encode(Duration::from_secs(2 * 3600)), "7200000m");
//! assert_eq!(encode(Duration::from_secs(100 * 3600)), "360000S");
//!
//! assert_eq!(decode(b"999978u"), Ok(Duration::from_micros(999_978)));
//! assert!(decode(b"1a").is_err());
//! ```

use std::fmt;
use std::time::Duration;

/// The largest value the header may carry: eight decimal digits.
const MAX_VALUE: u64 = 99_999_999;

/// The units from finest to coarsest, with their length in nanoseconds.
const UNITS: [(u8, u64); 6] = [
    (b'n', 1),
    (b'u', 1_000),
    (b'm', 1_000_000),
    (b'S', 1_000_000_000),
    (b'M', 60 * 1_000_000_000),
    (b'H', 3_600 * 1_000_000_000),
];

/// The longest duration a decoded header can mean: grpc-go clamps hours that
/// overflow its signed 64-bit nanosecond `Duration` to this value.
pub const MAX_DECODED: Duration = Duration::from_nanos(i64::MAX as u64);

/// Encodes a remaining budget as a `grpc-timeout` value.
///
/// Picks the finest unit whose value, rounded *up*, fits in eight digits, so
/// the receiver never sees less time than the sender had left. A zero budget
/// encodes as `0n` (already expired). Budgets beyond `99999999H` are clamped.
///
/// ```
/// use std::time::Duration;
/// use grpc_deadline::timeout_header::encode;
///
/// assert_eq!(encode(Duration::from_nanos(49_994_167)), "49994167n");
/// assert_eq!(encode(Duration::from_nanos(999_977_001)), "999978u");
/// assert_eq!(encode(Duration::ZERO), "0n");
/// ```
pub fn encode(budget: Duration) -> String {
    let mut buf = [0; ENCODED_MAX];
    let len = encode_into(budget, &mut buf);
    // Digits and a unit letter: always ASCII.
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

/// The longest encoded value: eight digits and a unit.
pub const ENCODED_MAX: usize = 9;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Writes the encoded `budget` into `buf`; returns its length. The one
/// encoder: [`encode`] and the client layer's header both use it, without
/// `format!` on the request path.
///
/// ```
/// use std::time::Duration;
/// use grpc_deadline::timeout_header::{ENCODED_MAX, encode_into};
///
/// let mut buf = [0; ENCODED_MAX];
/// let len = encode_into(Duration::from_millis(50), &mut buf);
/// assert_eq!(&buf[..len], b"50000000n");
/// ```
pub fn encode_into(budget: Duration, buf: &mut [u8; ENCODED_MAX]) -> usize {
    // In 64 bits: a division by a constant is a multiplication then, where
    // 128 bits call a division routine for each digit.
    let (value, unit) = match u64::try_from(budget.as_nanos()) {
        Ok(0) => (0, b'n'),
        // Each unit written out, so that each division is by a constant.
        Ok(nanos) if nanos <= MAX_VALUE => (nanos, b'n'),
        Ok(nanos) if nanos.div_ceil(1_000) <= MAX_VALUE => (nanos.div_ceil(1_000), b'u'),
        Ok(nanos) if nanos.div_ceil(1_000_000) <= MAX_VALUE => (nanos.div_ceil(1_000_000), b'm'),
        Ok(nanos) if nanos.div_ceil(NANOS_PER_SEC) <= MAX_VALUE => {
            (nanos.div_ceil(NANOS_PER_SEC), b'S')
        }
        Ok(nanos) if nanos.div_ceil(60 * NANOS_PER_SEC) <= MAX_VALUE => {
            (nanos.div_ceil(60 * NANOS_PER_SEC), b'M')
        }
        Ok(nanos) => (nanos.div_ceil(3_600 * NANOS_PER_SEC).min(MAX_VALUE), b'H'),
        // Past 64 bits of nanoseconds (584 years): hours, from the seconds.
        Err(_) => {
            let secs = budget
                .as_secs()
                .saturating_add(u64::from(budget.subsec_nanos() > 0));
            (secs.div_ceil(3_600).min(MAX_VALUE), b'H')
        }
    };
    // At most eight digits: `value <= MAX_VALUE`.
    let mut digits = [0u8; 8];
    let mut n = 0;
    let mut rest = value;
    loop {
        digits[n] = b'0' + (rest % 10) as u8;
        n += 1;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    for (i, d) in digits[..n].iter().rev().enumerate() {
        buf[i] = *d;
    }
    buf[n] = unit;
    n + 1
}

/// Decodes a `grpc-timeout` value with grpc-go's rules.
///
/// Accepted: 2–9 bytes, all but the last an ASCII digit (leading zeros
/// allowed; no sign, space or separator), the last one of `HMSmun`. A zero
/// value decodes to [`Duration::ZERO`], meaning already expired. Hours too
/// large for a signed 64-bit nanosecond count clamp to [`MAX_DECODED`].
///
/// # Errors
///
/// [`MalformedTimeout`] naming what is wrong with the value.
///
/// ```
/// use std::time::Duration;
/// use grpc_deadline::timeout_header::decode;
///
/// assert_eq!(decode(b"00000001S"), Ok(Duration::from_secs(1)));
/// assert_eq!(decode(b"0n"), Ok(Duration::ZERO));
/// assert!(decode(b"+1S").is_err());
/// assert!(decode(b"123456789S").is_err());
/// ```
pub fn decode(value: &[u8]) -> Result<Duration, MalformedTimeout> {
    // Built only on the error path: a valid header costs no allocation.
    let malformed = |reason| MalformedTimeout {
        reason,
        value: String::from_utf8_lossy(value).into_owned(),
    };
    let (&unit, digits) = value
        .split_last()
        .ok_or_else(|| malformed(Reason::TooShort))?;
    if digits.is_empty() {
        return Err(malformed(Reason::TooShort));
    }
    if value.len() > 9 {
        return Err(malformed(Reason::TooLong));
    }
    let unit_nanos = UNITS
        .iter()
        .find(|(u, _)| *u == unit)
        .map(|(_, len)| *len)
        .ok_or_else(|| malformed(Reason::UnknownUnit))?;
    // Eight digits at most (checked above) fit 64 bits.
    let mut count: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(malformed(Reason::NotADigit));
        }
        count = count * 10 + u64::from(d - b'0');
    }
    // Only hours can pass the maximum with eight digits; grpc-go clamps them.
    let nanos = count
        .checked_mul(unit_nanos)
        .map_or(MAX_DECODED, Duration::from_nanos);
    Ok(nanos.min(MAX_DECODED))
}

/// A `grpc-timeout` value that breaks the wire rules.
///
/// Its `Display` names the header and the offending value. A gRPC server
/// answers such a request [`INTERNAL`](crate::Code::Internal) (as gRPC's own
/// servers do), that text as the message: [`code`](MalformedTimeout::code).
/// With the `tonic` feature it converts into that `tonic::Status`; boxed,
/// it still answers `INTERNAL` through tonic's `Status::from_error`, with a
/// fixed message.
///
/// ```
/// use grpc_deadline::timeout_header::decode;
///
/// let malformed = decode(b"1a").unwrap_err();
/// assert_eq!(
///     malformed.to_string(),
///     "malformed grpc-timeout \"1a\": unit is not one of H M S m u n"
/// );
/// assert_eq!(malformed.code(), grpc_deadline::Code::Internal);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedTimeout {
    reason: Reason,
    value: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    TooShort,
    TooLong,
    UnknownUnit,
    NotADigit,
    NotAscii,
    Duplicated,
}

impl MalformedTimeout {
    /// The code a server answers a request carrying it with: `INTERNAL`.
    pub const fn code(&self) -> crate::Code {
        crate::Code::Internal
    }

    /// The header was sent more than once; the budget is ambiguous.
    fn duplicated() -> Self {
        Self {
            reason: Reason::Duplicated,
            value: String::new(),
        }
    }

    /// The header value is not visible ASCII.
    fn not_ascii(value: &[u8]) -> Self {
        Self {
            reason: Reason::NotAscii,
            value: String::from_utf8_lossy(value).into_owned(),
        }
    }
}

impl fmt::Display for MalformedTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.reason {
            Reason::TooShort => "needs at least one digit and a unit",
            Reason::TooLong => "has more than 8 digits",
            Reason::UnknownUnit => "unit is not one of H M S m u n",
            Reason::NotADigit => "value is not all ASCII digits",
            Reason::NotAscii => {
                "holds bytes other than visible ASCII (spaces, control or non-ASCII bytes)"
            }
            Reason::Duplicated => "was sent more than once",
        };
        if self.reason == Reason::Duplicated {
            write!(f, "malformed grpc-timeout: header {why}")
        } else {
            write!(f, "malformed grpc-timeout {:?}: {why}", self.value)
        }
    }
}

/// With the `tonic` feature, the status a boxed `MalformedTimeout` names
/// as its source, so tonic's `Status::from_error` answers `INTERNAL`, not
/// `UNKNOWN`.
impl std::error::Error for MalformedTimeout {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        #[cfg(feature = "tonic")]
        return Some(malformed_status());
        #[cfg(not(feature = "tonic"))]
        None
    }
}

/// The status a boxed [`MalformedTimeout`] names as its source.
#[cfg(feature = "tonic")]
fn malformed_status() -> &'static tonic::Status {
    static MALFORMED: std::sync::LazyLock<tonic::Status> =
        std::sync::LazyLock::new(|| tonic::Status::internal("malformed grpc-timeout"));
    &MALFORMED
}

/// `INTERNAL`, naming the header and the offending value (feature `tonic`).
///
/// ```
/// let malformed = grpc_deadline::timeout_header::decode(b"1x").unwrap_err();
/// assert_eq!(tonic::Status::from(malformed).code(), tonic::Code::Internal);
/// ```
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl From<MalformedTimeout> for tonic::Status {
    fn from(malformed: MalformedTimeout) -> tonic::Status {
        tonic::Status::new(malformed.code().into(), malformed.to_string())
    }
}

/// Reads the one `grpc-timeout` header of a request, if any.
///
/// `Ok(None)` means the caller set no deadline. Several values, non-ASCII
/// bytes and anything [`decode`] refuses are errors.
///
/// # Errors
///
/// [`MalformedTimeout`] naming what is wrong with the header.
///
/// ```
/// use std::time::Duration;
/// use grpc_deadline::timeout_header::{GRPC_TIMEOUT, from_headers};
///
/// let mut headers = http::HeaderMap::new();
/// assert_eq!(from_headers(&headers), Ok(None), "no deadline");
/// headers.insert(GRPC_TIMEOUT, http::HeaderValue::from_static("250m"));
/// assert_eq!(from_headers(&headers), Ok(Some(Duration::from_millis(250))));
/// headers.append(GRPC_TIMEOUT, http::HeaderValue::from_static("1S"));
/// assert!(from_headers(&headers).is_err(), "two budgets are ambiguous");
/// ```
pub fn from_headers(headers: &http::HeaderMap) -> Result<Option<Duration>, MalformedTimeout> {
    let mut values = headers.get_all(GRPC_TIMEOUT).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(MalformedTimeout::duplicated());
    }
    if !value.as_bytes().iter().all(u8::is_ascii_graphic) {
        return Err(MalformedTimeout::not_ascii(value.as_bytes()));
    }
    decode(value.as_bytes()).map(Some)
}

/// The header's name.
pub const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[cfg(feature = "tonic")]
    #[test]
    fn a_malformed_timeout_answers_internal_boxed_or_not() {
        let malformed = decode(b"1x").expect_err("x is no unit");
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

    const NS: u64 = 1;
    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    #[test]
    fn encode_picks_finest_unit_that_fits_eight_digits() {
        let table: &[(u64, &str)] = &[
            (0, "0n"),
            (1, "1n"),
            (99_999_999, "99999999n"),
            (100_000_000, "100000u"),
            (100_000_001, "100001u"),
            (49_994_167, "49994167n"),
            (999_977_001, "999978u"),
            (4_999_983_100, "4999984u"),
            (89_999_968_500, "89999969u"),
            (99_999_999 * US, "99999999u"),
            (99_999_999 * US + 1, "100000m"),
            (2 * 3600 * S, "7200000m"),
            (99_999_999 * MS + 1, "100000S"),
            (100 * 3600 * S, "360000S"),
            (99_999_999 * S + 1, "1666667M"),
        ];
        for &(nanos, want) in table {
            assert_eq!(
                encode(Duration::from_nanos(nanos)),
                want,
                "encoding {nanos}ns must match grpc-go"
            );
        }
        assert_eq!(
            encode(Duration::from_secs(99_999_999 * 60 + 1)),
            "1666667H",
            "beyond 99999999M the unit must be hours"
        );
        assert_eq!(
            encode(Duration::from_secs(1000 * 365 * 24 * 3600)),
            "8760000H",
            "a budget past 64 bits of nanoseconds (584 years) is encoded too"
        );
        assert_eq!(
            encode(Duration::MAX),
            "99999999H",
            "budgets beyond the format must clamp"
        );
    }

    #[test]
    fn decode_follows_grpc_go_table() {
        let ok: &[(&[u8], u64)] = &[
            (b"1n", NS),
            (b"1u", US),
            (b"1m", MS),
            (b"1S", S),
            (b"1M", 60 * S),
            (b"1H", 3600 * S),
            (b"0n", 0),
            (b"0H", 0),
            (b"00000001S", S),
            (b"99999999n", 99_999_999),
            (b"999978u", 999_978 * US),
            (b"2562047H", 2_562_047 * 3600 * S),
        ];
        for &(value, nanos) in ok {
            assert_eq!(
                decode(value),
                Ok(Duration::from_nanos(nanos)),
                "{:?} must decode",
                String::from_utf8_lossy(value)
            );
        }
        assert_eq!(
            decode(b"2562048H"),
            Ok(MAX_DECODED),
            "hours past i64 nanoseconds must clamp like grpc-go"
        );
        assert_eq!(decode(b"99999999H"), Ok(MAX_DECODED));

        let bad: &[&[u8]] = &[
            b"",
            b"1",
            b"n",
            b"123456789n",
            b"1a",
            b"1s",
            b"1h",
            b"+1S",
            b"-1S",
            b" 1S",
            b"1 S",
            b"1_0S",
            b"0x1S",
            b"1.5S",
            "１S".as_bytes(),
            b"1\xffS",
        ];
        for &value in bad {
            let err = decode(value).expect_err("malformed values must be refused");
            assert!(
                err.to_string().contains("malformed grpc-timeout"),
                "the message must name the header: {err}"
            );
        }
    }

    #[test]
    fn header_map_refuses_duplicates_and_non_ascii() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(from_headers(&headers), Ok(None), "absent means no deadline");
        headers.insert(GRPC_TIMEOUT, http::HeaderValue::from_static("1S"));
        assert_eq!(from_headers(&headers), Ok(Some(Duration::from_secs(1))));
        headers.append(GRPC_TIMEOUT, http::HeaderValue::from_static("2S"));
        assert!(
            from_headers(&headers).is_err(),
            "two values must be refused"
        );
        let mut headers = http::HeaderMap::new();
        headers.insert(
            GRPC_TIMEOUT,
            http::HeaderValue::from_bytes(b"1\xe9S").expect("opaque bytes are a valid header"),
        );
        assert!(from_headers(&headers).is_err(), "non-ASCII must be refused");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..16)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn decode_accepts_exactly_the_grammar(value in "[0-9]{0,10}[HMSmunxs ]?") {
            let bytes = value.as_bytes();
            let grammar = bytes.len() >= 2
                && bytes.len() <= 9
                && bytes[..bytes.len() - 1].iter().all(u8::is_ascii_digit)
                && b"HMSmun".contains(&bytes[bytes.len() - 1]);
            prop_assert_eq!(decode(bytes).is_ok(), grammar);
        }

        #[test]
        fn encode_round_trips_within_one_unit(nanos in 0u64..=(i64::MAX as u64)) {
            let budget = Duration::from_nanos(nanos);
            let wire = encode(budget);
            prop_assert!(wire.len() <= 9, "{} is longer than 8 digits + unit", wire);
            let back = decode(wire.as_bytes()).expect("our own encoding must decode");
            let unit = UNITS
                .iter()
                .find(|(u, _)| wire.as_bytes().ends_with(&[*u]))
                .map(|(_, len)| Duration::from_nanos(*len))
                .expect("a known unit");
            prop_assert!(back >= budget, "rounding must be up: {:?} < {:?}", back, budget);
            prop_assert!(back - budget < unit, "{:?} is off by a unit or more", wire);
        }
    }
}
