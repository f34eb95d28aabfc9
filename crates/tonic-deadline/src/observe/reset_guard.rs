//! What a reset guard reports: the connections it closed for reset floods,
//! and servers of its builder that serve connections it never wrapped.

use super::metrics::Metrics;
use crate::server::reset_guard::Observer;

/// A `Metrics` handle counts what a [`ResetGuard`](crate::server::ResetGuard)
/// reports: the connections it closes for reset floods, the new
/// connections it holds for their turn or closes unread, and a server of
/// its builder serving connections it never wrapped.
///
/// ```
/// use tonic_deadline::observe::Metrics;
/// use tonic_deadline::server::ResetGuard;
/// let metrics = Metrics::new();
/// let guard = ResetGuard::new().observed_by(metrics.clone());
/// # let _ = guard;
/// ```
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
