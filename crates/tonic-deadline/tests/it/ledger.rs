//! The ledger of a `DEADLINE_EXCEEDED`: root → A → B → C → D over real
//! sockets, D stalled in its handler. Each hop's server layer adds its
//! line on the way back; the root reads the whole chain, and the hop that
//! stalled is the one that spent the time. A hop without the layer cuts
//! the chain, and the ledger says where.

// Servers of these tests belong to no request.
#![allow(clippy::disallowed_methods)]

use std::pin::Pin;
use std::time::Duration;

use probe::probe_client::ProbeClient;
use probe::probe_server::{Probe, ProbeServer};
use probe::{CallReply, CallRequest};
use tokio_stream::Stream;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status, Streaming};
use tonic_deadline::client::ClientDeadline;
use tonic_deadline::ledger::{Ledger, MAX_ENTRY_BYTES, Reply};
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer};

use crate::common::loopback;

type Next = ProbeClient<ClientDeadline<Channel>>;
type Replies = Pin<Box<dyn Stream<Item = Result<CallReply, Status>> + Send>>;

/// The root's budget.
const BUDGET: Duration = Duration::from_millis(600);

/// Calls the next hop and passes its answer on; the last one stalls.
#[derive(Clone)]
struct Hop {
    next: Option<Next>,
}

#[tonic::async_trait]
impl Probe for Hop {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        match &self.next {
            Some(next) => next.clone().call(request.into_inner()).await,
            None => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(Response::new(CallReply::default()))
            }
        }
    }

    type WatchStream = Replies;

    async fn watch(&self, _: Request<CallRequest>) -> Result<Response<Replies>, Status> {
        Err(Status::unimplemented("unary only"))
    }

    type ChatStream = Replies;

    async fn chat(&self, _: Request<Streaming<CallRequest>>) -> Result<Response<Replies>, Status> {
        Err(Status::unimplemented("unary only"))
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
            + hops
                .iter()
                .zip(&hops[1..])
                .map(|(h, b)| h.calls.last().map_or(Duration::ZERO, |c| c.took - b.took))
                .sum::<Duration>();
        assert_eq!(accounted, root.took);
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
