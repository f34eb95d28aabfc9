//! Deadlines as absolute instants on the machine's one monotonic clock.
//!
//! A tokio `Instant` means something only inside its own process. Every
//! process on one machine — whatever its network namespace — reads the same
//! `CLOCK_MONOTONIC` (only a time namespace would shift it), so a deadline
//! written as `CLOCK_MONOTONIC` nanoseconds can be compared with a deadline
//! reported by another process: that is how `experiment hosts` sees what a
//! hop gained over its parent.

use tokio::time::Instant;

/// `at` as `CLOCK_MONOTONIC` nanoseconds.
///
/// The conversion reads the monotonic clock and the runtime's clock at the
/// same moment and carries the offset over; the two reads are nanoseconds
/// apart.
pub fn monotonic_ns(at: Instant) -> i64 {
    // The wall clock is the point here: an absolute reading to compare with
    // other processes. tokio's Instant wraps std's, which has no epoch of its
    // own, so std's is read beside clock_gettime and the offset carried over.
    #[allow(
        clippy::disallowed_types,
        reason = "an absolute CLOCK_MONOTONIC reading, compared across processes"
    )]
    let now_std = std::time::Instant::now();
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let now_ns = i128::from(now.tv_sec) * 1_000_000_000 + i128::from(now.tv_nsec);
    let at_std = at.into_std();
    let offset = match at_std.checked_duration_since(now_std) {
        Some(ahead) => i128::try_from(ahead.as_nanos()).unwrap_or(i128::MAX),
        None => -i128::try_from(now_std.duration_since(at_std).as_nanos()).unwrap_or(i128::MAX),
    };
    i64::try_from(now_ns.saturating_add(offset)).unwrap_or(i64::MAX)
}

/// A deadline as `CLOCK_MONOTONIC` nanoseconds; -1 for none.
pub fn deadline_ns(deadline: Option<Instant>) -> i64 {
    deadline.map_or(-1, monotonic_ns)
}

/// The difference `later - earlier` of two monotonic readings, in
/// milliseconds (negative when `later` is earlier).
pub fn diff_ms(later_ns: i64, earlier_ns: i64) -> f64 {
    (later_ns as f64 - earlier_ns as f64) / 1e6
}
