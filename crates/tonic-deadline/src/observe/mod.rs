//! What the layers report: a metrics registry behind a handle (the
//! `metrics` feature), and `tracing` spans with the budget as fields.
//!
//! The layers know nothing of either: each takes an observer, and this
//! module is what the builders hand them — `.metrics(&metrics)` on
//! [`ServerDeadlineLayer`](crate::ServerDeadlineLayer),
//! [`ClientDeadlineLayer`](crate::ClientDeadlineLayer), `AdmissionLayer`
//! and `ResilienceLayer`, and `.trace_spans()` on the server and client
//! layers. A layer told neither records nothing and pays for nothing but a
//! `None` check.
//!
//! Nothing here is process-global. A `Metrics` is a handle: give the same
//! one to the layers whose series belong together, and serve
//! `Metrics::encode` where Prometheus scrapes. Tests make their own.
//!
//! The series are gRPC's own call metrics under their standard names
//! (`grpc_server_call_started_total`, `grpc_server_call_duration_seconds`,
//! `grpc_client_attempt_started_total`, `grpc_client_attempt_duration_seconds`,
//! `grpc_client_call_duration_seconds`, labelled `grpc_method` and
//! `grpc_status`; the retry metrics `grpc_client_call_retries`, `…_hedges`,
//! `…_retry_delay_seconds`, labelled `grpc_method`), and ours, named
//! `tonic_deadline_*`: where each request's budget went — how much it
//! brought, how long it queued, how much each outbound call was granted,
//! how its scope ended, what was refused as already expired, and what ran
//! on after its scope had ended.
//! The repository's `docs/metrics.md` lists them all, with their labels
//! and units; the [`spans`] module lists the spans and their fields.
//!
//! ```
//! use tonic_deadline::{ClientDeadlineLayer, ServerDeadlineLayer};
//!
//! // A `grpc.server` span per request, a `grpc.client` span per call.
//! let server = ServerDeadlineLayer::new().trace_spans();
//! let client = ClientDeadlineLayer::new().trace_spans();
//! # let _ = (server, client);
//! ```
//!
//! How it differs from the `metrics` facade and the OpenTelemetry SDK: both
//! report into a recorder or meter provider installed for the whole
//! process; here the registry is a value, so two servers in one process (or
//! two tests) keep their counts apart.

#[cfg(feature = "metrics")]
mod admission;
mod client;
#[cfg(feature = "metrics")]
mod histogram;
#[cfg(feature = "metrics")]
mod metrics;
#[cfg(all(feature = "metrics", feature = "reset-guard"))]
mod reset_guard;
#[cfg(feature = "metrics")]
mod resilience;
mod server;
pub mod spans;

#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use histogram::Histogram;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use metrics::{CONTENT_TYPE, Metrics, ScopeEnding, Stage};

use std::any::Any;
use std::sync::Arc;

/// What a server or client layer was told to report: into a metrics
/// handle, into spans, or both. The layer holds it as its observer (the
/// `Observer` of its module), made once by its builder and shared by every
/// service it builds.
#[derive(Debug, Clone, Default)]
struct Reporting {
    #[cfg(feature = "metrics")]
    metrics: Option<Metrics>,
    spans: bool,
}

impl Reporting {
    /// The reporting of a layer whose observer is `current`, changed by
    /// `set`: one builder step adds to what the others set.
    fn amend(current: Option<&dyn Any>, set: impl FnOnce(&mut Self)) -> Arc<Self> {
        let mut reporting = current
            .and_then(<dyn Any>::downcast_ref::<Self>)
            .cloned()
            .unwrap_or_default();
        set(&mut reporting);
        Arc::new(reporting)
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests;
