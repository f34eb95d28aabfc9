//! The lab's clock readings: `CLOCK_MONOTONIC` in nanoseconds, as the
//! probes of other languages read it.

use std::time::Duration;

use deadline_lab::clock::{deadline_ns, diff_ms, monotonic_ns};
use tokio::time::Instant;

#[test]
fn monotonic_readings_keep_the_distance_between_instants() {
    let now = Instant::now();
    let later = now + Duration::from_millis(250);
    let gap = diff_ms(monotonic_ns(later), monotonic_ns(now));
    // Each conversion reads two clocks one after the other; a busy
    // machine can preempt the thread between them, so allow 1 ms.
    assert!(
        (gap - 250.0).abs() < 1.0,
        "two instants 250 ms apart must read 250 ms apart: {gap}"
    );
    assert!(
        diff_ms(
            monotonic_ns(now - Duration::from_millis(5)),
            monotonic_ns(now)
        ) < 0.0,
        "an earlier instant must read earlier"
    );
}

#[test]
fn a_reading_matches_clock_gettime_now() {
    let ours = monotonic_ns(Instant::now());
    let theirs = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let theirs = theirs.tv_sec * 1_000_000_000 + theirs.tv_nsec;
    assert!(
        (theirs - ours).abs() < 5_000_000,
        "now must read as CLOCK_MONOTONIC now: {ours} vs {theirs}"
    );
}

#[test]
fn no_deadline_reads_as_minus_one() {
    assert_eq!(deadline_ns(None), -1);
}
