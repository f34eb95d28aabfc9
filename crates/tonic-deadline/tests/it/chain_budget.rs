//! One retry budget for a chain: client → B → C, the same retry policy on
//! both hops, C failing every call. B's layer, having spent its attempts,
//! marks the failure `grpc-retry-pushback-ms: -1`; the client's layer
//! does not retry it, whatever B's handler does with the status: returns
//! it, or makes a new one, of the same code or another (the server layer
//! keeps the mark); a handler that recovers answers OK. Behind replicas
//! of B, the client retries the marked failure once, on another replica.

// Servers of these tests belong to no request.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use testkit::{CallReply, CallRequest};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status};
use tonic_deadline::client::{Balanced, ClientDeadline, ReadyChannel};
use tonic_deadline::resilience::{Resilience, ResilienceLayer};
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer};

use crate::common::loopback;

/// Every hop's policy: 3 attempts on UNAVAILABLE or INTERNAL.
const CONFIG: &str = r#"{"methodConfig": [{"name": [{"service": "probe.v1.Probe"}],
    "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.001s", "maxBackoff": "0.002s",
                    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", "INTERNAL"]}}]}"#;

const PUSHBACK: &str = "grpc-retry-pushback-ms";

type Retrying = ProbeClient<Resilience<ClientDeadline<Channel>>>;

/// What B's handler does with C's failure.
#[derive(Debug, Clone, Copy)]
enum Handler {
    /// `?`: the status as it came.
    PassesOn,
    /// A new status of the same code, its own message.
    SameCode,
    /// A new status of another code.
    OtherCode,
    /// Answers OK from elsewhere.
    Recovers,
}

/// C answers UNAVAILABLE; B calls C and handles the failure as told.
#[derive(Clone)]
struct Hop {
    calls: Arc<AtomicU32>,
    next: Option<(Retrying, Handler)>,
}

#[tonic::async_trait]
impl testkit::CallOnly for Hop {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let Some((next, handler)) = &self.next else {
            return Err(Status::unavailable("C is down"));
        };
        let failed = match next.clone().call(request.into_inner()).await {
            Ok(reply) => return Ok(reply),
            Err(status) => status,
        };
        match handler {
            Handler::PassesOn => Err(failed),
            Handler::SameCode => Err(Status::unavailable(format!(
                "inventory: {}",
                failed.message()
            ))),
            Handler::OtherCode => Err(Status::internal("inventory failed")),
            Handler::Recovers => Ok(Response::new(CallReply::default())),
        }
    }
}

async fn serve(hop: impl testkit::CallOnly) -> std::net::SocketAddr {
    let (listener, addr) = loopback().await;
    tokio::spawn(
        Server::builder()
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(hop))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    addr
}

fn retrying(addr: std::net::SocketAddr, chain_budget: bool) -> Retrying {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("a loopback URI")
        .connect_lazy();
    let layer = ResilienceLayer::from_service_config(CONFIG)
        .expect("a valid config")
        .chain_budget(chain_budget);
    ProbeClient::new(
        tower::ServiceBuilder::new()
            .layer(layer)
            .layer(ClientDeadlineLayer::new())
            .service(channel),
    )
}

/// One call at the root through B (`handler`; `chain_budget` on both
/// hops' layers) to C:
/// its status (if it failed), and the calls B and C saw.
async fn chain(handler: Handler, chain_budget: bool) -> (Option<Status>, u32, u32) {
    let c_calls = Arc::new(AtomicU32::new(0));
    let c = serve(Hop {
        calls: c_calls.clone(),
        next: None,
    })
    .await;
    let b_calls = Arc::new(AtomicU32::new(0));
    let b = serve(Hop {
        calls: b_calls.clone(),
        next: Some((retrying(c, chain_budget), handler)),
    })
    .await;
    let mut root = retrying(b, chain_budget);
    let outcome = Scope::background()
        .with_timeout(Duration::from_secs(10))
        .enter(root.call(CallRequest::default()))
        .await;
    (
        outcome.err(),
        b_calls.load(Ordering::Relaxed),
        c_calls.load(Ordering::Relaxed),
    )
}

fn pushback(status: &Status) -> Option<&str> {
    status
        .metadata()
        .get(PUSHBACK)
        .and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn a_failure_the_hop_below_spent_is_not_retried_above_it() {
    let (status, at_b, at_c) = chain(Handler::PassesOn, true).await;
    let status = status.expect("C is down");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(pushback(&status), Some("-1"), "{status:?}");
    assert_eq!(
        (at_b, at_c),
        (1, 3),
        "B retried C 3 times; the client did not retry B"
    );
}

#[tokio::test]
async fn per_hop_retries_multiply() {
    // The control: without the chain budget the client retries B, and B
    // retries C each time.
    let (status, at_b, at_c) = chain(Handler::PassesOn, false).await;
    let status = status.expect("C is down");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(pushback(&status), None, "{status:?}");
    assert_eq!((at_b, at_c), (3, 9));
}

#[tokio::test]
async fn a_handler_that_makes_a_new_status_keeps_the_mark() {
    for (handler, code) in [
        (Handler::SameCode, Code::Unavailable),
        (Handler::OtherCode, Code::Internal),
    ] {
        let (status, at_b, at_c) = chain(handler, true).await;
        let status = status.expect("C is down");
        assert_eq!(status.code(), code, "{handler:?}: {status:?}");
        assert!(
            status.message().starts_with("inventory"),
            "{handler:?}: the handler's own status: {status:?}"
        );
        assert_eq!(
            pushback(&status),
            Some("-1"),
            "{handler:?}: the server layer adds the mark the handler dropped: {status:?}"
        );
        assert_eq!(
            (at_b, at_c),
            (1, 3),
            "{handler:?}: the failure is retried once in the chain, both codes retryable"
        );
    }
}

#[tokio::test]
async fn a_handler_that_recovers_answers_ok_unmarked() {
    let (status, at_b, at_c) = chain(Handler::Recovers, true).await;
    assert!(status.is_none(), "{status:?}");
    assert_eq!((at_b, at_c), (1, 3));
}

/// A replica of B whose path is fine: answers every call OK.
#[derive(Clone)]
struct Up(Arc<AtomicU32>);

#[tonic::async_trait]
impl testkit::CallOnly for Up {
    async fn call(&self, _: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(Response::new(CallReply::default()))
    }
}

#[tokio::test]
async fn a_marked_failure_at_one_replica_is_retried_once_on_another() {
    let count = || Arc::new(AtomicU32::new(0));
    let (at_c, at_b1, at_b2) = (count(), count(), count());
    let c = serve(Hop {
        calls: at_c.clone(),
        next: None,
    })
    .await;
    let b1 = serve(Hop {
        calls: at_b1.clone(),
        next: Some((retrying(c, true), Handler::PassesOn)),
    })
    .await;
    let b2 = serve(Up(at_b2.clone())).await;
    // The client layer and a ReadyChannel per replica, the round-robin
    // over them, the resilience layer over that.
    let replicas = [b1, b2].map(|addr| {
        let endpoint = Endpoint::from_shared(format!("http://{addr}")).expect("a loopback URI");
        ClientDeadline::new(ReadyChannel::lazy(&endpoint))
    });
    let layer = ResilienceLayer::from_service_config(CONFIG).expect("a valid config");
    let mut root = ProbeClient::new(tower::Layer::layer(&layer, Balanced::new(replicas)));
    let calls = |n: u32| [&at_b1, &at_c, &at_b2].map(|c| c.load(Ordering::Relaxed)) == [1, 3, n];
    let scope = Scope::background().with_timeout(Duration::from_secs(10));
    let first = scope.enter(root.call(CallRequest::default())).await;
    assert!(first.is_ok(), "B2 answers the retry: {first:?}");
    assert!(
        calls(1),
        "B1 spent its 3 attempts at C and marked the failure; the client retried once, on B2"
    );
    let second = scope.enter(root.call(CallRequest::default())).await;
    assert!(second.is_ok(), "{second:?}");
    assert!(calls(2), "B1 rests: the next call goes to B2 at once");
}
