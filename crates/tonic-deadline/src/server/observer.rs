//! What the server layer tells whoever observes its requests. The layer
//! calls these and knows nothing of what is recorded: `observe` implements
//! them (metrics, spans) and hands the layer its observer through the
//! builder (`ServerDeadlineLayer::metrics`, `::trace_spans`).
//!
//! A layer given no observer makes none of these calls: it pays one `None`
//! check per request.

use std::fmt;
use std::time::Duration;

use http::{HeaderMap, Method, StatusCode};
use tokio::time::Instant;

use crate::scope::{Attachment, Cause, Scope};

/// A request as it arrived, read once by the layer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrival<'a> {
    /// Plain HTTP: the answer's status is its HTTP status, the request is
    /// labelled by its path; gRPC otherwise.
    pub(crate) http: bool,
    pub(crate) method: &'a Method,
    pub(crate) path: &'a str,
    pub(crate) headers: &'a HeaderMap,
    /// The budget the request asked for (`None`: none it could read).
    pub(crate) requested: Option<Duration>,
    /// The budget the layer gave it, after its default and maximum.
    pub(crate) budget: Option<Duration>,
}

/// Observes the requests of a server layer, and the work done under their
/// scopes.
/// (As an [`Attachment`], it is told of the work under a request's scope
/// that outlives it.)
pub(crate) trait Observer: Attachment {
    /// A request whose deadline could not be read, answered with `code`
    /// before any handler ran.
    fn malformed(&self, arrival: &Arrival<'_>, code: tonic::Code);

    /// A request that arrived with no time left, answered `status`
    /// (`DEADLINE_EXCEEDED`) before any handler ran.
    fn expired(&self, arrival: &Arrival<'_>, status: StatusCode);

    /// A request handed to its handler. `now` is the layer's clock reading
    /// when it made one (a request with a deadline), so that both count
    /// from the same instant. What it returns follows the request to its
    /// end.
    fn arrived(&self, arrival: &Arrival<'_>, now: Option<Instant>) -> Box<dyn Observation>;
}

/// What an [`Observer`] keeps of one request while it runs.
pub(crate) trait Observation: Send + Sync + fmt::Debug {
    /// The request's span, entered while its handler and body are polled
    /// (a disabled span when none is kept).
    fn span(&self) -> &tracing::Span;

    /// Response headers or trailers went out (the first `grpc-status`
    /// seen is the answer's).
    fn saw_status(&mut self, headers: &HeaderMap);

    /// A plain-HTTP answer's head went out.
    fn saw_http_status(&mut self, status: StatusCode);

    /// The answer failed without a status (the handler's or its body's
    /// error).
    fn failed(&mut self);

    /// The request's scope ended with `cause`.
    fn ended(self: Box<Self>, scope: &Scope, cause: Cause);
}
