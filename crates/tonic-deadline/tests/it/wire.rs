//! What goes on the wire: strict `grpc-timeout` decoding on the server, no
//! frames at all for a call whose scope has ended, and a stream reset when a
//! call is abandoned.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use crate::common;

use std::time::Duration;

use common::{
    DATA, Events, HEADERS, Node, PATIENCE, code, connect, decode_reply, frame_counting_proxy,
    raw_call, raw_client, serve, silent_server, with_deadlines,
};
use testkit::CallRequest;
use tokio::time::Instant;
use tonic_deadline::timeout_header::decode;
use tonic_deadline::{Scope, ServerDeadlineLayer};
use tonic_deadline_guard::frames::RST_STREAM;

/// RST_STREAM's CANCEL error code (RFC 9113, section 7).
const CANCEL: u32 = 0x8;

#[tokio::test]
async fn malformed_grpc_timeout_is_internal_before_the_handler() {
    let (mut events, tx) = Events::new();
    let addr = serve(ServerDeadlineLayer::new(), Node::new("S", &tx)).await;
    let mut connection = raw_client(addr).await;

    for malformed in [&b"1a"[..], b"+1S", b"123456789S", b"1 S", b"-1S"] {
        let shown = String::from_utf8_lossy(malformed);
        let answer = raw_call(
            &mut connection,
            addr,
            Some(malformed),
            &CallRequest::default(),
        )
        .await;
        assert_eq!(
            answer.status.code(),
            tonic::Code::Internal,
            "{shown:?} must be refused"
        );
        assert!(
            answer.status.message().contains("grpc-timeout"),
            "{shown:?}: the message must name the header, got {:?}",
            answer.status.message()
        );
        assert!(
            answer.trailers_only,
            "{shown:?}: refused before any message is sent"
        );
    }

    let answer = raw_call(&mut connection, addr, Some(b"5S"), &CallRequest::default()).await;
    assert_eq!(
        answer.status.code(),
        tonic::Code::Ok,
        "the same connection must still serve a valid request: {:?}",
        answer.status
    );
    let reply = decode_reply(&answer.data);
    assert_eq!(
        reply.hops[0].header, "5S",
        "the handler must see the header it was sent"
    );
    assert!(
        events.exited("S").await,
        "the valid request must run to completion"
    );
    let entered = events
        .received()
        .into_iter()
        .filter(|e| matches!(e, common::Event::Entered { .. }))
        .count();
    assert_eq!(
        entered, 1,
        "only the valid request may reach a handler, never a malformed grpc-timeout"
    );
}

#[tokio::test]
async fn expired_scope_sends_no_frames() {
    let (_events, tx) = Events::new();
    let server = serve(ServerDeadlineLayer::new(), Node::new("S", &tx)).await;
    let (proxy, log) = frame_counting_proxy(server).await;
    let mut client = connect(proxy).await;
    let live = || Scope::background().with_timeout(PATIENCE);

    live()
        .enter(client.call(CallRequest::default()))
        .await
        .expect("the first call opens the connection");
    let first = log.streams_with_requests();
    assert_eq!(
        first.len(),
        1,
        "the proxy must see the first call's frames: {first:?}"
    );

    let expired = Scope::background().with_timeout(Duration::ZERO);
    let outcome = expired.enter(client.call(CallRequest::default())).await;
    assert_eq!(code(&outcome), tonic::Code::DeadlineExceeded);
    let cancelled = Scope::background().with_timeout(PATIENCE);
    cancelled.cancel();
    let outcome = cancelled.enter(client.call(CallRequest::default())).await;
    assert_eq!(code(&outcome), tonic::Code::Cancelled);

    // A later call on the same connection: everything the client wrote
    // before it has gone through the proxy by the time it is answered.
    live()
        .enter(client.call(CallRequest::default()))
        .await
        .expect("the connection is still usable");
    let streams = log.streams_with_requests();
    assert_eq!(
        streams.len(),
        2,
        "only the two live calls may send HEADERS or DATA, saw streams {streams:?}"
    );
    assert_eq!(
        streams[1],
        streams[0] + 2,
        "the ended calls must not even take a stream id: {streams:?}"
    );
    assert_eq!(
        log.connections(),
        1,
        "all calls share the one open connection"
    );
    let headers = log
        .frames()
        .iter()
        .filter(|f| f.header.kind == HEADERS)
        .count();
    assert_eq!(headers, 2, "one HEADERS frame per live call");
    assert!(
        log.frames().iter().any(|f| f.header.kind == DATA),
        "the live calls sent their messages"
    );
}

#[tokio::test]
async fn deadline_mid_call_is_deadline_exceeded_and_resets_the_stream() {
    let (addr, mut seen) = silent_server(false).await;
    let mut client = connect(addr).await;
    let budget = Duration::from_millis(300);

    let start = Instant::now();
    let outcome = Scope::background()
        .with_timeout(budget)
        .enter(client.call(CallRequest::default()))
        .await;
    let elapsed = start.elapsed();
    assert_eq!(
        code(&outcome),
        tonic::Code::DeadlineExceeded,
        "never CANCELLED or UNKNOWN"
    );
    assert!(
        elapsed >= budget,
        "the call must not give up early ({elapsed:?})"
    );
    assert!(
        elapsed < budget + PATIENCE / 2,
        "the call must give up at the deadline ({elapsed:?})"
    );

    let silenced = tokio::time::timeout(PATIENCE, seen.recv())
        .await
        .expect("the server must learn the call ended")
        .expect("the server reports");
    let header = silenced
        .headers
        .get("grpc-timeout")
        .expect("the request must carry its deadline");
    let on_wire = decode(header.as_bytes()).expect("a valid grpc-timeout");
    assert!(
        on_wire <= budget,
        "the server must be told at most the budget, got {on_wire:?}"
    );
    assert_eq!(
        silenced.reset,
        Some(h2::Reason::CANCEL),
        "the client must reset the stream with CANCEL"
    );
}

#[tokio::test]
async fn explicit_cancel_mid_call_is_cancelled_and_resets_the_stream() {
    let (addr, mut seen) = silent_server(false).await;
    let (proxy, log) = frame_counting_proxy(addr).await;
    let mut client = connect(proxy).await;

    let scope = Scope::background();
    let caller = scope.clone();
    let call = tokio::spawn(async move { caller.enter(client.call(CallRequest::default())).await });
    // Wait until the request is on the wire.
    let deadline = Instant::now() + PATIENCE;
    while log.streams_with_requests().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the request must reach the server"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    scope.cancel();
    let outcome = tokio::time::timeout(PATIENCE, call)
        .await
        .expect("the cancel must end the call at once")
        .expect("no panic");
    assert_eq!(code(&outcome), tonic::Code::Cancelled);

    let silenced = tokio::time::timeout(PATIENCE, seen.recv())
        .await
        .expect("the server must learn the call ended")
        .expect("the server reports");
    assert!(
        silenced.headers.get("grpc-timeout").is_none(),
        "no deadline, no header"
    );
    assert_eq!(silenced.reset, Some(h2::Reason::CANCEL));
    let resets: Vec<_> = log
        .frames()
        .into_iter()
        .filter(|f| f.header.kind == RST_STREAM)
        .collect();
    assert_eq!(resets.len(), 1, "exactly one reset on the wire: {resets:?}");
    assert_eq!(resets[0].error_code(), Some(CANCEL));
}

#[tokio::test]
async fn cancelling_an_open_bidi_stream_resets_it_while_the_caller_holds_both_ends() {
    let (addr, mut seen) = silent_server(true).await;
    let mut client = connect(addr).await;
    let scope = Scope::background();
    let (outbound, inbound) = tokio::sync::mpsc::channel::<CallRequest>(4);
    let mut replies = scope
        .enter(client.chat(tokio_stream::wrappers::ReceiverStream::new(inbound)))
        .await
        .expect("the server sends the response head")
        .into_inner();

    scope.cancel();
    let ended = tokio::time::timeout(PATIENCE, replies.message())
        .await
        .expect("the cancel must end the reply stream at once");
    assert_eq!(code(&ended), tonic::Code::Cancelled);
    let silenced = tokio::time::timeout(PATIENCE, seen.recv())
        .await
        .expect("the server must learn of the cancel while the caller holds both ends")
        .expect("the server reports");
    assert_eq!(
        silenced.reset,
        Some(h2::Reason::CANCEL),
        "a cancel is RST_STREAM CANCEL"
    );
    drop((outbound, replies));
}

#[tokio::test]
async fn deadline_on_an_open_bidi_stream_resets_it() {
    let (addr, mut seen) = silent_server(true).await;
    let mut client = connect(addr).await;
    let scope = Scope::background().with_timeout(Duration::from_millis(300));
    let (outbound, inbound) = tokio::sync::mpsc::channel::<CallRequest>(4);
    let mut replies = scope
        .enter(client.chat(tokio_stream::wrappers::ReceiverStream::new(inbound)))
        .await
        .expect("the server sends the response head")
        .into_inner();

    let ended = tokio::time::timeout(PATIENCE, replies.message())
        .await
        .expect("the deadline must end the reply stream");
    assert_eq!(
        code(&ended),
        tonic::Code::DeadlineExceeded,
        "never CANCELLED"
    );
    let silenced = tokio::time::timeout(PATIENCE, seen.recv())
        .await
        .expect("the server must learn of the deadline")
        .expect("the server reports");
    assert_eq!(silenced.reset, Some(h2::Reason::CANCEL));
    drop((outbound, replies));
}

#[tokio::test]
async fn plain_channel_with_deadline_layer_is_a_grpc_service() {
    // The layer must compose with a plain tonic channel built by hand too.
    let (_events, tx) = Events::new();
    let addr = serve(ServerDeadlineLayer::new(), Node::new("S", &tx)).await;
    let mut client = with_deadlines(common::channel(addr).await);
    let reply = Scope::background()
        .with_timeout(PATIENCE)
        .enter(client.call(CallRequest::default()))
        .await
        .expect("the call succeeds")
        .into_inner();
    assert!(
        !reply.hops[0].header.is_empty(),
        "the deadline must be on the wire"
    );
}
