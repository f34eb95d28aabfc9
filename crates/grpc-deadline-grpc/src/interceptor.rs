//! The interceptor: the deadline and the scope of each call.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use grpc::client::interceptor::Intercept;
use grpc::client::{CallOptions, InvokeOnce};
use grpc::core::RequestHeaders;
use grpc::metadata::MetadataValue;
use grpc::{StatusCodeError, StatusError};
use grpc_deadline::timeout_header;
use grpc_deadline::{Cause, Scope};
use tokio::time::Instant;

use crate::stats::Stats;
use crate::status;
use crate::streams::{Call, DeadlineRecvStream, DeadlineSendStream, Watch, late};

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

/// What an interceptor and every clone of it share: its settings, and what
/// it counts (with its calls' streams).
pub(crate) struct Config {
    unscoped: Unscoped,
    abandoned: Abandoned,
    stats: Arc<Stats>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("unscoped", &self.unscoped)
            .field("abandoned", &self.abandoned)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Config {
    /// A call that found no scope: counted and reported, and refused under
    /// [`Unscoped::Deny`].
    fn unscoped_call(&self, method: &str) -> Result<(), StatusError> {
        if self.unscoped == Unscoped::Allow {
            return Ok(());
        }
        let refused = self.unscoped == Unscoped::Deny;
        self.stats.note_unscoped(method, refused);
        if refused {
            return Err(StatusError::new(
                StatusCodeError::FailedPrecondition,
                UNSCOPED_REFUSED,
            ));
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
                stats: Arc::default(),
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
                DeadlineRecvStream::failed(status, config.stats.clone(), method.clone()),
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
            config.stats.note_refused(false);
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
                    config.stats.note_refused(true);
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
                config.stats.note_refused(cause == Cause::DeadlineExceeded);
                return failed(status::ended(cause, false));
            }
        };
        if let Some(granted) = granted {
            let late = late(now);
            if late > LEFT_LATE && late > granted / 20 {
                config.stats.note_left_late(&method, granted, late);
            }
        }
        let call = (config.abandoned == Abandoned::Hold)
            .then(|| Call::new(deadline, config.stats.clone()));
        (
            DeadlineSendStream::new(Some(send), watch.clone(), call.clone()),
            DeadlineRecvStream::open(recv, watch, config.stats.clone(), method, note, call),
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
