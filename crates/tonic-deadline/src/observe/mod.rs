//! What the layers report: a handle they count into.
//!
//! Nothing here is process-global. A [`Metrics`] is a handle: give the same
//! one to the layers whose counts belong together, read it where you export
//! them. Tests make their own.
//!
//! ```
//! use tonic_deadline::{ClientDeadlineLayer, observe::Metrics};
//! let metrics = Metrics::new();
//! let layer = ClientDeadlineLayer::new().metrics(&metrics);
//! # let _ = layer;
//! assert_eq!(metrics.unscoped_calls(), 0);
//! ```

mod resilience;
pub mod spans;

pub(crate) use resilience::CallReport;
pub use resilience::{COUNT_BOUNDS, DELAY_BOUNDS, Histogram};

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters the layers report to. Cheap to clone: clones share the counts.
#[derive(Clone, Default)]
pub struct Metrics {
    inner: Arc<Counters>,
}

#[derive(Default)]
struct Counters {
    unscoped_calls: AtomicU64,
    resilience: resilience::Resilience,
}

impl Metrics {
    /// A handle with every count at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Outbound calls that found no scope (see
    /// [`Unscoped`](crate::client::Unscoped)), allowed or refused.
    pub fn unscoped_calls(&self) -> u64 {
        self.inner.unscoped_calls.load(Ordering::Relaxed)
    }

    pub(crate) fn unscoped_call(&self) {
        self.inner.unscoped_calls.fetch_add(1, Ordering::Relaxed);
    }
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("unscoped_calls", &self.unscoped_calls())
            .field("resilient_calls", &self.resilient_calls())
            .field("call_attempts", &self.call_attempts())
            .field("hedge_losers_cancelled", &self.hedge_losers_cancelled())
            .finish_non_exhaustive()
    }
}
