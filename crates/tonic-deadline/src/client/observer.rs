//! What the client layer tells whoever observes its calls. The layer calls
//! these and knows nothing of what is recorded: `observe` implements them
//! (metrics, spans) and hands the layer its observer through the builder
//! (`ClientDeadlineLayer::metrics`, `::trace_spans`).
//!
//! A layer given no observer makes none of these calls: it pays one `None`
//! check per call.

use std::any::Any;
use std::fmt;
use std::time::Duration;

use http::HeaderMap;
use tokio::time::Instant;

use crate::scope::Scope;

/// A call as it is handed to the connection.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(
    not(feature = "metrics"),
    allow(dead_code, reason = "spans read only the scope and the budget")
)]
pub(crate) struct Sent<'a> {
    pub(crate) path: &'a str,
    /// The layer's one clock reading for the call.
    pub(crate) now: Instant,
    /// The call's deadline: its scope's, or its own timeout's if sooner.
    pub(crate) deadline: Option<Instant>,
    /// The caller's scope.
    pub(crate) scope: Option<&'a Scope>,
    /// The budget written into its `grpc-timeout` (`None`: no header).
    pub(crate) granted: Option<Duration>,
}

/// Observes the outbound calls of a client layer.
pub(crate) trait Observer: Any + Send + Sync + fmt::Debug {
    /// The span of a call to `path`, opened before the layer decides
    /// anything about the call; `None` when spans are not kept.
    fn open(&self, path: &str) -> Option<tracing::Span>;

    /// The call failed locally with `code`, sending nothing.
    fn failed(&self, span: Option<tracing::Span>, code: tonic::Code);

    /// A call found no scope (allowed with a warning, or refused).
    fn unscoped(&self);

    /// A call was refused locally because its scope had expired.
    fn refused_expired(&self);

    /// A call's request left well after its `grpc-timeout` was written.
    fn left_late(&self);

    /// A call that asked to wait for ready was failed at once for want of
    /// a connection: the channel below does not wait.
    fn wait_for_ready_ignored(&self);

    /// The call is handed to the connection with `headers` (the observer
    /// may add its own: a trace context). What it returns follows the call
    /// to its end.
    fn sent(
        &self,
        call: &Sent<'_>,
        span: Option<tracing::Span>,
        headers: &mut HeaderMap,
    ) -> Box<dyn Observation>;
}

/// What an [`Observer`] keeps of one call while it runs.
pub(crate) trait Observation: Send + Sync + fmt::Debug {
    /// The call's span, entered while it is polled (a disabled span when
    /// none is kept).
    fn span(&self) -> &tracing::Span;

    /// The call ended with `code`; `answered_in` is the caller's scope when
    /// the status came from the server.
    fn settle(self: Box<Self>, code: tonic::Code, answered_in: Option<&Scope>);
}
