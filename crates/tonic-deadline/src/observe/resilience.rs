//! What the retry and hedging layers report: gRPC's per-call retry metrics
//! (`grpc.client.call.retries`, `.hedges`, `.retry_delay`) and the counts
//! behind their decisions.
//!
//! Kept apart from the other counters so that an exporter can take the
//! block as a whole.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::Metrics;

/// Bucket bounds of the attempt-count histograms (`retries`, `hedges`).
pub const COUNT_BOUNDS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0];

/// Bucket bounds of `retry_delay`, in seconds (as gRPC's latency buckets).
pub const DELAY_BOUNDS: &[f64] = &[
    0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];

/// A histogram read from [`Metrics`]: cumulative-free bucket counts.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Upper bounds (inclusive) of the buckets; one more bucket, `+Inf`,
    /// follows them.
    pub bounds: &'static [f64],
    /// Observations per bucket: `bounds.len() + 1` entries.
    pub buckets: Vec<u64>,
    /// Observations in all.
    pub count: u64,
    /// Sum of the observed values.
    pub sum: f64,
}

impl Histogram {
    /// The mean observation, or 0 with none.
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }
}

/// A fixed-bucket histogram of atomics; the sum is kept in millionths.
#[derive(Debug)]
pub(super) struct AtomicHistogram {
    bounds: &'static [f64],
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    sum_micro: AtomicU64,
}

impl AtomicHistogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micro: AtomicU64::new(0),
        }
    }

    fn observe(&self, value: f64) {
        let i = self
            .bounds
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(self.bounds.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micro
            .fetch_add((value * 1e6).round() as u64, Ordering::Relaxed);
    }

    fn read(&self) -> Histogram {
        Histogram {
            bounds: self.bounds,
            buckets: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            count: self.count.load(Ordering::Relaxed),
            sum: self.sum_micro.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}

/// The retry and hedging block of [`Metrics`].
#[derive(Debug)]
pub(super) struct Resilience {
    calls: AtomicU64,
    attempts: AtomicU64,
    retries: AtomicHistogram,
    hedges: AtomicHistogram,
    retry_delay: AtomicHistogram,
    hedge_losers_cancelled: AtomicU64,
    throttled: AtomicU64,
    no_time_for_attempt: AtomicU64,
    pushback_stops: AtomicU64,
    committed_unreplayable: AtomicU64,
}

impl Default for Resilience {
    fn default() -> Self {
        Self {
            calls: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            retries: AtomicHistogram::new(COUNT_BOUNDS),
            hedges: AtomicHistogram::new(COUNT_BOUNDS),
            retry_delay: AtomicHistogram::new(DELAY_BOUNDS),
            hedge_losers_cancelled: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
            no_time_for_attempt: AtomicU64::new(0),
            pushback_stops: AtomicU64::new(0),
            committed_unreplayable: AtomicU64::new(0),
        }
    }
}

/// What one call through a retry or hedging layer did, reported once when
/// it ends.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct CallReport {
    pub(crate) attempts: u32,
    pub(crate) hedged: bool,
    /// Time with no attempt in flight (backoff sleeps).
    pub(crate) delay: Duration,
}

impl Metrics {
    /// Calls made through a retry or hedging layer, counted when they end
    /// (a call whose caller dropped it first is not counted).
    pub fn resilient_calls(&self) -> u64 {
        self.inner.resilience.calls.load(Ordering::Relaxed)
    }

    /// Attempts those calls sent, first attempts included:
    /// `attempts / calls` is the load amplification.
    pub fn call_attempts(&self) -> u64 {
        self.inner.resilience.attempts.load(Ordering::Relaxed)
    }

    /// `grpc.client.call.retries`: retries per call, for calls that retried
    /// at least once (a call with none is not recorded, as gRPC specifies).
    pub fn call_retries(&self) -> Histogram {
        self.inner.resilience.retries.read()
    }

    /// `grpc.client.call.hedges`: hedges (attempts after the first) per
    /// hedged call that sent any.
    pub fn call_hedges(&self) -> Histogram {
        self.inner.resilience.hedges.read()
    }

    /// `grpc.client.call.retry_delay`: seconds per call spent with no
    /// attempt in flight (backoff), for calls that retried.
    pub fn call_retry_delay(&self) -> Histogram {
        self.inner.resilience.retry_delay.read()
    }

    /// Losing hedges reset (RST_STREAM CANCEL) once another attempt won.
    pub fn hedge_losers_cancelled(&self) -> u64 {
        self.inner
            .resilience
            .hedge_losers_cancelled
            .load(Ordering::Relaxed)
    }

    /// Retries and hedges not sent because throttling or the retry budget
    /// said no.
    pub fn retries_throttled(&self) -> u64 {
        self.inner.resilience.throttled.load(Ordering::Relaxed)
    }

    /// Retries and hedges not sent because what was left of the deadline
    /// could not fit a useful attempt (answered `DEADLINE_EXCEEDED`).
    pub fn attempts_refused_for_time(&self) -> u64 {
        self.inner
            .resilience
            .no_time_for_attempt
            .load(Ordering::Relaxed)
    }

    /// Calls that stopped retrying because the server's
    /// `grpc-retry-pushback-ms` said so (negative or malformed).
    pub fn pushback_stops(&self) -> u64 {
        self.inner.resilience.pushback_stops.load(Ordering::Relaxed)
    }

    /// Calls sent once without retries because their request body could not
    /// be replayed (a live stream, or more than the replay buffer holds).
    pub fn committed_unreplayable(&self) -> u64 {
        self.inner
            .resilience
            .committed_unreplayable
            .load(Ordering::Relaxed)
    }

    pub(crate) fn resilient_call(&self, report: CallReport) {
        let r = &self.inner.resilience;
        r.calls.fetch_add(1, Ordering::Relaxed);
        r.attempts
            .fetch_add(u64::from(report.attempts), Ordering::Relaxed);
        let extra = report.attempts.saturating_sub(1);
        if extra > 0 {
            if report.hedged {
                r.hedges.observe(f64::from(extra));
            } else {
                r.retries.observe(f64::from(extra));
                r.retry_delay.observe(report.delay.as_secs_f64());
            }
        }
    }

    pub(crate) fn hedge_losers(&self, n: u64) {
        self.inner
            .resilience
            .hedge_losers_cancelled
            .fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn retry_throttled(&self) {
        self.inner
            .resilience
            .throttled
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn attempt_refused_for_time(&self) {
        self.inner
            .resilience
            .no_time_for_attempt
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn pushback_stop(&self) {
        self.inner
            .resilience
            .pushback_stops
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn committed_unreplayable_call(&self) {
        self.inner
            .resilience
            .committed_unreplayable
            .fetch_add(1, Ordering::Relaxed);
    }
}
