//! What the client layer reports: gRPC's attempt and call metrics, the
//! budget written into each call's `grpc-timeout`, calls refused locally
//! as already expired, calls that found no scope, requests that left late;
//! and a span per call.

use std::any::Any;

use http::HeaderMap;
use tracing::Span;

use super::Reporting;
use super::spans::{self, Ending};
use crate::ClientDeadlineLayer;
use crate::client::observer::{Observation, Observer, Sent};
use crate::scope::Scope;
#[cfg(feature = "metrics")]
use {
    super::metrics::{Method, Metrics, Stage},
    crate::scope::Cause,
    std::sync::Arc,
    tokio::time::Instant,
};

impl ClientDeadlineLayer {
    /// Reports every outbound call into `metrics`: gRPC's attempt and call
    /// metrics, the budget written into its `grpc-timeout` (or that it had
    /// none), calls refused locally as already expired, calls that found
    /// no scope, and watched calls whose request left late. Without it the
    /// layer records nothing.
    ///
    /// ```
    /// use tonic_deadline::{ClientDeadlineLayer, observe::Metrics};
    /// let metrics = Metrics::new();
    /// let layer = ClientDeadlineLayer::new().metrics(&metrics);
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics(self, metrics: &Metrics) -> Self {
        self.reporting(|r| r.metrics = Some(metrics.clone()))
    }

    /// Opens a `grpc.client` span per call, with the budget as fields (see
    /// [`observe::spans`](super::spans)); with the `opentelemetry` feature
    /// the call writes its span's `traceparent`. Off by default: a call
    /// then pays for no span at all.
    ///
    /// ```
    /// let layer = tonic_deadline::ClientDeadlineLayer::new().trace_spans();
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
    fn open(&self, path: &str) -> Option<Span> {
        self.spans.then(|| spans::client(path))
    }

    fn failed(&self, span: Option<Span>, code: tonic::Code) {
        if let Some(span) = span {
            spans::client_ended(&span, code, None, false);
        }
    }

    fn unscoped(&self) {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            metrics.unscoped_call();
        }
    }

    fn refused_expired(&self) {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            metrics.refused(Stage::Client);
        }
    }

    fn left_late(&self) {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            metrics.budget_left_late();
        }
    }

    fn wait_for_ready_ignored(&self) {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            metrics.wait_for_ready_ignored();
        }
    }

    fn sent(
        &self,
        call: &Sent<'_>,
        span: Option<Span>,
        headers: &mut HeaderMap,
    ) -> Box<dyn Observation> {
        #[cfg(feature = "metrics")]
        let record = self
            .metrics
            .as_ref()
            .map(|metrics| ClientCall::start(metrics, call));
        if let Some(span) = &span {
            spans::client_sent(span, call.scope, call.granted, headers);
        }
        Box::new(Report {
            #[cfg(feature = "metrics")]
            record,
            span: Ending::new(span.unwrap_or_else(Span::none)),
        })
    }
}

/// What is kept of one call while it runs, told once by the first status
/// the call sees: its metrics record (a layer given [`Metrics`]) and its
/// span (a layer with spans turned on; a disabled span otherwise).
#[derive(Debug)]
struct Report {
    #[cfg(feature = "metrics")]
    record: Option<ClientCall>,
    span: Ending,
}

impl Observation for Report {
    fn span(&self) -> &Span {
        &self.span
    }

    fn settle(self: Box<Self>, code: tonic::Code, answered_in: Option<&Scope>) {
        spans::client_ended(&self.span, code, answered_in, answered_in.is_some());
        #[cfg(feature = "metrics")]
        if let Some(mut record) = self.record {
            record.status = Some(code);
        }
    }
}

/// An outbound call under way, reported once with its status (as an
/// attempt and as a call: the layer sees one attempt per call unless a
/// retry or hedging layer sits above it) when it settles, or, if it is
/// dropped first (the caller gave the call up), with the status of why:
/// `DEADLINE_EXCEEDED` when the caller's scope ended at its deadline or the
/// call's own deadline had passed, `CANCELLED` otherwise.
#[cfg(feature = "metrics")]
#[derive(Debug)]
struct ClientCall {
    metrics: Metrics,
    method: Arc<Method>,
    start: Instant,
    deadline: Option<Instant>,
    /// The caller's scope: how it ended says why an unanswered call was
    /// dropped.
    scope: Option<Scope>,
    status: Option<tonic::Code>,
}

#[cfg(feature = "metrics")]
impl ClientCall {
    fn start(metrics: &Metrics, call: &Sent<'_>) -> Self {
        let method = metrics.method(call.path);
        metrics.attempt_started(&method, call.granted);
        Self {
            metrics: metrics.clone(),
            method,
            start: call.now,
            deadline: call.deadline,
            scope: call.scope.cloned(),
            status: None,
        }
    }
}

#[cfg(feature = "metrics")]
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
