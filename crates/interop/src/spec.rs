//! What the gRPC spec says a server must make of `grpc-timeout`, written
//! from the spec's grammar rather than from the library's decoder: the
//! oracle of the property runs (`tests/fuzz.rs`) and of the coverage-guided
//! fuzz targets (`fuzz/`).
//!
//! ```
//! use std::time::Duration;
//! use interop::spec::{Verdict, timeout, verdict};
//! assert_eq!(timeout(b"100m"), Some(Duration::from_millis(100)));
//! assert_eq!(timeout(b"1a"), None);
//! assert_eq!(verdict(&[b"0n"]), Verdict::Expired);
//! assert_eq!(verdict(&[b"1S", b"2S"]), Verdict::Internal);
//! ```

use std::time::Duration;

use tonic_deadline::timeout_header::MAX_DECODED;

/// The duration a `grpc-timeout` value stands for, or `None` if it is
/// malformed: 1–8 ASCII digits and one unit of `H M S m u n`; hours past
/// i64 nanoseconds clamp to that, as grpc-go does.
pub fn timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let count: u128 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    let unit_nanos: u128 = match unit {
        b'n' => 1,
        b'u' => 1_000,
        b'm' => 1_000_000,
        b'S' => 1_000_000_000,
        b'M' => 60_000_000_000,
        b'H' => 3_600_000_000_000,
        _ => return None,
    };
    let nanos = (count * unit_nanos).min(MAX_DECODED.as_nanos());
    Some(Duration::from_nanos(u64::try_from(nanos).ok()?))
}

/// What a server must answer for a request carrying these `grpc-timeout`
/// values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// `INTERNAL` before any handler runs (malformed, or more than one).
    Internal,
    /// `DEADLINE_EXCEEDED` before any handler runs (a zero budget).
    Expired,
    /// The handler runs, with this deadline (or none).
    Runs(Option<Duration>),
}

/// The verdict for a request whose `grpc-timeout` headers are `values`.
pub fn verdict<V: AsRef<[u8]>>(values: &[V]) -> Verdict {
    match values {
        [] => Verdict::Runs(None),
        [one] => match timeout(one.as_ref()) {
            None => Verdict::Internal,
            Some(Duration::ZERO) => Verdict::Expired,
            Some(budget) => Verdict::Runs(Some(budget)),
        },
        _ => Verdict::Internal,
    }
}
