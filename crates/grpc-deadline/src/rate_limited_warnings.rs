//! Warnings that may repeat at most so often, saying how many they held
//! back: a layer warns about what a user must fix (a chain that breaks, a
//! guard that cannot read its connections) once in a while, not once per
//! request.
//!
//! ```
//! use grpc_deadline::rate_limited_warnings::WarnLimit;
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let limit = WarnLimit::new();
//! assert_eq!(limit.admit(), Some(0), "the first warning is given");
//! assert_eq!(limit.admit(), None, "the next one, at once, is held back");
//! tokio::time::advance(std::time::Duration::from_secs(10)).await;
//! assert_eq!(limit.admit(), Some(1), "and counted in the next one given");
//! # }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// How often one warning may repeat.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// At most one warning every 10 s; counts what it held back.
#[derive(Debug)]
pub struct WarnLimit {
    since: Instant,
    /// Milliseconds after `since` before which no warning is given.
    next_ms: AtomicU64,
    held_back: AtomicU64,
}

impl Default for WarnLimit {
    fn default() -> Self {
        Self::new()
    }
}

impl WarnLimit {
    /// A limit whose first warning may be given at once.
    pub fn new() -> Self {
        Self {
            since: Instant::now(),
            next_ms: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }

    /// `Some(held back since the last warning)` when a warning may be given now.
    pub fn admit(&self) -> Option<u64> {
        let now = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_ms.load(Ordering::Relaxed);
        let every = u64::try_from(WARN_EVERY.as_millis()).unwrap_or(u64::MAX);
        if now >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now.saturating_add(every),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.held_back.swap(0, Ordering::Relaxed));
        }
        self.held_back.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn warnings_are_limited_and_count_what_they_held_back() {
        let limit = WarnLimit::new();
        assert_eq!(limit.admit(), Some(0), "the first call is warned about");
        assert_eq!(limit.admit(), None);
        assert_eq!(limit.admit(), None);
        tokio::time::advance(WARN_EVERY).await;
        assert_eq!(
            limit.admit(),
            Some(2),
            "the next warning must say how many calls it held back"
        );
        assert_eq!(limit.admit(), None);
    }
}
