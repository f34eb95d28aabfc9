//! A fixed-bucket histogram of atomics, exposed through the registry and
//! readable back as a [`Histogram`].
//!
//! `prometheus-client`'s own histogram takes a lock per observation and
//! cannot be read back; this one is lock-free and can, through
//! [`Histogram`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Bucket bounds of the attempt-count histograms (`retries`, `hedges`).
pub(crate) const COUNT_BOUNDS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0];

/// Bucket bounds of `retry_delay`, in seconds (as gRPC's latency buckets).
pub(crate) const DELAY_BOUNDS: &[f64] = &[
    0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];

/// Bucket bounds of every latency and budget histogram, in seconds: the
/// latency buckets gRPC's OpenTelemetry metrics define.
pub(crate) const LATENCY_BOUNDS: &[f64] = &[
    0.0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005,
    0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13, 0.16,
    0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0,
];

/// A histogram read from [`Metrics`](super::Metrics): bucket counts (not
/// cumulative), their total and sum.
///
/// ```
/// use tonic_deadline::observe::Metrics;
/// let outlived = Metrics::new().outlived_by();
/// assert_eq!(outlived.count, 0);
/// assert_eq!(outlived.buckets.len(), outlived.bounds.len() + 1);
/// assert_eq!(outlived.mean(), 0.0);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
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

/// The histogram the registry holds; clones share the counts.
#[derive(Debug, Clone)]
pub(crate) struct Hist {
    inner: Arc<Atomic>,
}

#[derive(Debug)]
struct Atomic {
    bounds: &'static [f64],
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    /// The sum in millionths: seconds to the microsecond, counts exactly.
    sum_micro: AtomicU64,
}

impl Hist {
    pub(crate) fn new(bounds: &'static [f64]) -> Self {
        Self {
            inner: Arc::new(Atomic {
                bounds,
                buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
                count: AtomicU64::new(0),
                sum_micro: AtomicU64::new(0),
            }),
        }
    }

    pub(crate) fn latency() -> Self {
        Self::new(LATENCY_BOUNDS)
    }

    pub(crate) fn observe(&self, value: f64) {
        let a = &*self.inner;
        let i = a.bounds.partition_point(|b| *b < value);
        a.buckets[i].fetch_add(1, Ordering::Relaxed);
        a.count.fetch_add(1, Ordering::Relaxed);
        a.sum_micro
            .fetch_add((value.max(0.0) * 1e6).round() as u64, Ordering::Relaxed);
    }

    pub(crate) fn read(&self) -> Histogram {
        let a = &*self.inner;
        Histogram {
            bounds: a.bounds,
            buckets: a
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            count: a.count.load(Ordering::Relaxed),
            sum: a.sum_micro.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}

impl TypedMetric for Hist {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Hist {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let read = self.read();
        let buckets: Vec<(f64, u64)> = read
            .bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(read.buckets)
            .collect();
        encoder.encode_histogram::<NoLabelSet>(
            read.sum,
            read.count,
            &buckets,
            None::<&std::collections::HashMap<usize, Exemplar<NoLabelSet, f64>>>,
        )
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observation_on_a_bound_falls_in_that_bucket() {
        let h = Hist::new(&[1.0, 2.0]);
        h.observe(1.0);
        h.observe(1.5);
        h.observe(7.0);
        let read = h.read();
        assert_eq!(
            read.buckets,
            vec![1, 1, 1],
            "bounds are inclusive upper bounds"
        );
        assert_eq!(read.count, 3);
        assert!(
            (read.sum - 9.5).abs() < 1e-9,
            "the sum must add every value"
        );
    }
}
