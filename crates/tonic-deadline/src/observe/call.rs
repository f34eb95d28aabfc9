//! One call's record, kept by the layers while it runs and reported once
//! when it ends.

use std::sync::Arc;

use http::HeaderMap;
use tokio::time::Instant;

use super::spans::{self, Ending};
use super::{Method, Metrics};
use crate::scope::{Cause, Scope};
use crate::wire::status_code;

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
    /// The status of a plain-HTTP answer's head: it stands if the body
    /// completes, but a body that fails or is cut decides instead.
    head: Option<tonic::Code>,
}

impl ServerCall {
    pub(crate) fn start(
        metrics: &Metrics,
        method: Arc<Method>,
        start: Instant,
        requested: Option<std::time::Duration>,
        local_cap: bool,
    ) -> Self {
        metrics.server_started(&method, requested);
        Self {
            metrics: metrics.clone(),
            method,
            start,
            local_cap,
            status: None,
            head: None,
        }
    }

    /// Records the status of a plain-HTTP answer's head.
    pub(crate) fn saw_head(&mut self, code: tonic::Code) {
        self.head = Some(code);
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
        let status = match cause {
            Cause::Completed => self.status.or(self.head),
            _ => self.status,
        };
        let code = status.unwrap_or(match cause {
            Cause::Completed => tonic::Code::Ok,
            Cause::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            Cause::Abandoned | Cause::Cancelled => tonic::Code::Cancelled,
        });
        // Indices into `CAUSE_LABELS`.
        let label = match cause {
            Cause::Completed if code == tonic::Code::Ok => 0,
            Cause::Completed => 1,
            Cause::DeadlineExceeded if self.local_cap => 3,
            Cause::DeadlineExceeded => 2,
            Cause::Abandoned => 4,
            Cause::Cancelled => 5,
        };
        self.metrics.scope_ended(label);
        self.metrics
            .server_ended(&self.method, code, self.start.elapsed());
    }
}

/// An outbound call under way, reported once with its status (as an
/// attempt and as a call: the layer sees one attempt per call unless a
/// retry or hedging layer sits above it) by
/// [`settle`](ClientCall::settle), or, if it is dropped first (the caller
/// gave the call up), with the status of why: `DEADLINE_EXCEEDED` when the
/// caller's scope ended at its deadline or the call's own deadline had
/// passed, `CANCELLED` otherwise.
#[derive(Debug)]
pub(crate) struct ClientCall {
    metrics: Metrics,
    method: Arc<Method>,
    start: Instant,
    deadline: Option<Instant>,
    /// The caller's scope: how it ended says why an unanswered call was
    /// dropped.
    scope: Option<Scope>,
    status: Option<tonic::Code>,
}

impl ClientCall {
    pub(crate) fn start(
        metrics: &Metrics,
        method: Arc<Method>,
        start: Instant,
        deadline: Option<Instant>,
        scope: Option<Scope>,
        granted: Option<std::time::Duration>,
    ) -> Self {
        metrics.attempt_started(&method, granted);
        Self {
            metrics: metrics.clone(),
            method,
            start,
            deadline,
            scope,
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
        let now = Instant::now();
        // Given up unanswered: by a deadline (the server layer drops an
        // expired handler, and its calls with it), or by the caller.
        let code = self.status.unwrap_or_else(|| {
            let expired = self.scope.as_ref().and_then(Scope::cause)
                == Some(Cause::DeadlineExceeded)
                || self.deadline.is_some_and(|deadline| deadline <= now);
            if expired {
                tonic::Code::DeadlineExceeded
            } else {
                tonic::Code::Cancelled
            }
        });
        self.metrics.attempt_ended(
            &self.method,
            code,
            now.saturating_duration_since(self.start),
        );
    }
}

/// What one call reports while it runs: its metrics record (a layer given
/// [`Metrics`]) and its span (a layer with spans turned on). A layer makes
/// one only when either is on, so a layer with neither carries a null
/// pointer and reads no extra clock.
#[derive(Debug)]
pub(crate) struct Observed<R> {
    record: Option<R>,
    span: Ending,
}

/// An inbound call's report.
pub(crate) type ServerObserved = Observed<ServerCall>;

/// An outbound call's report, ended once, by the first status the call
/// sees.
pub(crate) type ClientObserved = Observed<ClientCall>;

impl<R> Observed<R> {
    /// `None` when there is nothing to report: no record, no span.
    #[inline]
    pub(crate) fn new(record: Option<R>, span: Option<tracing::Span>) -> Option<Box<Self>> {
        if record.is_none() && span.is_none() {
            return None;
        }
        Some(Box::new(Self {
            record,
            span: Ending::new(span.unwrap_or_else(tracing::Span::none)),
        }))
    }

    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }
}

impl Observed<ServerCall> {
    /// Records the status the answer carries (the first one seen wins).
    pub(crate) fn saw_status(&mut self, headers: &HeaderMap) {
        if let Some(report) = &mut self.record {
            report.saw_status(headers);
        }
        spans::server_answered(&self.span, headers);
    }

    /// Records the status of a plain-HTTP answer's head.
    pub(crate) fn saw_http_status(&mut self, status: http::StatusCode) {
        if let Some(report) = &mut self.record {
            report.saw_head(crate::status::code_for_http(status));
        }
        spans::http_server_answered(&self.span, status);
    }

    /// The answer failed without a status (a handler or body error).
    pub(crate) fn failed(&mut self) {
        if let Some(report) = &mut self.record {
            report.failed();
        }
    }

    /// The call's scope ended with `cause`: record it, close the span.
    pub(crate) fn ended(self, scope: &Scope, cause: Cause) {
        spans::server_ended(&self.span, scope, cause);
        if let Some(report) = self.record {
            report.ended(cause);
        }
    }
}

impl Observed<ClientCall> {
    /// Ends the call with `code`. `answered_in` is the caller's scope when
    /// the status came from the server: an answer that arrives after that
    /// scope ended outlived it.
    pub(crate) fn settle(self, code: tonic::Code, answered_in: Option<&Scope>) {
        spans::client_ended(&self.span, code, answered_in, answered_in.is_some());
        if let Some(record) = self.record {
            record.settle(code);
        }
    }
}
