//! What a guard reports, and to whom: without a registry of its own, it
//! tells an [`Observer`] the user gives it.

use std::fmt;

/// Told when a guard closes a connection, or refuses one it cannot read:
/// how a guard reports, without a registry of its own (tonic-deadline's
/// `observe::Metrics` implements it). Give it with
/// [`ResetGuard::observed_by`](crate::ResetGuard::observed_by).
///
/// ```
/// #[derive(Debug, Default)]
/// struct Floods(std::sync::atomic::AtomicU64);
/// impl tonic_deadline_guard::Observer for Floods {
///     fn reset_flood_cut(&self) {
///         self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///     }
///     fn unguarded(&self) {}
///     fn connection_held(&self) {}
///     fn connection_refused(&self) {}
/// }
/// let guard = tonic_deadline_guard::ResetGuard::new().observed_by(Floods::default());
/// # let _ = guard;
/// ```
pub trait Observer: Send + Sync + fmt::Debug {
    /// A connection was closed for its early resets.
    fn reset_flood_cut(&self);

    /// A connection the guard cannot read (TLS set on tonic's `Server`) was
    /// refused.
    fn unguarded(&self);

    /// A connection from an address cut off lately flooded again, and was
    /// held unread before being cut off.
    fn connection_held(&self);

    /// A connection from an address cut off lately flooded again, and was
    /// cut off at once: as many of its address's connections as may be
    /// held were held.
    fn connection_refused(&self);
}
