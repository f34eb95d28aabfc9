//! The official interop cases through the official `grpc` crate's client
//! (0.9) under `grpc-deadline-grpc`'s interceptor, for foreign servers.
//!
//! - `timeout_on_sleeping_server`: a `FullDuplexCall` with a 1 ms deadline
//!   ends with `DEADLINE_EXCEEDED`, and the server was sent the deadline;
//! - `cancel_after_begin`: a `StreamingInputCall` cancelled before any
//!   message ends with `CANCELLED`;
//! - `downstream_budget`: `conformance.relay.Downstream/Work` under a scope
//!   of `--budget_ms`, for a server that reports the deadline it was given.
//!
//! The crate's code generator is on crates.io (`protoc-gen-rust-grpc` and
//! its runtime `grpc-protobuf`, 0.9.0), but it generates code for Google's
//! `protobuf` crate (4.x), not prost, which every other peer here uses; so
//! the calls here are made with the crate's call API (`Invoke`), as its
//! generated code makes them: headers, prost-encoded messages, trailers.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail, ensure};
use bytes::{Buf, Bytes};
use grpc::client::interceptor::{Intercepted, InvokeExt};
use grpc::client::{
    CallOptions, Channel, ChannelOptions, Invoke, RecvStream, ResponseStreamItem, SendOptions,
    SendStream,
};
use grpc::core::{RecvMessage, RequestHeaders, SendMessage};
use grpc::credentials::LocalChannelCredentials;
use grpc_deadline_grpc::{DeadlineInterceptor, code_name};
use prost::Message;
use tonic_deadline::Scope;

use crate::pb::StreamingOutputCallRequest;
use crate::relay_pb::{WorkReply, WorkRequest};

/// The cases this client runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// `timeout_on_sleeping_server`.
    TimeoutOnSleepingServer,
    /// `cancel_after_begin`.
    CancelAfterBegin,
    /// `Downstream/Work` under a budget (not an official case).
    DownstreamBudget,
}

impl std::str::FromStr for Case {
    type Err = anyhow::Error;

    fn from_str(name: &str) -> anyhow::Result<Case> {
        Ok(match name {
            "timeout_on_sleeping_server" => Case::TimeoutOnSleepingServer,
            "cancel_after_begin" => Case::CancelAfterBegin,
            "downstream_budget" => Case::DownstreamBudget,
            other => bail!(
                "unknown case {other}: timeout_on_sleeping_server, cancel_after_begin, \
                 downstream_budget"
            ),
        })
    }
}

impl std::fmt::Display for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Case::TimeoutOnSleepingServer => "timeout_on_sleeping_server",
            Case::CancelAfterBegin => "cancel_after_begin",
            Case::DownstreamBudget => "downstream_budget",
        })
    }
}

/// A channel of the `grpc` crate under the interceptor.
pub struct Client {
    calls: Intercepted<Channel, DeadlineInterceptor>,
    interceptor: DeadlineInterceptor,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("interceptor", &self.interceptor)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A channel to `host:port` (an IP address), under the interceptor.
    pub fn new(host: &str, port: u16) -> Self {
        let channel = Channel::new(
            format!("dns:///{host}:{port}"),
            Arc::new(LocalChannelCredentials::new()),
            ChannelOptions::default(),
        );
        let interceptor = DeadlineInterceptor::new();
        Self {
            calls: channel.with_interceptor(interceptor.clone()),
            interceptor,
        }
    }

    /// [`Client::new`], connected: one `grpc.testing.TestService/EmptyCall`
    /// with no deadline, as the official clients connect before their
    /// cases (a channel of the crate connects on its first call, and a
    /// deadline of 1 ms would end that call before it left).
    ///
    /// # Errors
    ///
    /// When the empty call fails.
    pub async fn connect(host: &str, port: u16) -> anyhow::Result<Self> {
        let client = Self::new(host, port);
        let outcome = Scope::background()
            .enter(async {
                let headers =
                    RequestHeaders::new().with_method_name("/grpc.testing.TestService/EmptyCall");
                let (mut send, mut recv) = client.calls.invoke(headers, CallOptions::new()).await;
                let empty = Encoded(Bytes::new());
                let _ = send
                    .send(&empty, SendOptions::new().with_final_msg(true))
                    .await;
                finish(&mut recv).await
            })
            .await;
        outcome.map_err(|(code, message)| {
            anyhow!("the first call (EmptyCall) failed: {code} {message}")
        })?;
        Ok(client)
    }

    /// What the interceptor counted.
    pub fn interceptor(&self) -> &DeadlineInterceptor {
        &self.interceptor
    }
}

/// A prost message for the crate's `SendStream`.
struct Encoded(Bytes);

impl SendMessage for Encoded {
    fn encode(&self) -> Result<Box<dyn Buf + Send + Sync>, String> {
        Ok(Box::new(self.0.clone()))
    }
}

fn encoded(message: &impl Message) -> Encoded {
    Encoded(Bytes::from(message.encode_to_vec()))
}

/// The raw bytes of each message received.
#[derive(Default)]
struct Raw(Option<Bytes>);

impl RecvMessage for Raw {
    fn decode(&mut self, data: &mut dyn Buf) -> Result<(), String> {
        self.0 = Some(data.copy_to_bytes(data.remaining()));
        Ok(())
    }
}

/// Reads `recv` to its trailers: the last message, or the status's code
/// name and message.
async fn finish(recv: &mut impl RecvStream) -> Result<Option<Bytes>, (&'static str, String)> {
    let mut raw = Raw::default();
    loop {
        match recv.recv(&mut raw).await {
            ResponseStreamItem::Trailers(trailers) => {
                return match trailers.status() {
                    Ok(()) => Ok(raw.0),
                    Err(e) => Err((code_name(e.code()), e.message().to_owned())),
                };
            }
            ResponseStreamItem::StreamClosed => {
                return Err(("INTERNAL", "closed without trailers".to_owned()));
            }
            ResponseStreamItem::Headers(_) | ResponseStreamItem::Message => {}
        }
    }
}

fn expect_code<T>(
    outcome: Result<T, (&'static str, String)>,
    code: &str,
    what: &str,
) -> anyhow::Result<()> {
    match outcome {
        Err((got, _)) if got == code => Ok(()),
        Err((got, message)) => bail!("{what}: expected {code}, got {got}: {message}"),
        Ok(_) => bail!("{what}: expected {code}, got OK"),
    }
}

/// Runs `case` with `client`; `budget` is `downstream_budget`'s, `tag` its
/// tag.
///
/// # Errors
///
/// What the case found wrong.
pub async fn run(case: Case, client: &Client, budget: Duration, tag: &str) -> anyhow::Result<()> {
    match case {
        Case::TimeoutOnSleepingServer => timeout_on_sleeping_server(client).await,
        Case::CancelAfterBegin => cancel_after_begin(client).await,
        Case::DownstreamBudget => downstream_budget(client, budget, tag).await,
    }
}

/// `timeout_on_sleeping_server`: 1 ms, one request of 27 182 bytes, and the
/// server answers nothing: `DEADLINE_EXCEEDED`.
pub async fn timeout_on_sleeping_server(client: &Client) -> anyhow::Result<()> {
    let scope = Scope::background().with_timeout(Duration::from_millis(1));
    let outcome = scope
        .enter(async {
            let headers =
                RequestHeaders::new().with_method_name("/grpc.testing.TestService/FullDuplexCall");
            let (mut send, mut recv) = client.calls.invoke(headers, CallOptions::new()).await;
            let request = StreamingOutputCallRequest {
                payload: Some(crate::pb::Payload {
                    body: vec![0; 27_182],
                    ..crate::pb::Payload::default()
                }),
                ..StreamingOutputCallRequest::default()
            };
            // A send the deadline cut shows in the trailers.
            let _ = send.send(&encoded(&request), SendOptions::new()).await;
            finish(&mut recv).await
        })
        .await;
    expect_code(outcome, "DEADLINE_EXCEEDED", "FullDuplexCall with 1 ms")
}

/// `cancel_after_begin`: a client stream cancelled once started, before any
/// message: `CANCELLED`.
pub async fn cancel_after_begin(client: &Client) -> anyhow::Result<()> {
    let scope = Scope::background().child();
    let headers =
        RequestHeaders::new().with_method_name("/grpc.testing.TestService/StreamingInputCall");
    let (send, mut recv) = scope
        .enter(client.calls.invoke(headers, CallOptions::new()))
        .await;
    // The crate sends the call from a task of its own once `invoke`
    // returns: a moment for it to be on the wire, so that the cancel comes
    // after the call began, as the case asks.
    tokio::time::sleep(Duration::from_millis(50)).await;
    scope.cancel();
    let outcome = finish(&mut recv).await;
    drop(send);
    expect_code(outcome, "CANCELLED", "StreamingInputCall cancelled")
}

/// `Downstream/Work` with no work under a scope of `budget`: the server
/// reports the deadline it was given.
pub async fn downstream_budget(client: &Client, budget: Duration, tag: &str) -> anyhow::Result<()> {
    let scope = Scope::background().with_timeout(budget);
    let outcome = scope
        .enter(async {
            let headers =
                RequestHeaders::new().with_method_name("/conformance.relay.Downstream/Work");
            let (mut send, mut recv) = client.calls.invoke(headers, CallOptions::new()).await;
            let request = WorkRequest {
                work_ms: 0,
                tag: tag.to_owned(),
            };
            let _ = send
                .send(&encoded(&request), SendOptions::new().with_final_msg(true))
                .await;
            finish(&mut recv).await
        })
        .await;
    let reply = outcome
        .map_err(|(code, message)| anyhow!("Work failed: {code} {message}"))?
        .context("Work answered no message")?;
    let reply = WorkReply::decode(reply).context("Work's reply must decode")?;
    ensure!(
        reply.remaining_us > 0 && u128::try_from(reply.remaining_us)? <= budget.as_micros(),
        "the server must be given at most the {budget:?} budget, got {} µs",
        reply.remaining_us
    );
    println!(
        "{{\"event\": \"budget\", \"tag\": \"{tag}\", \"sent_ms\": {}, \"remaining_us\": {}, \"server\": \"{}\"}}",
        budget.as_millis(),
        reply.remaining_us,
        reply.implementation
    );
    Ok(())
}
