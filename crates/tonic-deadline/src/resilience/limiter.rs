//! What stops retries and hedges when too many calls fail: gRPC's token
//! bucket (`retryThrottling`) or a retry budget.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::service_config::Throttling;

/// A retry budget: retries and hedges together may add at most `ratio` of
/// the retried and hedged calls made in the last `ttl`, plus
/// `min_per_second` — the alternative to gRPC's `retryThrottling`, after
/// Finagle's and Linkerd's budgets. Give it to
/// [`ResilienceLayer::budget`](super::ResilienceLayer::budget).
///
/// Where throttling reacts to failures (and stops retrying once half its
/// tokens are gone), a budget bounds the *extra load* directly: with a
/// ratio of 0.1, retries and hedges can never make more than about 1.1
/// attempts per call however the server fails.
///
/// ```
/// use std::time::Duration;
/// use tonic_deadline::resilience::RetryBudget;
/// let budget = RetryBudget::new(0.1, 5).ttl(Duration::from_secs(10));
/// # let _ = budget;
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryBudget {
    ratio: f64,
    min_per_second: u32,
    ttl: Duration,
}

impl RetryBudget {
    /// Retries may add `ratio` (clamped to 0..=1000) of the recent calls,
    /// plus `min_per_second` so that a quiet client can still retry. The
    /// window is 10 s (Finagle's default).
    pub fn new(ratio: f64, min_per_second: u32) -> Self {
        let ratio = if ratio.is_finite() {
            ratio.clamp(0.0, 1000.0)
        } else {
            0.0
        };
        Self {
            ratio,
            min_per_second,
            ttl: Duration::from_secs(10),
        }
    }

    /// How long a call counts towards the budget (1 s to 60 s).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl.clamp(Duration::from_secs(1), Duration::from_secs(60));
        self
    }
}

/// Slots the budget's window is divided into.
const SLOTS: usize = 10;

#[derive(Debug)]
pub(crate) enum Limiter {
    Unlimited,
    /// gRPC's per-server token bucket, in thousandths of a token.
    Throttle {
        tokens_milli: AtomicU64,
        max_milli: u64,
        ratio_milli: u64,
    },
    Budget {
        config: RetryBudget,
        window: Mutex<Window>,
    },
}

#[derive(Debug)]
pub(crate) struct Window {
    calls: [u64; SLOTS],
    retries: [u64; SLOTS],
    /// Start of the newest slot.
    slot_start: Instant,
    newest: usize,
}

impl Window {
    fn advance(&mut self, slot: Duration) {
        let now = Instant::now();
        let mut moved = 0;
        while now.duration_since(self.slot_start) >= slot && moved < SLOTS {
            self.newest = (self.newest + 1) % SLOTS;
            self.calls[self.newest] = 0;
            self.retries[self.newest] = 0;
            self.slot_start += slot;
            moved += 1;
        }
        if now.duration_since(self.slot_start) >= slot {
            // Idle for longer than the whole window.
            self.slot_start = now;
        }
    }
}

impl Limiter {
    pub(crate) fn throttle(t: Throttling) -> Self {
        let max_milli = u64::from(t.max_tokens) * 1000;
        Limiter::Throttle {
            tokens_milli: AtomicU64::new(max_milli),
            max_milli,
            ratio_milli: u64::from(t.token_ratio_milli),
        }
    }

    pub(crate) fn budget(config: &RetryBudget) -> Self {
        Limiter::Budget {
            config: *config,
            window: Mutex::new(Window {
                calls: [0; SLOTS],
                retries: [0; SLOTS],
                slot_start: Instant::now(),
                newest: 0,
            }),
        }
    }

    /// A call starts (it deposits into a budget).
    pub(crate) fn on_call(&self) {
        if let Limiter::Budget { config, window } = self
            && let Ok(mut w) = window.lock()
        {
            w.advance(config.ttl / SLOTS as u32);
            let i = w.newest;
            w.calls[i] += 1;
        }
    }

    /// An attempt ended: `failed` when its status is one the policy retries
    /// or hedges on (the throttle loses a token), a success otherwise (it
    /// gains `tokenRatio`).
    pub(crate) fn on_attempt(&self, failed: bool) {
        if let Limiter::Throttle {
            tokens_milli,
            max_milli,
            ratio_milli,
        } = self
        {
            let _ = tokens_milli.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(if failed {
                    t.saturating_sub(1000)
                } else {
                    (t + ratio_milli).min(*max_milli)
                })
            });
        }
    }

    /// Asks to send one more attempt of a call; a budget is charged for it.
    pub(crate) fn allow_retry(&self) -> bool {
        match self {
            Limiter::Unlimited => true,
            Limiter::Throttle {
                tokens_milli,
                max_milli,
                ..
            } => tokens_milli.load(Ordering::Relaxed) > max_milli / 2,
            Limiter::Budget { config, window } => {
                let Ok(mut w) = window.lock() else {
                    return false;
                };
                w.advance(config.ttl / SLOTS as u32);
                let calls: u64 = w.calls.iter().sum();
                let retries: u64 = w.retries.iter().sum();
                let reserve = f64::from(config.min_per_second) * config.ttl.as_secs_f64();
                let allowed = reserve + config.ratio * calls as f64;
                if (retries as f64) < allowed.floor() {
                    let i = w.newest;
                    w.retries[i] += 1;
                    true
                } else {
                    false
                }
            }
        }
    }
}
