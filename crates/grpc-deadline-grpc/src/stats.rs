//! What an interceptor counts, and says as it counts: the calls it could
//! not follow as it should, and those it refused. One `Stats` is shared by
//! an interceptor, its clones and the streams of its calls; each count
//! that asks for a fix is warned about too, at most once every 10 s.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use grpc_deadline::rate_limited_warnings::WarnLimit;

/// What the interceptor counted since it was made: what it could not do,
/// and what it refused. Shared by every clone.
///
/// ```
/// let interceptor = grpc_deadline_grpc::DeadlineInterceptor::new();
/// assert_eq!(interceptor.stats().cancels_not_reset(), 0);
/// ```
#[derive(Default)]
pub struct Stats {
    unscoped: AtomicU64,
    refused_expired: AtomicU64,
    refused_cancelled: AtomicU64,
    cancels_not_reset: AtomicU64,
    left_late: AtomicU64,
    held_then_ended: AtomicU64,
    // What is counted is warned about too, at most once every 10 s each.
    unscoped_warnings: WarnLimit,
    reset_warnings: WarnLimit,
    late_warnings: WarnLimit,
    held_warnings: WarnLimit,
}

impl fmt::Debug for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stats")
            .field("unscoped", &self.unscoped())
            .field("refused_expired", &self.refused_expired())
            .field("refused_cancelled", &self.refused_cancelled())
            .field("cancels_not_reset", &self.cancels_not_reset())
            .field("left_late", &self.left_late())
            .field("held_then_ended", &self.held_then_ended())
            .finish_non_exhaustive()
    }
}

impl Stats {
    /// Calls made outside any scope (under [`Unscoped::Warn`](crate::Unscoped::Warn) or
    /// [`Unscoped::Deny`](crate::Unscoped::Deny)).
    pub fn unscoped(&self) -> u64 {
        self.unscoped.load(Ordering::Relaxed)
    }

    /// Calls failed locally with `DEADLINE_EXCEEDED`, sending nothing: the
    /// deadline had passed.
    pub fn refused_expired(&self) -> u64 {
        self.refused_expired.load(Ordering::Relaxed)
    }

    /// Calls failed locally with `CANCELLED`, sending nothing: the scope
    /// had ended.
    pub fn refused_cancelled(&self) -> u64 {
        self.refused_cancelled.load(Ordering::Relaxed)
    }

    /// Calls abandoned for a reason other than their deadline — their
    /// scope ended, or the caller dropped them (a `select!`, a `timeout`
    /// around the call) — whose stream the `grpc` crate's transport could
    /// not reset: before the server's response headers (0.9 keeps the
    /// stream on a task of its own until then), or with the request
    /// stream still open (held, so that it is not ended normally). The
    /// caller got its answer at once; the server was not told, and stops
    /// at the deadline it was sent, if any. Never counted under
    /// [`Abandoned::Drop`](crate::Abandoned::Drop).
    pub fn cancels_not_reset(&self) -> u64 {
        self.cancels_not_reset.load(Ordering::Relaxed)
    }

    /// Calls whose request left more than 10 ms (and a twentieth of their
    /// budget) after their `grpc-timeout` was written: the channel was
    /// still connecting, and the server was told that much too much.
    pub fn left_late(&self) -> u64 {
        self.left_late.load(Ordering::Relaxed)
    }

    /// Abandoned calls without a deadline whose open request stream was
    /// held 10 s and then let go: the `grpc` crate's transport then ended
    /// it normally, and the server may have read the part it received as
    /// a complete input. Give such calls a deadline (the server then ends
    /// them), or run them on a transport that resets what it drops.
    pub fn held_then_ended(&self) -> u64 {
        self.held_then_ended.load(Ordering::Relaxed)
    }
}

/// What a call noted: each counted, and warned about where a user has
/// something to fix (rate-limited).
impl Stats {
    /// A call found no scope; `refused` under `Unscoped::Deny`.
    pub(crate) fn note_unscoped(&self, method: &str, refused: bool) {
        self.unscoped.fetch_add(1, Ordering::Relaxed);
        if refused {
            tracing::warn!(method, "refused an outbound call made outside any scope");
            return;
        }
        if let Some(similar) = self.unscoped_warnings.admit() {
            tracing::warn!(
                method,
                similar_since_last_warning = similar,
                "outbound call through the grpc crate without a scope: nothing cancels it when \
                 the request that made it is over, and it carries no budget but the deadline of \
                 its own call options. It was probably started with tokio::spawn or on a thread \
                 of its own. Use grpc_deadline::spawn / grpc_deadline::JoinSet, or opt out \
                 explicitly with grpc_deadline::detach",
            );
        }
    }

    /// A call failed locally, sending nothing: its deadline had passed
    /// (`expired`), or its scope had ended.
    pub(crate) fn note_refused(&self, expired: bool) {
        let count = if expired {
            &self.refused_expired
        } else {
            &self.refused_cancelled
        };
        count.fetch_add(1, Ordering::Relaxed);
    }

    /// An abandoned call the transport could not reset.
    #[cold]
    pub(crate) fn note_cancel_not_reset(&self, method: &str) {
        self.cancels_not_reset.fetch_add(1, Ordering::Relaxed);
        if let Some(similar) = self.reset_warnings.admit() {
            tracing::warn!(
                method,
                similar_since_last_warning = similar,
                "a call made through the grpc crate was abandoned (its scope ended, or it was \
                 dropped) before the server's response headers or with its request stream open: \
                 grpc 0.9 keeps such a call's HTTP/2 stream on a task of its own until the \
                 server's response headers arrive, and ends a dropped request stream normally, so \
                 it is held, not reset. The server was not told; it stops at the deadline it was \
                 sent (grpc-timeout), if the call had one. TonicInvoke (feature tonic-transport) \
                 resets such calls",
            );
        }
    }

    /// An abandoned call without a deadline was held for `held` and then
    /// let go.
    #[cold]
    pub(crate) fn note_held_then_ended(&self, held: Duration) {
        self.held_then_ended.fetch_add(1, Ordering::Relaxed);
        if let Some(similar) = self.held_warnings.admit() {
            tracing::warn!(
                held_s = held.as_secs(),
                similar_since_last_warning = similar,
                "a call made through the grpc crate was abandoned before its upload ended and had \
                 no deadline: its request stream was held open {held:?} and then let go, and the \
                 crate's transport ended it normally, so the server may read the part it received \
                 as a complete input. Give such calls a deadline (the server then ends them), or \
                 use a transport that resets what it drops (Abandoned::Drop)",
            );
        }
    }

    /// A call left `late` after its `grpc-timeout` of `granted` was
    /// written.
    #[cold]
    pub(crate) fn note_left_late(&self, method: &str, granted: Duration, late: Duration) {
        self.left_late.fetch_add(1, Ordering::Relaxed);
        if let Some(similar) = self.late_warnings.admit() {
            tracing::warn!(
                method,
                late_ms = late.as_secs_f64() * 1e3,
                granted_ms = granted.as_secs_f64() * 1e3,
                similar_since_last_warning = similar,
                "a call made through the grpc crate left {late:?} after its grpc-timeout was \
                 written: the channel was connecting (or the process waited for a CPU), and the \
                 server was told that much more time than the caller has. Connect the channel \
                 before the first call that carries a deadline",
            );
        }
    }
}
