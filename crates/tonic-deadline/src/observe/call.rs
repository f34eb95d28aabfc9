//! One call's record, kept by the layers while it runs and reported once
//! when it ends.

use std::sync::Arc;

use http::HeaderMap;
use tokio::time::Instant;

use super::{Method, Metrics};
use crate::scope::Cause;

/// The `grpc_status` label of each code, as gRPC's metrics spell them.
const STATUS_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

pub(super) fn status_name(code: tonic::Code) -> &'static str {
    STATUS_NAMES
        .get(code as usize)
        .copied()
        .unwrap_or("UNKNOWN")
}

/// The `cause` labels of `tonic_deadline_scope_ended_total`.
pub(super) const CAUSE_LABELS: [&str; 6] = [
    "completed",
    "failed",
    "deadline_exceeded",
    "local_cap",
    "abandoned",
    "cancelled",
];

/// The `stage` labels of `tonic_deadline_refused_expired_total`.
pub(super) const STAGE_LABELS: [&str; 3] = ["arrival", "admission", "client"];

/// Where work was refused as already expired.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stage {
    /// The server layer: the request arrived with no budget left.
    Arrival,
    /// The admission layer: the scope had expired before a permit.
    Admission,
    /// The client layer: an outbound call whose scope had expired.
    Client,
}

impl Stage {
    pub(super) fn label(self) -> &'static str {
        match self {
            Stage::Arrival => STAGE_LABELS[0],
            Stage::Admission => STAGE_LABELS[1],
            Stage::Client => STAGE_LABELS[2],
        }
    }
}

/// The `grpc-status` in `headers` (response headers of a trailers-only
/// answer, or trailers), if any.
pub(crate) fn status_code(headers: &HeaderMap) -> Option<tonic::Code> {
    let value = headers.get("grpc-status")?;
    let n: i32 = value.to_str().ok()?.parse().ok()?;
    Some(tonic::Code::from_i32(n))
}

/// A server call under way: started, and reported when its scope ends.
#[derive(Debug)]
pub(crate) struct ServerCall {
    metrics: Metrics,
    method: Arc<Method>,
    start: Instant,
    /// The deadline is this server's own (its default or maximum), not
    /// the caller's.
    local_cap: bool,
    status: Option<tonic::Code>,
}

impl ServerCall {
    pub(crate) fn start(
        metrics: &Metrics,
        path: &str,
        start: Instant,
        requested: Option<std::time::Duration>,
        local_cap: bool,
    ) -> Self {
        let method = metrics.method(path);
        metrics.server_started(&method, requested);
        Self {
            metrics: metrics.clone(),
            method,
            start,
            local_cap,
            status: None,
        }
    }

    /// Records the status the answer carries (the first one seen wins).
    pub(crate) fn saw_status(&mut self, headers: &HeaderMap) {
        if self.status.is_none() {
            self.status = status_code(headers);
        }
    }

    /// The answer failed without a status (a handler or body error).
    pub(crate) fn failed(&mut self) {
        self.status.get_or_insert(tonic::Code::Unknown);
    }

    /// A call answered by the layer itself, before any handler ran.
    pub(crate) fn answered(self, code: tonic::Code) {
        self.metrics
            .server_ended(&self.method, code, self.start.elapsed());
    }

    /// The call's scope ended with `cause`.
    pub(crate) fn ended(self, cause: Cause) {
        let code = self.status.unwrap_or(match cause {
            Cause::Completed => tonic::Code::Ok,
            Cause::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            Cause::Abandoned | Cause::Cancelled => tonic::Code::Cancelled,
        });
        let label = match cause {
            Cause::Completed if code == tonic::Code::Ok => "completed",
            Cause::Completed => "failed",
            Cause::DeadlineExceeded if self.local_cap => "local_cap",
            Cause::DeadlineExceeded => "deadline_exceeded",
            Cause::Abandoned => "abandoned",
            Cause::Cancelled => "cancelled",
        };
        self.metrics.scope_ended(label);
        self.metrics
            .server_ended(&self.method, code, self.start.elapsed());
    }
}

/// An outbound call under way, reported once with its status (as an
/// attempt and as a call: the layer sees one attempt per call unless a
/// retry or hedging layer sits above it) by
/// [`settle`](ClientCall::settle), or as `CANCELLED` if it is dropped first
/// (the caller gave the call up).
#[derive(Debug)]
pub(crate) struct ClientCall {
    metrics: Metrics,
    method: Arc<Method>,
    start: Instant,
    status: Option<tonic::Code>,
}

impl ClientCall {
    pub(crate) fn start(
        metrics: &Metrics,
        method: Arc<Method>,
        start: Instant,
        granted: Option<std::time::Duration>,
    ) -> Self {
        metrics.attempt_started(&method, granted);
        Self {
            metrics: metrics.clone(),
            method,
            start,
            status: None,
        }
    }

    /// Ends the attempt with `code`.
    pub(crate) fn settle(mut self, code: tonic::Code) {
        self.status = Some(code);
    }
}

impl Drop for ClientCall {
    fn drop(&mut self) {
        let code = self.status.unwrap_or(tonic::Code::Cancelled);
        self.metrics
            .attempt_ended(&self.method, code, self.start.elapsed());
    }
}
