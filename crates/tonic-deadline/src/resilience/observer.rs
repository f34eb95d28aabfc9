//! What the retry and hedging layer tells whoever observes it. The layer
//! calls these and knows nothing of what is recorded: `observe`'s
//! `Metrics` implements them, handed over by `ResilienceLayer::metrics`.
//!
//! A layer given no observer makes none of these calls.

use std::any::Any;
use std::fmt;
use std::time::Duration;

/// What one call through the layer did, told once as it ends.
#[derive(Debug, Default, Clone, Copy)]
#[cfg_attr(
    not(feature = "metrics"),
    allow(dead_code, reason = "only `observe::Metrics` reads it")
)]
pub(crate) struct CallReport {
    pub(crate) attempts: u32,
    pub(crate) hedged: bool,
    /// Time with no attempt in flight (backoff sleeps).
    pub(crate) delay: Duration,
}

/// Observes the calls of a retry and hedging layer, and the decisions
/// behind their attempts.
pub(crate) trait Observer: Any + Send + Sync + fmt::Debug {
    /// A call to `path` ended (a call its caller dropped first is not told).
    fn call_ended(&self, path: &str, report: CallReport);

    /// A call was sent once, without retries: its request body could not
    /// be replayed.
    fn committed_unreplayable(&self);

    /// `n` losing hedges were reset once another attempt won.
    fn hedge_losers(&self, n: u64);

    /// A retry or hedge was not sent: throttling or the budget said no.
    fn retry_throttled(&self);

    /// A retry or hedge was not sent: the deadline left no time for a
    /// useful attempt.
    fn attempt_refused_for_time(&self);

    /// A call stopped retrying because the server's pushback said so.
    fn pushback_stop(&self);

    /// A call failed with a status its policy retries once no further
    /// attempt would be sent, and told its caller not to retry.
    fn retries_spent(&self);
}
