//! An abandoned call never looks finished: a request stream whose client
//! reset it, or whose deadline passed, is never read by a handler behind
//! the server layer as a complete input. Plain tonic reads a reset with
//! `CANCEL` as a clean end (`Ok(None)`), so a handler that commits at the
//! end of its input commits an upload its client gave up on.

// The test drives its calls from tasks of its own.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use testkit::probe_server::{Probe, ProbeServer};
use testkit::{CallReply, CallRequest};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::Server;
use tonic::{Request, Response, Status, Streaming};
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::common::{PATIENCE, connect, loopback};

/// How many messages a whole upload has; the client sends fewer.
const WHOLE: usize = 5;
/// How many the client sends before it goes away.
const SENT: usize = 2;

/// How a handler's reading of one upload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// It read the end of the input and committed what it had read.
    Committed { messages: usize },
    /// It read an error; `scope_ended` says whether its scope had ended
    /// by then.
    ReadError {
        code: tonic::Code,
        scope_ended: bool,
    },
    /// It was dropped while reading; `scope_ended` as above.
    Stopped { scope_ended: bool },
}

/// What the handler tells the test.
#[derive(Debug)]
enum Seen {
    Received { run: String, messages: usize },
    Ended { run: String, outcome: Outcome },
}

/// An upload handler written the usual way: read until the end of the
/// input, then commit. `Chat` stands for a client-streaming method.
#[derive(Clone)]
struct Uploads {
    seen: mpsc::UnboundedSender<Seen>,
}

type Replies = Pin<Box<dyn Stream<Item = Result<CallReply, Status>> + Send>>;

/// Reports the handler dropped before it said how it ended.
struct StopWatch {
    run: Option<String>,
    seen: mpsc::UnboundedSender<Seen>,
}

impl Drop for StopWatch {
    fn drop(&mut self) {
        if let Some(run) = self.run.take() {
            let scope_ended = Scope::try_current().is_some_and(|s| s.is_ended());
            let _ = self.seen.send(Seen::Ended {
                run,
                outcome: Outcome::Stopped { scope_ended },
            });
        }
    }
}

#[tonic::async_trait]
impl Probe for Uploads {
    async fn call(&self, _: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        Err(Status::unimplemented("uploads only"))
    }

    type WatchStream = Replies;

    async fn watch(&self, _: Request<CallRequest>) -> Result<Response<Replies>, Status> {
        Err(Status::unimplemented("uploads only"))
    }

    type ChatStream = Replies;

    async fn chat(
        &self,
        request: Request<Streaming<CallRequest>>,
    ) -> Result<Response<Replies>, Status> {
        let mut input = request.into_inner();
        let mut watch = StopWatch {
            run: None,
            seen: self.seen.clone(),
        };
        let mut messages = 0;
        loop {
            match input.message().await {
                Ok(Some(message)) => {
                    messages += 1;
                    watch.run = Some(message.payload.clone());
                    let _ = self.seen.send(Seen::Received {
                        run: message.payload,
                        messages,
                    });
                }
                Ok(None) => {
                    // The end of the input: commit.
                    if let Some(run) = watch.run.take() {
                        let outcome = Outcome::Committed { messages };
                        let _ = self.seen.send(Seen::Ended { run, outcome });
                    }
                    return Ok(Response::new(Box::pin(tokio_stream::empty())));
                }
                Err(status) => {
                    let scope_ended = Scope::try_current().is_some_and(|s| s.is_ended());
                    if let Some(run) = watch.run.take() {
                        let outcome = Outcome::ReadError {
                            code: status.code(),
                            scope_ended,
                        };
                        let _ = self.seen.send(Seen::Ended { run, outcome });
                    }
                    return Err(status);
                }
            }
        }
    }
}

/// Serves [`Uploads`], behind the server layer or as plain tonic.
async fn serve_uploads(layered: bool) -> (SocketAddr, mpsc::UnboundedReceiver<Seen>) {
    let (seen, rx) = mpsc::unbounded_channel();
    let (listener, addr) = loopback().await;
    let incoming = TcpListenerStream::new(listener);
    let service = ProbeServer::new(Uploads { seen });
    if layered {
        tokio::spawn(
            Server::builder()
                .layer(ServerDeadlineLayer::new())
                .add_service(service)
                .serve_with_incoming(incoming),
        );
    } else {
        tokio::spawn(
            Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming),
        );
    }
    (addr, rx)
}

/// How the client goes away after [`SENT`] messages.
#[derive(Debug, Clone, Copy)]
enum Leave {
    /// Its scope is cancelled: the client layer resets the stream.
    Cancel,
    /// The call is dropped (a `select!`, a `timeout` around it).
    Drop,
    /// Its deadline passes.
    Deadline,
}

/// Sends [`SENT`] of [`WHOLE`] messages, goes away, and returns how the
/// handler's reading ended. The request stream stays open until then: the
/// client never ends it normally.
async fn abandon_upload(
    client: &crate::common::Client,
    seen: &mut mpsc::UnboundedReceiver<Seen>,
    run: usize,
    leave: Leave,
) -> Outcome {
    let run = format!("run-{run}");
    let budget = match leave {
        Leave::Deadline => Duration::from_millis(200),
        Leave::Cancel | Leave::Drop => PATIENCE,
    };
    let scope = Scope::background().with_timeout(budget);
    let (outbound, inbound) = mpsc::channel::<CallRequest>(WHOLE);
    let mut caller = client.clone();
    let call =
        tokio::spawn(scope.enter(async move { caller.chat(ReceiverStream::new(inbound)).await }));
    for _ in 0..SENT {
        outbound
            .send(CallRequest {
                payload: run.clone(),
                ..CallRequest::default()
            })
            .await
            .expect("the call takes its messages");
    }
    let outcome = tokio::time::timeout(PATIENCE * 2, async {
        loop {
            match seen.recv().await.expect("the server reports") {
                Seen::Received { run: r, messages } if r == run && messages == SENT => {
                    match leave {
                        Leave::Cancel => scope.cancel(),
                        Leave::Drop => call.abort(),
                        Leave::Deadline => {}
                    }
                }
                Seen::Ended { run: r, outcome } if r == run => return outcome,
                _ => {}
            }
        }
    })
    .await
    .expect("the handler must end once its client went away");
    drop(outbound);
    outcome
}

/// Whether `outcome` is what an abandoned upload must give: never a
/// commit, and an error or a stop only after the scope ended.
fn abandoned_safely(outcome: Outcome) -> bool {
    match outcome {
        Outcome::Committed { .. } => false,
        Outcome::ReadError { scope_ended, .. } | Outcome::Stopped { scope_ended } => scope_ended,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_upload_is_never_read_as_complete_behind_the_layer() {
    let (addr, mut seen) = serve_uploads(true).await;
    let client = connect(addr).await;
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for run in 0..1000 {
        let leave = if run % 2 == 0 {
            Leave::Cancel
        } else {
            Leave::Drop
        };
        let outcome = abandon_upload(&client, &mut seen, run, leave).await;
        assert!(
            abandoned_safely(outcome),
            "run {run} ({leave:?}): the handler must read an error or be stopped, after its \
             scope ended, never commit: {outcome:?}"
        );
        *outcomes.entry(format!("{outcome:?}")).or_default() += 1;
    }
    println!("behind the layer, 1000 uploads reset after {SENT} of {WHOLE} messages: {outcomes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_deadline_passes_is_never_read_as_complete_behind_the_layer() {
    let (addr, mut seen) = serve_uploads(true).await;
    let client = connect(addr).await;
    for run in 0..10 {
        let outcome = abandon_upload(&client, &mut seen, run, Leave::Deadline).await;
        assert!(
            abandoned_safely(outcome),
            "run {run}: at the deadline the handler must be stopped or read an error, never \
             commit: {outcome:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_reads_aborted_not_the_end_when_its_client_resets() {
    let (addr, mut seen) = serve_uploads(true).await;
    let client = connect(addr).await;
    // The handler is awaiting its third message when the reset comes: it
    // reads the error, with its scope already ended.
    let outcome = abandon_upload(&client, &mut seen, 0, Leave::Cancel).await;
    assert_eq!(
        outcome,
        Outcome::ReadError {
            code: tonic::Code::Aborted,
            scope_ended: true
        },
        "a reset reads ABORTED (tonic reads CANCELLED as the end)"
    );
}

/// What the layer changes: plain tonic, the same handler and client, commits
/// the uploads its client abandoned (tonic's decoder reads a request stream
/// reset with `CANCEL` as its end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_tonic_commits_a_reset_upload() {
    let (addr, mut seen) = serve_uploads(false).await;
    let client = connect(addr).await;
    let mut committed = 0;
    for run in 0..100 {
        let leave = if run % 2 == 0 {
            Leave::Cancel
        } else {
            Leave::Drop
        };
        let outcome = abandon_upload(&client, &mut seen, run, leave).await;
        if outcome == (Outcome::Committed { messages: SENT }) {
            committed += 1;
        }
    }
    println!("plain tonic: {committed} of 100 uploads reset after {SENT} of {WHOLE} committed");
    assert!(
        committed > 0,
        "plain tonic reads a reset upload as complete (docs/chain-breaks.md says so): if it no \
         longer does, the docs must change"
    );
}
