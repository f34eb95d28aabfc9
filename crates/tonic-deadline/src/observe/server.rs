//! What the server layer reports: gRPC's server call metrics, the budget
//! each request brought, how its scope ended, what was refused on arrival,
//! what outlived its request; and a span per request.

use std::any::Any;
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use tokio::time::Instant;
use tracing::Span;

use super::Reporting;
use super::spans::{self, Ending};
use crate::scope::{Attachment, Cause, Scope};
use crate::server::observer::{Arrival, Observation, Observer};
use crate::server::{Protocol, ServerDeadlineLayer};
#[cfg(feature = "metrics")]
use {
    super::metrics::{Method, Metrics, ScopeEnding, Stage},
    crate::wire::status_code,
    std::sync::Arc,
};

impl<P: Protocol> ServerDeadlineLayer<P> {
    /// Reports every call into `metrics`: gRPC's server call metrics, the
    /// budget each request brought, how its scope ended, the requests
    /// refused on arrival as already expired, and the work that outlived
    /// its request. Without it the layer records nothing. A plain-HTTP
    /// layer reports under the same names, its requests labelled by path
    /// and its answers by the gRPC status of their HTTP status (see
    /// `server::Http`).
    ///
    /// ```
    /// use tonic_deadline::{ServerDeadlineLayer, observe::Metrics};
    /// let metrics = Metrics::new();
    /// let layer = ServerDeadlineLayer::new().metrics(&metrics);
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics(self, metrics: &Metrics) -> Self {
        self.reporting(|r| r.metrics = Some(metrics.clone()))
    }

    /// Opens a span per request — `grpc.server`, or `http.server` for a
    /// plain-HTTP layer — with the budget as fields (see
    /// [`observe::spans`](super::spans)); with the `opentelemetry` feature
    /// it is parented on the caller's `traceparent`. Off by default: a
    /// request then pays for no span at all.
    ///
    /// ```
    /// let layer = tonic_deadline::ServerDeadlineLayer::new().trace_spans();
    /// # let _ = layer;
    /// ```
    pub fn trace_spans(self) -> Self {
        self.reporting(|r| r.spans = true)
    }

    fn reporting(self, set: impl FnOnce(&mut Reporting)) -> Self {
        let current = self.observer().map(|o| o as &dyn Any);
        let reporting = Reporting::amend(current, set);
        self.observed_by(reporting)
    }
}

impl Observer for Reporting {
    fn malformed(&self, arrival: &Arrival<'_>, code: tonic::Code) {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            ServerCall::start(metrics, arrival, Instant::now()).answered(code);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (arrival, code);
    }

    fn expired(&self, arrival: &Arrival<'_>, status: StatusCode) {
        if self.spans {
            let span = span(arrival);
            if arrival.http {
                spans::http_server_answered(&span, status);
            }
            spans::server_ended(&span, &Scope::root(None), Cause::DeadlineExceeded);
        }
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            let call = ServerCall::start(metrics, arrival, Instant::now());
            metrics.refused(Stage::Arrival);
            call.answered(tonic::Code::DeadlineExceeded);
        }
    }

    fn arrived(&self, arrival: &Arrival<'_>, now: Option<Instant>) -> Box<dyn Observation> {
        #[cfg(feature = "metrics")]
        let record = self
            .metrics
            .as_ref()
            .map(|metrics| ServerCall::start(metrics, arrival, now.unwrap_or_else(Instant::now)));
        #[cfg(not(feature = "metrics"))]
        let _ = now;
        let span = if self.spans {
            span(arrival)
        } else {
            Span::none()
        };
        Box::new(Report {
            #[cfg(feature = "metrics")]
            record,
            span: Ending::new(span),
        })
    }
}

impl Attachment for Reporting {
    fn outlived(&self, _what: &'static str, by: Option<Duration>) {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            metrics.outlived_scope(by);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = by;
    }

    fn blocking_span(&self) -> Option<Span> {
        self.spans.then(spans::blocking)
    }

    fn blocking_returned(&self, span: &Span, scope: &Scope) {
        spans::blocking_ended(span, scope);
    }
}

/// The span of a request: `grpc.server`, or `http.server`.
fn span(arrival: &Arrival<'_>) -> Span {
    if arrival.http {
        spans::http_server(
            arrival.method,
            arrival.path,
            arrival.headers,
            arrival.requested,
            arrival.budget,
        )
    } else {
        spans::server(
            arrival.path,
            arrival.headers,
            arrival.requested,
            arrival.budget,
        )
    }
}

/// What is kept of one request while it runs: its metrics record (a layer
/// given [`Metrics`]) and its span (a layer with spans turned on; a
/// disabled span otherwise).
#[derive(Debug)]
struct Report {
    #[cfg(feature = "metrics")]
    record: Option<ServerCall>,
    span: Ending,
}

impl Observation for Report {
    fn span(&self) -> &Span {
        &self.span
    }

    fn saw_status(&mut self, headers: &HeaderMap) {
        #[cfg(feature = "metrics")]
        if let Some(record) = &mut self.record
            && record.status.is_none()
        {
            record.status = status_code(headers);
        }
        spans::server_answered(&self.span, headers);
    }

    fn saw_http_status(&mut self, status: StatusCode) {
        #[cfg(feature = "metrics")]
        if let Some(record) = &mut self.record {
            record.head = Some(crate::status::code_for_http(status));
        }
        spans::http_server_answered(&self.span, status);
    }

    fn failed(&mut self) {
        #[cfg(feature = "metrics")]
        if let Some(record) = &mut self.record {
            record.status.get_or_insert(tonic::Code::Unknown);
        }
    }

    fn ended(self: Box<Self>, scope: &Scope, cause: Cause) {
        spans::server_ended(&self.span, scope, cause);
        #[cfg(feature = "metrics")]
        if let Some(record) = self.record {
            record.ended(cause);
        }
    }
}

/// A server call under way: started, and reported when its scope ends.
#[cfg(feature = "metrics")]
#[derive(Debug)]
struct ServerCall {
    metrics: Metrics,
    method: Arc<Method>,
    start: Instant,
    /// The deadline is this server's own (its default or maximum), not
    /// the caller's.
    local_cap: bool,
    /// The status the answer carries (the first one seen wins).
    status: Option<tonic::Code>,
    /// The status of a plain-HTTP answer's head: it stands if the body
    /// completes, but a body that fails or is cut decides instead.
    head: Option<tonic::Code>,
}

#[cfg(feature = "metrics")]
impl ServerCall {
    /// Counts the call as started at `start`. A gRPC call is labelled by
    /// its method, a plain-HTTP request by its path as it arrived (slash
    /// and all: `/` is a label too, and none reads like a gRPC method).
    fn start(metrics: &Metrics, arrival: &Arrival<'_>, start: Instant) -> Self {
        let method = if arrival.http {
            metrics.named(arrival.path)
        } else {
            metrics.method(arrival.path)
        };
        metrics.server_started(&method, arrival.requested);
        Self {
            metrics: metrics.clone(),
            method,
            start,
            local_cap: arrival.budget != arrival.requested,
            status: None,
            head: None,
        }
    }

    /// A call answered by the layer itself, before any handler ran.
    fn answered(self, code: tonic::Code) {
        self.metrics
            .server_ended(&self.method, code, self.start.elapsed());
    }

    /// The call's scope ended with `cause`.
    fn ended(self, cause: Cause) {
        let status = match cause {
            Cause::Completed => self.status.or(self.head),
            _ => self.status,
        };
        let code = status.unwrap_or(match cause {
            Cause::Completed => tonic::Code::Ok,
            Cause::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            Cause::Abandoned | Cause::Cancelled => tonic::Code::Cancelled,
        });
        let ending = match cause {
            Cause::Completed if code == tonic::Code::Ok => ScopeEnding::Completed,
            Cause::Completed => ScopeEnding::Failed,
            Cause::DeadlineExceeded if self.local_cap => ScopeEnding::LocalCap,
            Cause::DeadlineExceeded => ScopeEnding::DeadlineExceeded,
            Cause::Abandoned => ScopeEnding::Abandoned,
            Cause::Cancelled => ScopeEnding::Cancelled,
        };
        self.metrics.scope_ended(ending);
        self.metrics
            .server_ended(&self.method, code, self.start.elapsed());
    }
}
