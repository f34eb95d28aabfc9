//! Where the budget went, as metrics: both layers report to one
//! [`Metrics`] handle, which renders the Prometheus text a scrape reads.
//!
//! Four calls to a server whose handler works for the number of
//! milliseconds the request asks:
//!
//! 1. 10 ms of work in a 500 ms budget: completed;
//! 2. 300 ms of work in a 100 ms budget: the server's scope ends at the
//!    deadline (`deadline_exceeded`), or as `abandoned` when the client's
//!    reset for the same deadline reaches the server before its own timer
//!    fires (both sides end at the same instant; a busy machine decides);
//! 3. a call made from a scope that has already expired: refused by the
//!    client layer before anything is sent (`refused_expired{stage="client"}`);
//! 4. a call with no deadline at all: counted apart from the budgets.
//!
//! ```text
//! cargo run -p tonic-deadline-examples --example metrics
//! ```

use std::time::Duration;

use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status};
use tonic_deadline::client::{ClientDeadline, ReadyChannel};
use tonic_deadline::observe::{Metrics, ScopeEnding, Stage};
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer};
use tonic_deadline_examples::loopback;
use tonic_deadline_examples::work::work_client::WorkClient;
use tonic_deadline_examples::work::work_server::{Work, WorkServer};
use tonic_deadline_examples::work::{StartReply, StartRequest};

const METHOD: &str = "work.v1.Work/Start";

/// Works for `steps` milliseconds, stopping when the request's scope ends.
struct Busy;

#[tonic::async_trait]
impl Work for Busy {
    async fn start(&self, request: Request<StartRequest>) -> Result<Response<StartReply>, Status> {
        let work = Duration::from_millis(u64::from(request.get_ref().steps));
        Scope::current().run(tokio::time::sleep(work)).await?;
        Ok(Response::new(StartReply {}))
    }
}

/// Server scopes ended by the second call's deadline: the server's own
/// timer, or the client's reset when it arrives first.
fn ended_at_the_deadline(metrics: &Metrics) -> u64 {
    metrics.scopes_ended(ScopeEnding::DeadlineExceeded)
        + metrics.scopes_ended(ScopeEnding::Abandoned)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // One handle for the process; a test would make its own.
    let metrics = Metrics::new();
    let (addr, incoming) = loopback().await?;
    let server = Server::builder()
        .layer(ServerDeadlineLayer::new().metrics(&metrics))
        .add_service(WorkServer::new(Busy));
    tonic_deadline::detach(server.serve_with_incoming(incoming));
    let channel = ReadyChannel::connect(&Endpoint::from_shared(format!("http://{addr}"))?).await?;
    let mut client = WorkClient::new(
        tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new().metrics(&metrics))
            .service(channel),
    );

    let budget = |ms| Scope::background().with_timeout(Duration::from_millis(ms));
    let completed = call(&mut client, 10, budget(500)).await;
    let expired = call(&mut client, 300, budget(100)).await;
    let refused = call(&mut client, 0, budget(0)).await;
    let unbounded = call(&mut client, 0, Scope::background()).await;
    println!(
        "calls: {completed:?} (10 ms of work, 500 ms budget), {expired:?} (300 ms, 100 ms), \
         {refused:?} (scope already expired), {unbounded:?} (no deadline)"
    );

    // The server's side of the second call ends on its own timer; wait for
    // its scope to be counted.
    for _ in 0..100 {
        if ended_at_the_deadline(&metrics) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let scrape = metrics.encode();
    println!("\nthe scrape, the deadline series only (`metrics.encode()`):");
    for line in scrape.lines().filter(|line| shown(line)) {
        println!("  {line}");
    }

    let budgets = metrics.budget_on_entry(METHOD);
    println!(
        "\nscopes ended: completed {}, deadline_exceeded {}; refused as expired at the client: {}; \
         budgets on entry: {} (mean {:.0} ms)",
        metrics.scopes_ended(ScopeEnding::Completed),
        metrics.scopes_ended(ScopeEnding::DeadlineExceeded),
        metrics.refused_expired(Stage::Client),
        budgets.count,
        budgets.mean() * 1e3,
    );
    expect(completed == tonic::Code::Ok, "the first call must complete")?;
    expect(
        expired == tonic::Code::DeadlineExceeded,
        "the second call must end at its deadline",
    )?;
    expect(
        refused == tonic::Code::DeadlineExceeded,
        "the third call must be refused",
    )?;
    expect(
        metrics.scopes_ended(ScopeEnding::Completed) == 2,
        "two server scopes must complete",
    )?;
    expect(
        ended_at_the_deadline(&metrics) == 1,
        "one server scope must end at its deadline (by its own timer or the client's reset)",
    )?;
    expect(
        metrics.refused_expired(Stage::Client) == 1,
        "the client layer must count the refused call",
    )?;
    expect(
        budgets.count == 2,
        "the two calls with a deadline must record their budget on entry",
    )?;
    expect(
        scrape.contains("grpc_server_call_duration_seconds_count"),
        "the scrape must carry gRPC's call metrics",
    )?;
    Ok(())
}

type Client = WorkClient<ClientDeadline<ReadyChannel>>;

/// One call of `steps` ms of work, made inside `scope`.
async fn call(client: &mut Client, steps: u32, scope: Scope) -> tonic::Code {
    let answer = scope.enter(client.start(StartRequest { steps })).await;
    answer.map_or_else(|status| status.code(), |_| tonic::Code::Ok)
}

/// The lines of the scrape this example is about: our series and gRPC's
/// started-call counters, without the histogram buckets.
fn shown(line: &str) -> bool {
    let ours = line.starts_with("tonic_deadline_") || line.starts_with("grpc_server_call_started");
    ours && !line.contains("_bucket{")
}

fn expect(holds: bool, what: &str) -> Result<(), Box<dyn std::error::Error>> {
    if holds { Ok(()) } else { Err(what.into()) }
}
