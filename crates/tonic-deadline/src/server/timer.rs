//! The server's deadline timer, registered only when it can matter.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};

/// Fires at `at`. Most handlers answer on their first poll, long before any
/// deadline; registering a timer for them would be pure overhead. So the
/// clock is read on every poll but the first (the layer read it when it
/// made the deadline, an instant before), and the timer is only created
/// and polled once the inner work is pending — the only case where a
/// wake-up at the deadline is needed.
#[derive(Debug)]
pub(crate) struct LazyTimer {
    at: Instant,
    sleep: Option<Pin<Box<Sleep>>>,
    /// No poll has asked yet, and the deadline was ahead of the reading it
    /// was made from.
    fresh: bool,
}

impl LazyTimer {
    /// A timer for `at`, made from the clock reading `now`.
    pub(crate) fn new(at: Instant, now: Instant) -> Self {
        Self {
            at,
            sleep: None,
            fresh: at > now,
        }
    }

    /// Whether the deadline has passed: asked of the registered timer when
    /// there is one (no clock read), else of the clock — but not the first
    /// time, which follows the reading the deadline was made from.
    pub(crate) fn passed(&mut self) -> bool {
        match &self.sleep {
            Some(sleep) => sleep.is_elapsed(),
            None if std::mem::take(&mut self.fresh) => false,
            None => self.at <= Instant::now(),
        }
    }

    /// Registers for a wake-up at the deadline; ready once it passed.
    pub(crate) fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let at = self.at;
        self.sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)))
            .as_mut()
            .poll(cx)
    }
}
