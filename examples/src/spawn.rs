//! A handler that starts background work, the right way and the escape hatch:
//! `tonic_deadline::spawn` ties the task to the request, so it stops when the
//! client gives up; `tonic_deadline::detach` breaks the chain on purpose, and
//! that task runs on.
//!
//! The client gives up twice: once by its deadline (300 ms), once by
//! cancelling the call with no deadline at all (after 150 ms).
//!
//! ```text
//! cargo run -p tonic-deadline-examples --example spawn
//! ```

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status};
use tonic_deadline::client::ReadyChannel;
use tonic_deadline::{Cause, ClientDeadlineLayer, Scope, ServerDeadlineLayer};
use tonic_deadline_examples::work::work_client::WorkClient;
use tonic_deadline_examples::work::work_server::{Work, WorkServer};
use tonic_deadline_examples::work::{StartReply, StartRequest};
use tonic_deadline_examples::{loopback, ms};

const STEP: Duration = Duration::from_millis(100);
/// Ten steps: a second of work, far longer than the client waits.
const STEPS: u32 = 10;
/// How long `main` waits for the tasks' reports before calling it a failure.
const PATIENCE: Duration = Duration::from_secs(10);

/// What a background task reports when it stops, whether it finished or was
/// stopped half-way.
#[derive(Debug)]
struct Stopped {
    how: &'static str,
    after: Duration,
    steps_done: u32,
    finished: bool,
    /// Why the task's scope ended, if it had.
    cause: Option<Cause>,
}

/// Sends the report when the task's future goes away: at its end, or when the
/// scope stops it (the future is dropped then, mid-step).
struct ReportOnDrop {
    report: Option<Stopped>,
    started: Instant,
    scope: Scope,
    tx: mpsc::UnboundedSender<Stopped>,
}

impl Drop for ReportOnDrop {
    fn drop(&mut self) {
        if let Some(mut report) = self.report.take() {
            report.after = self.started.elapsed();
            report.cause = self.scope.cause();
            let _ = self.tx.send(report);
        }
    }
}

async fn background_work(how: &'static str, steps: u32, tx: mpsc::UnboundedSender<Stopped>) {
    let mut guard = ReportOnDrop {
        report: Some(Stopped {
            how,
            after: Duration::ZERO,
            steps_done: 0,
            finished: false,
            cause: None,
        }),
        started: Instant::now(),
        scope: Scope::current(),
        tx,
    };
    for _ in 0..steps {
        tokio::time::sleep(STEP).await;
        if let Some(report) = guard.report.as_mut() {
            report.steps_done += 1;
        }
    }
    if let Some(report) = guard.report.as_mut() {
        report.finished = true;
    }
}

struct Worker {
    tx: mpsc::UnboundedSender<Stopped>,
}

#[tonic::async_trait]
impl Work for Worker {
    async fn start(&self, request: Request<StartRequest>) -> Result<Response<StartReply>, Status> {
        let steps = request.into_inner().steps;
        // Belongs to the request: stops when the request's scope ends.
        let owned = tonic_deadline::spawn(background_work("spawn", steps, self.tx.clone()));
        // Breaks the chain on purpose: no deadline, nothing cancels it.
        drop(tonic_deadline::detach(background_work(
            "detach",
            steps,
            self.tx.clone(),
        )));
        // The reply waits for the owned work; `?` turns a stopped task into
        // DEADLINE_EXCEEDED or CANCELLED.
        owned
            .await
            .map_err(|panicked| Status::internal(panicked.to_string()))??;
        Ok(Response::new(StartReply {}))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (tx, mut stopped) = mpsc::unbounded_channel();
    let (addr, incoming) = loopback().await?;
    let server = Server::builder()
        .layer(ServerDeadlineLayer::new())
        .add_service(WorkServer::new(Worker { tx }));
    // The server belongs to no request: `detach` says so.
    tonic_deadline::detach(server.serve_with_incoming(incoming));
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?;
    // Ready only once connected, so the budget on the wire counts the connect.
    let channel = ReadyChannel::connect(&endpoint).await?;
    let client = WorkClient::new(
        tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new())
            .service(channel),
    );
    let request = StartRequest { steps: STEPS };
    println!(
        "the handler starts {} of work twice: with tonic_deadline::spawn and with tonic_deadline::detach\n",
        ms(STEP * STEPS)
    );

    // 1. The client's deadline passes.
    let budget = Duration::from_millis(300);
    let started = Instant::now();
    let scope = Scope::background().with_timeout(budget);
    let answer = scope.enter(client.clone().start(request)).await;
    let code = answer.map_or_else(|status| status.code(), |_| tonic::Code::Ok);
    println!(
        "client with a {} budget: {:?} after {}",
        ms(budget),
        code,
        ms(started.elapsed())
    );
    expect(
        code == tonic::Code::DeadlineExceeded,
        "the call must end at its deadline",
    )?;
    let spawned = next_report(&mut stopped, "spawn").await?;
    let detached = next_report(&mut stopped, "detach").await?;
    // Its cause is the deadline, or the client's reset if that arrived
    // first: either way the task stopped because the client gave up.
    expect(
        !spawned.finished && spawned.cause.is_some(),
        "the spawned task must stop at the request's deadline",
    )?;
    expect(detached.finished, "the detached task must run to its end")?;

    // 2. The client gives up by itself, without any deadline.
    let give_up_after = Duration::from_millis(150);
    let started = Instant::now();
    let scope = Scope::background();
    // The caller's own task for the call, under the scope it cancels.
    let call = tonic_deadline::detach({
        let (scope, mut client) = (scope.clone(), client.clone());
        async move { scope.enter(client.start(request)).await }
    });
    tokio::time::sleep(give_up_after).await;
    scope.cancel(); // the client layer resets the stream; the server sees the reset
    let code = call
        .await?
        .map_or_else(|status| status.code(), |_| tonic::Code::Ok);
    println!(
        "\nclient with no deadline, cancelling after {}: {:?} after {}",
        ms(give_up_after),
        code,
        ms(started.elapsed())
    );
    expect(
        code == tonic::Code::Cancelled,
        "a cancelled call must answer CANCELLED",
    )?;
    let spawned = next_report(&mut stopped, "spawn").await?;
    let detached = next_report(&mut stopped, "detach").await?;
    expect(
        !spawned.finished && spawned.cause == Some(Cause::Abandoned),
        "the spawned task must stop when the caller cancels",
    )?;
    expect(detached.finished, "the detached task must run to its end")?;

    println!(
        "\nwork started with spawn stopped when the client gave up; work started with detach ran on"
    );
    Ok(())
}

/// Waits for the report of the task started with `how`, and prints it.
async fn next_report(
    stopped: &mut mpsc::UnboundedReceiver<Stopped>,
    how: &'static str,
) -> Result<Stopped, Box<dyn std::error::Error>> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let report = tokio::time::timeout_at(deadline, stopped.recv())
            .await
            .map_err(|_| format!("no report from the {how} task within {PATIENCE:?}"))?
            .ok_or("the server is gone")?;
        let cause = report
            .cause
            .map_or_else(|| "none".to_owned(), |cause| cause.to_string());
        println!(
            "  task from {:<6} {} after {} ({}/{STEPS} steps; its scope ended: {cause})",
            report.how,
            if report.finished {
                "finished"
            } else {
                "stopped "
            },
            ms(report.after),
            report.steps_done,
        );
        if report.how == how {
            return Ok(report);
        }
    }
}

fn expect(holds: bool, what: &str) -> Result<(), String> {
    if holds {
        Ok(())
    } else {
        Err(format!("failed: {what}"))
    }
}
