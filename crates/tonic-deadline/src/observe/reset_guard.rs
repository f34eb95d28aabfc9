//! What a reset guard reports: the connections it closed for reset floods,
//! and servers of its builder that serve connections it never wrapped.

use std::sync::Arc;

use super::metrics::Metrics;
use crate::server::ResetGuard;
use crate::server::reset_guard::Observer;

impl ResetGuard {
    /// Reports into `metrics` the connections the guard closes for reset
    /// floods, the new connections it holds for their turn or closes unread, and a server of its builder serving connections it never
    /// wrapped.
    ///
    /// ```
    /// use tonic_deadline::observe::Metrics;
    /// use tonic_deadline::server::ResetGuard;
    /// let metrics = Metrics::new();
    /// let guard = ResetGuard::new().metrics(&metrics);
    /// # let _ = guard;
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics(self, metrics: &Metrics) -> Self {
        self.observed_by(Arc::new(metrics.clone()))
    }
}

impl Observer for Metrics {
    fn reset_flood_cut(&self) {
        self.flood_cut();
    }

    fn unguarded(&self) {
        self.unguarded_server();
    }

    fn connection_held(&self) {
        self.held_connection();
    }

    fn connection_refused(&self) {
        self.refused_connection();
    }
}
