//! The budget travels across real tonic services: each hop sees what the
//! previous one had left, never more; the server's safety limits apply; the
//! only way out of the chain is an explicit `detach`.

use crate::common;

use std::time::Duration;

use common::{Events, Node, PATIENCE, code, connect, serve};
use testkit::CallRequest;
use tonic_deadline::timeout_header::decode;
use tonic_deadline::{Scope, ServerDeadlineLayer};

fn micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).expect("the hop must report a deadline, not -1"))
}

#[tokio::test]
async fn three_hop_chain_each_hop_sees_less_budget() {
    let budget = Duration::from_secs(3);
    let work = Duration::from_millis(100);
    let (_events, tx) = Events::new();
    let c = serve(ServerDeadlineLayer::new(), Node::new("C", &tx)).await;
    let b = serve(
        ServerDeadlineLayer::new(),
        Node::new("B", &tx).calling(connect(c).await),
    )
    .await;
    let a = serve(
        ServerDeadlineLayer::new(),
        Node::new("A", &tx).calling(connect(b).await),
    )
    .await;
    let mut client = connect(a).await;

    let request = CallRequest {
        work_ms: u64::try_from(work.as_millis()).expect("small"),
        ..CallRequest::default()
    };
    let reply = Scope::background()
        .with_timeout(budget)
        .enter(client.call(request))
        .await
        .expect("a 3 s budget must cover three 100 ms hops")
        .into_inner();

    let names: Vec<_> = reply.hops.iter().map(|h| h.service.as_str()).collect();
    assert_eq!(
        names,
        ["A", "B", "C"],
        "every hop must report, in call order"
    );

    let mut previous_remaining = budget;
    for (i, hop) in reply.hops.iter().enumerate() {
        let on_wire = decode(hop.header.as_bytes())
            .unwrap_or_else(|e| panic!("{} must receive a valid grpc-timeout: {e}", hop.service));
        let remaining = micros(hop.remaining_us);
        assert!(
            remaining <= on_wire,
            "{}: the server's deadline must come from the header ({remaining:?} > {on_wire:?})",
            hop.service
        );
        // The caller spent at least `work` before calling on (the client
        // spent nothing). The header rounds up by less than one unit.
        let spent = if i == 0 { Duration::ZERO } else { work };
        assert!(
            on_wire <= previous_remaining - spent + Duration::from_micros(1),
            "{}: a hop must never receive more than its caller had left \
             ({on_wire:?} on the wire, caller had {previous_remaining:?} on entry)",
            hop.service
        );
        assert!(
            on_wire + Duration::from_secs(1) > previous_remaining - spent,
            "{}: forwarding must not lose budget beyond transit ({on_wire:?} vs {previous_remaining:?})",
            hop.service
        );
        previous_remaining = remaining;
    }
}

#[tokio::test]
async fn propagating_chain_does_no_work_after_the_caller_gave_up() {
    let budget = Duration::from_millis(300);
    let (mut events, tx) = Events::new();
    let slow = Duration::from_secs(1);
    let c = serve(
        ServerDeadlineLayer::new(),
        Node::new("C", &tx).working(slow),
    )
    .await;
    let b_node = Node::new("B", &tx).working(slow).calling(connect(c).await);
    let b = serve(ServerDeadlineLayer::new(), b_node).await;
    let a_node = Node::new("A", &tx)
        .working(Duration::ZERO)
        .calling(connect(b).await);
    let a = serve(ServerDeadlineLayer::new(), a_node).await;
    let mut client = connect(a).await;

    let outcome = Scope::background()
        .with_timeout(budget)
        .enter(client.call(CallRequest::default()))
        .await;
    assert_eq!(code(&outcome), tonic::Code::DeadlineExceeded);

    let b_scope = events.entered("B").await;
    b_scope.ended().await;
    assert!(
        !events.exited("B").await,
        "B must be stopped before finishing its 1 s of work"
    );
    assert!(
        !events.exited("A").await,
        "A must be stopped with its caller"
    );
    let stray: Vec<_> = events
        .received()
        .into_iter()
        .filter(|e| matches!(e, common::Event::Entered { hop: "C", .. }))
        .collect();
    assert!(
        stray.is_empty(),
        "C must never start work nobody waits for: {stray:?}"
    );
}

#[tokio::test]
async fn detached_downstream_call_finishes_after_the_caller_gave_up() {
    let budget = Duration::from_millis(300);
    let (mut events, tx) = Events::new();
    let work = Duration::from_millis(600);
    let c = serve(
        ServerDeadlineLayer::new(),
        Node::new("C", &tx).working(work),
    )
    .await;
    let b_node = Node::new("B", &tx).working(work).calling(connect(c).await);
    let b = serve(ServerDeadlineLayer::new(), b_node).await;
    let a_node = Node::new("A", &tx)
        .working(Duration::ZERO)
        .calling(connect(b).await)
        .detaching();
    let a = serve(ServerDeadlineLayer::new(), a_node).await;
    let mut client = connect(a).await;

    let outcome = Scope::background()
        .with_timeout(budget)
        .enter(client.call(CallRequest::default()))
        .await;
    assert_eq!(
        code(&outcome),
        tonic::Code::DeadlineExceeded,
        "the caller still gives up"
    );

    let (b_scope, b_metadata) = events.entered_with_metadata("B").await;
    assert!(
        b_metadata.get("grpc-timeout").is_none(),
        "a detached call must carry no deadline"
    );
    assert_eq!(b_scope.deadline(), None, "B must run without a deadline");
    assert!(
        !events.exited("A").await,
        "A itself is stopped with its caller"
    );
    assert!(
        events.exited("B").await,
        "B must finish: the chain was broken on purpose"
    );
    assert!(events.exited("C").await, "C must finish too");
}

#[tokio::test]
async fn server_limits_are_what_the_handler_sees() {
    let default = Duration::from_secs(2);
    let max = Duration::from_secs(5);
    let (mut events, tx) = Events::new();
    let layer = ServerDeadlineLayer::new()
        .default_timeout(default)
        .max_timeout(max);
    let addr = serve(layer, Node::new("S", &tx)).await;
    let mut client = connect(addr).await;

    let cases = [
        ("no deadline gets the default", None, default),
        (
            "a huge budget is capped",
            Some(Duration::from_secs(3600)),
            max,
        ),
        (
            "a budget within the limits is kept",
            Some(Duration::from_secs(3)),
            Duration::from_secs(3),
        ),
    ];
    for (case, budget, expected) in cases {
        let call = client.call(CallRequest::default());
        let reply = match budget {
            Some(budget) => Scope::background().with_timeout(budget).enter(call).await,
            None => call.await,
        }
        .unwrap_or_else(|s| panic!("{case}: the call must succeed: {s}"))
        .into_inner();
        let seen = micros(reply.hops[0].remaining_us);
        assert!(
            seen <= expected,
            "{case}: the handler saw {seen:?} > {expected:?}"
        );
        assert!(
            seen + Duration::from_secs(1) > expected,
            "{case}: the handler saw {seen:?}, far below {expected:?}"
        );
        let scope = events.entered("S").await;
        assert_eq!(
            scope.remaining().map(|left| left <= expected),
            Some(true),
            "{case}: the handler's scope must carry the same limit"
        );
    }
}

#[tokio::test]
async fn forwarded_metadata_travels_only_when_listed() {
    let (mut events, tx) = Events::new();
    let c = serve(ServerDeadlineLayer::new(), Node::new("C", &tx)).await;
    let b_layer = ServerDeadlineLayer::new().forward_metadata("x-trace-id");
    let b = serve(b_layer, Node::new("B", &tx).calling(connect(c).await)).await;
    let mut client = connect(b).await;

    let mut request = tonic::Request::new(CallRequest::default());
    request
        .metadata_mut()
        .insert("x-trace-id", "trace-42".parse().expect("ASCII"));
    request
        .metadata_mut()
        .insert("authorization", "Bearer secret".parse().expect("ASCII"));
    Scope::background()
        .with_timeout(PATIENCE)
        .enter(client.call(request))
        .await
        .expect("the chain answers");

    let (_, at_b) = events.entered_with_metadata("B").await;
    assert!(
        at_b.get("authorization").is_some(),
        "B itself receives what the client sent"
    );
    let (_, at_c) = events.entered_with_metadata("C").await;
    assert_eq!(
        at_c.get("x-trace-id").and_then(|v| v.to_str().ok()),
        Some("trace-42"),
        "a listed key must reach the next hop"
    );
    assert!(
        at_c.get("authorization").is_none(),
        "credentials must not leak downstream"
    );
    assert!(
        at_c.get("grpc-timeout").is_some(),
        "the deadline travels by its own mechanism"
    );
}
