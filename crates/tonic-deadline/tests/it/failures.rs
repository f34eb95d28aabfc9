//! Streams under a deadline, and failures that are not deadlines: a refused
//! connection fails fast as UNAVAILABLE, a cut message is INTERNAL.

use crate::common;

use std::time::Duration;

use common::{
    Events, Node, PATIENCE, channel, code, connect, connect_lazy, cut_message_server,
    dropping_server, loopback, serve,
};
use testkit::CallRequest;
use testkit::probe_client::ProbeClient;
use tokio::time::Instant;
use tonic_deadline::{Cause, Scope, ServerDeadlineLayer};

fn endless_watch() -> CallRequest {
    CallRequest {
        count: u32::MAX,
        interval_ms: 20,
        ..CallRequest::default()
    }
}

#[tokio::test]
async fn server_cuts_a_stream_at_the_deadline_with_deadline_exceeded() {
    let (mut events, tx) = Events::new();
    let addr = serve(
        ServerDeadlineLayer::new().reply_reserve(Duration::ZERO),
        Node::new("S", &tx),
    )
    .await;
    // A plain tonic client: it only sends the header and enforces nothing,
    // so whatever ends the stream comes from the server.
    let mut client = ProbeClient::new(channel(addr).await);
    let budget = Duration::from_millis(500);
    let mut request = tonic::Request::new(endless_watch());
    request.set_timeout(budget);

    let start = Instant::now();
    let mut stream = client
        .watch(request)
        .await
        .expect("the stream opens")
        .into_inner();
    let mut received = 0;
    let ended = loop {
        match tokio::time::timeout(PATIENCE, stream.message()).await {
            Err(_) => panic!("the server must end the stream at its deadline"),
            Ok(Ok(Some(_))) => received += 1,
            Ok(Ok(None)) => panic!("an endless stream must not end cleanly"),
            Ok(Err(status)) => break status,
        }
    };
    let elapsed = start.elapsed();
    assert_eq!(ended.code(), tonic::Code::DeadlineExceeded, "{ended:?}");
    assert!(received > 0, "messages before the deadline must arrive");
    assert!(
        elapsed + Duration::from_millis(5) >= budget,
        "the deadline covers the whole stream, not the first message ({elapsed:?})"
    );
    let scope = events.entered("S").await;
    assert_eq!(
        scope.cause(),
        Some(Cause::DeadlineExceeded),
        "the server's scope ends as a deadline"
    );
    assert!(
        !events.exited("S").await,
        "the stream must be cut, not finish"
    );
}

#[tokio::test]
async fn client_stream_deadline_is_deadline_exceeded_not_cancelled() {
    let (mut events, tx) = Events::new();
    let addr = serve(ServerDeadlineLayer::new(), Node::new("S", &tx)).await;
    let mut client = connect(addr).await;
    let scope = Scope::background().with_timeout(Duration::from_millis(500));

    let mut stream = scope
        .enter(client.watch(endless_watch()))
        .await
        .expect("the stream opens")
        .into_inner();
    let mut received = 0;
    let ended = loop {
        match tokio::time::timeout(PATIENCE, stream.message()).await {
            Err(_) => panic!("the stream must end at the deadline"),
            Ok(Ok(Some(_))) => received += 1,
            Ok(Ok(None)) => panic!("an endless stream must not end cleanly"),
            Ok(Err(status)) => break status,
        }
    };
    assert_eq!(
        ended.code(),
        tonic::Code::DeadlineExceeded,
        "never CANCELLED: {ended:?}"
    );
    assert!(received > 0, "messages before the deadline must arrive");
    // The server's layer ends it, its reply reserve before the deadline,
    // so that its answer arrives before the client gives up.
    let left = scope.remaining().unwrap_or_default();
    assert!(
        left <= tonic_deadline::server::default_reply_reserve(Duration::from_millis(500)),
        "the stream ended because the deadline passed ({left:?} left)"
    );
    let server_scope = events.entered("S").await;
    let cause = tokio::time::timeout(PATIENCE, server_scope.ended())
        .await
        .expect("the server's scope must end too");
    assert!(
        matches!(cause, Cause::DeadlineExceeded | Cause::Abandoned),
        "the server ends by its timer or the client's reset, got {cause:?}"
    );
}

#[tokio::test]
async fn connection_refused_is_unavailable_long_before_the_deadline() {
    let (listener, addr) = loopback().await;
    drop(listener);
    let mut client = connect_lazy(addr);
    let budget = Duration::from_secs(60);

    let start = Instant::now();
    let outcome = tokio::time::timeout(
        PATIENCE,
        Scope::background()
            .with_timeout(budget)
            .enter(client.call(CallRequest::default())),
    )
    .await
    .expect("fail-fast: a refused connection must not wait for the deadline");
    assert_eq!(code(&outcome), tonic::Code::Unavailable, "{outcome:?}");
    assert!(start.elapsed() < budget / 2);
}

#[tokio::test]
async fn message_cut_in_the_middle_is_internal() {
    let addr = cut_message_server(100, 10).await;
    let mut client = connect(addr).await;
    let outcome = tokio::time::timeout(
        PATIENCE,
        Scope::background()
            .with_timeout(Duration::from_secs(60))
            .enter(client.call(CallRequest::default())),
    )
    .await
    .expect("a cut message must fail at once, not at the deadline");
    assert_eq!(code(&outcome), tonic::Code::Internal, "{outcome:?}");
}

#[tokio::test]
async fn connection_lost_mid_call_is_unavailable_long_before_the_deadline() {
    let addr = dropping_server(None).await;
    let mut client = connect(addr).await;
    let budget = Duration::from_secs(60);
    let start = Instant::now();
    let outcome = tokio::time::timeout(
        PATIENCE,
        Scope::background()
            .with_timeout(budget)
            .enter(client.call(CallRequest::default())),
    )
    .await
    .expect("a lost connection must fail at once, not at the deadline");
    assert_eq!(code(&outcome), tonic::Code::Unavailable, "{outcome:?}");
    assert!(start.elapsed() < budget / 2);
}

#[tokio::test]
async fn connection_lost_in_the_middle_of_a_message_is_internal() {
    let addr = dropping_server(Some((100, 10))).await;
    let mut client = connect(addr).await;
    let outcome = tokio::time::timeout(
        PATIENCE,
        Scope::background()
            .with_timeout(Duration::from_secs(60))
            .enter(client.call(CallRequest::default())),
    )
    .await
    .expect("a message cut by a lost connection must fail at once");
    assert_eq!(code(&outcome), tonic::Code::Internal, "{outcome:?}");
}

#[tokio::test]
async fn connection_lost_between_messages_of_a_stream_is_unavailable() {
    let addr = dropping_server(Some((0, 0))).await;
    let mut client = connect(addr).await;
    let outcome = tokio::time::timeout(PATIENCE, async {
        let mut stream = Scope::background()
            .with_timeout(Duration::from_secs(60))
            .enter(client.watch(endless_watch()))
            .await?
            .into_inner();
        // The one empty message arrives whole; then the connection is gone.
        while stream.message().await?.is_some() {}
        Ok::<(), tonic::Status>(())
    })
    .await
    .expect("a lost connection must end the stream at once");
    assert_eq!(code(&outcome), tonic::Code::Unavailable, "{outcome:?}");
}
