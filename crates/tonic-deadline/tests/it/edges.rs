//! Where a user's own code meets the layers: tonic's patterns that must
//! compile and keep the guarantee under them, and the edges where the
//! guarantee cannot hold and the library must say so.

// Servers and peers of these tests belong to no request.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use hyper_util::rt::TokioIo;
use testkit::CallRequest;
use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use tonic::transport::{Endpoint, Server, Uri};
use tonic::{Code, Status};
use tonic_deadline::client::{ReadyChannel, WaitForReady, capture_scope};
use tonic_deadline::observe::Metrics;
use tonic_deadline::resilience::ResilienceLayer;
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer};

use crate::common::{Events, Node, PATIENCE, loopback, serve_on};

const BUDGET: Duration = Duration::from_secs(2);

/// Asserts that `hop` ran with a deadline the caller's budget bounds.
async fn assert_budget_arrived(events: &mut Events, hop: &'static str) {
    let scope = events.entered(hop).await;
    let left = scope
        .remaining()
        .expect("the handler's scope must carry the caller's deadline");
    assert!(
        left <= BUDGET && left > BUDGET - Duration::from_secs(1),
        "the server must be told what the caller has left, not {left:?} of {BUDGET:?}"
    );
}

// ---------------------------------------------------------------------------
// A generated client's `with_interceptor` over the client layer
// ---------------------------------------------------------------------------

/// Adds a metadata entry, as tonic's own interceptor examples do.
fn stamp(mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
    request
        .metadata_mut()
        .insert("x-stamp", "interceptor".parse().expect("an ASCII value"));
    Ok(request)
}

#[tokio::test]
async fn with_interceptor_takes_the_documented_buffer_and_layer_stack() {
    let (mut events, tx) = Events::new();
    let (listener, addr) = loopback().await;
    tokio::spawn(serve_on(listener, Node::new("B", &tx)));
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("a loopback URI")
        .connect_lazy();
    // As `capture_scope`'s documentation says: the interceptor on the
    // caller's task, a Buffer, then the layer on the buffer's worker.
    let stack = tower::ServiceBuilder::new()
        .buffer::<http::Request<tonic::body::Body>>(16)
        .layer(ClientDeadlineLayer::new())
        .service(channel);
    let mut client = ProbeClient::with_interceptor(stack, capture_scope);
    Scope::background()
        .with_timeout(BUDGET)
        .enter(client.call(CallRequest::default()))
        .await
        .expect("the call through with_interceptor must succeed");
    assert_budget_arrived(&mut events, "B").await;
}

#[tokio::test]
async fn with_interceptor_takes_a_ready_channel_under_the_layer_and_its_refusal_is_the_answer() {
    let (mut events, tx) = Events::new();
    let (listener, addr) = loopback().await;
    tokio::spawn(serve_on(listener, Node::new("B", &tx)));
    let endpoint = Endpoint::from_shared(format!("http://{addr}")).expect("a loopback URI");
    let channel = tower::ServiceBuilder::new()
        .layer(ClientDeadlineLayer::new())
        .service(ReadyChannel::lazy(&endpoint));
    let mut client = ProbeClient::with_interceptor(channel.clone(), stamp);
    Scope::background()
        .with_timeout(BUDGET)
        .enter(client.call(CallRequest::default()))
        .await
        .expect("the call through with_interceptor must succeed");
    let (scope, metadata) = events.entered_with_metadata("B").await;
    assert_eq!(
        metadata.get("x-stamp").map(|v| v.as_bytes()),
        Some(&b"interceptor"[..]),
        "the interceptor's metadata must reach the server"
    );
    assert!(scope.deadline().is_some(), "and so must the deadline");

    // An interceptor that refuses: tonic answers with an empty body of the
    // channel's type, which the layer's body must be able to make.
    let mut refusing = ProbeClient::with_interceptor(channel, |_| {
        Err::<tonic::Request<()>, _>(Status::permission_denied("no ticket"))
    });
    let refused = Scope::background()
        .with_timeout(BUDGET)
        .enter(refusing.call(CallRequest::default()))
        .await
        .expect_err("the interceptor refuses the call");
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert_eq!(refused.message(), "no ticket");
}

// ---------------------------------------------------------------------------
// ReadyChannel and tonic's endpoints
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_ready_channel_reaches_a_unix_socket_it_is_given() {
    let (mut events, tx) = Events::new();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("probe.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("a Unix socket to listen on");
    tokio::spawn(async move {
        Server::builder()
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(Node::new("B", &tx)))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await
            .expect("the test server must keep serving");
    });
    // The endpoint tonic users write for a Unix socket.
    let endpoint = Endpoint::from_shared(format!("unix:{}", path.display())).expect("a unix: URI");
    let channel = ReadyChannel::builder(&endpoint)
        .unix_socket(&path)
        .connect()
        .await
        .expect("the channel must connect to the socket");
    let mut client = ProbeClient::new(
        tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new())
            .service(channel),
    );
    Scope::background()
        .with_timeout(BUDGET)
        .enter(client.call(CallRequest::default()))
        .await
        .expect("the call over the Unix socket must succeed");
    assert_budget_arrived(&mut events, "B").await;
}

#[tokio::test]
async fn a_unix_endpoint_without_its_path_fails_naming_the_fix_and_dials_nothing() {
    // tonic's `Endpoint::uri()` for a unix: address is `http://tonic`; a
    // channel that dialled it over TCP would look up a host named "tonic".
    let endpoint = Endpoint::from_static("unix:/nonexistent/probe.sock");
    let mut client = ProbeClient::new(
        tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new())
            .service(ReadyChannel::lazy(&endpoint)),
    );
    let status = tokio::time::timeout(
        PATIENCE,
        Scope::background()
            .with_timeout(BUDGET)
            .enter(client.call(CallRequest::default())),
    )
    .await
    .expect("the call must fail at once, not wait")
    .expect_err("there is nothing to dial");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status
            .message()
            .contains("ReadyChannelBuilder::unix_socket"),
        "the status must name the fix: {status:?}"
    );

    let connected = ReadyChannel::connect(&endpoint).await;
    let Err(err) = connected else {
        panic!("connect must fail for a unix: endpoint without its path")
    };
    let said = format!("{err:?}");
    assert!(
        said.contains("ReadyChannelBuilder::unix_socket"),
        "the failure must name the fix: {said}"
    );
}

#[tokio::test]
async fn a_ready_channel_takes_tonics_one_shot_connector() {
    let (mut events, tx) = Events::new();
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        Server::builder()
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(Node::new("B", &tx)))
            .serve_with_incoming(tokio_stream::once(Ok::<_, std::io::Error>(server_io)))
            .await
            .expect("the test server must keep serving");
    });
    // tonic's own pattern (its mock example): the one stream, handed out
    // once by a connector that cannot be cloned.
    let mut client_io = Some(client_io);
    let connector = tower::service_fn(move |_: Uri| {
        let io = client_io.take();
        async move {
            io.map(TokioIo::new)
                .ok_or_else(|| std::io::Error::other("the one stream was taken"))
        }
    });
    let endpoint = Endpoint::from_static("http://[::]:50051");
    let channel = ReadyChannel::connect_with_connector(&endpoint, connector)
        .await
        .expect("the channel must take the one stream");
    let mut client = ProbeClient::new(
        tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new())
            .service(channel),
    );
    Scope::background()
        .with_timeout(BUDGET)
        .enter(client.call(CallRequest::default()))
        .await
        .expect("the call over the one-shot stream must succeed");
    assert_budget_arrived(&mut events, "B").await;
}

// ---------------------------------------------------------------------------
// What the layer cannot keep is reported, on every call
// ---------------------------------------------------------------------------

/// A server that takes one stream at a time, whose calls work 300 ms.
async fn one_stream_server(tx: &tokio::sync::mpsc::UnboundedSender<crate::common::Event>) -> Uri {
    let (listener, addr) = loopback().await;
    let node = Node::new("B", tx).working(Duration::from_millis(300));
    tokio::spawn(
        Server::builder()
            .max_concurrent_streams(1)
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(node))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    format!("http://{addr}").parse().expect("a loopback URI")
}

#[tokio::test]
async fn a_one_off_call_queued_in_a_plain_channel_is_reported_whichever_call_it_is() {
    let (_events, tx) = Events::new();
    let uri = one_stream_server(&tx).await;
    let channel = Endpoint::from(uri)
        .connect()
        .await
        .expect("the server must accept a connection");
    let metrics = Metrics::new();
    // One client, one layer: the queued call is its second.
    let client = ProbeClient::new(
        tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new().metrics(&metrics))
            .service(channel),
    );
    let mut holder = client.clone();
    let holding = Scope::background().with_timeout(BUDGET);
    let held = holding.enter(holder.call(CallRequest::default()));
    let mut queued = client;
    let waiter = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Scope::background()
            .with_timeout(Duration::from_secs(1))
            .enter(queued.call(CallRequest::default()))
            .await
    };
    let (held, waited) = tokio::join!(held, waiter);
    held.expect("the first call is served");
    waited.expect("the queued call is served once the stream is free");
    assert_eq!(
        metrics.budgets_left_late(),
        1,
        "the second call waited about 250 ms for the stream after its header was written: \
         every call is watched, not one in 64"
    );
}

/// A loopback address nothing listens on.
async fn closed_port() -> Uri {
    let (listener, addr) = loopback().await;
    drop(listener);
    format!("http://{addr}").parse().expect("a loopback URI")
}

#[tokio::test]
async fn wait_for_ready_over_a_plain_channel_fails_naming_the_fix_and_is_counted() {
    let uri = closed_port().await;
    let metrics = Metrics::new();
    let config =
        r#"{"methodConfig": [{"name": [{"service": "probe.v1.Probe"}], "waitForReady": true}]}"#;
    let stack = tower::ServiceBuilder::new()
        .layer(ResilienceLayer::from_service_config(config).expect("a valid config"))
        .layer(ClientDeadlineLayer::new().metrics(&metrics))
        .service(Endpoint::from(uri).connect_lazy());
    let mut client = ProbeClient::new(stack);
    for _ in 0..2 {
        let status = Scope::background()
            .with_timeout(BUDGET)
            .enter(client.call(CallRequest::default()))
            .await
            .expect_err("nothing listens");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(
            status.message().contains("wait for ready")
                && status.message().contains("ReadyChannel"),
            "the status must say the wait was not kept, and name the fix: {status:?}"
        );
    }
    assert_eq!(
        metrics.waits_for_ready_ignored(),
        2,
        "each such call counts"
    );
}

#[tokio::test]
async fn a_call_that_fails_fast_over_a_plain_channel_is_not_reported() {
    let uri = closed_port().await;
    let metrics = Metrics::new();
    let mut client = ProbeClient::new(
        tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new().metrics(&metrics))
            .service(Endpoint::from(uri).connect_lazy()),
    );
    let status = Scope::background()
        .with_timeout(BUDGET)
        .enter(client.call(CallRequest::default()))
        .await
        .expect_err("nothing listens");
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        !status.message().contains("ReadyChannel"),
        "failing fast is what the call asked for: {status:?}"
    );
    assert_eq!(metrics.waits_for_ready_ignored(), 0);
}

#[tokio::test]
async fn wait_for_ready_over_a_ready_channel_is_kept_and_not_reported() {
    let uri = closed_port().await;
    let metrics = Metrics::new();
    let endpoint = Endpoint::from(uri);
    let mut client = ProbeClient::new(
        tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new().metrics(&metrics))
            .service(ReadyChannel::lazy(&endpoint)),
    );
    let mut request = tonic::Request::new(CallRequest::default());
    request.extensions_mut().insert(WaitForReady);
    let status = Scope::background()
        .with_timeout(Duration::from_millis(200))
        .enter(client.call(request))
        .await
        .expect_err("nothing listens");
    assert_eq!(
        status.code(),
        Code::DeadlineExceeded,
        "the call waits for a connection until its deadline: {status:?}"
    );
    assert_eq!(metrics.waits_for_ready_ignored(), 0);
}
