//! The interceptor: the deadline and the scope of each call.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use grpc::client::interceptor::Intercept;
use grpc::client::{CallOptions, InvokeOnce};
use grpc::core::RequestHeaders;
use grpc::metadata::MetadataValue;
use grpc::{StatusCodeError, StatusError};
use grpc_deadline::timeout_header;
use grpc_deadline::warn_limit::WarnLimit;
use grpc_deadline::{Cause, Scope};
use tokio::time::Instant;

use crate::status;
use crate::streams::{
    Call, DeadlineRecvStream, DeadlineSendStream, HOLD_WITHOUT_DEADLINE, Watch, late,
};

/// The header a call's budget travels in.
const GRPC_TIMEOUT: &str = "grpc-timeout";

/// What the interceptor does with a call that finds no scope — neither a
/// current scope on its task ([`Scope::enter`], or a server layer's) nor
/// anything else: the core's policy, [`grpc_deadline::Unscoped`], as the
/// tonic client layer applies it. Under `Warn` and `Deny` the call is
/// counted in [`Stats::unscoped`].
///
/// ```
/// use grpc_deadline_grpc::{DeadlineInterceptor, Unscoped};
/// let strict = DeadlineInterceptor::new().unscoped(Unscoped::Deny);
/// # let _ = strict;
/// ```
pub use grpc_deadline::Unscoped;

/// The message of a call refused by [`Unscoped::Deny`].
const UNSCOPED_REFUSED: &str = "outbound call made outside any scope: run it under the request's \
     scope (grpc_deadline::spawn, grpc_deadline::JoinSet, Scope::enter) or leave the chain \
     explicitly with grpc_deadline::detach";

/// How much later than its header a call may leave before it is reported:
/// scheduling on a busy machine stays under it.
const LEFT_LATE: Duration = Duration::from_millis(10);

/// What the interceptor counted since it was made: what it could not do,
/// and what it refused. Shared by every clone.
///
/// ```
/// let interceptor = grpc_deadline_grpc::DeadlineInterceptor::new();
/// assert_eq!(interceptor.stats().cancels_not_reset(), 0);
/// ```
#[derive(Debug, Default)]
pub struct Stats {
    unscoped: AtomicU64,
    refused_expired: AtomicU64,
    refused_cancelled: AtomicU64,
    cancels_not_reset: AtomicU64,
    left_late: AtomicU64,
    held_then_ended: AtomicU64,
}

impl Stats {
    /// Calls made outside any scope (under [`Unscoped::Warn`] or
    /// [`Unscoped::Deny`]).
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
    /// [`Abandoned::Drop`].
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

/// What the interceptor does with the streams of a call its caller
/// abandoned before the answer's end (its scope ended, its deadline
/// passed, or the caller dropped it).
///
/// ```
/// use grpc_deadline_grpc::{Abandoned, DeadlineInterceptor};
/// // Over a transport whose dropped streams are reset (RST_STREAM).
/// let interceptor = DeadlineInterceptor::new().abandoned(Abandoned::Drop);
/// # let _ = interceptor;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Abandoned {
    /// Hold them until the server has ended the call (the default, for
    /// the `grpc` crate's own transport, which ends a dropped request
    /// stream normally — HTTP/2 END_STREAM — so that the server would read
    /// the part it received as a complete input). A call whose request
    /// stream is still open is held until a second past its deadline (the
    /// server ends it at the deadline it was sent), or, without a
    /// deadline, 10 s, then let go and counted in
    /// [`Stats::held_then_ended`]. Its send half, dropped before its last
    /// message, ends the request stream when the caller next reads the
    /// answer, as the crate's generated clients do to finish an upload.
    #[default]
    Hold,
    /// Drop them at once: for a transport that resets the stream of a
    /// call whose streams are dropped, and never ends it normally.
    Drop,
}

/// What an interceptor and every clone of it share.
pub(crate) struct Config {
    unscoped: Unscoped,
    abandoned: Abandoned,
    stats: Stats,
    unscoped_warnings: WarnLimit,
    reset_warnings: WarnLimit,
    late_warnings: WarnLimit,
    held_warnings: WarnLimit,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("unscoped", &self.unscoped)
            .field("abandoned", &self.abandoned)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Config {
    /// An abandoned call the transport could not reset: counted and
    /// warned about (rate-limited).
    #[cold]
    pub(crate) fn cancel_not_reset(&self, method: &str) {
        self.stats.cancels_not_reset.fetch_add(1, Ordering::Relaxed);
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

    /// An abandoned call without a deadline was held and then let go:
    /// counted and warned about (rate-limited).
    #[cold]
    pub(crate) fn held_then_ended(&self) {
        self.stats.held_then_ended.fetch_add(1, Ordering::Relaxed);
        if let Some(similar) = self.held_warnings.admit() {
            tracing::warn!(
                held_s = HOLD_WITHOUT_DEADLINE.as_secs(),
                similar_since_last_warning = similar,
                "a call made through the grpc crate was abandoned before its upload ended and had \
                 no deadline: its request stream was held open {HOLD_WITHOUT_DEADLINE:?} and then \
                 let go, and the crate's transport ended it normally, so the server may read the \
                 part it received as a complete input. Give such calls a deadline (the server \
                 then ends them), or use a transport that resets what it drops (Abandoned::Drop)",
            );
        }
    }

    #[cold]
    fn departed(&self, method: &str, granted: Duration, late: Duration) {
        self.stats.left_late.fetch_add(1, Ordering::Relaxed);
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

    fn unscoped_call(&self, method: &str) -> Result<(), StatusError> {
        if self.unscoped == Unscoped::Allow {
            return Ok(());
        }
        self.stats.unscoped.fetch_add(1, Ordering::Relaxed);
        if self.unscoped == Unscoped::Deny {
            tracing::warn!(method, "refused an outbound call made outside any scope");
            return Err(StatusError::new(
                StatusCodeError::FailedPrecondition,
                UNSCOPED_REFUSED,
            ));
        }
        if let Some(similar) = self.unscoped_warnings.admit() {
            tracing::warn!(
                method,
                similar_since_last_warning = similar,
                "outbound call through the grpc crate without a scope: nothing cancels it when the \
                 request that made it is over, and it carries no budget but the deadline of its own \
                 call options. It was probably started with tokio::spawn or on a thread of its own. \
                 Use grpc_deadline::spawn / grpc_deadline::JoinSet, or opt out explicitly with \
                 grpc_deadline::detach",
            );
        }
        Ok(())
    }
}

/// The deadline interceptor for the official `grpc` crate's client. See the
/// [crate docs](crate).
///
/// Attach it to a channel with the crate's `with_interceptor`; clones share
/// their settings and [`Stats`].
///
/// ```
/// use std::sync::Arc;
/// use grpc::client::{Channel, ChannelOptions, interceptor::InvokeExt};
/// use grpc::credentials::LocalChannelCredentials;
/// use grpc_deadline_grpc::DeadlineInterceptor;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let channel = Channel::new(
///     "dns:///127.0.0.1:50051",
///     Arc::new(LocalChannelCredentials::new()),
///     ChannelOptions::default(),
/// );
/// let interceptor = DeadlineInterceptor::new();
/// let calls = channel.with_interceptor(interceptor.clone());
/// # let _ = calls;
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct DeadlineInterceptor {
    config: Arc<Config>,
}

impl Default for DeadlineInterceptor {
    fn default() -> Self {
        Self::new()
    }
}

impl DeadlineInterceptor {
    /// An interceptor that reports calls made outside any scope
    /// ([`Unscoped::Warn`]).
    ///
    /// ```
    /// let interceptor = grpc_deadline_grpc::DeadlineInterceptor::new();
    /// assert_eq!(interceptor.stats().unscoped(), 0);
    /// ```
    pub fn new() -> Self {
        Self::with(Unscoped::default(), Abandoned::default())
    }

    fn with(unscoped: Unscoped, abandoned: Abandoned) -> Self {
        Self {
            config: Arc::new(Config {
                unscoped,
                abandoned,
                stats: Stats::default(),
                unscoped_warnings: WarnLimit::new(),
                reset_warnings: WarnLimit::new(),
                late_warnings: WarnLimit::new(),
                held_warnings: WarnLimit::new(),
            }),
        }
    }

    /// What to do with a call that finds no scope (see [`Unscoped`]).
    /// Configure before cloning: the setting and the [`Stats`] are shared
    /// by the clones made after it.
    ///
    /// ```
    /// use grpc_deadline_grpc::{DeadlineInterceptor, Unscoped};
    /// let interceptor = DeadlineInterceptor::new().unscoped(Unscoped::Allow);
    /// # let _ = interceptor;
    /// ```
    #[must_use]
    pub fn unscoped(self, unscoped: Unscoped) -> Self {
        Self::with(unscoped, self.config.abandoned)
    }

    /// What to do with the streams of a call its caller abandoned (see
    /// [`Abandoned`]; [`Abandoned::Hold`] by default, for the `grpc`
    /// crate's own transport). Configure before cloning, as
    /// [`unscoped`](Self::unscoped).
    ///
    /// ```
    /// use grpc_deadline_grpc::{Abandoned, DeadlineInterceptor};
    /// let interceptor = DeadlineInterceptor::new().abandoned(Abandoned::Hold);
    /// # let _ = interceptor;
    /// ```
    #[must_use]
    pub fn abandoned(self, abandoned: Abandoned) -> Self {
        Self::with(self.config.unscoped, abandoned)
    }

    /// What this interceptor (and its clones) counted.
    ///
    /// ```
    /// let interceptor = grpc_deadline_grpc::DeadlineInterceptor::new();
    /// let clone = interceptor.clone();
    /// assert_eq!(clone.stats().refused_expired(), interceptor.stats().refused_expired());
    /// ```
    pub fn stats(&self) -> &Stats {
        &self.config.stats
    }
}

impl<I> Intercept<I> for DeadlineInterceptor
where
    I: InvokeOnce,
    I::SendStream: Send,
    I::RecvStream: Send,
{
    type SendStream = DeadlineSendStream<I::SendStream>;
    type RecvStream = DeadlineRecvStream<I::RecvStream>;

    async fn intercept(
        &self,
        mut headers: RequestHeaders,
        mut options: CallOptions,
        next: I,
    ) -> (Self::SendStream, Self::RecvStream) {
        let config = &self.config;
        let method: Arc<str> = Arc::from(headers.method_name().as_str());
        let scope = Scope::try_current();
        let failed = |status: StatusError| {
            let watch = Watch {
                scope: None,
                deadline: None,
            };
            (
                DeadlineSendStream::new(None, watch, None),
                DeadlineRecvStream::failed(status, config.clone(), method.clone()),
            )
        };
        if scope.is_none()
            && let Err(refused) = config.unscoped_call(&method)
        {
            return failed(refused);
        }
        // Whatever the caller wrote by hand counts as a limit too.
        let requested = match headers.metadata().get(GRPC_TIMEOUT) {
            None => None,
            Some(value) => match timeout_header::decode(value.as_bytes()) {
                Ok(requested) => Some(requested),
                Err(malformed) => {
                    return failed(StatusError::new(
                        StatusCodeError::Internal,
                        malformed.to_string(),
                    ));
                }
            },
        };
        if let Some(scope) = &scope
            && scope.is_cancelled()
            && let Some(cause) = scope.cause()
        {
            config
                .stats
                .refused_cancelled
                .fetch_add(1, Ordering::Relaxed);
            return failed(status::ended(cause, false));
        }
        // One clock read, as late as the interceptor can: the next step
        // hands the call to the channel.
        let now = Instant::now();
        let deadline = [
            scope.as_ref().and_then(Scope::deadline),
            options.deadline().map(from_std),
            requested.and_then(|t| now.checked_add(t)),
        ]
        .into_iter()
        .flatten()
        .min();
        let mut granted = None;
        match deadline {
            Some(deadline) => {
                let budget = deadline.saturating_duration_since(now);
                if budget.is_zero() {
                    config.stats.refused_expired.fetch_add(1, Ordering::Relaxed);
                    return failed(status::ended(Cause::DeadlineExceeded, false));
                }
                granted = Some(budget);
                let mut wire = [0; timeout_header::ENCODED_MAX];
                let len = timeout_header::encode_into(budget, &mut wire);
                // Digits and a unit letter are always a valid value.
                if let Ok(value) = MetadataValue::try_from(&wire[..len]) {
                    headers.metadata_mut().insert(GRPC_TIMEOUT, value);
                }
                // The crate does not act on it (0.9); a later one that does
                // agrees with the header.
                options.set_deadline(deadline.into_std());
            }
            None => {
                headers.metadata_mut().remove(GRPC_TIMEOUT);
            }
        }
        let note = crate::ledger::Note::new(scope.as_ref(), &method, granted, now);
        let watch = Watch { scope, deadline };
        // The channel may still be connecting: that wait is bounded too.
        // Until `invoke_once` returns, the call has not left.
        let mut timer = None;
        let invoked = {
            let invoke = next.invoke_once(headers, options);
            tokio::select! {
                biased;
                cause = watch.ended(&mut timer) => Err(cause),
                streams = invoke => Ok(streams),
            }
        };
        let (send, recv) = match invoked {
            Ok(streams) => streams,
            Err(cause) => {
                // It never left, and the request's ledger says so.
                if let (Some(note), Some(scope)) = (note, &watch.scope) {
                    note.ended(scope, cause.code(), None);
                }
                if cause == Cause::DeadlineExceeded {
                    config.stats.refused_expired.fetch_add(1, Ordering::Relaxed);
                } else {
                    config
                        .stats
                        .refused_cancelled
                        .fetch_add(1, Ordering::Relaxed);
                }
                return failed(status::ended(cause, false));
            }
        };
        if let Some(granted) = granted {
            let late = late(now);
            if late > LEFT_LATE && late > granted / 20 {
                config.departed(&method, granted, late);
            }
        }
        let call =
            (config.abandoned == Abandoned::Hold).then(|| Call::new(deadline, config.clone()));
        (
            DeadlineSendStream::new(Some(send), watch.clone(), call.clone()),
            DeadlineRecvStream::open(recv, watch, config.clone(), method, note, call),
        )
    }
}

/// A `CallOptions` deadline on tokio's clock (which a paused test clock
/// moves too).
#[allow(
    clippy::disallowed_types,
    reason = "the grpc crate's CallOptions speak std's Instant"
)]
pub(crate) fn from_std(deadline: std::time::Instant) -> Instant {
    Instant::from_std(deadline)
}
