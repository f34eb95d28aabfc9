//! What the retry and hedging layers report: gRPC's per-call retry metrics
//! (`grpc.client.call.retries`, `.hedges`, `.retry_delay`) and the counts
//! behind their decisions.
//!
//! Kept apart from the other counters: the block has its own accessors,
//! which the retry and hedging tests read.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::{Registry, Unit};

use super::histogram::{COUNT_BOUNDS, DELAY_BOUNDS, Hist, Histogram};
use super::{HistFamily, MethodLabel, Metrics};

/// The retry and hedging block of [`Metrics`].
#[derive(Debug)]
pub(super) struct Resilience {
    calls: Counter,
    attempts: Counter,
    /// All methods together, for the accessors.
    retries: Hist,
    hedges: Hist,
    retry_delay: Hist,
    /// By `grpc_method`, as exposed.
    retries_by: HistFamily<MethodLabel>,
    hedges_by: HistFamily<MethodLabel>,
    retry_delay_by: HistFamily<MethodLabel>,
    hedge_losers_cancelled: Counter,
    throttled: Counter,
    no_time_for_attempt: Counter,
    pushback_stops: Counter,
    committed_unreplayable: Counter,
}

impl Resilience {
    /// The block, its series registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let this = Self {
            calls: Counter::default(),
            attempts: Counter::default(),
            retries: Hist::new(COUNT_BOUNDS),
            hedges: Hist::new(COUNT_BOUNDS),
            retry_delay: Hist::new(DELAY_BOUNDS),
            retries_by: HistFamily::new_with_constructor(|| Hist::new(COUNT_BOUNDS)),
            hedges_by: HistFamily::new_with_constructor(|| Hist::new(COUNT_BOUNDS)),
            retry_delay_by: HistFamily::new_with_constructor(|| Hist::new(DELAY_BOUNDS)),
            hedge_losers_cancelled: Counter::default(),
            throttled: Counter::default(),
            no_time_for_attempt: Counter::default(),
            pushback_stops: Counter::default(),
            committed_unreplayable: Counter::default(),
        };
        registry.register(
            "grpc_client_call_retries",
            "Retries per call, for calls that retried at least once",
            this.retries_by.clone(),
        );
        registry.register(
            "grpc_client_call_hedges",
            "Hedges (attempts after the first) per hedged call that sent any",
            this.hedges_by.clone(),
        );
        registry.register_with_unit(
            "grpc_client_call_retry_delay",
            "Time per retried call with no attempt in flight (backoff)",
            Unit::Seconds,
            this.retry_delay_by.clone(),
        );
        let counters = [
            (
                "tonic_deadline_resilient_calls",
                "Calls made through a retry or hedging layer, counted when they end",
                &this.calls,
            ),
            (
                "tonic_deadline_call_attempts",
                "Attempts sent by calls through a retry or hedging layer, first attempts included",
                &this.attempts,
            ),
            (
                "tonic_deadline_hedge_losers_cancelled",
                "Losing hedges reset once another attempt won",
                &this.hedge_losers_cancelled,
            ),
            (
                "tonic_deadline_retries_throttled",
                "Retries and hedges not sent because throttling or the retry budget said no",
                &this.throttled,
            ),
            (
                "tonic_deadline_attempts_refused_for_time",
                "Retries and hedges not sent because the deadline left no time for a useful attempt",
                &this.no_time_for_attempt,
            ),
            (
                "tonic_deadline_pushback_stops",
                "Calls that stopped retrying because the server's pushback said so",
                &this.pushback_stops,
            ),
            (
                "tonic_deadline_committed_unreplayable",
                "Calls sent once without retries because their request body could not be replayed",
                &this.committed_unreplayable,
            ),
        ];
        for (name, help, counter) in counters {
            registry.register(name, help, counter.clone());
        }
        this
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
        self.inner.resilience.calls.get()
    }

    /// Attempts those calls sent, first attempts included:
    /// `attempts / calls` is the load amplification.
    pub fn call_attempts(&self) -> u64 {
        self.inner.resilience.attempts.get()
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
        self.inner.resilience.hedge_losers_cancelled.get()
    }

    /// Retries and hedges not sent because throttling or the retry budget
    /// said no.
    pub fn retries_throttled(&self) -> u64 {
        self.inner.resilience.throttled.get()
    }

    /// Retries and hedges not sent because what was left of the deadline
    /// could not fit a useful attempt (answered `DEADLINE_EXCEEDED`).
    pub fn attempts_refused_for_time(&self) -> u64 {
        self.inner.resilience.no_time_for_attempt.get()
    }

    /// Calls that stopped retrying because the server's
    /// `grpc-retry-pushback-ms` said so (negative or malformed).
    pub fn pushback_stops(&self) -> u64 {
        self.inner.resilience.pushback_stops.get()
    }

    /// Calls sent once without retries because their request body could not
    /// be replayed (a live stream, or more than the replay buffer holds).
    pub fn committed_unreplayable(&self) -> u64 {
        self.inner.resilience.committed_unreplayable.get()
    }

    /// Reports a call to `path` through a retry or hedging layer as it
    /// ends.
    pub(crate) fn resilient_call(&self, path: &str, report: CallReport) {
        let r = &self.inner.resilience;
        r.calls.inc();
        r.attempts.inc_by(u64::from(report.attempts));
        let extra = report.attempts.saturating_sub(1);
        if extra == 0 {
            return;
        }
        // Only calls that sent more than one attempt look their method up.
        let label = MethodLabel {
            grpc_method: self.method(path).name.clone(),
        };
        if report.hedged {
            r.hedges.observe(f64::from(extra));
            r.hedges_by.get_or_create(&label).observe(f64::from(extra));
        } else {
            let delay = report.delay.as_secs_f64();
            r.retries.observe(f64::from(extra));
            r.retries_by.get_or_create(&label).observe(f64::from(extra));
            r.retry_delay.observe(delay);
            r.retry_delay_by.get_or_create(&label).observe(delay);
        }
    }

    pub(crate) fn hedge_losers(&self, n: u64) {
        self.inner.resilience.hedge_losers_cancelled.inc_by(n);
    }

    pub(crate) fn retry_throttled(&self) {
        self.inner.resilience.throttled.inc();
    }

    pub(crate) fn attempt_refused_for_time(&self) {
        self.inner.resilience.no_time_for_attempt.inc();
    }

    pub(crate) fn pushback_stop(&self) {
        self.inner.resilience.pushback_stops.inc();
    }

    pub(crate) fn committed_unreplayable_call(&self) {
        self.inner.resilience.committed_unreplayable.inc();
    }
}
