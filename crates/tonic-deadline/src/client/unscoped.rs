//! Outbound calls that find no scope: allowed, reported, or refused.

use std::sync::Arc;
use std::time::Duration;

use super::observer::Observer;
use grpc_deadline::rate_limited_warnings::WarnLimit;

/// What the client layer does with an outbound call that finds no scope —
/// neither a current scope on its task nor one carried in the request: the
/// core's policy, [`grpc_deadline::Unscoped`], the same for every stack.
/// Under `Warn` and `Deny` the call is counted in the layer's
/// [`Metrics`](crate::observe::Metrics).
///
/// ```
/// use tonic_deadline::{ClientDeadlineLayer, client::Unscoped};
/// let strict = ClientDeadlineLayer::new().unscoped(Unscoped::Deny);
/// # let _ = strict;
/// ```
pub use grpc_deadline::Unscoped;

/// The fixed text of a refused unscoped call.
pub(crate) const UNSCOPED_REFUSED: &str = "outbound call made outside any scope: run it under the request's scope \
     (tonic_deadline::spawn, tonic_deadline::JoinSet, Scope::enter) or leave the chain explicitly \
     with tonic_deadline::detach";

/// The message of a call that asked to wait for ready and was failed at
/// once by a channel that does not wait.
pub(crate) const WAIT_FOR_READY_IGNORED: &str = "the call asked to wait for ready (waitForReady), \
     but the channel below ClientDeadlineLayer failed it at once when it could not connect (a \
     plain tonic Channel always fails fast): put the layer over \
     tonic_deadline::client::ReadyChannel, which waits, bounded by the deadline";

/// How much later than its header a request may leave before it is
/// reported: scheduling on a busy machine stays under it.
pub(crate) const LEFT_LATE: Duration = Duration::from_millis(10);

/// Whether a request told `granted` that left `late` after its
/// `grpc-timeout` was written told the server too much: more than
/// [`LEFT_LATE`] and more than a twentieth of the budget — a scheduling
/// delay on a loaded machine is neither.
pub(crate) fn left_late(granted: Duration, late: Duration) -> bool {
    late > LEFT_LATE && late > granted / 20
}

/// The configuration shared by a layer and every service it made.
#[derive(Debug)]
pub(crate) struct Config {
    pub(crate) transit_allowance: Duration,
    /// A measured round trip whose half is deducted too.
    #[cfg(feature = "channel")]
    pub(crate) transit_from: Option<super::RoundTrip>,
    pub(crate) unscoped: Unscoped,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    warnings: WarnLimit,
    late_warnings: WarnLimit,
    wait_warnings: WarnLimit,
}

impl Config {
    pub(crate) fn new(layer: &super::ClientDeadlineLayer) -> Self {
        Self {
            transit_allowance: layer.transit_allowance,
            #[cfg(feature = "channel")]
            transit_from: layer.transit_from.clone(),
            unscoped: layer.unscoped,
            observer: layer.observer.clone(),
            warnings: WarnLimit::new(),
            late_warnings: WarnLimit::new(),
            wait_warnings: WarnLimit::new(),
        }
    }

    /// A call's request, told `granted`, left `late` after its
    /// `grpc-timeout` was written, which [`left_late`] found too late:
    /// counted and warned about (rate-limited).
    #[cold]
    #[inline(never)]
    pub(crate) fn departed(&self, method: &str, granted: Duration, late: Duration) {
        if let Some(observer) = &self.observer {
            observer.left_late();
        }
        if let Some(similar) = self.late_warnings.admit() {
            tracing::warn!(
                method,
                late_ms = late.as_secs_f64() * 1e3,
                granted_ms = granted.as_secs_f64() * 1e3,
                similar_since_last_warning = similar,
                "an outbound call left {late:?} after its grpc-timeout was written: the server \
                 was told that much more time than the caller has. Something below \
                 ClientDeadlineLayer held the request (a plain tonic Channel connecting: use \
                 tonic_deadline::client::ReadyChannel; a queue or rate limit: put it above the \
                 layer), or the process waited that long for a CPU",
            );
        }
    }

    /// A call that asked to wait for ready failed to connect at once: the
    /// service below the layer does not wait (a plain tonic `Channel`).
    /// Counted and warned about (rate-limited).
    #[cold]
    #[inline(never)]
    pub(crate) fn wait_for_ready_ignored(&self, method: &str) {
        if let Some(observer) = &self.observer {
            observer.wait_for_ready_ignored();
        }
        if let Some(similar) = self.wait_warnings.admit() {
            tracing::warn!(
                method,
                similar_since_last_warning = similar,
                "{WAIT_FOR_READY_IGNORED}"
            );
        }
    }

    /// What to deduct from the budget on the wire for the trip.
    pub(crate) fn transit(&self) -> Duration {
        #[cfg(feature = "channel")]
        if let Some(one_way) = self
            .transit_from
            .as_ref()
            .and_then(super::RoundTrip::one_way)
        {
            return self.transit_allowance + one_way;
        }
        self.transit_allowance
    }

    /// Applies the policy to a call to `method` that found no scope.
    pub(crate) fn unscoped_call(&self, method: &str) -> Result<(), tonic::Status> {
        if self.unscoped == Unscoped::Allow {
            return Ok(());
        }
        if let Some(observer) = &self.observer {
            observer.unscoped();
        }
        if self.unscoped == Unscoped::Deny {
            tracing::warn!(method, "refused an outbound call made outside any scope");
            return Err(tonic::Status::failed_precondition(UNSCOPED_REFUSED));
        }
        if let Some(similar) = self.warnings.admit() {
            tracing::warn!(
                method,
                similar_since_last_warning = similar,
                "outbound call without a scope: it carries no deadline and nothing cancels it when \
                 the request that made it is over. It was probably started with tokio::spawn, a \
                 tokio JoinSet or spawn_blocking, or passed through a tower Buffer placed above \
                 ClientDeadlineLayer. Use tonic_deadline::spawn / tonic_deadline::JoinSet, put \
                 ClientDeadlineLayer above the Buffer (or capture the scope with \
                 tonic_deadline::client::capture_scope), or opt out explicitly with \
                 tonic_deadline::detach",
            );
        }
        Ok(())
    }
}

/// A tonic interceptor that puts the current scope into the request, so
/// that a [`ClientDeadlineLayer`](crate::ClientDeadlineLayer) further down
/// finds it even when it runs on another task.
///
/// Needed only when something between the call site and the layer moves the
/// call to another task — a tower `Buffer` above the layer, or a worker
/// pool. Give it to a generated client's `with_interceptor`, or as a
/// `tonic::service::InterceptorLayer` at the top of the stack:
///
/// ```
/// use tonic_deadline::{ClientDeadlineLayer, client::capture_scope};
/// # fn wrap(channel: tonic::transport::Channel) {
/// let stack = tower::ServiceBuilder::new()
///     .layer(tonic::service::InterceptorLayer::new(capture_scope)) // on the caller's task
///     .buffer::<http::Request<tonic::body::Body>>(16) // calls below run on the buffer's worker
///     .layer(ClientDeadlineLayer::new())
///     .service(channel);
/// # let _ = stack;
/// # }
/// ```
///
/// # Errors
///
/// Never; the signature is tonic's `Interceptor`.
pub fn capture_scope(mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
    if request.extensions().get::<crate::Scope>().is_none()
        && let Some(scope) = crate::Scope::try_current()
    {
        request.extensions_mut().insert(scope);
    }
    Ok(request)
}
