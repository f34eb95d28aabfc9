//! What the admission layer reports: how long admitted requests queued,
//! the requests not admitted by reason, and those refused as already
//! expired.

use std::sync::Arc;

use super::metrics::{Metrics, Stage};
use crate::admission::observer::Observer;
use crate::admission::{AdmissionLayer, Permit, Reason, Refused};
use crate::scope::Cause;

impl AdmissionLayer {
    /// Reports into `metrics` how long each admitted request queued, the
    /// requests not admitted by reason, and those refused as already
    /// expired.
    ///
    /// ```
    /// use tonic_deadline::admission::{Admission, AdmissionLayer};
    /// use tonic_deadline::observe::Metrics;
    /// let metrics = Metrics::new();
    /// let layer = AdmissionLayer::new(Admission::new(8)).metrics(&metrics);
    /// # let _ = layer;
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics(self, metrics: &Metrics) -> Self {
        self.observed_by(Arc::new(metrics.clone()))
    }
}

impl Observer for Metrics {
    fn decided(&self, path: &str, acquired: &Result<Permit, Refused>) {
        match acquired {
            Ok(permit) => self.admitted(&self.method(path), permit.waited()),
            Err(refused) => {
                let reason = match refused.reason() {
                    Reason::Ended(Cause::DeadlineExceeded) => {
                        self.refused(Stage::Admission);
                        "deadline_exceeded"
                    }
                    Reason::Ended(_) => "cancelled",
                    Reason::WouldNotFinish => "would_not_finish",
                    Reason::QueueFull => "queue_full",
                    // The core's `Reason` may gain a reason in a later
                    // release (it is `non_exhaustive`).
                    _ => "other",
                };
                self.not_admitted(reason);
            }
        }
    }
}
