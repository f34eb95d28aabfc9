//! The rules a guard judges a connection by, and their defaults: when a
//! reset is early, how many early resets a connection may spend and what
//! earns them back, and how long a connection that floods again is held.
//! Fixed when a guard is built; every connection it wraps reads them.

use std::time::Duration;

/// The early resets a connection may spend, and hold back, by default:
/// what each connection of a flood that reconnects costs the server
/// (`experiment rapid-reset`: at 128, the honest client's median under
/// fast floods was 1.5 to 2.4 × plain tonic's; at 32, within 1.3 ×).
pub(crate) const ALLOWANCE: u32 = 32;

/// How soon after its HEADERS a reset counts as early: half tokio's timer
/// tick, the shortest timeout a Rust client gives up at without telling the
/// server (`tokio::time::timeout` of 1 ms fires no sooner than 1 ms after
/// the call).
pub(crate) const EARLY: Duration = Duration::from_micros(500);

/// How far before its deadline a reset may come and still be explained by
/// it: a client's HEADERS can wait in its own connection's queue while its
/// deadline runs, and reach the server together with the reset.
pub(crate) const DEADLINE_SLACK: Duration = Duration::from_millis(10);

/// How many early resets a second time gives back.
pub(crate) const REFILL_PER_SECOND: f64 = 100.0;

/// How long a connection that floods again, from an address cut off
/// lately, is held unread before it is cut off: a flood that reconnects
/// at once has one connection a second read per thread.
pub(crate) const HOLD: Duration = Duration::from_secs(1);

/// The rules of a guard: fixed when it is built.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    pub(crate) allowance: u32,
    pub(crate) early: Duration,
    pub(crate) deadline_slack: Duration,
    pub(crate) refill_per_second: f64,
    /// How long a connection that floods on probation is held before it
    /// is cut off (`None`: no probation, every connection alike).
    pub(crate) hold: Option<Duration>,
}

impl Default for Rules {
    /// The rules of the [crate docs](crate).
    fn default() -> Self {
        Self {
            allowance: ALLOWANCE,
            early: EARLY,
            deadline_slack: DEADLINE_SLACK,
            refill_per_second: REFILL_PER_SECOND,
            hold: Some(HOLD),
        }
    }
}
