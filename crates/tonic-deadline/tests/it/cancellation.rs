//! Cancellation crosses real services: a client's cancel or a dropped call
//! reaches the last hop's handler and the tasks it spawned.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use crate::common;

use std::time::Duration;

use common::{Events, Node, PATIENCE, code, connect, serve};
use testkit::CallRequest;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic_deadline::{Cause, Scope, ServerDeadlineLayer};

#[tokio::test]
async fn client_cancel_reaches_the_last_hop_and_its_spawned_task() {
    let (mut events, tx) = Events::new();
    let forever = Duration::from_secs(3600);
    let c_node = Node::new("C", &tx).working(forever).spawning_child();
    let c = serve(ServerDeadlineLayer::new(), c_node).await;
    let b_node = Node::new("B", &tx)
        .working(Duration::ZERO)
        .calling(connect(c).await);
    let b = serve(ServerDeadlineLayer::new(), b_node).await;
    let a_node = Node::new("A", &tx)
        .working(Duration::ZERO)
        .calling(connect(b).await);
    let a = serve(ServerDeadlineLayer::new(), a_node).await;
    let mut client = connect(a).await;

    let request_scope = Scope::background().with_timeout(Duration::from_secs(60));
    let caller = request_scope.clone();
    let call = tokio::spawn(async move { caller.enter(client.call(CallRequest::default())).await });

    let a_scope = events.entered("A").await;
    let b_scope = events.entered("B").await;
    let c_scope = events.entered("C").await;
    for scope in [&a_scope, &b_scope, &c_scope] {
        assert_eq!(scope.cause(), None, "every hop is live before the cancel");
    }

    request_scope.cancel();
    let outcome = tokio::time::timeout(PATIENCE, call)
        .await
        .expect("the cancelled call must return at once")
        .expect("the call task must not panic");
    assert_eq!(
        code(&outcome),
        tonic::Code::Cancelled,
        "an explicit cancel is CANCELLED"
    );

    for (hop, scope) in [("A", &a_scope), ("B", &b_scope), ("C", &c_scope)] {
        let cause = tokio::time::timeout(PATIENCE, scope.ended())
            .await
            .unwrap_or_else(|_| panic!("the cancel must reach {hop}"));
        assert_eq!(
            cause,
            Cause::Abandoned,
            "{hop} must see its caller going away"
        );
    }
    let child = events.child_stopped("C").await;
    assert_eq!(
        child.map_err(|e| e.cause()),
        Err(Cause::Abandoned),
        "the task C spawned under its scope must be cancelled with it"
    );
    assert!(
        !events.exited("C").await,
        "C's handler must be stopped, not finish"
    );
}

#[tokio::test]
async fn dropping_the_call_cancels_the_server_scope_as_caller_cancelled() {
    let (mut events, tx) = Events::new();
    let node = Node::new("S", &tx)
        .working(Duration::from_secs(3600))
        .spawning_child();
    let addr = serve(ServerDeadlineLayer::new(), node).await;
    let mut client = connect(addr).await;

    // No scope, no deadline: only the drop can end the call.
    let call = tokio::spawn(async move { client.call(CallRequest::default()).await });
    let scope = events.entered("S").await;
    assert_eq!(scope.deadline(), None, "no deadline was sent");
    call.abort();

    let cause = tokio::time::timeout(PATIENCE, scope.ended())
        .await
        .expect("the reset must reach the handler's scope");
    assert_eq!(cause, Cause::Abandoned);
    assert_eq!(
        events.child_stopped("S").await.map_err(|e| e.cause()),
        Err(Cause::Abandoned),
        "the handler's spawned task must stop too"
    );
    assert!(
        !events.exited("S").await,
        "the handler must be dropped, not finish"
    );
}

#[tokio::test]
async fn cancel_reaches_both_sides_of_a_bidi_stream() {
    let (mut events, tx) = Events::new();
    let addr = serve(ServerDeadlineLayer::new(), Node::new("S", &tx)).await;
    let mut client = connect(addr).await;

    let scope = Scope::background();
    let (outbound, inbound) = mpsc::channel(4);
    let mut replies = scope
        .enter(client.chat(ReceiverStream::new(inbound)))
        .await
        .expect("the stream opens")
        .into_inner();
    outbound
        .send(CallRequest {
            payload: "ping".to_owned(),
            ..CallRequest::default()
        })
        .await
        .expect("the request stream is open");
    let echo = tokio::time::timeout(PATIENCE, replies.message())
        .await
        .expect("the echo must arrive")
        .expect("the stream is healthy")
        .expect("one message");
    assert_eq!(echo.payload, "ping");
    let server_scope = events.entered("S").await;
    assert_eq!(
        server_scope.deadline(),
        None,
        "a subscription runs without a deadline"
    );

    scope.cancel();
    let ended = tokio::time::timeout(PATIENCE, replies.message())
        .await
        .expect("the cancel must end the client side at once");
    assert_eq!(
        code(&ended),
        tonic::Code::Cancelled,
        "the client side ends as CANCELLED"
    );
    let cause = tokio::time::timeout(PATIENCE, server_scope.ended())
        .await
        .expect("the cancel must reach the server side");
    assert_eq!(cause, Cause::Abandoned);
    assert!(
        !events.exited("S").await,
        "the server's stream must be dropped, not finish"
    );
}
