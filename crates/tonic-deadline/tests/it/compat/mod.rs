//! Compatibility: every tonic feature a user combines with the layers keeps
//! working through both of them — `ServerDeadlineLayer` on a tonic
//! `Server`, `ClientDeadlineLayer` on the client — over both client
//! transports, a plain tonic `Channel` and `client::ReadyChannel`; and
//! through each one the guarantee still holds: the handler's scope has the
//! caller's deadline, and an expired one still answers `DEADLINE_EXCEEDED`.
//!
//! One file per feature; `docs/compatibility.md` is the table of what
//! holds and which test shows it.

// Servers, peers and drivers of these tests belong to no request.
#![allow(clippy::disallowed_methods)]

mod compression;
mod connect_info;
mod connectors;
mod interceptors;
mod keepalive;
mod limits;
mod load;
mod status_details;
mod timeouts;
mod tls;
mod web;

use std::fmt;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Extensions, Request, Response};
use testkit::probe_client::ProbeClient;
use testkit::probe_server::{Probe, ProbeServer};
use testkit::{CallReply, CallRequest};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status, Streaming};
use tonic_deadline::{BoxError, ClientDeadlineLayer, Scope, ServerDeadlineLayer};
use tower::ServiceExt;
use tower::util::BoxCloneSyncService;

pub(crate) use crate::common::{PATIENCE, loopback};

/// The caller's budget in these tests: long enough for any loaded machine
/// to make the call, short enough that the handler sees its bound.
pub(crate) const BUDGET: Duration = Duration::from_secs(2);

/// A budget meant to run out: the handler works far longer.
pub(crate) const EXPIRING: Duration = Duration::from_millis(50);

/// What a handler asked to outlive [`EXPIRING`] works for (it ignores its
/// scope: the layers must end the call by themselves).
pub(crate) const SLOW_MS: u64 = 5_000;

// ---------------------------------------------------------------------------
// The two client transports
// ---------------------------------------------------------------------------

/// `$make`, a client stack built over `$channel`, for `$transport` to
/// `$endpoint` (a `&Endpoint`): a lazy tonic `Channel` or a lazy
/// `ReadyChannel`, boxed so that a test loops over both. (A macro, not a
/// closure: each arm builds a stack of another type.)
macro_rules! stacks {
    ($transport:expr, $endpoint:expr, |$channel:ident| $make:expr) => {
        match $transport {
            $crate::compat::Transport::Channel => {
                let $channel = ($endpoint).connect_lazy();
                $crate::compat::boxed($make)
            }
            $crate::compat::Transport::ReadyChannel => {
                let $channel = tonic_deadline::client::ReadyChannel::lazy($endpoint);
                $crate::compat::boxed($make)
            }
        }
    };
}
pub(crate) use stacks;

/// A client transport under `ClientDeadlineLayer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// tonic's own `Channel`.
    Channel,
    /// `tonic_deadline::client::ReadyChannel`.
    ReadyChannel,
}

impl Transport {
    pub(crate) const BOTH: [Self; 2] = [Self::Channel, Self::ReadyChannel];

    /// The client layer over this transport to `endpoint`, connecting on
    /// first use: `ServiceBuilder::new().layer(ClientDeadlineLayer::new())`
    /// over `endpoint.connect_lazy()` or `ReadyChannel::lazy(&endpoint)`.
    pub(crate) fn stack(self, endpoint: &Endpoint) -> Stack {
        stacks!(self, endpoint, |channel| tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new())
            .service(channel))
    }

    /// A probe client over [`stack`](Self::stack).
    pub(crate) fn client(self, endpoint: &Endpoint) -> Client {
        ProbeClient::new(self.stack(endpoint))
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Channel => "tonic Channel",
            Self::ReadyChannel => "ReadyChannel",
        })
    }
}

/// Any client stack, boxed to one type.
pub(crate) type Stack = BoxCloneSyncService<Request<Body>, Response<Body>, BoxError>;

/// A probe client over a boxed stack.
pub(crate) type Client = ProbeClient<Stack>;

/// Boxes a client stack whose response body tonic can read; the error
/// passes unchanged, for tonic's generated client to turn into a status.
pub(crate) fn boxed<S, B>(stack: S) -> Stack
where
    S: tower::Service<Request<Body>, Response = Response<B>> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    BoxCloneSyncService::new(
        stack
            .map_response(|r: Response<B>| r.map(Body::new))
            .map_err(Into::into),
    )
}

/// The endpoint of a loopback server.
pub(crate) fn endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint::from_shared(format!("http://{addr}")).expect("a loopback address is a valid URI")
}

/// A plain tonic client without any layer: what tonic alone answers.
pub(crate) fn plain_client(endpoint: &Endpoint) -> ProbeClient<Channel> {
    ProbeClient::new(endpoint.connect_lazy())
}

/// `call` made in a fresh scope with `budget`.
pub(crate) async fn within<T>(budget: Duration, call: impl Future<Output = T>) -> T {
    Scope::background().with_timeout(budget).enter(call).await
}

// ---------------------------------------------------------------------------
// A probe that reports what its handlers see
// ---------------------------------------------------------------------------

/// What a handler saw of one call, on entry.
#[derive(Debug)]
pub(crate) struct Seen {
    /// `Scope::try_current()`'s remaining time: `None` without a scope, or
    /// without a deadline.
    pub(crate) remaining: Option<Duration>,
    /// Whether the handler ran inside a scope at all.
    pub(crate) scoped: bool,
    pub(crate) metadata: MetadataMap,
    /// The request's extensions: the scope, connect info, whatever an
    /// interceptor put there.
    pub(crate) extensions: Extensions,
    /// `tonic::Request::remote_addr()`.
    pub(crate) remote_addr: Option<SocketAddr>,
    /// Whether the call was meant to outlive its deadline (`work_ms` of
    /// [`SLOW_MS`]).
    slow: bool,
}

impl Seen {
    /// Asserts that the handler's scope carries the caller's deadline,
    /// bounded by its `budget`.
    pub(crate) fn assert_budget(&self, budget: Duration, what: &dyn fmt::Display) {
        assert!(self.scoped, "{what}: the handler must run inside its scope");
        let left = self.remaining.unwrap_or_else(|| {
            panic!("{what}: the handler's scope must carry the caller's deadline")
        });
        assert!(
            left <= budget && left > budget.saturating_sub(Duration::from_secs(1)),
            "{what}: the server must be told what the caller has left, not {left:?} of {budget:?}"
        );
        assert!(
            self.extensions.get::<Scope>().is_some(),
            "{what}: the scope must be in the request's extensions too"
        );
    }
}

/// The receiving end of a [`Seer`]'s reports.
///
/// Calls meant to outlive their deadline ([`SLOW_MS`]) are left out: their
/// handler may or may not be reached before the caller gives up, and a
/// test asks only what the caller got.
pub(crate) struct Sightings(mpsc::UnboundedReceiver<Seen>);

impl Sightings {
    /// The next call a handler saw, waited for at most [`PATIENCE`].
    pub(crate) async fn next(&mut self) -> Seen {
        loop {
            let seen = tokio::time::timeout(PATIENCE, self.0.recv())
                .await
                .unwrap_or_else(|_| panic!("a handler must be reached within {PATIENCE:?}"))
                .expect("the server keeps its sender");
            if !seen.slow {
                return seen;
            }
        }
    }

    /// Asserts that no handler was reached (so far).
    pub(crate) fn assert_none(&mut self, what: &dyn fmt::Display) {
        while let Ok(seen) = self.0.try_recv() {
            assert!(
                seen.slow,
                "{what}: no handler may be reached, but one saw {seen:?}"
            );
        }
    }
}

/// How a [`Seer`]'s handlers answer once they have reported.
#[derive(Clone, Copy)]
pub(crate) enum Answer {
    /// Unary: the request's payload back, or `count` bytes when it asks
    /// for them; streams: `count` replies of the payload, one every
    /// `interval_ms`, and an echo of every message.
    Echo,
    /// Unary: this status; streams: this status after their replies, in
    /// the trailers.
    Fail(fn() -> Status),
}

/// The probe service of these tests: each handler reports what it saw
/// ([`Seen`]), works `work_ms` ignoring its scope, waits for its [`Gate`]
/// when its payload is [`HOLD`], answers as told, and sends back the
/// request's [`TOKEN_BIN`] metadata in its response headers as
/// [`ECHO_BIN`].
#[derive(Clone)]
pub(crate) struct Seer {
    seen: mpsc::UnboundedSender<Seen>,
    answer: Answer,
    gate: Gate,
}

/// The payload of a call whose handler holds on until the test opens the
/// [`Gate`]: a call that keeps a permit or a stream for as long as a test
/// needs, and no longer.
pub(crate) const HOLD: &str = "hold";

/// Lets one held call ([`HOLD`]) answer per opening.
#[derive(Clone)]
pub(crate) struct Gate(Arc<Semaphore>);

impl Gate {
    pub(crate) fn open_one(&self) {
        self.0.add_permits(1);
    }
}

/// The request's binary entry a [`Seer`] echoes, and the key it echoes it under.
pub(crate) const TOKEN_BIN: &str = "x-token-bin";
pub(crate) const ECHO_BIN: &str = "x-echo-bin";

impl Seer {
    pub(crate) fn new(answer: Answer) -> (Self, Sightings) {
        let (seer, sightings, _) = Self::gated(answer);
        (seer, sightings)
    }

    /// A seer whose [`HOLD`] calls wait for the returned gate.
    pub(crate) fn gated(answer: Answer) -> (Self, Sightings, Gate) {
        let (seen, rx) = mpsc::unbounded_channel();
        let gate = Gate(Arc::new(Semaphore::new(0)));
        let seer = Self {
            seen,
            answer,
            gate: gate.clone(),
        };
        (seer, Sightings(rx), gate)
    }

    fn report<T>(&self, request: &tonic::Request<T>, work_ms: u64) -> MetadataMap {
        let scope = Scope::try_current();
        let _ = self.seen.send(Seen {
            remaining: scope.as_ref().and_then(Scope::remaining),
            scoped: scope.is_some(),
            metadata: request.metadata().clone(),
            extensions: request.extensions().clone(),
            remote_addr: request.remote_addr(),
            slow: work_ms == SLOW_MS,
        });
        let mut echo = MetadataMap::new();
        if let Some(token) = request.metadata().get_bin(TOKEN_BIN) {
            echo.insert_bin(ECHO_BIN, token.clone());
        }
        echo
    }

    fn respond<T>(echo: MetadataMap, message: T) -> tonic::Response<T> {
        let mut response = tonic::Response::new(message);
        *response.metadata_mut() = echo;
        response
    }
}

#[tonic::async_trait]
impl Probe for Seer {
    async fn call(
        &self,
        request: tonic::Request<CallRequest>,
    ) -> Result<tonic::Response<CallReply>, Status> {
        let echo = self.report(&request, request.get_ref().work_ms);
        let request = request.into_inner();
        tokio::time::sleep(Duration::from_millis(request.work_ms)).await;
        if request.payload == HOLD {
            self.gate
                .0
                .acquire()
                .await
                .expect("the gate is never closed")
                .forget();
        }
        match self.answer {
            Answer::Fail(status) => Err(status()),
            Answer::Echo => {
                let payload = if request.count > 0 {
                    "x".repeat(request.count as usize)
                } else {
                    request.payload
                };
                Ok(Self::respond(
                    echo,
                    CallReply {
                        hops: Vec::new(),
                        payload,
                    },
                ))
            }
        }
    }

    type WatchStream = Replies;

    async fn watch(
        &self,
        request: tonic::Request<CallRequest>,
    ) -> Result<tonic::Response<Replies>, Status> {
        let echo = self.report(&request, request.get_ref().work_ms);
        let request = request.into_inner();
        let period = Duration::from_millis(request.interval_ms.max(1));
        let replies = Replies {
            ticks: tokio::time::interval_at(tokio::time::Instant::now() + period, period),
            left: request.count,
            payload: request.payload,
            last: match self.answer {
                Answer::Echo => None,
                Answer::Fail(status) => Some(status),
            },
        };
        Ok(Self::respond(echo, replies))
    }

    type ChatStream = Echoes;

    async fn chat(
        &self,
        request: tonic::Request<Streaming<CallRequest>>,
    ) -> Result<tonic::Response<Echoes>, Status> {
        let echo = self.report(&request, 0);
        Ok(Self::respond(echo, Echoes(request.into_inner())))
    }
}

/// `Watch`'s stream: `count` replies, one per interval, then the failure
/// the [`Seer`] was told to end with, if any.
pub(crate) struct Replies {
    ticks: tokio::time::Interval,
    left: u32,
    payload: String,
    last: Option<fn() -> Status>,
}

impl Stream for Replies {
    type Item = Result<CallReply, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.left == 0 {
            return Poll::Ready(self.last.take().map(|status| Err(status())));
        }
        ready!(self.ticks.poll_tick(cx));
        self.left -= 1;
        Poll::Ready(Some(Ok(CallReply {
            hops: Vec::new(),
            payload: self.payload.clone(),
        })))
    }
}

/// `Chat`'s stream: every inbound message echoed back.
pub(crate) struct Echoes(Streaming<CallRequest>);

impl Stream for Echoes {
    type Item = Result<CallReply, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.0).poll_next(cx).map(|message| {
            message.map(|m| {
                m.map(|m| CallReply {
                    hops: Vec::new(),
                    payload: m.payload,
                })
            })
        })
    }
}

/// Serves `seer` behind the default server layer on a fresh loopback port
/// until the test ends.
pub(crate) async fn serve(seer: Seer) -> SocketAddr {
    let (listener, addr) = loopback().await;
    tokio::spawn(
        Server::builder()
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(seer))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    addr
}

/// Serves `seer` on plain tonic, without the server layer: what tonic
/// alone answers.
pub(crate) async fn serve_plain(seer: Seer) -> SocketAddr {
    let (listener, addr) = loopback().await;
    tokio::spawn(
        Server::builder()
            .add_service(ProbeServer::new(seer))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    addr
}

// ---------------------------------------------------------------------------
// Checks every feature's tests share
// ---------------------------------------------------------------------------

/// Makes one call with [`BUDGET`] and asserts that it succeeds and that the
/// handler saw the caller's deadline.
pub(crate) async fn assert_call_keeps_the_budget(
    client: &mut Client,
    sightings: &mut Sightings,
    what: &dyn fmt::Display,
) {
    within(BUDGET, client.call(CallRequest::default()))
        .await
        .unwrap_or_else(|status| panic!("{what}: the call must succeed, got {status:?}"));
    sightings.next().await.assert_budget(BUDGET, what);
}

/// Asserts that a call whose budget runs out while the handler works
/// answers `DEADLINE_EXCEEDED`.
pub(crate) async fn assert_expired_call_answers_deadline_exceeded(
    client: &mut Client,
    what: &dyn fmt::Display,
) {
    let request = CallRequest {
        work_ms: SLOW_MS,
        ..CallRequest::default()
    };
    let status = tokio::time::timeout(PATIENCE, within(EXPIRING, client.call(request)))
        .await
        .unwrap_or_else(|_| panic!("{what}: the call must end at its deadline"))
        .expect_err("the handler works far beyond the budget");
    assert_eq!(
        status.code(),
        Code::DeadlineExceeded,
        "{what}: an expired deadline must answer DEADLINE_EXCEEDED: {status:?}"
    );
}
