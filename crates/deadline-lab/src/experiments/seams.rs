//! Every way real code moves work or makes a call, on real sockets: does the
//! next hop get the right budget, and is it stopped when the client gives
//! up — and when it does not, did the library say so?
//!
//! Each row: a client with a 200 ms budget calls A; A's handler calls B in
//! the row's way; B works 400 ms (ignoring its scope: the server layer must
//! stop it). What B saw on entry, when B's scope ended, and what the library
//! logged or counted are the row.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use http::{Request, Response};
use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use testkit::{CallReply, CallRequest};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tonic::Status;
use tonic::body::Body;
use tonic::transport::Server;
use tonic_deadline::client::{ReadyChannel, Unscoped, capture_scope};
use tonic_deadline::observe::Metrics;
use tonic_deadline::{Cause, ClientDeadlineLayer, JoinSet, Scope, ServerDeadlineLayer};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceBuilder, ServiceExt};

use crate::net;
use crate::registry::{Experiment, NoArgs, Spans};
use crate::report::{Outcome, code_name, ms};

/// The client's budget.
pub const BUDGET: Duration = Duration::from_millis(200);
/// What B works for: far beyond the budget.
pub const SLOW: Duration = Duration::from_millis(400);
/// How long a slow peer takes to accept a connection.
pub const CONNECT: Duration = Duration::from_millis(100);

/// One way of making the call, measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// How A's handler calls B.
    pub way: String,
    /// B's remaining budget on entry; `None` when B got no deadline (or was
    /// never reached).
    pub next_hop_remaining_ms: Option<f64>,
    /// B's deadline minus the client's: what B was told beyond what the
    /// client had. `None` without a deadline.
    pub excess_ms: Option<f64>,
    /// What the client got.
    pub client_status: String,
    /// When the client got it, after the call began.
    pub client_ms: f64,
    /// When B's scope ended, after the call began (`None`: B never ran).
    pub next_hop_stopped_ms: Option<f64>,
    /// Why B's scope ended.
    pub next_hop_cause: Option<String>,
    /// Whether B worked its full time (nothing stopped it).
    pub next_hop_completed: bool,
    /// Whether the client layer logged or counted the break.
    pub reported: bool,
    /// Every warning the library logged during the row.
    pub said: Vec<String>,
}

/// The experiment's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Seams {
    /// The client's budget.
    pub budget_ms: u64,
    /// What B works for.
    pub next_hop_work_ms: u64,
    /// One row per way.
    pub rows: Vec<Row>,
}

// ---------------------------------------------------------------------------
// B: records what it saw and when its scope ended.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct Entry {
    deadline: Option<Instant>,
    remaining: Option<Duration>,
    ended: Option<(Instant, Cause)>,
    completed: bool,
}

#[derive(Debug, Clone, Default)]
struct Sink {
    entries: Arc<Mutex<Vec<Entry>>>,
}

impl Sink {
    fn last(&self) -> Option<Entry> {
        self.entries.lock().ok().and_then(|e| e.last().copied())
    }

    fn clear(&self) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.clear();
        }
    }
}

#[tonic::async_trait]
impl testkit::CallOnly for Sink {
    async fn call(
        &self,
        _: tonic::Request<CallRequest>,
    ) -> Result<tonic::Response<CallReply>, Status> {
        let scope = Scope::current();
        let index = {
            let mut entries = self
                .entries
                .lock()
                .map_err(|_| Status::internal("poisoned"))?;
            entries.push(Entry {
                deadline: scope.deadline(),
                remaining: scope.remaining(),
                ended: None,
                completed: false,
            });
            entries.len() - 1
        };
        let entries = self.entries.clone();
        scope.on_end(move |cause| async move {
            if let Ok(mut entries) = entries.lock() {
                entries[index].ended = Some((Instant::now(), cause));
            }
        });
        tokio::time::sleep(SLOW).await;
        if let Ok(mut entries) = self.entries.lock() {
            entries[index].completed = true;
        }
        Ok(tonic::Response::new(CallReply::default()))
    }
}

/// B, serving on `listener` until `stop` fires (then its connections close).
fn serve_sink(sink: Sink, listener: TcpListener) -> net::Stop {
    let (stop, stopped) = net::Stop::new();
    tonic_deadline::detach(
        Server::builder()
            // What the header gives each hop, exactly: no reserve kept for
            // the ledger's answer.
            .layer(ServerDeadlineLayer::new().reply_reserve(Duration::ZERO))
            .add_service(ProbeServer::new(sink))
            .serve_with_incoming_shutdown(net::Incoming::new(listener), stopped),
    );
    stop
}

// ---------------------------------------------------------------------------
// A: calls B in one of the ways real code does.
// ---------------------------------------------------------------------------

/// The error is a `Status`: a boxed error as the transport error of a
/// generated client trips the proof that the call's future is `Send`.
type Stack = BoxCloneSyncService<Request<Body>, Response<Body>, Status>;
type Next = ProbeClient<Stack>;

fn boxed<S, RB>(stack: S) -> Next
where
    S: tower::Service<Request<Body>, Response = Response<RB>> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<tonic_deadline::BoxError>,
    RB: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    RB::Error: Into<tonic_deadline::BoxError>,
{
    ProbeClient::new(BoxCloneSyncService::new(
        stack
            .map_response(|r: Response<RB>| r.map(Body::new))
            .map_err(|e: S::Error| Status::from_error(e.into())),
    ))
}

/// How A's handler makes the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Direct,
    TokioSpawn,
    TokioJoinSet,
    TokioSpawnBlocking,
    ScopedSpawn,
    ScopedJoinSet,
    ScopedSpawnBlocking,
    JoinAll,
    FuturesUnordered,
}

type Called = Pin<Box<dyn Future<Output = Result<CallReply, Status>> + Send>>;

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

impl Call {
    fn call(self, next: &Next) -> Called {
        let mut next = next.clone();
        let one = async move {
            next.call(CallRequest::default())
                .await
                .map(tonic::Response::into_inner)
        };
        match self {
            Call::Direct => Box::pin(one),
            // The breaks shown here are the point of the rows.
            #[allow(clippy::disallowed_methods)]
            Call::TokioSpawn => Box::pin(async move { tokio::spawn(one).await.map_err(internal)? }),
            #[allow(clippy::disallowed_methods)]
            Call::TokioJoinSet => Box::pin(async move {
                let mut set = tokio::task::JoinSet::new();
                set.spawn(one);
                match set.join_next().await {
                    Some(joined) => joined.map_err(internal)?,
                    None => Err(internal("no task")),
                }
            }),
            #[allow(clippy::disallowed_methods)]
            Call::TokioSpawnBlocking => Box::pin(async move {
                let runtime = tokio::runtime::Handle::current();
                tokio::task::spawn_blocking(move || runtime.block_on(one))
                    .await
                    .map_err(internal)?
            }),
            Call::ScopedSpawn => {
                Box::pin(async move { tonic_deadline::spawn(one).await.map_err(internal)?? })
            }
            Call::ScopedJoinSet => Box::pin(async move {
                let mut set = JoinSet::new();
                set.spawn(one);
                match set.join_next().await {
                    Some(joined) => joined.map_err(internal)??,
                    None => Err(internal("no task")),
                }
            }),
            Call::ScopedSpawnBlocking => Box::pin(async move {
                let runtime = tokio::runtime::Handle::current();
                let scope = Scope::current();
                scope
                    .spawn_blocking(move |scope| runtime.block_on(scope.enter(one)))
                    .await?
            }),
            Call::JoinAll => {
                Box::pin(async move { futures_util::future::join(one, async {}).await.0 })
            }
            Call::FuturesUnordered => Box::pin(async move {
                let mut all: FuturesUnordered<_> = [one].into_iter().collect();
                all.next().await.unwrap_or_else(|| Err(internal("no call")))
            }),
        }
    }
}

#[derive(Clone)]
struct Relay {
    call: Call,
    next: Next,
}

#[tonic::async_trait]
impl testkit::CallOnly for Relay {
    async fn call(
        &self,
        _: tonic::Request<CallRequest>,
    ) -> Result<tonic::Response<CallReply>, Status> {
        Ok(tonic::Response::new(self.call.call(&self.next).await?))
    }
}

// ---------------------------------------------------------------------------
// The client stacks A uses.
// ---------------------------------------------------------------------------

/// A TCP connector that takes [`CONNECT`] to connect, as a far peer does.
#[derive(Debug, Clone)]
struct SlowConnect;

impl tower::Service<http::Uri> for SlowConnect {
    type Response = hyper_util::rt::TokioIo<tokio::net::TcpStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        Box::pin(async move {
            tokio::time::sleep(CONNECT).await;
            let authority = uri.authority().map(ToString::to_string).unwrap_or_default();
            let tcp = tokio::net::TcpStream::connect(authority).await?;
            tcp.set_nodelay(true)?;
            Ok(hyper_util::rt::TokioIo::new(tcp))
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// ClientDeadlineLayer over a connected ReadyChannel.
    Layer,
    /// The same, refusing unscoped calls.
    Deny,
    /// A tower Buffer above the layer.
    BufferAbove,
    /// A Buffer above the layer, with the scope captured first.
    BufferAboveCaptured,
    /// A Buffer below the layer.
    BufferBelow,
    /// A ReadyChannel over a connector that takes 100 ms, not yet connected.
    LazyReady,
    /// A plain tonic Channel over the same connector.
    LazyPlain,
}

async fn build(stack: Via, addr: SocketAddr, metrics: &Metrics) -> anyhow::Result<Next> {
    let layer = ClientDeadlineLayer::new().metrics(metrics);
    let endpoint = net::endpoint(addr)?;
    Ok(match stack {
        Via::Layer => boxed(layer.layer(ReadyChannel::connect(&endpoint).await?)),
        Via::Deny => boxed(
            layer
                .unscoped(Unscoped::Deny)
                .layer(ReadyChannel::connect(&endpoint).await?),
        ),
        Via::BufferAbove => boxed(
            ServiceBuilder::new()
                .buffer::<Request<Body>>(16)
                .layer(layer)
                .service(ReadyChannel::connect(&endpoint).await?),
        ),
        Via::BufferAboveCaptured => boxed(
            ServiceBuilder::new()
                .layer(tonic::service::InterceptorLayer::new(capture_scope))
                .buffer::<Request<Body>>(16)
                .layer(layer)
                .service(ReadyChannel::connect(&endpoint).await?),
        ),
        Via::BufferBelow => boxed(
            ServiceBuilder::new()
                .layer(layer)
                .buffer::<Request<Body>>(16)
                .service(ReadyChannel::connect(&endpoint).await?),
        ),
        Via::LazyReady => {
            boxed(layer.layer(ReadyChannel::lazy_with_connector(&endpoint, SlowConnect)))
        }
        Via::LazyPlain => boxed(layer.layer(endpoint.connect_with_connector_lazy(SlowConnect))),
    })
}

// ---------------------------------------------------------------------------
// The rows
// ---------------------------------------------------------------------------

struct Way {
    name: &'static str,
    call: Call,
    stack: Via,
    /// Warm the connection, then restart B: the measured call reconnects.
    reconnect: bool,
}

const fn way(name: &'static str, call: Call, stack: Via) -> Way {
    Way {
        name,
        call,
        stack,
        reconnect: false,
    }
}

fn ways() -> Vec<Way> {
    vec![
        way("direct", Call::Direct, Via::Layer),
        way("tokio::spawn", Call::TokioSpawn, Via::Layer),
        way("JoinSet", Call::TokioJoinSet, Via::Layer),
        way(
            "spawn_blocking + block_on",
            Call::TokioSpawnBlocking,
            Via::Layer,
        ),
        way("tokio::spawn, Unscoped::Deny", Call::TokioSpawn, Via::Deny),
        way("tonic_deadline::spawn", Call::ScopedSpawn, Via::Layer),
        way("tonic_deadline::JoinSet", Call::ScopedJoinSet, Via::Layer),
        way(
            "Scope::spawn_blocking",
            Call::ScopedSpawnBlocking,
            Via::Layer,
        ),
        way("futures join", Call::JoinAll, Via::Layer),
        way("FuturesUnordered", Call::FuturesUnordered, Via::Layer),
        way("buffer above", Call::Direct, Via::BufferAbove),
        way(
            "buffer above + capture_scope",
            Call::Direct,
            Via::BufferAboveCaptured,
        ),
        way("buffer below", Call::Direct, Via::BufferBelow),
        way("lazy connect 100ms", Call::Direct, Via::LazyReady),
        way(
            "lazy connect 100ms, plain tonic Channel",
            Call::Direct,
            Via::LazyPlain,
        ),
        Way {
            reconnect: true,
            ..way("reconnect", Call::Direct, Via::LazyReady)
        },
        Way {
            reconnect: true,
            ..way(
                "reconnect, plain tonic Channel",
                Call::Direct,
                Via::LazyPlain,
            )
        },
    ]
}

async fn measure(way: &Way) -> anyhow::Result<Row> {
    let sink = Sink::default();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let sink_addr = listener.local_addr()?;
    let mut stop_sink = serve_sink(sink.clone(), listener);

    let warned_before = crate::logs::library_warnings().0;
    let metrics = Metrics::new();
    let next = build(way.stack, sink_addr, &metrics).await?;
    let relay = Relay {
        call: way.call,
        next: next.clone(),
    };
    let relay_addr = net::serve(
        "127.0.0.1:0",
        tonic::service::Routes::new(ProbeServer::new(relay)),
        Some(ServerDeadlineLayer::new().reply_reserve(Duration::ZERO)),
    )
    .await?;
    let mut client = ProbeClient::new(net::connect_layered(relay_addr).await?);

    if way.reconnect {
        // Connect A to B, then restart B on the same port: its connections
        // close, and the measured call has to connect again.
        Scope::background()
            .with_timeout(Duration::from_secs(5))
            .enter(next.clone().call(CallRequest::default()))
            .await?;
        stop_sink.stop();
        tokio::time::sleep(Duration::from_millis(50)).await;
        sink.clear();
        stop_sink = serve_sink(sink.clone(), TcpListener::bind(sink_addr).await?);
    }

    let scope = Scope::background().with_timeout(BUDGET);
    let client_deadline = scope.deadline().unwrap_or_else(Instant::now);
    let started = Instant::now();
    let outcome = scope.enter(client.call(CallRequest::default())).await;
    let client_ms = ms(started.elapsed());
    // Let B finish or be stopped: once its scope has ended its entry is
    // whole; a call still on its way gets B's full work, and some slack.
    let settled = started + SLOW + CONNECT + Duration::from_millis(100);
    while Instant::now() < settled && sink.last().is_none_or(|e| e.ended.is_none()) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let entry = sink.last();
    stop_sink.stop();

    let (warned_after, said) = crate::logs::library_warnings();
    let said: Vec<String> = said
        .into_iter()
        .skip(usize::try_from(warned_before).unwrap_or(usize::MAX))
        .collect();
    // A break is reported by the client layer: a count, or its warning.
    let reported = metrics.unscoped_calls() > 0
        || metrics.budgets_left_late() > 0
        || said
            .iter()
            .any(|line| line.starts_with("tonic_deadline::client"));
    let _ = warned_after;
    Ok(Row {
        way: way.name.to_owned(),
        next_hop_remaining_ms: entry.and_then(|e| e.remaining).map(ms),
        excess_ms: entry.and_then(|e| e.deadline).map(|d| {
            if d >= client_deadline {
                ms(d - client_deadline)
            } else {
                -ms(client_deadline - d)
            }
        }),
        client_status: match &outcome {
            Ok(_) => "OK".to_owned(),
            Err(status) => code_name(status.code()).to_owned(),
        },
        client_ms,
        next_hop_stopped_ms: entry
            .and_then(|e| e.ended)
            .map(|(at, _)| ms(at.saturating_duration_since(started))),
        next_hop_cause: entry
            .and_then(|e| e.ended)
            .map(|(_, cause)| cause.to_string()),
        next_hop_completed: entry.is_some_and(|e| e.completed),
        reported,
        said,
    })
}

/// Runs every row.
///
/// # Errors
///
/// When a server cannot be started.
pub async fn measure_all() -> anyhow::Result<Seams> {
    crate::logs::install();
    let mut rows = Vec::new();
    for way in ways() {
        rows.push(measure(&way).await?);
    }
    Ok(Seams {
        budget_ms: BUDGET.as_millis() as u64,
        next_hop_work_ms: SLOW.as_millis() as u64,
        rows,
    })
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "—".to_owned(), |v| format!("{v:.1}"))
}

impl Experiment for Seams {
    const NAME: &'static str = "seams";
    const LIGHT: bool = true;
    const ABOUT: &'static str =
        "Every way code moves work or makes a call: budget kept, or the break reported";
    const PRINTS: &'static str =
        "17 ways a handler calls the next hop (spawned tasks, JoinSets, blocking threads, Buffers, lazy and reconnecting channels): the budget the next hop got, when it stopped, and whether a break was reported";
    type Args = NoArgs;

    async fn run(_: NoArgs, _: Spans) -> anyhow::Result<Self> {
        measure_all().await
    }

    fn outcome(&self) -> Outcome {
        let rows = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.way.clone(),
                    opt(r.next_hop_remaining_ms),
                    opt(r.excess_ms),
                    r.client_status.clone(),
                    format!("{:.1}", r.client_ms),
                    match (r.next_hop_stopped_ms, r.next_hop_completed) {
                        (_, true) => "worked on to the end".to_owned(),
                        (Some(at), false) => format!("stopped at {at:.1}"),
                        (None, false) => "never reached".to_owned(),
                    },
                    if r.reported { "yes" } else { "no" }.to_owned(),
                ]
            })
            .collect();
        Outcome {
            title: format!(
                "seams: {} ms client budget, the next hop works {} ms; does the call carry the budget, and is a break reported?",
                self.budget_ms, self.next_hop_work_ms
            ),
            json: crate::report::to_json(self),
            columns: vec![
                "way",
                "next hop remaining ms",
                "excess ms",
                "client status",
                "client ms",
                "next hop",
                "reported",
            ],
            rows,
            notes: vec![
                "excess: the next hop's deadline minus the client's (what it was told beyond what the client had)".into(),
                "a row with no budget at the next hop must be reported (a WARN naming the fix, and a count)".into(),
            ],
        }
    }
}
