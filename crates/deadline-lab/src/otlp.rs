//! Traces out of the lab: `--otlp-endpoint URL` sends every span of the
//! library's layers (and the lab's own) over OTLP/gRPC, and a [`Receiver`]
//! is a real OTLP trace collector endpoint, built on the collector protos,
//! that keeps what it is sent.
//!
//! Spans come from `tracing` (the layers' `grpc.server`, `grpc.client` and
//! `blocking work` spans), bridged by `tracing-opentelemetry`, batched by the
//! OpenTelemetry SDK and exported with `opentelemetry-otlp`'s tonic client.
//! The W3C trace context travels in each call's headers (the library's
//! `opentelemetry` feature), so the services of one system, in one process
//! or in many, make one trace.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};

/// How often batched spans leave the process: short, so that a trace is at
/// the collector a moment after its request ended.
const EXPORT_EVERY: Duration = Duration::from_millis(100);

/// The lab's exporters, installed with its log subscriber. Dropping it (or
/// [`shutdown`](Self::shutdown)) sends what is still batched.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    receiver: Option<Receiver>,
}

impl Telemetry {
    /// Installs the process's subscriber: logs to stderr as always, and,
    /// when `endpoint` is given or `own_receiver` asks for an in-process
    /// [`Receiver`], spans exported over OTLP/gRPC as `service`.
    ///
    /// Call it inside a tokio runtime (the exporter's channel needs one).
    ///
    /// # Errors
    ///
    /// An endpoint that is not a URL, or a receiver port that cannot be bound.
    pub fn install(
        service: &str,
        endpoint: Option<&str>,
        own_receiver: bool,
    ) -> anyhow::Result<Self> {
        let receiver = own_receiver.then(Receiver::start).transpose()?;
        let endpoints: Vec<String> = receiver
            .iter()
            .map(Receiver::url)
            .chain(endpoint.map(str::to_owned))
            .collect();
        if endpoints.is_empty() {
            crate::logs::install();
            return Ok(Self {
                provider: None,
                receiver,
            });
        }
        let provider = provider(service, &endpoints)?;
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("deadline-lab"))
            .with_filter(span_targets());
        crate::logs::install_with(Some(Box::new(layer)));
        Ok(Self {
            provider: Some(provider),
            receiver,
        })
    }

    /// The in-process receiver, when one was asked for.
    pub fn receiver(&self) -> Option<&Receiver> {
        self.receiver.as_ref()
    }

    /// Sends what is batched and stops the exporters.
    pub fn shutdown(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The spans worth exporting: ours. Not h2's, hyper's or tonic's (the
/// exporter's own calls would make spans of their own, forever).
fn span_targets() -> Targets {
    Targets::new()
        .with_target("tonic_deadline", LevelFilter::INFO)
        .with_target("deadline_lab", LevelFilter::INFO)
}

/// A tracer provider exporting to every endpoint, each through its own
/// batch processor.
///
/// # Errors
///
/// An endpoint the exporter refuses.
pub fn provider(service: &str, endpoints: &[String]) -> anyhow::Result<SdkTracerProvider> {
    let resource = opentelemetry_sdk::Resource::builder_empty()
        .with_service_name(service.to_owned())
        .build();
    let mut builder = SdkTracerProvider::builder().with_resource(resource);
    for endpoint in endpoints {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .with_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| anyhow::anyhow!("--otlp-endpoint {endpoint}: {e}"))?;
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_scheduled_delay(EXPORT_EVERY)
                    .build(),
            )
            .build();
        builder = builder.with_span_processor(processor);
    }
    Ok(builder.build())
}

/// One span as a collector received it, with the `service.name` of the
/// process that sent it.
#[derive(Debug, Clone)]
pub struct Received {
    /// The sender's `service.name` resource attribute.
    pub service: String,
    /// The span, as sent.
    pub span: Span,
}

impl Received {
    /// An attribute of the span, if it has it.
    pub fn attr(&self, key: &str) -> Option<&any_value::Value> {
        attr(&self.span.attributes, key)
    }

    /// A numeric attribute (integer or float) as `f64`.
    pub fn number(&self, key: &str) -> Option<f64> {
        match self.attr(key)? {
            any_value::Value::DoubleValue(v) => Some(*v),
            any_value::Value::IntValue(v) => Some(*v as f64),
            _ => None,
        }
    }

    /// A string attribute.
    pub fn text(&self, key: &str) -> Option<&str> {
        match self.attr(key)? {
            any_value::Value::StringValue(v) => Some(v),
            _ => None,
        }
    }

    /// A boolean attribute.
    pub fn flag(&self, key: &str) -> Option<bool> {
        match self.attr(key)? {
            any_value::Value::BoolValue(v) => Some(*v),
            _ => None,
        }
    }

    /// The trace id in hex.
    pub fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }

    /// The span id in hex.
    pub fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }

    /// The parent's span id in hex; `None` for a root span.
    pub fn parent(&self) -> Option<String> {
        (!self.span.parent_span_id.is_empty()).then(|| hex(&self.span.parent_span_id))
    }
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

/// Lowercase hex, as W3C trace context writes ids.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An OTLP/gRPC trace collector on loopback that keeps every span sent.
#[derive(Debug, Clone)]
pub struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Received>>>,
}

#[derive(Debug, Clone)]
struct Collect(Arc<Mutex<Vec<Received>>>);

#[tonic::async_trait]
impl TraceService for Collect {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = Vec::new();
        for resource in request.into_inner().resource_spans {
            let service = resource
                .resource
                .as_ref()
                .and_then(|r| attr(&r.attributes, "service.name"))
                .and_then(|v| match v {
                    any_value::Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    got.push(Received {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
        self.0
            .lock()
            .map_err(|_| tonic::Status::internal("receiver poisoned"))?
            .extend(got);
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Receiver {
    /// Listens on a free loopback port. Call it inside a tokio runtime.
    ///
    /// # Errors
    ///
    /// When no port can be bound.
    pub fn start() -> anyhow::Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let spans = Arc::new(Mutex::new(Vec::new()));
        let service = TraceServiceServer::new(Collect(spans.clone()));
        let incoming = crate::net::Incoming::new(listener);
        // The collector lives as long as the process; no request owns it.
        tonic_deadline::detach(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming),
        );
        Ok(Self { addr, spans })
    }

    /// The endpoint to export to: `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The spans of `trace_id` (hex), once `done` says they are all there,
    /// or whatever arrived when `within` ran out.
    pub async fn trace(
        &self,
        trace_id: &str,
        within: Duration,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let polls = (within.as_millis() / 50).max(1);
        let mut spans = Vec::new();
        for _ in 0..polls {
            spans = self
                .spans()
                .into_iter()
                .filter(|s| s.trace_id() == trace_id)
                .collect();
            if done(&spans) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        spans
    }
}
