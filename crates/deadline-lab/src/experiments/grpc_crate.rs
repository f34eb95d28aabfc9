//! The official `grpc` crate (0.9) alone, with our interceptor (over the
//! crate's own transport, and over tonic's through `TonicInvoke`), and
//! tonic with our layers: the deadline on the wire, the call's end, the
//! server's work, and a chain whose middle calls go through the crate.
//!
//! Every server is tonic behind our server layer, so it keeps whatever
//! deadline arrives; what differs is only the client that calls it.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes};
use grpc::client::interceptor::{Intercepted, InvokeExt};
use grpc::client::{
    CallOptions, Channel, ChannelOptions, Invoke, RecvStream, ResponseStreamItem, SendOptions,
    SendStream,
};
use grpc::core::{RecvMessage, RequestHeaders, SendMessage};
use grpc::credentials::LocalChannelCredentials;
use grpc_deadline_grpc::{DeadlineInterceptor, TonicInvoke, code_name as grpc_code_name};
use testkit::probe_client::ProbeClient;
use testkit::probe_server::{Probe, ProbeServer};
use testkit::{CallReply, CallRequest};
use prost::Message;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_stream::Stream;
use tonic::service::Routes;
use tonic::{Request, Response, Status, Streaming};
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::kit::calls::{layered_client, status_name, without_deadline};
use crate::net::{self, Layered};
use crate::registry::{Experiment, NoArgs, Spans};
use crate::report::{Outcome, ms};

/// The deadline of the first case.
pub const DEADLINE: Duration = Duration::from_millis(500);
/// The server's work in the first case.
pub const SERVER_WORK: Duration = Duration::from_secs(2);
/// The chain's budget and each hop's work.
pub const CHAIN_BUDGET: Duration = Duration::from_secs(1);
/// Each hop's work before it calls the next.
pub const HOP: Duration = Duration::from_millis(100);
/// C's work in the cancel case, and the root's deadline there: the cancel
/// comes long before either would end it.
const CANCEL_WORK: Duration = Duration::from_secs(2);
const CANCEL_BUDGET: Duration = Duration::from_secs(5);
/// How long after C entered the root cancels.
const CANCEL_AFTER: Duration = Duration::from_millis(200);

/// The clients, as the JSON names them: the crate alone, the crate under
/// our interceptor over its own transport and over tonic's
/// (`TonicInvoke`), and tonic with our layers.
pub const CLIENTS: [&str; 4] = [
    "grpc",
    "grpc + ours",
    "grpc + ours (tonic transport)",
    "tonic + ours",
];
/// The three cases, as the JSON names them.
pub const CASES: [&str; 3] = [
    "server works 2 s, deadline 500 ms",
    "chain A → B → C",
    "cancel at the root",
];

/// One client in one case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// One of [`CLIENTS`].
    pub client: String,
    /// One of [`CASES`].
    pub case: String,
    /// The `grpc-timeout` the server received (in a chain: C, the hop
    /// whose header came through the client under test), or `null`.
    pub grpc_timeout_on_wire: Option<String>,
    /// The status the caller got (in a chain: the root's call).
    pub status: String,
    /// When, after the call began.
    pub elapsed_ms: f64,
    /// Whether the server's work (in a chain: C's) stopped before its
    /// end. In the chain case nothing should stop it: `false` is right.
    pub server_work_stopped: bool,
    /// The budget on entry at A, B and C (`null` where none arrived);
    /// `null` outside the chains.
    pub remaining_ms_on_entry: Option<Vec<Option<f64>>>,
    /// In the cancel case: how long after the cancel C's work stopped
    /// (`null`: it ran to its end).
    pub stopped_after_cancel_ms: Option<f64>,
}

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GrpcCrate {
    /// Every client in every case.
    pub rows: Vec<Row>,
    /// Cancels our interceptor counted as not reaching the server
    /// (`Stats::cancels_not_reset`), over the run.
    pub cancels_not_reset: u64,
}

// ---- the `grpc` crate's side: messages and calls -------------------------

/// A prost message, encoded for the crate's `SendStream`.
struct Encoded(Bytes);

impl SendMessage for Encoded {
    fn encode(&self) -> Result<Box<dyn Buf + Send + Sync>, String> {
        Ok(Box::new(self.0.clone()))
    }
}

/// A reply decoded from the crate's `RecvStream`.
#[derive(Default)]
struct Decoded(Option<CallReply>);

impl RecvMessage for Decoded {
    fn decode(&mut self, data: &mut dyn Buf) -> Result<(), String> {
        let bytes = data.copy_to_bytes(data.remaining());
        self.0 = Some(CallReply::decode(bytes).map_err(|e| e.to_string())?);
        Ok(())
    }
}

/// A channel of the crate to `addr`, plain or under our interceptor.
#[derive(Clone)]
pub enum GrpcClient {
    /// The crate alone.
    Plain(Channel),
    /// Under [`DeadlineInterceptor`].
    Ours(
        Arc<Intercepted<Channel, DeadlineInterceptor>>,
        DeadlineInterceptor,
    ),
    /// Under [`DeadlineInterceptor`], over tonic's transport
    /// ([`TonicInvoke`]) instead of the crate's.
    OursOverTonic(
        Arc<Intercepted<TonicInvoke, DeadlineInterceptor>>,
        DeadlineInterceptor,
    ),
}

impl std::fmt::Debug for GrpcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GrpcClient::Plain(_) => "GrpcClient::Plain",
            GrpcClient::Ours(..) => "GrpcClient::Ours",
            GrpcClient::OursOverTonic(..) => "GrpcClient::OursOverTonic",
        })
    }
}

impl GrpcClient {
    /// The client [`CLIENTS`] names `which` (one of the crate's), to `addr`.
    ///
    /// # Errors
    ///
    /// When `addr` makes no endpoint for tonic.
    pub fn named(addr: SocketAddr, which: &str) -> anyhow::Result<Self> {
        Ok(match which {
            "grpc + ours (tonic transport)" => Self::over_tonic(addr)?,
            _ => Self::new(addr, which == "grpc + ours"),
        })
    }

    /// The crate's calls under our interceptor, over tonic's transport to
    /// `addr` (a `ReadyChannel` under our client layer, TCP_NODELAY on).
    ///
    /// # Errors
    ///
    /// When `addr` makes no endpoint for tonic.
    pub fn over_tonic(addr: SocketAddr) -> anyhow::Result<Self> {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?;
        // The interceptor reports a call made outside any scope; the layer
        // below it need not say so again.
        let layer = tonic_deadline::ClientDeadlineLayer::new()
            .unscoped(tonic_deadline::client::Unscoped::Allow);
        let invoke = TonicInvoke::new(layer, tonic_deadline::client::ReadyChannel::lazy(&endpoint));
        let interceptor = DeadlineInterceptor::new().abandoned(grpc_deadline_grpc::Abandoned::Drop);
        Ok(GrpcClient::OursOverTonic(
            Arc::new(invoke.with_interceptor(interceptor.clone())),
            interceptor,
        ))
    }

    /// A channel to `addr`, with our interceptor when `ours`.
    pub fn new(addr: SocketAddr, ours: bool) -> Self {
        let channel = Channel::new(
            format!("dns:///{addr}"),
            Arc::new(LocalChannelCredentials::new()),
            ChannelOptions::default(),
        );
        if ours {
            let interceptor = DeadlineInterceptor::new();
            GrpcClient::Ours(
                Arc::new(channel.with_interceptor(interceptor.clone())),
                interceptor,
            )
        } else {
            GrpcClient::Plain(channel)
        }
    }

    /// What our interceptor counted (none for the crate alone).
    pub fn cancels_not_reset(&self) -> u64 {
        match self {
            GrpcClient::Plain(_) => 0,
            GrpcClient::Ours(_, i) | GrpcClient::OursOverTonic(_, i) => {
                i.stats().cancels_not_reset()
            }
        }
    }

    /// `Probe/Call` with `options`.
    ///
    /// # Errors
    ///
    /// The call's status when it is not OK (named as gRPC names it).
    pub async fn call(
        &self,
        request: &CallRequest,
        options: CallOptions,
    ) -> Result<CallReply, (&'static str, String)> {
        match self {
            GrpcClient::Plain(channel) => unary(channel, request, options).await,
            GrpcClient::Ours(channel, _) => unary(&**channel, request, options).await,
            GrpcClient::OursOverTonic(invoke, _) => unary(&**invoke, request, options).await,
        }
    }
}

/// A unary call made the way the crate's generated code makes one: one
/// message, then headers, the reply and trailers.
async fn unary<I: Invoke>(
    invoker: &I,
    request: &CallRequest,
    options: CallOptions,
) -> Result<CallReply, (&'static str, String)> {
    let headers = RequestHeaders::new().with_method_name("/probe.v1.Probe/Call");
    let (mut send, mut recv) = invoker.invoke(headers, options).await;
    let message = Encoded(Bytes::from(request.encode_to_vec()));
    // A failed send shows in the trailers.
    let _ = send
        .send(&message, SendOptions::new().with_final_msg(true))
        .await;
    let mut reply = Decoded::default();
    loop {
        match recv.recv(&mut reply).await {
            ResponseStreamItem::Trailers(trailers) => {
                return match trailers.status() {
                    Ok(()) => reply.0.ok_or(("INTERNAL", "no reply message".to_owned())),
                    Err(e) => Err((grpc_code_name(e.code()), e.message().to_owned())),
                };
            }
            ResponseStreamItem::StreamClosed => {
                return Err(("INTERNAL", "closed without trailers".to_owned()));
            }
            ResponseStreamItem::Headers(_) | ResponseStreamItem::Message => {}
        }
    }
}

/// A `CallOptions` deadline `timeout` from now.
#[allow(
    clippy::disallowed_types,
    reason = "the grpc crate's CallOptions take std's Instant"
)]
pub fn options_in(timeout: Duration) -> CallOptions {
    let mut options = CallOptions::new();
    options.set_deadline((Instant::now() + timeout).into_std());
    options
}

// ---- the servers ---------------------------------------------------------

/// What one server saw.
#[derive(Debug, Default)]
pub struct Log {
    /// Each call's `grpc-timeout` and remaining budget on entry.
    entries: Mutex<Vec<(Option<String>, Option<f64>)>>,
    /// Work that ran to its end.
    completed: AtomicU64,
    /// Work stopped before its end (its future dropped), with when.
    stopped: Mutex<Vec<Instant>>,
}

impl Log {
    fn last(&self) -> (Option<String>, Option<f64>) {
        self.entries
            .lock()
            .expect("not poisoned")
            .last()
            .cloned()
            .unwrap_or_default()
    }

    fn entered(&self) -> usize {
        self.entries.lock().expect("not poisoned").len()
    }

    fn stopped_at(&self) -> Option<Instant> {
        self.stopped.lock().expect("not poisoned").last().copied()
    }

    /// Waits (at most `within`) until the work entered last completed or
    /// stopped; whether it stopped.
    async fn settle(&self, completed_before: u64, stopped_before: usize, within: Duration) -> bool {
        let end = Instant::now() + within;
        loop {
            let stopped = self.stopped.lock().expect("not poisoned").len() > stopped_before;
            if stopped {
                return true;
            }
            if self.completed.load(Ordering::Relaxed) > completed_before || Instant::now() >= end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn marks(&self) -> (u64, usize) {
        (
            self.completed.load(Ordering::Relaxed),
            self.stopped.lock().expect("not poisoned").len(),
        )
    }
}

/// Notes work dropped before its end.
struct Working<'a> {
    log: &'a Log,
    done: bool,
}

impl Drop for Working<'_> {
    fn drop(&mut self) {
        if self.done {
            self.log.completed.fetch_add(1, Ordering::Relaxed);
        } else {
            self.log
                .stopped
                .lock()
                .expect("not poisoned")
                .push(Instant::now());
        }
    }
}

/// How a hop calls the next one.
#[derive(Debug, Clone)]
enum Next {
    Grpc(GrpcClient),
    Tonic(Box<ProbeClient<Layered>>),
}

/// A probe service: logs what arrived, works, calls the next hop if any.
#[derive(Debug, Clone)]
struct Hop {
    work: Duration,
    next: Option<Next>,
    log: Arc<Log>,
}

/// A request that only opens the connection: no work, no next call.
const WARM: &str = "warm";

type ReplyStream = Pin<Box<dyn Stream<Item = Result<CallReply, Status>> + Send>>;

#[tonic::async_trait]
impl Probe for Hop {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        let request = request_entry(&self.log, request);
        if request.payload == WARM {
            return Ok(Response::new(CallReply::default()));
        }
        let mut working = Working {
            log: &self.log,
            done: false,
        };
        tokio::time::sleep(self.work).await;
        let reply =
            match &self.next {
                None => CallReply::default(),
                Some(Next::Tonic(client)) => (**client).clone().call(request).await?.into_inner(),
                Some(Next::Grpc(client)) => client
                    .call(&request, CallOptions::new())
                    .await
                    .map_err(|(code, message)| {
                        let code = tonic_deadline::Code::from_name(code)
                            .map_or(tonic::Code::Unknown, |c| tonic::Code::from_i32(c as i32));
                        Status::new(code, message)
                    })?,
            };
        working.done = true;
        Ok(Response::new(reply))
    }

    type WatchStream = ReplyStream;

    async fn watch(&self, _: Request<CallRequest>) -> Result<Response<ReplyStream>, Status> {
        Err(Status::unimplemented("not served here"))
    }

    type ChatStream = ReplyStream;

    async fn chat(
        &self,
        _: Request<Streaming<CallRequest>>,
    ) -> Result<Response<ReplyStream>, Status> {
        Err(Status::unimplemented("not served here"))
    }
}

fn request_entry(log: &Log, request: Request<CallRequest>) -> CallRequest {
    let header = request
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let remaining = Scope::try_current()
        .and_then(|s| s.remaining())
        .map(|d| (d.as_secs_f64() * 10_000.0).round() / 10.0);
    let request = request.into_inner();
    if request.payload != WARM {
        log.entries
            .lock()
            .expect("not poisoned")
            .push((header, remaining));
    }
    request
}

/// Serves `hop` behind our server layer on a loopback port. Like
/// `experiment chain`, its hops keep nothing for a ledger's answer, so the
/// budgets they report are what the header gave them.
async fn serve(hop: Hop) -> anyhow::Result<SocketAddr> {
    net::serve(
        "127.0.0.1:0",
        Routes::new(ProbeServer::new(hop)),
        Some(ServerDeadlineLayer::new().reply_reserve(Duration::ZERO)),
    )
    .await
}

/// The client under test, calling the first server.
enum Client {
    Grpc(GrpcClient),
    Tonic(Box<ProbeClient<Layered>>),
}

impl Client {
    async fn to(addr: SocketAddr, which: &str) -> anyhow::Result<Client> {
        let client = match which {
            "tonic + ours" => Client::Tonic(Box::new(layered_client(addr).await?)),
            _ => Client::Grpc(GrpcClient::named(addr, which)?),
        };
        // The connection is opened before anything is measured.
        let warm = CallRequest {
            payload: WARM.to_owned(),
            ..CallRequest::default()
        };
        match &client {
            Client::Tonic(_) => {}
            Client::Grpc(c) => {
                without_deadline(c.call(&warm, CallOptions::new()))
                    .await
                    .map_err(|(code, m)| {
                        anyhow::anyhow!("warming the grpc crate's channel: {code} {m}")
                    })?;
            }
        }
        Ok(client)
    }

    /// A call with a per-call deadline `timeout` (the crate's
    /// `set_deadline`, tonic's `set_timeout`) under `scope`.
    async fn call(&self, scope: &Scope, timeout: Option<Duration>) -> &'static str {
        match self {
            Client::Grpc(c) => {
                let options = timeout.map_or_else(CallOptions::new, options_in);
                match scope.enter(c.call(&CallRequest::default(), options)).await {
                    Ok(_) => "OK",
                    Err((code, _)) => code,
                }
            }
            Client::Tonic(c) => {
                let mut request = Request::new(CallRequest::default());
                if let Some(timeout) = timeout {
                    request.set_timeout(timeout);
                }
                status_name(&scope.enter((**c).clone().call(request)).await)
            }
        }
    }
}

/// A chain A → B → C whose two inner calls are made by `which`.
async fn chain(
    which: &str,
    works: [Duration; 3],
) -> anyhow::Result<([Arc<Log>; 3], SocketAddr, Vec<GrpcClient>)> {
    let logs = [(); 3].map(|()| Arc::new(Log::default()));
    let c = serve(Hop {
        work: works[2],
        next: None,
        log: logs[2].clone(),
    })
    .await?;
    let mut kept = Vec::new();
    let mut next_to = async |addr: SocketAddr| -> anyhow::Result<Next> {
        Ok(match which {
            "tonic + ours" => Next::Tonic(Box::new(ProbeClient::new(
                net::connect_layered(addr).await?,
            ))),
            _ => {
                let client = GrpcClient::named(addr, which)?;
                let warm = CallRequest {
                    payload: WARM.to_owned(),
                    ..CallRequest::default()
                };
                without_deadline(client.call(&warm, CallOptions::new()))
                    .await
                    .map_err(|(code, m)| {
                        anyhow::anyhow!("warming the grpc crate's channel: {code} {m}")
                    })?;
                kept.push(client.clone());
                Next::Grpc(client)
            }
        })
    };
    let b = serve(Hop {
        work: works[1],
        next: Some(next_to(c).await?),
        log: logs[1].clone(),
    })
    .await?;
    let a = serve(Hop {
        work: works[0],
        next: Some(next_to(b).await?),
        log: logs[0].clone(),
    })
    .await?;
    Ok((logs, a, kept))
}

async fn deadline_case(which: &str) -> anyhow::Result<Row> {
    let log = Arc::new(Log::default());
    let addr = serve(Hop {
        work: SERVER_WORK,
        next: None,
        log: log.clone(),
    })
    .await?;
    let client = Client::to(addr, which).await?;
    let (completed, stopped) = log.marks();
    let started = Instant::now();
    let status = client.call(&Scope::background(), Some(DEADLINE)).await;
    let elapsed = started.elapsed();
    let server_work_stopped = log.settle(completed, stopped, SERVER_WORK * 2).await;
    Ok(Row {
        client: which.to_owned(),
        case: CASES[0].to_owned(),
        grpc_timeout_on_wire: log.last().0,
        status: status.to_owned(),
        elapsed_ms: ms(elapsed),
        server_work_stopped,
        remaining_ms_on_entry: None,
        stopped_after_cancel_ms: None,
    })
}

/// The root's client to the first hop of a chain, its connection opened by
/// a call A answers at once without calling on.
///
/// Not `layered_client`'s warm-up, a whole call down the chain: over the
/// grpc crate's own transport (no `TCP_NODELAY`) a call's first DATA waits
/// for the server to acknowledge its HEADERS, which Linux delays up to
/// 40 ms while the connection is interactive — the server answered its
/// last request within that time, as a service under steady traffic does.
/// A warm-up whose hops work 100 ms before answering leaves the chain's
/// connections quiet (the delayed ACK fired, and no answer came quickly
/// since), so the measured call would travel as on no busy connection.
/// After `WARM`, which every hop answered at once, it travels as a user's
/// call does.
async fn root_client(a: SocketAddr) -> anyhow::Result<Client> {
    let mut client = ProbeClient::new(net::connect_layered(a).await?);
    let warm = CallRequest {
        payload: WARM.to_owned(),
        ..CallRequest::default()
    };
    without_deadline(client.call(warm)).await?;
    Ok(Client::Tonic(Box::new(client)))
}

async fn chain_case(which: &str) -> anyhow::Result<Row> {
    let (logs, a, _) = chain(which, [HOP; 3]).await?;
    let client = root_client(a).await?;
    let (completed, stopped) = logs[2].marks();
    let scope = Scope::background().with_timeout(CHAIN_BUDGET);
    let started = Instant::now();
    let status = client.call(&scope, None).await;
    let elapsed = started.elapsed();
    let server_work_stopped = logs[2].settle(completed, stopped, CHAIN_BUDGET).await;
    Ok(Row {
        client: which.to_owned(),
        case: CASES[1].to_owned(),
        grpc_timeout_on_wire: logs[2].last().0,
        status: status.to_owned(),
        elapsed_ms: ms(elapsed),
        server_work_stopped,
        remaining_ms_on_entry: Some(logs.iter().map(|l| l.last().1).collect()),
        stopped_after_cancel_ms: None,
    })
}

async fn cancel_case(which: &str) -> anyhow::Result<(Row, u64)> {
    let (logs, a, grpc) = chain(which, [Duration::ZERO, Duration::ZERO, CANCEL_WORK]).await?;
    let client = root_client(a).await?;
    let (completed, stopped) = logs[2].marks();
    let entered = logs[2].entered();
    let scope = Scope::background().with_timeout(CANCEL_BUDGET);
    let started = Instant::now();
    let call = client.call(&scope, None);
    let cancel = async {
        // The root gives up once C is working.
        while logs[2].entered() == entered && started.elapsed() < CANCEL_BUDGET {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(CANCEL_AFTER).await;
        let at = Instant::now();
        scope.cancel();
        at
    };
    let (status, cancelled_at) = tokio::join!(call, cancel);
    let elapsed = started.elapsed();
    let server_work_stopped = logs[2].settle(completed, stopped, CANCEL_WORK * 2).await;
    let stopped_after = server_work_stopped
        .then(|| logs[2].stopped_at())
        .flatten()
        .map(|at| ms(at.saturating_duration_since(cancelled_at)));
    let row = Row {
        client: which.to_owned(),
        case: CASES[2].to_owned(),
        grpc_timeout_on_wire: logs[2].last().0,
        status: status.to_owned(),
        elapsed_ms: ms(elapsed),
        server_work_stopped,
        remaining_ms_on_entry: Some(logs.iter().map(|l| l.last().1).collect()),
        stopped_after_cancel_ms: stopped_after,
    };
    Ok((row, grpc.iter().map(GrpcClient::cancels_not_reset).sum()))
}

/// Runs every client in every case.
///
/// # Errors
///
/// When a server cannot be started or a channel warmed.
pub async fn measure() -> anyhow::Result<GrpcCrate> {
    // The clients side by side, each on servers of its own: each case
    // mostly waits (2 s of work, 100 ms hops).
    let clients = futures_util::future::try_join_all(CLIENTS.map(|which| async move {
        let deadline = deadline_case(which).await?;
        let chain = chain_case(which).await?;
        let (cancel, not_reset) = cancel_case(which).await?;
        anyhow::Ok(([deadline, chain, cancel], not_reset))
    }))
    .await?;
    let mut rows = Vec::new();
    let mut cancels_not_reset = 0;
    for (three, not_reset) in clients {
        rows.extend(three);
        cancels_not_reset += not_reset;
    }
    Ok(GrpcCrate {
        rows,
        cancels_not_reset,
    })
}

fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "—".to_owned(), |v| v.to_string())
}

impl Experiment for GrpcCrate {
    const NAME: &'static str = "grpc-crate";
    const LIGHT: bool = true;
    const ABOUT: &'static str =
        "The official grpc crate alone, with our interceptor, and tonic with our layers";
    const PRINTS: &'static str =
        "the official `grpc` crate (0.9) alone, with our interceptor, and tonic with our layers: `grpc-timeout` on the wire, status and time of a 500 ms deadline on 2 s of work, the chain's budgets, a cancel at the root ([guide](grpc-crate.md))";
    type Args = NoArgs;

    async fn run(_: NoArgs, _: Spans) -> anyhow::Result<Self> {
        measure().await
    }

    fn outcome(&self) -> Outcome {
        let mut rows = Vec::new();
        for case in CASES {
            for row in self.rows.iter().filter(|r| r.case == case) {
                let budgets = row.remaining_ms_on_entry.as_ref().map(|hops| {
                    hops.iter()
                        .map(|h| or_dash(h.map(|ms| format!("{ms:.1}"))))
                        .collect::<Vec<_>>()
                        .join(" → ")
                });
                let stopped = match (row.server_work_stopped, row.stopped_after_cancel_ms) {
                    (true, Some(after)) => format!("yes, {after:.0} ms after the cancel"),
                    (true, None) => "yes".to_owned(),
                    (false, _) => "no, ran to its end".to_owned(),
                };
                rows.push(vec![
                    row.case.clone(),
                    row.client.clone(),
                    or_dash(row.grpc_timeout_on_wire.clone()),
                    row.status.clone(),
                    format!("{:.0}", row.elapsed_ms),
                    stopped,
                    or_dash(budgets),
                ]);
            }
        }
        Outcome {
            title: "grpc crate 0.9: alone, with our interceptor, beside tonic with our layers"
                .to_owned(),
            json: crate::report::to_json(self),
            columns: vec![
                "case",
                "client",
                "grpc-timeout on the wire",
                "status",
                "elapsed ms",
                "server work stopped",
                "ms on entry A → B → C",
            ],
            rows,
            notes: vec![
                "Every server is tonic behind our server layer; only the client differs. In the \
                 chains A and B are such servers whose handlers call on through the client named."
                    .to_owned(),
                format!(
                    "Cancels our interceptor could not carry to the server (grpc 0.9's own \
                     transport resets a call's stream only after the server's response headers; \
                     over tonic's transport, TonicInvoke, every dropped call is reset): {}",
                    self.cancels_not_reset
                ),
            ],
        }
    }
}
