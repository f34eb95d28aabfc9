//! The service config's `waitForReady` and `timeout`, on real sockets: a
//! call that waits for ready reaches a server that starts late, with the
//! budget the server is told counting the wait; one that fails fast does
//! not wait; `timeout` caps the caller's deadline.

// The late server belongs to no request.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response};
use testkit::CallRequest;
use testkit::probe_client::ProbeClient;
use tokio::time::Instant;
use tonic::Status;
use tonic::body::Body;
use tonic::transport::Endpoint;
use tonic_deadline::client::ReadyChannel;
use tonic_deadline::resilience::ResilienceLayer;
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer};
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};

use crate::common::{Events, Node, loopback, serve, serve_on};

type Client = ProbeClient<BoxCloneSyncService<Request<Body>, Response<Body>, Status>>;

/// How late the server starts, as the issue that asked for this measured.
const LATE: Duration = Duration::from_millis(150);

/// A service config naming the probe service with `fields` (JSON members).
fn config(fields: &str) -> String {
    format!(r#"{{"methodConfig": [{{"name": [{{"service": "probe.v1.Probe"}}], {fields}}}]}}"#)
}

/// The probe client: `config`'s layer over the client layer over `channel`.
fn client(config: &str, channel: ReadyChannel) -> Client {
    let stack = ServiceBuilder::new()
        .layer(ResilienceLayer::from_service_config(config).expect("a valid config"))
        .layer(ClientDeadlineLayer::new())
        .service(channel)
        .map_response(|r: Response<_>| r.map(Body::new))
        .map_err(Status::from_error);
    ProbeClient::new(BoxCloneSyncService::new(stack))
}

/// A free loopback address on which a probe server starts `after` from now.
async fn late_server(after: Duration, node: Node) -> SocketAddr {
    let (listener, addr) = loopback().await;
    drop(listener);
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("the port is still free");
        serve_on(listener, node).await;
    });
    addr
}

fn endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint::from_shared(format!("http://{addr}")).expect("a loopback URI")
}

#[tokio::test]
async fn a_call_that_waits_for_ready_reaches_a_server_that_starts_150_ms_late() {
    let (mut events, tx) = Events::new();
    let addr = late_server(LATE, Node::new("B", &tx)).await;
    let mut waiting = client(
        &config(r#""waitForReady": true"#),
        ReadyChannel::lazy(&endpoint(addr)),
    );
    let scope = Scope::background().with_timeout(Duration::from_millis(500));
    let client_deadline = scope.deadline().expect("a deadline");
    let started = Instant::now();
    scope
        .enter(waiting.call(CallRequest::default()))
        .await
        .expect("a call that waits for ready is served once the server is up");
    assert!(
        started.elapsed() >= LATE,
        "it waited for the server: {:?}",
        started.elapsed()
    );
    let server_deadline = events
        .entered("B")
        .await
        .deadline()
        .expect("the server is told a deadline");
    let excess = server_deadline.saturating_duration_since(client_deadline);
    // A header written before the wait would tell the server the 150 ms of
    // waiting too much; what is left is loopback transit, which a loaded
    // machine can stretch to tens of milliseconds.
    assert!(
        excess < LATE / 3,
        "the budget on the wire counts the wait: the server was told {excess:?} too much"
    );
}

#[tokio::test]
async fn a_call_that_fails_fast_does_not_wait_for_a_late_server() {
    let (_events, tx) = Events::new();
    let addr = late_server(LATE, Node::new("B", &tx)).await;
    // The same config without waitForReady: gRPC's default, fail fast.
    let mut failing = client(
        &config(r#""timeout": "5s""#),
        ReadyChannel::lazy(&endpoint(addr)),
    );
    let started = Instant::now();
    let status = Scope::background()
        .with_timeout(Duration::from_millis(500))
        .enter(failing.call(CallRequest::default()))
        .await
        .expect_err("nobody listens yet");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        started.elapsed() < LATE,
        "failed at once, before the server came up: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn waiting_for_a_server_that_never_starts_ends_at_the_deadline() {
    let (listener, addr) = loopback().await;
    drop(listener);
    // The builder switch, for code without a service config.
    let channel = ReadyChannel::builder(&endpoint(addr))
        .wait_for_ready()
        .lazy();
    let mut waiting = client(r#"{}"#, channel);
    let budget = Duration::from_millis(200);
    let started = Instant::now();
    let status = Scope::background()
        .with_timeout(budget)
        .enter(waiting.call(CallRequest::default()))
        .await
        .expect_err("nobody ever listens");
    let took = started.elapsed();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(took >= budget, "it waited until the deadline: {took:?}");
    assert!(
        took < budget * 5,
        "and not much longer than the deadline: {took:?}"
    );
}

#[tokio::test]
async fn a_config_timeout_caps_the_callers_deadline() {
    let (mut events, tx) = Events::new();
    let addr = serve(ServerDeadlineLayer::new(), Node::new("B", &tx)).await;
    let channel = ReadyChannel::connect(&endpoint(addr))
        .await
        .expect("the server is up");
    let mut capped = client(&config(r#""timeout": "0.1s""#), channel);
    Scope::background()
        .with_timeout(Duration::from_secs(5))
        .enter(capped.call(CallRequest::default()))
        .await
        .expect("a quick call fits 100 ms");
    let (_, metadata) = events.entered_with_metadata("B").await;
    let header = metadata
        .get("grpc-timeout")
        .expect("the server is told a deadline");
    let told = tonic_deadline::timeout_header::decode(header.as_bytes())
        .expect("a well-formed grpc-timeout");
    assert!(
        told <= Duration::from_millis(100),
        "the smaller of 5 s and the config's 100 ms: {told:?}"
    );
    assert!(
        told > Duration::from_millis(50),
        "the config's 100 ms, less the trip: {told:?}"
    );
}
