//! Every way real code moves work or makes a call: the outbound call either
//! carries the right budget and cancellation, or the library says so —
//! never silently. Real tonic servers on loopback.

use crate::common;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Event, Events, Node, PATIENCE, channel, code, connect, loopback, serve, serve_on};
use futures_util::stream::{FuturesUnordered, StreamExt};
use http::{Request, Response};
use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use testkit::{CallReply, CallRequest};
use tokio::time::Instant;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Status;
use tonic::body::Body;
use tonic::transport::{Endpoint, Server};
use tonic_deadline::client::{ReadyChannel, Unscoped, capture_scope};
use tonic_deadline::observe::Metrics;
use tonic_deadline::{BoxError, Cause, ClientDeadlineLayer, JoinSet, Scope, ServerDeadlineLayer};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceBuilder, ServiceExt};

/// The client's budget in these tests: short, so broken chains show.
const BUDGET: Duration = Duration::from_millis(300);
/// What the next hop works for: far beyond the budget.
const SLOW: Duration = Duration::from_secs(1);
/// Loopback transit under a loaded test run (debug build, tests in
/// parallel on two cores): what a hop may see beyond its caller's deadline
/// without anything being wrong. Generous on purpose (a busy machine can
/// hold a ready task back for tens of milliseconds); the slow connects
/// below take twice as long, so a lost connect time cannot hide in it.
const TRANSIT: Duration = Duration::from_millis(100);
/// How long the slow connector takes.
const CONNECT: Duration = Duration::from_millis(200);

// ---------------------------------------------------------------------------
// A relay that calls the next hop in one of the ways real code does.
// ---------------------------------------------------------------------------

// The error is a `Status`, not a `BoxError`: a boxed trait object as the
// error of a generated client's transport trips the compiler's proof that
// the call's future is `Send`.
type Stack = BoxCloneSyncService<Request<Body>, Response<Body>, Status>;
type Next = ProbeClient<Stack>;

/// Boxes any client stack whose body tonic can read.
fn boxed<S, RB>(stack: S) -> Next
where
    S: tower::Service<Request<Body>, Response = Response<RB>> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    RB: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    ProbeClient::new(BoxCloneSyncService::new(
        stack
            .map_response(|r: Response<RB>| r.map(Body::new))
            .map_err(|e: S::Error| Status::from_error(e.into())),
    ))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Direct,
    TokioSpawn,
    TokioJoinSet,
    ScopedSpawn,
    ScopedJoinSet,
    JoinAll,
    FuturesUnordered,
}

type Called = Pin<Box<dyn Future<Output = Result<CallReply, Status>> + Send>>;

impl Way {
    /// Calls `next` from inside a handler, this way.
    fn call(self, next: &Next, request: CallRequest) -> Called {
        let mut next = next.clone();
        let one = async move { next.call(request).await.map(tonic::Response::into_inner) };
        match self {
            Way::Direct => Box::pin(one),
            #[allow(clippy::disallowed_methods)] // the break under test
            Way::TokioSpawn => Box::pin(async move {
                tokio::spawn(one)
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?
            }),
            #[allow(clippy::disallowed_methods)] // the break under test
            Way::TokioJoinSet => Box::pin(async move {
                let mut set = tokio::task::JoinSet::new();
                set.spawn(one);
                joined(set.join_next().await)
            }),
            Way::ScopedSpawn => Box::pin(async move {
                let task = tonic_deadline::spawn(one).await;
                task.map_err(|e| Status::internal(e.to_string()))??
            }),
            Way::ScopedJoinSet => Box::pin(async move {
                let mut set = JoinSet::new();
                set.spawn(one);
                let joined = set.join_next().await.expect("one task was spawned");
                joined.map_err(|e| Status::internal(e.to_string()))??
            }),
            Way::JoinAll => Box::pin(async move {
                let (reply, ()) = futures_util::future::join(one, async {}).await;
                reply
            }),
            Way::FuturesUnordered => Box::pin(async move {
                let mut all: FuturesUnordered<_> = [one].into_iter().collect();
                all.next().await.expect("one call was pushed")
            }),
        }
    }
}

fn joined<T>(
    joined: Option<Result<Result<T, Status>, tokio::task::JoinError>>,
) -> Result<T, Status> {
    joined
        .expect("one task was spawned")
        .map_err(|e| Status::internal(e.to_string()))?
}

#[derive(Clone)]
struct Relay {
    way: Way,
    next: Next,
}

#[tonic::async_trait]
impl testkit::CallOnly for Relay {
    async fn call(
        &self,
        request: tonic::Request<CallRequest>,
    ) -> Result<tonic::Response<CallReply>, Status> {
        let reply = self.way.call(&self.next, request.into_inner()).await?;
        Ok(tonic::Response::new(reply))
    }
}

async fn serve_relay(layer: ServerDeadlineLayer, relay: Relay) -> SocketAddr {
    let (listener, addr) = loopback().await;
    #[allow(clippy::disallowed_methods)] // the server outlives every request
    tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(ProbeServer::new(relay))
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .expect("the relay must keep serving");
    });
    addr
}

/// What one call through client → relay → next hop showed.
#[derive(Debug)]
struct Seen {
    /// The next hop's scope on entry.
    next_hop: Scope,
    /// The client's own deadline.
    client_deadline: Instant,
    outcome: Result<CallReply, Status>,
    /// Whether the next hop worked its full second (the chain was broken).
    next_hop_completed: bool,
}

impl Seen {
    /// How much later than the client's the next hop's deadline is; `None`
    /// when it has none.
    fn excess(&self) -> Option<Duration> {
        self.next_hop
            .deadline()
            .map(|d| d.saturating_duration_since(self.client_deadline))
    }
}

/// Runs one call with a 300 ms budget from a client to a relay calling the
/// next hop (which works 1 s) through `stack`, `way`.
async fn through(way: Way, stack: impl AsyncFnOnce(SocketAddr) -> Next) -> Seen {
    let (mut events, tx) = Events::new();
    let sink = serve(
        ServerDeadlineLayer::new(),
        Node::new("B", &tx).working(SLOW),
    )
    .await;
    let relay = serve_relay(
        ServerDeadlineLayer::new(),
        Relay {
            way,
            next: stack(sink).await,
        },
    )
    .await;
    let mut client = connect(relay).await;
    let scope = Scope::background().with_timeout(BUDGET);
    let client_deadline = scope.deadline().expect("a budget is a deadline");
    let outcome = scope
        .enter(client.call(CallRequest::default()))
        .await
        .map(tonic::Response::into_inner);
    let next_hop = events.entered("B").await;
    let next_hop_completed = events.exited("B").await;
    Seen {
        next_hop,
        client_deadline,
        outcome,
        next_hop_completed,
    }
}

/// A channel to `addr` that connects on first use, with the connect time
/// counted in the budget (see the lazy-channel tests below).
fn lazy(addr: SocketAddr) -> ReadyChannel {
    ReadyChannel::lazy(
        &Endpoint::from_shared(format!("http://{addr}"))
            .expect("a loopback address is a valid URI")
            .tcp_nodelay(true),
    )
}

/// A channel to `addr`, connected before it is returned.
async fn connected(addr: SocketAddr) -> ReadyChannel {
    ReadyChannel::connect(
        &Endpoint::from_shared(format!("http://{addr}"))
            .expect("a loopback address is a valid URI")
            .tcp_nodelay(true),
    )
    .await
    .expect("the test server must accept a connection")
}

async fn layered(addr: SocketAddr, layer: ClientDeadlineLayer) -> Next {
    boxed(layer.layer(channel(addr).await))
}

fn assert_kept(way: &str, seen: &Seen) {
    let excess = seen
        .excess()
        .unwrap_or_else(|| panic!("{way}: the next hop must receive a deadline"));
    assert!(
        excess < TRANSIT,
        "{way}: the next hop must not get more than the client had (+{excess:?})"
    );
    assert_eq!(
        code(&seen.outcome),
        tonic::Code::DeadlineExceeded,
        "{way}: the client must get DEADLINE_EXCEEDED"
    );
    assert!(
        !seen.next_hop_completed,
        "{way}: the next hop must be stopped with its caller"
    );
}

// ---------------------------------------------------------------------------
// Spawned tasks
// ---------------------------------------------------------------------------

#[tokio::test]
async fn tokio_spawn_in_a_handler_loses_the_scope_and_is_counted_and_warned() {
    testkit::logs::capture();
    let metrics = Metrics::new();
    let layer = ClientDeadlineLayer::new().metrics(&metrics);
    let seen = through(Way::TokioSpawn, async |addr| boxed(layer.layer(lazy(addr)))).await;
    assert_eq!(
        seen.next_hop.deadline(),
        None,
        "a call from tokio::spawn reaches the next hop without a deadline"
    );
    assert!(
        seen.next_hop_completed,
        "and nothing stops the next hop: it works its full second"
    );
    assert_eq!(code(&seen.outcome), tonic::Code::DeadlineExceeded);
    assert_eq!(
        metrics.unscoped_calls(),
        1,
        "the lost scope must be counted"
    );
    let warned = testkit::logs::warnings_about("/probe.v1.Probe/Call");
    assert!(
        warned
            .iter()
            .any(|w| w.contains("without a scope") && w.contains("tonic_deadline::spawn")),
        "the lost scope must be logged as a WARN naming the method and the fix: {warned:?}"
    );
}

#[tokio::test]
async fn tokio_join_set_in_a_handler_loses_the_scope_and_is_counted() {
    let metrics = Metrics::new();
    let layer = ClientDeadlineLayer::new().metrics(&metrics);
    let seen = through(Way::TokioJoinSet, async |addr| {
        boxed(layer.layer(lazy(addr)))
    })
    .await;
    assert_eq!(seen.next_hop.deadline(), None);
    assert_eq!(
        metrics.unscoped_calls(),
        1,
        "the lost scope must be counted"
    );
}

#[tokio::test]
async fn scoped_spawn_and_join_set_carry_the_budget_and_stop_with_the_request() {
    for way in [Way::ScopedSpawn, Way::ScopedJoinSet] {
        let metrics = Metrics::new();
        let layer = ClientDeadlineLayer::new().metrics(&metrics);
        let seen = through(way, async |addr| boxed(layer.layer(lazy(addr)))).await;
        assert_kept(&format!("{way:?}"), &seen);
        assert_eq!(metrics.unscoped_calls(), 0, "{way:?}: nothing was lost");
    }
}

#[tokio::test]
async fn futures_combinators_poll_in_the_handler_task_and_keep_the_budget() {
    for way in [Way::Direct, Way::JoinAll, Way::FuturesUnordered] {
        let layer = ClientDeadlineLayer::new();
        let seen = through(way, async |addr| boxed(layer.layer(lazy(addr)))).await;
        assert_kept(&format!("{way:?}"), &seen);
    }
}

#[tokio::test]
async fn unscoped_call_is_refused_under_deny_with_a_status_naming_the_fix() {
    let metrics = Metrics::new();
    let (mut events, tx) = Events::new();
    let sink = serve(ServerDeadlineLayer::new(), Node::new("B", &tx)).await;
    let strict = ClientDeadlineLayer::new()
        .unscoped(Unscoped::Deny)
        .metrics(&metrics);
    let relay = serve_relay(
        ServerDeadlineLayer::new(),
        Relay {
            way: Way::TokioSpawn,
            next: layered(sink, strict).await,
        },
    )
    .await;
    let mut client = connect(relay).await;
    let refused = Scope::background()
        .with_timeout(BUDGET)
        .enter(client.call(CallRequest::default()))
        .await
        .expect_err("an unscoped call under Deny must fail");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("tonic_deadline::spawn") && refused.message().contains("detach"),
        "the message must name the fix: {}",
        refused.message()
    );
    assert_eq!(metrics.unscoped_calls(), 1);
    assert!(
        events
            .received()
            .iter()
            .all(|e| !matches!(e, Event::Entered { hop: "B", .. })),
        "nothing may reach the next hop"
    );
}

#[tokio::test]
async fn the_unscoped_policy_is_the_clients_setting_not_the_process() {
    // Two clients in one process, calling one server: what each does with a
    // call that finds no scope is its own layer's setting, nothing else.
    testkit::logs::capture();
    let (_events, tx) = Events::new();
    let sink = serve(ServerDeadlineLayer::new(), Node::new("B", &tx)).await;
    let reported = Metrics::new();
    let mut default = layered(sink, ClientDeadlineLayer::new().metrics(&reported)).await;
    default
        .call(CallRequest::default())
        .await
        .expect("an unscoped call goes out under the default policy");
    assert_eq!(reported.unscoped_calls(), 1, "the default counts it");
    assert!(
        testkit::logs::warnings_about("without a scope")
            .iter()
            .any(|w| w.contains("/Call")),
        "and warns, naming the method"
    );
    Scope::background()
        .enter(default.call(CallRequest::default()))
        .await
        .expect("a call in an explicit scope without a deadline goes out");
    assert_eq!(
        reported.unscoped_calls(),
        1,
        "a call entered in Scope::background() chose to have no deadline: not reported"
    );

    let quiet_metrics = Metrics::new();
    let mut quiet = layered(
        sink,
        ClientDeadlineLayer::new()
            .unscoped(Unscoped::Allow)
            .metrics(&quiet_metrics),
    )
    .await;
    quiet
        .call(CallRequest::default())
        .await
        .expect("an allowed unscoped call goes out");
    assert_eq!(quiet_metrics.unscoped_calls(), 0, "Allow reports nothing");
}

// ---------------------------------------------------------------------------
// tower middleware around the layer
// ---------------------------------------------------------------------------

#[tokio::test]
async fn buffer_above_the_layer_loses_the_scope_and_is_reported() {
    testkit::logs::capture();
    let metrics = Metrics::new();
    let layer = ClientDeadlineLayer::new().metrics(&metrics);
    let seen = through(Way::Direct, async |addr| {
        let channel = lazy(addr);
        boxed(
            ServiceBuilder::new()
                .buffer::<Request<Body>>(16)
                .layer(layer)
                .service(channel),
        )
    })
    .await;
    assert_eq!(
        seen.next_hop.deadline(),
        None,
        "a Buffer above the layer runs `call` on its worker, outside the scope"
    );
    assert_eq!(metrics.unscoped_calls(), 1, "and the break must be counted");
    assert!(!testkit::logs::warnings_about("without a scope").is_empty());
}

#[tokio::test]
async fn buffer_above_the_layer_keeps_the_budget_when_the_scope_is_captured() {
    let metrics = Metrics::new();
    let layer = ClientDeadlineLayer::new().metrics(&metrics);
    let seen = through(Way::Direct, async |addr| {
        let channel = lazy(addr);
        boxed(
            ServiceBuilder::new()
                .layer(tonic::service::InterceptorLayer::new(capture_scope))
                .buffer::<Request<Body>>(16)
                .layer(layer)
                .service(channel),
        )
    })
    .await;
    assert_kept("capture_scope + buffer above", &seen);
    assert_eq!(metrics.unscoped_calls(), 0);
}

#[tokio::test]
async fn tower_middleware_that_keeps_the_call_on_its_task_keeps_the_budget() {
    type Build = Box<dyn FnOnce(ReadyChannel) -> Next>;
    let stacks: Vec<(&str, Build)> = vec![
        (
            "buffer below",
            Box::new(|c| {
                boxed(
                    ServiceBuilder::new()
                        .layer(ClientDeadlineLayer::new())
                        .buffer::<Request<Body>>(16)
                        .service(c),
                )
            }),
        ),
        (
            "concurrency limit above",
            Box::new(|c| {
                boxed(
                    ServiceBuilder::new()
                        .concurrency_limit(4)
                        .layer(ClientDeadlineLayer::new())
                        .service(c),
                )
            }),
        ),
        (
            "timeout above",
            Box::new(|c| {
                boxed(
                    ServiceBuilder::new()
                        .timeout(Duration::from_secs(10))
                        .layer(ClientDeadlineLayer::new())
                        .service(c),
                )
            }),
        ),
        (
            "load shed above",
            Box::new(|c| {
                boxed(
                    ServiceBuilder::new()
                        .load_shed()
                        .layer(ClientDeadlineLayer::new())
                        .service(c),
                )
            }),
        ),
        (
            "interceptor above",
            Box::new(|c| {
                boxed(
                    ServiceBuilder::new()
                        .layer(tonic::service::InterceptorLayer::new(
                            |r: tonic::Request<()>| Ok(r),
                        ))
                        .layer(ClientDeadlineLayer::new())
                        .service(c),
                )
            }),
        ),
    ];
    for (name, build) in stacks {
        // Connected first: a load shedder sheds calls while the channel
        // connects, since a ReadyChannel is not ready until then.
        let seen = through(Way::Direct, async |addr| build(connected(addr).await)).await;
        assert_kept(name, &seen);
    }
}

// ---------------------------------------------------------------------------
// Lazy and reconnecting channels
// ---------------------------------------------------------------------------

/// A TCP connector that takes `delay` to connect, as a far or busy peer does.
#[derive(Clone)]
struct SlowConnect {
    delay: Duration,
    dials: Arc<AtomicUsize>,
}

impl tower::Service<http::Uri> for SlowConnect {
    type Response = hyper_util::rt::TokioIo<tokio::net::TcpStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, std::io::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let delay = self.delay;
        self.dials.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            let authority = uri.authority().map(ToString::to_string).unwrap_or_default();
            let tcp = tokio::net::TcpStream::connect(authority).await?;
            tcp.set_nodelay(true)?;
            Ok(hyper_util::rt::TokioIo::new(tcp))
        })
    }
}

/// One call with a 1 s budget, straight to a node; how much later than the
/// client's the node's deadline was.
async fn excess_of_one_call(client: &mut Next, events: &mut Events) -> Duration {
    let scope = Scope::background().with_timeout(Duration::from_secs(1));
    let client_deadline = scope.deadline().expect("a budget is a deadline");
    scope
        .enter(client.call(CallRequest::default()))
        .await
        .expect("a 1 s budget covers the connect and the call");
    let node = events.entered("B").await;
    node.deadline()
        .expect("the node must receive a deadline")
        .saturating_duration_since(client_deadline)
}

#[tokio::test]
async fn lazy_tonic_channel_tells_the_server_the_connect_time_too_much() {
    // The baseline the ReadyChannel exists for: tonic connects after the
    // layer wrote the header.
    let (mut events, tx) = Events::new();
    let node = serve(ServerDeadlineLayer::new(), Node::new("B", &tx)).await;
    let connector = SlowConnect {
        delay: CONNECT,
        dials: Arc::default(),
    };
    let endpoint = Endpoint::from_shared(format!("http://{node}")).expect("uri");
    let metrics = Metrics::new();
    // A middleware between the layer and the Channel: what the layer sees
    // below it is not tonic's Channel type, and the report must not depend
    // on that.
    let below = ServiceBuilder::new()
        .map_request(|request: Request<Body>| request)
        .service(endpoint.connect_with_connector_lazy(connector));
    let mut client = boxed(ClientDeadlineLayer::new().metrics(&metrics).layer(below));
    let excess = excess_of_one_call(&mut client, &mut events).await;
    assert!(
        excess >= CONNECT - Duration::from_millis(10),
        "a plain lazy Channel gives the server the connect time extra ({excess:?})"
    );
    assert_eq!(
        metrics.budgets_left_late(),
        1,
        "the first call is watched, and its request left a connect after its header"
    );
}

#[tokio::test]
async fn ready_channel_counts_the_connect_time_on_first_call_and_after_reconnect() {
    let (mut events, tx) = Events::new();
    let (listener, addr) = loopback().await;
    let node = Node::new("B", &tx);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    #[allow(clippy::disallowed_methods)] // the server outlives every request
    let server = tokio::spawn(
        Server::builder()
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(node.clone()))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    let dials = Arc::new(AtomicUsize::new(0));
    let connector = SlowConnect {
        delay: CONNECT,
        dials: dials.clone(),
    };
    let endpoint = Endpoint::from_shared(format!("http://{addr}")).expect("uri");
    let channel = ReadyChannel::lazy_with_connector(&endpoint, connector);
    assert!(!channel.is_connected(), "a lazy channel starts unconnected");
    let metrics = Metrics::new();
    let mut client = boxed(
        ClientDeadlineLayer::new()
            .metrics(&metrics)
            .layer(channel.clone()),
    );

    let first = excess_of_one_call(&mut client, &mut events).await;
    assert!(
        first < TRANSIT,
        "the first call's header must count the connect (+{first:?})"
    );
    assert!(channel.is_connected());
    let steady = excess_of_one_call(&mut client, &mut events).await;
    assert!(steady < TRANSIT, "steady state (+{steady:?})");

    // The server goes away (closing its connections) and comes back on the
    // same port.
    let _ = stop.send(());
    tokio::time::timeout(PATIENCE, server)
        .await
        .expect("the server must shut down")
        .expect("the server task must not panic")
        .expect("the server must shut down cleanly");
    tokio::time::timeout(PATIENCE, async {
        while channel.is_connected() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the channel must notice its connection is gone");
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .expect("the port is free again");
    #[allow(clippy::disallowed_methods)] // the server outlives every request
    tokio::spawn(serve_on(listener, node));

    let after = excess_of_one_call(&mut client, &mut events).await;
    assert!(
        after < TRANSIT,
        "after a reconnect the header must count the connect again (+{after:?})"
    );
    assert_eq!(dials.load(Ordering::SeqCst), 2, "one dial per connection");
    assert_eq!(
        metrics.budgets_left_late(),
        0,
        "the connect is waited for before the header is written"
    );
}

#[tokio::test]
async fn ready_channel_to_nowhere_fails_fast_as_unavailable() {
    let (listener, addr) = loopback().await;
    drop(listener);
    let endpoint = Endpoint::from_shared(format!("http://{addr}")).expect("uri");
    let mut client = boxed(ClientDeadlineLayer::new().layer(ReadyChannel::lazy(&endpoint)));
    let started = Instant::now();
    let status = Scope::background()
        .with_timeout(Duration::from_secs(5))
        .enter(client.call(CallRequest::default()))
        .await
        .expect_err("nobody listens");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "fail-fast: no waiting for the deadline"
    );
}

// ---------------------------------------------------------------------------
// Errors, tonic's own timer, cleanup
// ---------------------------------------------------------------------------

/// A handler whose step fails through `?` into a boxed error, as code built
/// on `Box<dyn Error>` or `anyhow` does, and answers with tonic's own
/// `Status::from_error`.
#[derive(Clone)]
struct Boxing;

async fn capped_step() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let lookup = Scope::current().with_timeout(Duration::from_millis(50));
    lookup.ended().await;
    lookup.check()?; // `?` boxes the Ended
    Ok(())
}

#[tonic::async_trait]
impl testkit::CallOnly for Boxing {
    async fn call(
        &self,
        _: tonic::Request<CallRequest>,
    ) -> Result<tonic::Response<CallReply>, Status> {
        capped_step().await.map_err(Status::from_error)?;
        Ok(tonic::Response::new(CallReply::default()))
    }
}

#[tokio::test]
async fn ended_boxed_by_question_mark_still_answers_deadline_exceeded() {
    let (listener, addr) = loopback().await;
    #[allow(clippy::disallowed_methods)] // the server outlives every request
    tokio::spawn(async move {
        Server::builder()
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(Boxing))
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
    });
    let mut client = connect(addr).await;
    // The request has 1 s; the handler's own 50 ms cap ends its step, so the
    // answer is the handler's, not the server timer's.
    let status = Scope::background()
        .with_timeout(Duration::from_secs(1))
        .enter(client.call(CallRequest::default()))
        .await
        .expect_err("the capped step fails");
    assert_eq!(
        status.code(),
        tonic::Code::DeadlineExceeded,
        "an Ended that went through `?` into a boxed error must not become UNKNOWN: {status:?}"
    );
}

#[tokio::test]
async fn tonic_server_timeout_next_to_the_layer_is_never_called_a_caller_cancel() {
    let (mut events, tx) = Events::new();
    let (listener, addr) = loopback().await;
    let node = Node::new("B", &tx).working(SLOW);
    #[allow(clippy::disallowed_methods)] // the server outlives every request
    tokio::spawn(async move {
        Server::builder()
            .timeout(Duration::from_millis(100)) // tonic's own timer, outside our layer
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(node))
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
    });
    let mut client = connect(addr).await;
    let status = Scope::background()
        .with_timeout(Duration::from_secs(1))
        .enter(client.call(CallRequest::default()))
        .await
        .expect_err("tonic's timer stops the call at 100 ms");
    assert_eq!(
        status.code(),
        tonic::Code::Cancelled,
        "tonic answers its own timeout as CANCELLED; we cannot change what it sends"
    );
    let scope = events.entered("B").await;
    let cause = tokio::time::timeout(PATIENCE, scope.ended())
        .await
        .expect("the scope must end when tonic drops the handler");
    assert_eq!(
        cause,
        Cause::Abandoned,
        "the layer cannot see why it was dropped, so it must not claim the caller cancelled"
    );
}

#[tokio::test]
async fn max_timeout_replaces_tonic_server_timeout_with_deadline_exceeded() {
    let (mut events, tx) = Events::new();
    let node = Node::new("B", &tx).working(SLOW);
    let addr = serve(
        ServerDeadlineLayer::new().max_timeout(Duration::from_millis(100)),
        node,
    )
    .await;
    let mut client = connect(addr).await;
    let status = Scope::background()
        .with_timeout(Duration::from_secs(1))
        .enter(client.call(CallRequest::default()))
        .await
        .expect_err("the server's limit stops the call at 100 ms");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    let scope = events.entered("B").await;
    assert_eq!(scope.ended().await, Cause::DeadlineExceeded);
}

/// A node whose handler registers cleanup and a drop guard, then waits.
#[derive(Clone)]
struct Cleaning {
    cleaned: tokio::sync::mpsc::UnboundedSender<(Cause, Option<Cause>)>,
}

struct Guard {
    seen: Arc<Mutex<Option<Option<Cause>>>>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        *self.seen.lock().expect("not poisoned") = Some(Scope::current().cause());
    }
}

#[tonic::async_trait]
impl testkit::CallOnly for Cleaning {
    async fn call(
        &self,
        _: tonic::Request<CallRequest>,
    ) -> Result<tonic::Response<CallReply>, Status> {
        let seen = Arc::new(Mutex::new(None));
        let _guard = Guard { seen: seen.clone() };
        let cleaned = self.cleaned.clone();
        Scope::current().on_end(move |cause| async move {
            let in_drop = seen.lock().expect("not poisoned").flatten();
            let _ = cleaned.send((cause, in_drop));
        });
        std::future::pending::<()>().await;
        unreachable!("the handler waits until it is dropped")
    }
}

#[tokio::test]
async fn cleanup_runs_every_time_the_caller_goes_away_and_drop_guards_see_the_cause() {
    let (cleaned, mut reports) = tokio::sync::mpsc::unbounded_channel();
    let (listener, addr) = loopback().await;
    #[allow(clippy::disallowed_methods)] // the server outlives every request
    tokio::spawn(async move {
        Server::builder()
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(Cleaning { cleaned }))
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
    });
    let client = connect(addr).await;
    const CALLS: usize = 20;
    for i in 0..CALLS {
        let mut client = client.clone();
        let scope = Scope::background();
        let call = scope.spawn(async move { client.call(CallRequest::default()).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        scope.cancel(); // the client gives up: RST_STREAM
        let _ = call.await;
        let (cause, in_drop) = tokio::time::timeout(PATIENCE, reports.recv())
            .await
            .unwrap_or_else(|_| panic!("call {i}: the cleanup must run"))
            .expect("the server keeps its sender");
        assert_eq!(cause, Cause::Abandoned, "call {i}");
        assert_eq!(
            in_drop,
            Some(Cause::Abandoned),
            "call {i}: the scope must end before the handler is dropped"
        );
    }
}

#[tokio::test]
async fn on_end_runs_once_the_scope_ends_and_never_before() {
    let never = Scope::background();
    let (tx, quiet) = tokio::sync::oneshot::channel();
    never.on_end(move |cause| async move {
        let _ = tx.send(cause);
    });
    let request = Scope::background();
    let (tx, ended) = tokio::sync::oneshot::channel();
    request.on_end(move |cause| async move {
        let _ = tx.send(cause);
    });
    request.cancel();
    assert_eq!(ended.await.expect("the cleanup runs"), Cause::Cancelled);
    assert!(
        tokio::time::timeout(Duration::from_millis(50), quiet)
            .await
            .is_err(),
        "a scope that never ends never runs its cleanup"
    );
}

/// A server that takes one stream at a time, whose calls work 300 ms.
async fn one_stream_server(tx: &tokio::sync::mpsc::UnboundedSender<Event>) -> SocketAddr {
    let (listener, addr) = loopback().await;
    let node = Node::new("B", tx).working(Duration::from_millis(300));
    #[allow(clippy::disallowed_methods)] // the server outlives every request
    tokio::spawn(
        Server::builder()
            .max_concurrent_streams(1)
            .layer(ServerDeadlineLayer::new().reply_reserve(Duration::ZERO))
            .add_service(ProbeServer::new(node))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    addr
}

/// Runs a call that holds the one stream, and 50 ms later a second call
/// with a 1 s budget on its own layer (so that each layer's metrics speak
/// of one call); returns the second call's scope and the metrics of both
/// layers.
async fn queue_behind_one_stream<S, RB>(channel: S) -> (Scope, Metrics, Metrics)
where
    S: tower::Service<Request<Body>, Response = Response<RB>> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    RB: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    let first_metrics = Metrics::new();
    let mut first = boxed(
        ClientDeadlineLayer::new()
            .metrics(&first_metrics)
            .layer(channel.clone()),
    );
    let metrics = Metrics::new();
    let mut queued = boxed(ClientDeadlineLayer::new().metrics(&metrics).layer(channel));
    let holding = Scope::background().with_timeout(Duration::from_secs(2));
    let holder = holding.enter(first.call(CallRequest::default()));
    let waiter = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let scope = Scope::background().with_timeout(Duration::from_secs(1));
        let answer = scope.enter(queued.call(CallRequest::default())).await;
        (scope, answer)
    };
    let (held, (scope, waited)) = tokio::join!(holder, waiter);
    held.expect("the first call is served");
    waited.expect("the queued call is served once the stream is free");
    assert_eq!(
        first_metrics.budgets_left_late(),
        0,
        "the first call left at once"
    );
    (scope, first_metrics, metrics)
}

#[tokio::test]
async fn a_call_queued_behind_a_one_stream_server_is_reported_as_left_late() {
    // Over a tonic Channel the second call waits inside h2, below the
    // layer, after its header was written.
    let (_events, tx) = Events::new();
    let addr = one_stream_server(&tx).await;
    let endpoint = Endpoint::from_shared(format!("http://{addr}")).expect("uri");
    let channel = endpoint.connect().await.expect("connects");
    let (_, _, metrics) = queue_behind_one_stream(channel).await;
    assert_eq!(
        metrics.budgets_left_late(),
        1,
        "the queued call left about 250 ms after its header, and says so"
    );
}

#[tokio::test]
async fn ready_channel_queues_a_call_for_a_free_stream_before_its_header_is_written() {
    let (mut events, tx) = Events::new();
    let addr = one_stream_server(&tx).await;
    let endpoint = Endpoint::from_shared(format!("http://{addr}")).expect("uri");
    let channel = ReadyChannel::connect(&endpoint).await.expect("connects");
    let started = Instant::now();
    let (scope, _, metrics) = queue_behind_one_stream(channel).await;
    let client_deadline = scope.deadline().expect("a budget is a deadline");
    events.entered("B").await;
    let queued = events.entered("B").await;
    let server_deadline = queued
        .deadline()
        .expect("the server must receive a deadline");
    let told_too_much = server_deadline.saturating_duration_since(client_deadline);
    let told_too_little = client_deadline.saturating_duration_since(server_deadline);
    assert!(
        started.elapsed() >= Duration::from_millis(550),
        "the queued call waited for the stream (300 ms) and then worked (300 ms)"
    );
    // Were the header written before the call queued, the server would be
    // told the 250 ms of queueing too much; loopback transit is a fraction.
    assert!(
        told_too_much <= TRANSIT,
        "the server must be told what the caller has left when the stream opens: +{told_too_much:?}"
    );
    assert!(
        told_too_little <= Duration::from_millis(5),
        "and not less: -{told_too_little:?}"
    );
    assert_eq!(
        metrics.budgets_left_late(),
        0,
        "the call waited above the layer: its header left with it"
    );
}
