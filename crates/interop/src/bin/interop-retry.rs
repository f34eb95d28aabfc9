//! One call through our resilience layer, for the retry conformance test.
//!
//! ```text
//! interop-retry --server 127.0.0.1:50052 --tag 'name/2/100' --timeout_ms 2000
//! ```
//!
//! Calls `conformance.relay.Downstream/Work` once, under a scope of
//! `--timeout_ms`, through [`ResilienceLayer`] over our client layer over a
//! `ReadyChannel`, with the service config given by `--service_config` (a
//! retry policy for the Downstream service by default). Prints one JSON
//! line: `{"status": "OK" | code name, "elapsed_ms": N, "attempts": N}`.

use std::time::Duration;

use clap::Parser;
use interop::hostile::code_name;
use interop::relay_pb::WorkRequest;
use interop::relay_pb::downstream_client::DownstreamClient;
use tokio::time::Instant;
use tonic::transport::Endpoint;
use tonic_deadline::client::ReadyChannel;
use tonic_deadline::observe::Metrics;
use tonic_deadline::resilience::ResilienceLayer;
use tonic_deadline::{ClientDeadlineLayer, Scope};

/// The default policy: up to 4 attempts on UNAVAILABLE, 50 ms first backoff.
const SERVICE_CONFIG: &str = r#"{"methodConfig": [{
  "name": [{"service": "conformance.relay.Downstream"}],
  "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.05s", "maxBackoff": "0.5s",
                  "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#;

#[derive(Debug, Parser)]
struct Args {
    /// The server, `host:port`.
    #[arg(long)]
    server: String,
    /// The request's tag.
    #[arg(long)]
    tag: String,
    /// The caller's budget for the whole call, every attempt included.
    #[arg(long = "timeout_ms", default_value_t = 2000)]
    timeout_ms: u64,
    /// A gRPC service config (JSON) instead of the default policy.
    #[arg(long = "service_config")]
    service_config: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let metrics = Metrics::new();
    let json = args.service_config.as_deref().unwrap_or(SERVICE_CONFIG);
    let resilience = ResilienceLayer::from_service_config(json)?.metrics(&metrics);
    let endpoint = Endpoint::from_shared(format!("http://{}", args.server))?;
    let channel = tower::ServiceBuilder::new()
        .layer(resilience)
        .layer(ClientDeadlineLayer::new())
        .service(ReadyChannel::connect(&endpoint).await?);
    let mut client = DownstreamClient::new(channel);
    let scope = Scope::background().with_timeout(Duration::from_millis(args.timeout_ms));
    let started = Instant::now();
    let request = WorkRequest {
        work_ms: 0,
        tag: args.tag,
    };
    let result = scope.enter(client.work(request)).await;
    let status = match &result {
        Ok(_) => "OK",
        Err(status) => code_name(status.code()),
    };
    println!(
        "{{\"status\": \"{status}\", \"elapsed_ms\": {:.1}, \"attempts\": {}}}",
        started.elapsed().as_secs_f64() * 1000.0,
        metrics.call_attempts()
    );
    Ok(())
}
