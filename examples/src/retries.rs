//! Retries and hedging inside the caller's one deadline, configured from
//! gRPC service-config JSON.
//!
//! 1. Retries: the server fails the first two attempts with `UNAVAILABLE`;
//!    the third answers. Every attempt carries what is left of the caller's
//!    500 ms on the wire, so the budgets shrink from attempt to attempt.
//! 2. Hedging: the first attempt of a call stalls; a hedge sent 30 ms later
//!    answers at once and wins. The losing attempt is reset, and its scope on
//!    the server ends at once instead of running on.
//!
//! ```text
//! cargo run -p tonic-deadline-examples --example retries
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status};
use tonic_deadline::client::ReadyChannel;
use tonic_deadline::resilience::ResilienceLayer;
use tonic_deadline::{Cause, ClientDeadlineLayer, Scope, ServerDeadlineLayer};
use tonic_deadline_examples::work::work_client::WorkClient;
use tonic_deadline_examples::work::work_server::{Work, WorkServer};
use tonic_deadline_examples::work::{StartReply, StartRequest};
use tonic_deadline_examples::{loopback, ms};

const RETRY_CONFIG: &str = r#"{"methodConfig": [{
    "name": [{"service": "work.v1.Work"}],
    "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.02s", "maxBackoff": "0.1s",
                    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#;

/// A hedge sends the call more than once: configure it only for methods for
/// which that is harmless.
const HEDGE_CONFIG: &str = r#"{"methodConfig": [{
    "name": [{"service": "work.v1.Work"}],
    "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.03s"}}]}"#;

/// How long the hedged call's first attempt would stall.
const STALL: Duration = Duration::from_secs(2);

/// What the server saw of one attempt.
#[derive(Debug, Clone)]
struct Attempt {
    /// `grpc-previous-rpc-attempts`, absent on a call's first attempt.
    previous: Option<String>,
    /// `grpc-timeout` as it arrived.
    timeout: Option<String>,
    /// The budget the server's scope had on entry.
    remaining: Option<Duration>,
}

struct Flaky {
    /// Calls `start` answers with `UNAVAILABLE` before it answers OK.
    failures: Mutex<u32>,
    /// Whether a call's first attempt stalls (the hedging part).
    stall_first: bool,
    seen: Arc<Mutex<Vec<Attempt>>>,
    /// Why the scope of each stalled attempt ended.
    ended: mpsc::UnboundedSender<Cause>,
}

#[tonic::async_trait]
impl Work for Flaky {
    async fn start(&self, request: Request<StartRequest>) -> Result<Response<StartReply>, Status> {
        let header = |name: &str| {
            request
                .metadata()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let attempt = Attempt {
            previous: header("grpc-previous-rpc-attempts"),
            timeout: header("grpc-timeout"),
            remaining: Scope::current().remaining(),
        };
        let first = attempt.previous.is_none();
        self.seen.lock().expect("not poisoned").push(attempt);
        if self.stall_first && first {
            let ended = self.ended.clone();
            // Cleanup that runs once this attempt's scope ends, whatever ends it.
            drop(Scope::current().on_end(move |cause| async move {
                let _ = ended.send(cause);
            }));
            tokio::time::sleep(STALL).await;
            return Ok(Response::new(StartReply {}));
        }
        let mut failures = self.failures.lock().expect("not poisoned");
        if *failures > 0 {
            *failures -= 1;
            return Err(Status::unavailable("not yet"));
        }
        Ok(Response::new(StartReply {}))
    }
}

/// Serves a `Flaky` on a free port; returns a channel to it and what it saw.
async fn serve(
    failures: u32,
    stall_first: bool,
) -> Result<
    (
        ReadyChannel,
        Arc<Mutex<Vec<Attempt>>>,
        mpsc::UnboundedReceiver<Cause>,
    ),
    Box<dyn std::error::Error>,
> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (ended, ended_rx) = mpsc::unbounded_channel();
    let service = Flaky {
        failures: Mutex::new(failures),
        stall_first,
        seen: Arc::clone(&seen),
        ended,
    };
    let (addr, incoming) = loopback().await?;
    let server = Server::builder()
        .layer(ServerDeadlineLayer::new())
        .add_service(WorkServer::new(service));
    // The server belongs to no request: `detach` says so.
    tonic_deadline::detach(server.serve_with_incoming(incoming));
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?;
    Ok((ReadyChannel::connect(&endpoint).await?, seen, ended_rx))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. Retries.
    let (channel, seen, _) = serve(2, false).await?;
    let mut client = WorkClient::new(
        tower::ServiceBuilder::new()
            .layer(ResilienceLayer::from_service_config(RETRY_CONFIG)?)
            .layer(ClientDeadlineLayer::new())
            .service(channel),
    );
    let budget = Duration::from_millis(500);
    let scope = Scope::background().with_timeout(budget);
    let started = Instant::now();
    let answer = scope.enter(client.start(StartRequest { steps: 0 })).await;
    let code = answer.map_or_else(|status| status.code(), |_| tonic::Code::Ok);
    println!(
        "retries: a {} budget, the server fails twice: {code:?} after {}",
        ms(budget),
        ms(started.elapsed())
    );
    let attempts = seen.lock().expect("not poisoned").clone();
    for (n, attempt) in attempts.iter().enumerate() {
        println!(
            "  attempt {}: grpc-timeout {:<10} grpc-previous-rpc-attempts {:<4} server's budget {}",
            n + 1,
            attempt.timeout.as_deref().unwrap_or("-"),
            attempt.previous.as_deref().unwrap_or("-"),
            attempt.remaining.map_or_else(|| "none".to_owned(), ms),
        );
    }
    expect(code == tonic::Code::Ok, "the third attempt must answer")?;
    expect(attempts.len() == 3, "three attempts must reach the server")?;
    expect(
        attempts.windows(2).all(|w| w[1].remaining < w[0].remaining),
        "every attempt must carry less of the one budget than the one before",
    )?;

    // 2. Hedging.
    let (channel, seen, mut ended) = serve(0, true).await?;
    let mut client = WorkClient::new(
        tower::ServiceBuilder::new()
            .layer(ResilienceLayer::from_service_config(HEDGE_CONFIG)?)
            .layer(ClientDeadlineLayer::new())
            .service(channel),
    );
    let scope = Scope::background().with_timeout(budget);
    let started = Instant::now();
    let answer = scope.enter(client.start(StartRequest { steps: 0 })).await;
    let took = started.elapsed();
    let code = answer.map_or_else(|status| status.code(), |_| tonic::Code::Ok);
    let cause = tokio::time::timeout(Duration::from_secs(5), ended.recv())
        .await
        .ok()
        .flatten();
    let after_answer = started.elapsed();
    println!(
        "\nhedging: the first attempt stalls for {}, a hedge goes out after 30 ms: {code:?} after {}",
        ms(STALL),
        ms(took)
    );
    println!(
        "  attempts seen by the server: {}; the stalled attempt's scope ended ({}) {} after the call began",
        seen.lock().expect("not poisoned").len(),
        cause.map_or_else(|| "never".to_owned(), |c| c.to_string()),
        ms(after_answer)
    );
    expect(code == tonic::Code::Ok, "the hedge must answer")?;
    expect(
        took < Duration::from_millis(250),
        "the hedge must win long before the stalled attempt",
    )?;
    expect(
        cause == Some(Cause::Abandoned),
        "the losing attempt must be reset, and its server scope end",
    )?;
    println!("\nevery attempt lived inside the caller's one deadline; the loser did not run on");
    Ok(())
}

fn expect(holds: bool, what: &str) -> Result<(), Box<dyn std::error::Error>> {
    if holds {
        Ok(())
    } else {
        Err(format!("unexpected: {what}").into())
    }
}
