//! The `tracing` spans of the layers: one per inbound call, one per
//! outbound call, one per piece of blocking work, with the budget as fields.
//!
//! The call spans are opt-in on the layer builders
//! ([`ServerDeadlineLayer::trace_spans`](crate::ServerDeadlineLayer::trace_spans),
//! [`ClientDeadlineLayer::trace_spans`](crate::ClientDeadlineLayer::trace_spans)):
//! even a span no subscriber wants costs a callsite check, entering and
//! moving it, a few hundred instructions a request in all. Every field is
//! declared [`Empty`] and filled in only when the
//! span is enabled, so a disabled span reads no clock and formats nothing.
//!
//! | span | field | meaning |
//! |---|---|---|
//! | `grpc.server` | `grpc_timeout_ms` | the `grpc-timeout` that arrived (empty: none) |
//! | | `budget_on_entry_ms` | the budget the handler got, after the layer's default and maximum (empty: none) |
//! | | `cap_applied` | `max_timeout` or `default_timeout` when one changed the budget |
//! | | `outcome` | the gRPC status answered |
//! | | `cause` | why the request's scope ended (`request completed`, `deadline exceeded`, …) |
//! | | `outlived_parent_deadline` | `true` when the answer completed after the caller's deadline |
//! | `http.server` | `deadline_header_ms` | the tightest accepted deadline header that arrived (empty: none) |
//! | | `budget_on_entry_ms`, `cap_applied`, `cause`, `outlived_parent_deadline` | as on `grpc.server` |
//! | | `http.response.status_code` | the HTTP status of the answer's head |
//! | | `outcome` | the gRPC status of that answer (the table on `Http` in `server`), or of why the layer ended it |
//! | `grpc.client` | `scope_remaining_ms` | what the caller's scope had left when the call was made |
//! | | `granted_ms` | the `grpc-timeout` written on the wire (empty: none) |
//! | | `cap_ms`, `cap_bound` | the nearest [`Scope::with_timeout`](crate::Scope::with_timeout) above the call that was tighter than its parent, and whether it still sets the call's deadline |
//! | | `reserve_ms`, `reserve_bound` | the same for [`Scope::reserve`](crate::Scope::reserve) |
//! | | `outcome` | the call's gRPC status (`OK`, `DEADLINE_EXCEEDED`, …) |
//! | `blocking work` | `outlived_parent_deadline`, `outlived_ms` | the work returned after its scope had ended, and how long after |
//!
//! Server and client spans also carry OpenTelemetry's `otel.name`,
//! `otel.kind` and `rpc.*` fields (`http.request.method`, `url.path` and
//! `http.response.status_code` on `http.server`). With the `opentelemetry` feature the
//! client layer writes a W3C `traceparent` from its call's span and the
//! server layer parents its span on the one it reads, so every hop is a
//! child span with an id of its own.

use std::time::Duration;

use http::HeaderMap;
use tokio::time::Instant;
use tracing::Span;
use tracing::field::Empty;

use crate::scope::{Cause, Scope};
use crate::wire::code_name;
use crate::wire::status_code;

/// A span that ends when it is dropped, not at its last poll.
///
/// `tracing-opentelemetry` takes a span's end time from its last exit;
/// a call ended by a timer (or a dropped handler) was last polled long
/// before. Entering once more as it drops makes the end time the end.
#[derive(Debug)]
pub(crate) struct Ending(Span);

impl Ending {
    pub(crate) fn new(span: Span) -> Self {
        Self(span)
    }
}

impl std::ops::Deref for Ending {
    type Target = Span;

    fn deref(&self) -> &Span {
        &self.0
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        if !self.0.is_disabled() {
            drop(self.0.enter());
        }
    }
}

/// Milliseconds with microsecond precision, as span fields carry them.
fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

/// The `rpc.service` and `rpc.method` of a gRPC path `/pkg.Service/Method`.
fn rpc_parts(path: &str) -> (&str, &str) {
    let path = path.strip_prefix('/').unwrap_or(path);
    path.split_once('/').unwrap_or((path, ""))
}

/// Records OpenTelemetry's name and `rpc.*` fields of a call to `path`.
fn record_rpc(span: &Span, path: &str) {
    let (service, method) = rpc_parts(path);
    span.record("otel.name", path.strip_prefix('/').unwrap_or(path));
    span.record("rpc.service", service);
    span.record("rpc.method", method);
}

/// The span of one inbound call, parented on the caller's span when the
/// request carries its trace context.
pub(crate) fn server(
    path: &str,
    headers: &HeaderMap,
    requested: Option<Duration>,
    budget: Option<Duration>,
) -> Span {
    let span = tracing::info_span!(
        "grpc.server",
        otel.name = Empty,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = Empty,
        rpc.method = Empty,
        grpc_timeout_ms = Empty,
        budget_on_entry_ms = Empty,
        cap_applied = Empty,
        outcome = Empty,
        cause = Empty,
        outlived_parent_deadline = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    record_rpc(&span, path);
    if let Some(requested) = requested {
        span.record("grpc_timeout_ms", ms(requested));
    }
    record_budget(&span, requested, budget);
    propagation::extract(&span, headers);
    span
}

/// Records the budget a server handler got, and which cap made it.
fn record_budget(span: &Span, requested: Option<Duration>, budget: Option<Duration>) {
    if let Some(budget) = budget {
        span.record("budget_on_entry_ms", ms(budget));
    }
    match (requested, budget) {
        (None, Some(_)) => {
            span.record("cap_applied", "default_timeout");
        }
        (Some(r), Some(b)) if b < r => {
            span.record("cap_applied", "max_timeout");
        }
        _ => {}
    }
}

/// The span of one inbound plain-HTTP request, parented on the caller's
/// span when the request carries its trace context.
pub(crate) fn http_server(
    method: &http::Method,
    path: &str,
    headers: &HeaderMap,
    requested: Option<Duration>,
    budget: Option<Duration>,
) -> Span {
    let span = tracing::info_span!(
        "http.server",
        otel.name = Empty,
        otel.kind = "server",
        http.request.method = Empty,
        url.path = Empty,
        http.response.status_code = Empty,
        deadline_header_ms = Empty,
        budget_on_entry_ms = Empty,
        cap_applied = Empty,
        outcome = Empty,
        cause = Empty,
        outlived_parent_deadline = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    // OpenTelemetry names a server span `{method} {route}`, or the method
    // alone where no route is known: a path would make one name per id.
    span.record("otel.name", method.as_str());
    span.record("http.request.method", method.as_str());
    span.record("url.path", path);
    if let Some(requested) = requested {
        span.record("deadline_header_ms", ms(requested));
    }
    record_budget(&span, requested, budget);
    propagation::extract(&span, headers);
    span
}

/// Records the status a plain-HTTP server answered with, and its gRPC
/// equivalent as `outcome`.
pub(crate) fn http_server_answered(span: &Span, status: http::StatusCode) {
    if span.is_disabled() {
        return;
    }
    span.record("http.response.status_code", status.as_u16());
    span.record("outcome", code_name(crate::status::code_for_http(status)));
}

/// Records the status a server answered with (from the headers or
/// trailers that carry `grpc-status`).
pub(crate) fn server_answered(span: &Span, headers: &HeaderMap) {
    if span.is_disabled() {
        return;
    }
    if let Some(code) = status_code(headers) {
        span.record("outcome", code_name(code));
    }
}

/// Records how the request's scope ended on its server span.
pub(crate) fn server_ended(span: &Span, scope: &Scope, cause: Cause) {
    if span.is_disabled() {
        return;
    }
    span.record("cause", tracing::field::display(cause));
    if cause != Cause::Completed {
        // The layer answered for the handler at its deadline, or nobody
        // was left to answer: the status is the cause's.
        span.record("outcome", cause.code().name());
    }
    // The timer answers one tick before the deadline: an answer completed
    // after it was not stopped, and the caller had already given up.
    let late = cause == Cause::Completed && scope.is_expired();
    span.record("outlived_parent_deadline", late);
}

/// The span of one outbound call; its parent is the current span.
pub(crate) fn client(path: &str) -> Span {
    let span = tracing::info_span!(
        "grpc.client",
        otel.name = Empty,
        otel.kind = "client",
        rpc.system = "grpc",
        rpc.service = Empty,
        rpc.method = Empty,
        scope_remaining_ms = Empty,
        granted_ms = Empty,
        cap_ms = Empty,
        cap_bound = Empty,
        reserve_ms = Empty,
        reserve_bound = Empty,
        outcome = Empty,
        outlived_parent_deadline = Empty,
    );
    if !span.is_disabled() {
        record_rpc(&span, path);
    }
    span
}

/// Records the budget of an outbound call and writes its trace context into
/// `headers`.
pub(crate) fn client_sent(
    span: &Span,
    scope: Option<&Scope>,
    granted: Option<Duration>,
    headers: &mut HeaderMap,
) {
    if span.is_disabled() {
        return;
    }
    if let Some(scope) = scope {
        if let Some(remaining) = scope.remaining() {
            span.record("scope_remaining_ms", ms(remaining));
        }
        let limits = scope.limits();
        if let Some((cap, bound)) = limits.cap {
            span.record("cap_ms", ms(cap));
            span.record("cap_bound", bound);
        }
        if let Some((reserve, bound)) = limits.reserve {
            span.record("reserve_ms", ms(reserve));
            span.record("reserve_bound", bound);
        }
    }
    if let Some(granted) = granted {
        span.record("granted_ms", ms(granted));
    }
    propagation::inject(span, headers);
}

/// Records how an outbound call ended: `outcome` is its status code name.
/// A call that got its answer after its scope had ended outlived it.
pub(crate) fn client_ended(span: &Span, code: tonic::Code, scope: Option<&Scope>, answered: bool) {
    if span.is_disabled() {
        return;
    }
    span.record("outcome", code_name(code));
    let late = answered && scope.is_some_and(Scope::is_ended);
    span.record("outlived_parent_deadline", late);
}

/// The span of blocking work run under `scope`; its parent is the current
/// span.
pub(crate) fn blocking() -> Span {
    tracing::info_span!(
        "blocking work",
        outlived_parent_deadline = Empty,
        outlived_ms = Empty,
    )
}

/// Records, as the work returns, whether it ran on after its scope ended
/// (and by how long past the deadline, when that is why it ended).
pub(crate) fn blocking_ended(span: &Span, scope: &Scope) {
    if span.is_disabled() {
        return;
    }
    let outlived = scope.is_ended();
    span.record("outlived_parent_deadline", outlived);
    if outlived && let Some(deadline) = scope.deadline() {
        span.record(
            "outlived_ms",
            ms(Instant::now().saturating_duration_since(deadline)),
        );
    }
}

#[cfg(feature = "opentelemetry")]
mod propagation {
    //! W3C trace context in HTTP/2 headers, through OpenTelemetry's own
    //! propagator: the `traceparent` written is the *call's* span, so the
    //! server's span is its child and has an id of its own.

    use http::{HeaderMap, HeaderName, HeaderValue};
    use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing::Span;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    struct Write<'a>(&'a mut HeaderMap);

    impl Injector for Write<'_> {
        fn set(&mut self, key: &str, value: String) {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(key.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                self.0.insert(name, value);
            }
        }
    }

    struct Read<'a>(&'a HeaderMap);

    impl Extractor for Read<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }

        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(HeaderName::as_str).collect()
        }
    }

    pub(super) fn inject(span: &Span, headers: &mut HeaderMap) {
        let cx = span.context();
        if cx.span().span_context().is_valid() {
            TraceContextPropagator::new().inject_context(&cx, &mut Write(headers));
        }
    }

    pub(super) fn extract(span: &Span, headers: &HeaderMap) {
        if !headers.contains_key("traceparent") {
            return;
        }
        let parent = TraceContextPropagator::new().extract(&Read(headers));
        if parent.span().span_context().is_valid() {
            // Fails only without an OpenTelemetry layer: nothing to parent.
            let _ = span.set_parent(parent);
        }
    }
}

#[cfg(not(feature = "opentelemetry"))]
mod propagation {
    use http::HeaderMap;
    use tracing::Span;

    pub(super) fn inject(_: &Span, _: &mut HeaderMap) {}

    pub(super) fn extract(_: &Span, _: &HeaderMap) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_parts_split_a_grpc_path() {
        assert_eq!(
            rpc_parts("/lab.v1.Route/GetRoute"),
            ("lab.v1.Route", "GetRoute")
        );
        assert_eq!(
            rpc_parts("odd"),
            ("odd", ""),
            "a path without a method must not panic"
        );
    }
}
