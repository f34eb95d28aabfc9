//! The ledger of a `DEADLINE_EXCEEDED`: root → A → B → C → D over real
//! sockets, D stalled in its handler. Each hop's server layer adds its
//! line on the way back; the root reads the whole chain, and the hop that
//! stalled is the one that spent the time. A hop without the layer cuts
//! the chain, and the ledger says where. A queue's wait, a handler that
//! answers `CANCELLED` after a call ran out, and a stream cut at the
//! deadline carry their lines too.

// Servers of these tests belong to no request.
#![allow(clippy::disallowed_methods)]

use std::pin::Pin;
use std::time::Duration;

use testkit::probe_client::ProbeClient;
use testkit::probe_server::{Probe, ProbeServer};
use testkit::{CallReply, CallRequest};
use tokio_stream::Stream;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status, Streaming};
use tonic_deadline::client::ClientDeadline;
use tonic_deadline::ledger::{Ledger, MAX_ENTRY_BYTES, Reply};
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer};

use crate::common::loopback;

type Next = ProbeClient<ClientDeadline<Channel>>;
type Answer<T> = Result<Response<T>, Status>;
type Replies = Pin<Box<dyn Stream<Item = Result<CallReply, Status>> + Send>>;

/// The root's budget.
const BUDGET: Duration = Duration::from_millis(600);

/// Calls the next hop and passes its answer on; the last one stalls.
#[derive(Clone)]
struct Hop {
    next: Option<Next>,
}

#[tonic::async_trait]
impl testkit::CallOnly for Hop {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        match &self.next {
            Some(next) => next.clone().call(request.into_inner()).await,
            None => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(Response::new(CallReply::default()))
            }
        }
    }
}

/// What each layered hop keeps of its budget for its answer's way back.
const RESERVE: Duration = Duration::from_millis(10);

/// Serves `hop`, with the server layer or (`layered` false) as plain tonic.
async fn serve(hop: Hop, layered: bool) -> std::net::SocketAddr {
    let (listener, addr) = loopback().await;
    let incoming = TcpListenerStream::new(listener);
    let service = ProbeServer::new(hop);
    if layered {
        tokio::spawn(
            Server::builder()
                .layer(ServerDeadlineLayer::new().reply_reserve(RESERVE))
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
    addr
}

/// A client of `addr`.
fn next(addr: std::net::SocketAddr) -> Next {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("a loopback URI")
        .connect_lazy();
    ProbeClient::new(
        tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new())
            .service(channel),
    )
}

/// root → A → B → C → D, D stalling; `layered[i]`: whether hop i has the
/// server layer. The root's status.
async fn chain(layered: [bool; 4]) -> Status {
    let mut below = None;
    for layered in layered.into_iter().rev() {
        let addr = serve(Hop { next: below }, layered).await;
        below = Some(next(addr));
    }
    let mut root = below.expect("four hops");
    // Connected first: the ledger is about the call, not the dial.
    for _ in 0..2 {
        let _ = Scope::background()
            .with_timeout(Duration::from_millis(50))
            .enter(root.call(CallRequest::default()))
            .await;
    }
    Scope::background()
        .with_timeout(BUDGET)
        .enter(root.call(CallRequest::default()))
        .await
        .expect_err("D stalls")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_root_reads_every_hops_line_and_the_stalled_hop_is_named() {
    let mut arrived = 0;
    for _ in 0..5 {
        let status = chain([true; 4]).await;
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        let ledger = Ledger::from_status(&status).expect("a ledger in the details");
        assert!(
            status.message().contains(" [ledger] "),
            "{}",
            status.message()
        );
        eprintln!("{}", status.message());
        if ledger.hops().len() < 4 {
            continue;
        }
        arrived += 1;
        let hops = ledger.hops();
        assert!(hops.iter().all(|h| h.method == "/probe.v1.Probe/Call"));
        let stalled = ledger.stalled().expect("a hop");
        assert!(std::ptr::eq(stalled, &hops[3]), "D stalled: {ledger:?}");
        assert!(hops[3].calls.is_empty(), "D called nobody");
        for (hop, below) in hops.iter().zip(&hops[1..]) {
            let call = hop.calls.last().expect("each hop called the next");
            assert_eq!(call.reply, Reply::Ledger);
            assert!(call.took >= below.took, "the call spans the hop below");
            assert!(below.budget < hop.budget, "each hop was given less");
        }
        // Every millisecond is someone's: the root hop's time is its own
        // plus each call's, down to D; what it did not spend is the
        // reserves the hops kept for their answers (and timer slack).
        let root = &hops[0];
        let budget = root.budget.expect("a budget");
        let unspent = budget.saturating_sub(root.took);
        assert!(
            unspent <= 4 * RESERVE + budget / 20,
            "took {:?} of {budget:?}",
            root.took
        );
        let accounted: Duration = hops.iter().map(|h| h.own()).sum::<Duration>()
            + hops.iter().filter_map(|h| h.transit).sum::<Duration>();
        assert_eq!(accounted, root.took);
        assert!(hops[1..].iter().all(|h| h.transit.is_some()));
        // Each call started after its hop arrived, within its time.
        for hop in hops {
            for call in &hop.calls {
                let started = call.started.expect("each call says when it started");
                assert!(started + call.took <= hop.took, "{hop:?}");
            }
        }
    }
    // The answers race their callers' timers; the reserve wins the race.
    assert!(arrived >= 4, "the whole ledger arrived in {arrived} of 5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hop_without_the_layer_cuts_the_ledger_and_it_says_where() {
    // B is plain tonic: it answers its own CANCELLED, with no line.
    let status = chain([true, false, true, true]).await;
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    let ledger = Ledger::from_status(&status).expect("A's line");
    assert_eq!(ledger.hops().len(), 1, "{ledger:?}");
    let cut = ledger.hops()[0].calls.last().expect("A called B");
    assert_ne!(cut.reply, Reply::Ledger, "{ledger:?}");
    assert!(
        status.message().contains("answered without a ledger")
            || status.message().contains("no answer in time"),
        "{}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_hops_line_is_short() {
    let status = chain([true; 4]).await;
    let details = status.details();
    assert!(
        details.len() < 4 * MAX_ENTRY_BYTES + 200,
        "{} bytes",
        details.len()
    );
    let ledger = Ledger::from_status(&status).expect("a ledger");
    assert!(!ledger.capped());
}

/// tonic's channel times a call by the `grpc-timeout` it carries and fails
/// it `CANCELLED` ("Timeout expired"). When the client layer tells the
/// server less than its own deadline (a transit allowance), that timer
/// fires first: the call still ends `DEADLINE_EXCEEDED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_told_short_on_the_wire_still_ends_deadline_exceeded() {
    let (listener, addr) = loopback().await;
    tokio::spawn(
        Server::builder()
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(Hop { next: None }))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("a loopback URI")
        .connect_lazy();
    let mut client = ProbeClient::new(
        tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new().transit_allowance(Duration::from_millis(3)))
            .service(channel),
    );
    for _ in 0..20 {
        let status = Scope::background()
            .with_timeout(Duration::from_millis(30))
            .enter(client.call(CallRequest::default()))
            .await
            .expect_err("the server stalls");
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    }
}

/// What a hop of the tests below does.
#[derive(Clone)]
enum Does {
    /// Stalls for an hour, holding what it holds.
    Stall,
    /// Fails at once, `UNAVAILABLE`.
    Refuse,
    /// Calls `next`, and answers any failure with a code of its own.
    CallAndFail(Next, Code),
    /// Streams one reply, then calls `next` and streams its answer.
    StreamThenCall(Next),
}

#[tonic::async_trait]
impl Probe for Does {
    async fn call(&self, request: Request<CallRequest>) -> Answer<CallReply> {
        match self {
            Does::CallAndFail(next, code) => next
                .clone()
                .call(request.into_inner())
                .await
                .map_err(|failed| Status::new(*code, format!("gave up: {}", failed.message()))),
            Does::Refuse => Err(Status::unavailable("not now")),
            _ => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(Response::new(CallReply::default()))
            }
        }
    }

    type WatchStream = Replies;

    async fn watch(&self, request: Request<CallRequest>) -> Answer<Replies> {
        use futures_util::StreamExt as _;
        let first = futures_util::stream::once(async { Ok(CallReply::default()) });
        let next = match self {
            Does::StreamThenCall(next) => next.clone(),
            // One reply, then nothing more.
            Does::Stall => {
                return Ok(Response::new(Box::pin(
                    first.chain(futures_util::stream::pending()),
                )));
            }
            Does::CallAndFail(..) | Does::Refuse => {
                return Err(Status::unimplemented("unary only"));
            }
        };
        let request = request.into_inner();
        let then = async move { next.clone().call(request).await.map(Response::into_inner) };
        let replies = first.chain(futures_util::stream::once(then));
        Ok(Response::new(Box::pin(replies)))
    }

    type ChatStream = Replies;

    async fn chat(&self, _: Request<Streaming<CallRequest>>) -> Answer<Replies> {
        Err(Status::unimplemented("unary and server streams only"))
    }
}

/// What the servers of `serve_does` keep for their answers' way back: what
/// their tests show owes nothing to its size, and a wide one keeps a busy
/// core's late wakeups inside it (with 10 ms, a hop's answer on a loaded
/// machine sometimes reached its caller after the caller's own deadline,
/// which then answered without the hop's lines). The layer keeps at most a
/// twentieth of a budget: [`BUDGET`] keeps 30 ms, [`WIDE_BUDGET`] all 50.
const WIDE_RESERVE: Duration = Duration::from_millis(50);

/// A budget that keeps the whole [`WIDE_RESERVE`], for a test with one
/// call whose ledger must arrive (with 300 ms, 15 ms were kept, and a
/// queued request's answer lost its race on a loaded machine).
const WIDE_BUDGET: Duration = Duration::from_millis(1000);

/// Serves `does` with the server layer (and [`WIDE_RESERVE`]), inside it
/// an admission of `permits` when given.
async fn serve_does(does: Does, permits: Option<usize>) -> std::net::SocketAddr {
    use tonic_deadline::admission::{Admission, AdmissionLayer};
    let (listener, addr) = loopback().await;
    let incoming = TcpListenerStream::new(listener);
    let layer = ServerDeadlineLayer::new().reply_reserve(WIDE_RESERVE);
    match permits {
        Some(permits) => tokio::spawn(
            Server::builder()
                .layer(
                    tower::ServiceBuilder::new()
                        .layer(layer)
                        .layer(AdmissionLayer::new(Admission::new(permits))),
                )
                .add_service(ProbeServer::new(does))
                .serve_with_incoming(incoming),
        ),
        None => tokio::spawn(
            Server::builder()
                .layer(layer)
                .add_service(ProbeServer::new(does))
                .serve_with_incoming(incoming),
        ),
    };
    addr
}

async fn call_within(client: &Next, budget: Duration) -> Status {
    Scope::background()
        .with_timeout(budget)
        .enter(client.clone().call(CallRequest::default()))
        .await
        .expect_err("it stalls")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_a_request_queued_for_admission_is_its_own_field() {
    // One permit, held by a request that stalls: the next one queues until
    // its deadline, and its ledger says the queue took the time.
    let x = next(serve_does(Does::Stall, Some(1)).await);
    let holder = tokio::spawn({
        let x = x.clone();
        async move { call_within(&x, Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = call_within(&x, WIDE_BUDGET).await;
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    let ledger = Ledger::from_status(&status).expect("a ledger");
    let hop = &ledger.hops()[0];
    assert!(
        hop.queued >= hop.took * 9 / 10 && hop.queued <= hop.took,
        "queued {:?} of {:?}",
        hop.queued,
        hop.took
    );
    assert!(
        status.message().contains(" ms queued (stalled here)"),
        "{}",
        status.message()
    );
    holder.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_answers_its_own_code_after_a_call_ran_out_still_sends_the_ledger() {
    let b = serve_does(Does::Stall, None).await;
    for code in [Code::Cancelled, Code::Internal, Code::Unavailable] {
        let a = next(serve_does(Does::CallAndFail(next(b), code), None).await);
        let _ = call_within(&a, Duration::from_millis(50)).await;
        let mut arrived = 0;
        for _ in 0..5 {
            let status = call_within(&a, BUDGET).await;
            let ledger = Ledger::from_status(&status)
                .unwrap_or_else(|| panic!("a ledger on every failure here: {status:?}"));
            // B's answer lost its race with A's deadline (a busy core): A's
            // layer answered, with its own line; counted as a miss below.
            if status.code() == Code::DeadlineExceeded {
                assert_eq!(ledger.hops().len(), 1, "{status:?}");
                continue;
            }
            // Before the root's deadline: the handler's own code.
            assert_eq!(status.code(), code, "{status:?}");
            assert!(status.message().starts_with("gave up: "), "{status:?}");
            if ledger.hops().len() == 2 {
                arrived += 1;
                assert_eq!(
                    ledger.stalled().map(|h| h.method.as_str()),
                    ledger.hops().get(1).map(|h| h.method.as_str())
                );
            }
        }
        assert!(arrived >= 4, "{code:?}: B's line arrived in {arrived} of 5");
    }
    // A failure that owes nothing to time carries none.
    let refuses = serve_does(Does::Refuse, None).await;
    let a = next(serve_does(Does::CallAndFail(next(refuses), Code::Internal), None).await);
    let status = call_within(&a, BUDGET).await;
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(Ledger::from_status(&status).is_none(), "{status:?}");
    assert!(!status.message().contains("[ledger]"), "{status:?}");
}

/// The second reply of a `watch` under `BUDGET`, after the first.
async fn second_reply(a: &Next) -> Status {
    use tokio_stream::StreamExt as _;
    let mut replies = Scope::background()
        .with_timeout(BUDGET)
        .enter(a.clone().watch(CallRequest::default()))
        .await
        .expect("the stream starts")
        .into_inner();
    let first = replies.next().await;
    assert!(matches!(first, Some(Ok(_))), "{first:?}");
    replies
        .next()
        .await
        .expect("an end")
        .expect_err("the stream stalls")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_at_the_deadline_carries_the_ledger_in_its_trailers() {
    let a = next(serve_does(Does::Stall, None).await);
    let status = second_reply(&a).await;
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    let ledger = Ledger::from_status(&status)
        .unwrap_or_else(|| panic!("a ledger in the trailers: {status:?}"));
    assert_eq!(ledger.hops().len(), 1, "{ledger:?}");
    assert_eq!(ledger.hops()[0].method, "/probe.v1.Probe/Watch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_fails_at_the_deadline_carries_the_ledger_in_its_trailers() {
    let b = serve_does(Does::Stall, None).await;
    let a = next(serve_does(Does::StreamThenCall(next(b)), None).await);
    for _ in 0..5 {
        let status = second_reply(&a).await;
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        let ledger = Ledger::from_status(&status)
            .unwrap_or_else(|| panic!("a ledger in the trailers: {status:?}"));
        let hop = &ledger.hops()[0];
        assert_eq!(hop.method, "/probe.v1.Probe/Watch");
        assert_eq!(
            hop.calls.first().map(|c| c.method.as_str()),
            Some("/probe.v1.Probe/Call"),
            "{ledger:?}"
        );
    }
}
