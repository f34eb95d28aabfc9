//! What the retry and hedging layer reports: gRPC's per-call retry metrics
//! (`grpc.client.call.retries`, `.hedges`, `.retry_delay`) and the counts
//! behind their decisions.
//!
//! The block has accessors of its own, which the retry and hedging tests
//! read. Registered in every [`Metrics`]; the layer itself (and what
//! reports into the block) comes with the `service-config` feature.

use super::histogram::Histogram;
#[cfg(feature = "service-config")]
use super::metrics::MethodLabel;
use super::metrics::Metrics;
#[cfg(feature = "service-config")]
use {
    crate::resilience::ResilienceLayer,
    crate::resilience::observer::{CallReport, Observer},
    std::sync::Arc,
};

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
    /// could not fit a useful attempt (the call answered with the last
    /// attempt's status, its message saying no further attempt fitted).
    pub fn attempts_refused_for_time(&self) -> u64 {
        self.inner.resilience.no_time_for_attempt.get()
    }

    /// Calls that stopped retrying because the server's
    /// `grpc-retry-pushback-ms` said so (negative or malformed).
    pub fn pushback_stops(&self) -> u64 {
        self.inner.resilience.pushback_stops.get()
    }

    /// Calls that failed with a status their policy retries once the layer
    /// had sent every attempt it would (attempts spent, pushback, throttle,
    /// no time left), answered with `grpc-retry-pushback-ms: -1` so that no
    /// hop above retries them again
    /// ([`ResilienceLayer::chain_budget`](crate::resilience::ResilienceLayer::chain_budget)).
    pub fn retries_spent(&self) -> u64 {
        self.inner.resilience.retries_spent.get()
    }

    /// Calls sent once without retries because their request body could not
    /// be replayed (a live stream, or more than the replay buffer holds).
    pub fn committed_unreplayable(&self) -> u64 {
        self.inner.resilience.committed_unreplayable.get()
    }
}

#[cfg(feature = "service-config")]
impl ResilienceLayer {
    /// Counts calls, attempts, retries, hedges, backoff and cancelled
    /// losers into `metrics`.
    ///
    /// ```
    /// use tonic_deadline::observe::Metrics;
    /// use tonic_deadline::resilience::ResilienceLayer;
    ///
    /// let metrics = Metrics::new();
    /// let layer = ResilienceLayer::from_service_config(r#"{"methodConfig": []}"#)?
    ///     .metrics(&metrics);
    /// # let _ = layer;
    /// # Ok::<(), tonic_deadline::service_config::ConfigError>(())
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics(self, metrics: &Metrics) -> Self {
        self.observed_by(Arc::new(metrics.clone()))
    }
}

/// The retry and hedging layer reports into the block.
#[cfg(feature = "service-config")]
impl Observer for Metrics {
    fn call_ended(&self, path: &str, report: CallReport) {
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

    fn hedge_losers(&self, n: u64) {
        self.inner.resilience.hedge_losers_cancelled.inc_by(n);
    }

    fn retry_throttled(&self) {
        self.inner.resilience.throttled.inc();
    }

    fn attempt_refused_for_time(&self) {
        self.inner.resilience.no_time_for_attempt.inc();
    }

    fn pushback_stop(&self) {
        self.inner.resilience.pushback_stops.inc();
    }

    fn retries_spent(&self) {
        self.inner.resilience.retries_spent.inc();
    }

    fn committed_unreplayable(&self) {
        self.inner.resilience.committed_unreplayable.inc();
    }
}
