//! Load shedding and concurrency limits: tonic's own on the server
//! (`load_shed`, `concurrency_limit_per_connection`), tower's on the client
//! (`ConcurrencyLimit`, `LoadShed`) above and below the client layer; what a
//! caller sees when it is shed, and what a wait for a permit does to its
//! budget. The call that holds the only permit is held open by its
//! handler's [`Gate`] for exactly as long as each test needs.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use testkit::CallRequest;
use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Code;
use tonic::body::Body;
use tonic::transport::Server;
use tonic_deadline::client::ReadyChannel;
use tonic_deadline::{BoxError, ClientDeadlineLayer, ServerDeadlineLayer};
use tower::ServiceBuilder;

use super::{
    Answer, BUDGET, Client, EXPIRING, Gate, HOLD, PATIENCE, Seen, Seer, Sightings, Stack,
    Transport, boxed, endpoint, loopback, plain_client, stacks, within,
};

/// A call whose handler holds its permit until the gate opens.
fn holding() -> CallRequest {
    CallRequest {
        payload: HOLD.to_owned(),
        ..CallRequest::default()
    }
}

/// How long a test keeps the permit held while a call waits for it.
const WAIT: Duration = Duration::from_millis(200);

/// Serves a probe that takes one call at a time per connection and sheds
/// the rest, behind the server layer or without it.
async fn serve_one_at_a_time(seer: Seer, layered: bool) -> SocketAddr {
    let (listener, addr) = loopback().await;
    let incoming = TcpListenerStream::new(listener);
    let mut builder = Server::builder()
        .load_shed(true)
        .concurrency_limit_per_connection(1);
    if layered {
        tokio::spawn(
            builder
                .layer(ServerDeadlineLayer::new())
                .add_service(ProbeServer::new(seer))
                .serve_with_incoming(incoming),
        );
    } else {
        tokio::spawn(
            builder
                .add_service(ProbeServer::new(seer))
                .serve_with_incoming(incoming),
        );
    }
    addr
}

/// Makes `second` once `first`'s handler holds the permit, then opens
/// `release_after`, if given (else `second` opens the gate itself): what
/// the second call got, what the handler saw of the first, and what the
/// first got.
async fn while_one_holds<F: Future, S: Future>(
    sightings: &mut Sightings,
    release_after: Option<&Gate>,
    first: F,
    second: impl FnOnce() -> S,
) -> (S::Output, Seen, F::Output) {
    let second_after_first = async {
        let seen = sightings.next().await;
        let second = second().await;
        if let Some(gate) = release_after {
            gate.open_one();
        }
        (second, seen)
    };
    let (first, (second, seen)) =
        tokio::time::timeout(PATIENCE, async { tokio::join!(first, second_after_first) })
            .await
            .expect("both calls must end");
    (second, seen, first)
}

#[tokio::test]
async fn a_server_that_sheds_load_answers_through_both_layers_as_plain_tonic_does() {
    // Plain tonic: the answer to match.
    let (seer, mut sightings, gate) = Seer::gated(Answer::Echo);
    let plain = endpoint(serve_one_at_a_time(seer, false).await);
    let client = plain_client(&plain);
    let (mut first, mut second) = (client.clone(), client);
    let (expected, _, held) =
        while_one_holds(&mut sightings, Some(&gate), first.call(holding()), || {
            second.call(CallRequest::default())
        })
        .await;
    held.expect("the first call holds the permit and succeeds");
    let expected = expected.expect_err("the second call on the connection is shed");
    assert_eq!(
        expected.code(),
        Code::ResourceExhausted,
        "tonic sheds with RESOURCE_EXHAUSTED: {expected:?}"
    );

    let (seer, mut sightings, gate) = Seer::gated(Answer::Echo);
    let layered = endpoint(serve_one_at_a_time(seer, true).await);
    for transport in Transport::BOTH {
        let what = format!("server load shed, {transport}");
        // Clones share one connection, whose one permit the first call takes.
        let client = transport.client(&layered);
        let (mut first, mut second) = (client.clone(), client.clone());
        let (shed, seen, held) = while_one_holds(
            &mut sightings,
            Some(&gate),
            within(BUDGET, first.call(holding())),
            || within(BUDGET, second.call(CallRequest::default())),
        )
        .await;
        let shed = shed.expect_err("the second call on the connection is shed");
        assert_eq!(
            (shed.code(), shed.message()),
            (expected.code(), expected.message()),
            "{what}: the caller must see tonic's answer, unchanged: {shed:?}"
        );
        held.unwrap_or_else(|status| panic!("{what}: the first call must succeed: {status:?}"));
        seen.assert_budget(BUDGET, &what);
        sightings.assert_none(&format!("{what}: the shed call"));

        // With the permit back, the next call goes through, with its budget.
        let mut third = client;
        within(BUDGET, third.call(CallRequest::default()))
            .await
            .unwrap_or_else(|status| {
                panic!("{what}: a call after the first must succeed: {status:?}")
            });
        sightings.next().await.assert_budget(BUDGET, &what);
    }
}

#[tokio::test]
async fn a_wait_for_a_client_permit_above_the_layer_is_taken_off_the_budget() {
    let (seer, mut sightings, gate) = Seer::gated(Answer::Echo);
    let addr = super::serve(seer).await;
    for transport in Transport::BOTH {
        let what = format!("ConcurrencyLimit above the layer, {transport}");
        let stack = stacks!(transport, &endpoint(addr), |channel| ServiceBuilder::new()
            .concurrency_limit(1)
            .layer(ClientDeadlineLayer::new())
            .service(channel));
        let client: Client = ProbeClient::new(stack);
        let (mut first, mut second) = (client.clone(), client);
        let (waited, first_seen, held) = while_one_holds(
            &mut sightings,
            None,
            within(BUDGET, first.call(holding())),
            || async {
                // The second call waits for the permit; the first gives it
                // back once WAIT has passed.
                let waiting = within(BUDGET, second.call(CallRequest::default()));
                let release = async {
                    tokio::time::sleep(WAIT).await;
                    gate.open_one();
                };
                tokio::join!(waiting, release).0
            },
        )
        .await;
        held.unwrap_or_else(|status| panic!("{what}: the first call must succeed: {status:?}"));
        first_seen.assert_budget(BUDGET, &what);
        waited.unwrap_or_else(|status| panic!("{what}: the waiting call must succeed: {status:?}"));
        let seen = sightings.next().await;
        seen.assert_budget(BUDGET, &what);
        // The layer wrote its header after the wait: the server is told
        // what is left once the permit came.
        let left = seen.remaining.expect("checked above");
        assert!(
            left <= BUDGET - WAIT,
            "{what}: the wait for the permit must count against the budget: \
             {left:?} of {BUDGET:?} left after a {WAIT:?} wait"
        );
    }
}

#[tokio::test]
async fn a_client_permit_wait_ends_at_the_deadline_only_below_the_layer() {
    let (seer, mut sightings, gate) = Seer::gated(Answer::Echo);
    let addr = super::serve(seer).await;
    for transport in Transport::BOTH {
        // Below the layer, the layer's wait for readiness is bounded by the
        // deadline: the waiting call answers DEADLINE_EXCEEDED while the
        // permit is still held (the gate opens only after it answered).
        let what = format!("ConcurrencyLimit below the layer, {transport}");
        let stack = stacks!(transport, &endpoint(addr), |channel| ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new())
            .concurrency_limit(1)
            .service(channel));
        let client: Client = ProbeClient::new(stack);
        let (mut first, mut second) = (client.clone(), client);
        let (expired, _, held) = while_one_holds(
            &mut sightings,
            Some(&gate),
            within(BUDGET, first.call(holding())),
            || within(EXPIRING, second.call(CallRequest::default())),
        )
        .await;
        held.unwrap_or_else(|status| panic!("{what}: the first call must succeed: {status:?}"));
        let expired = expired.expect_err("the permit is held past the waiting call's deadline");
        assert_eq!(
            expired.code(),
            Code::DeadlineExceeded,
            "{what}: the waiting call must end at its own deadline: {expired:?}"
        );
        sightings.assert_none(&format!("{what}: the call that never got a permit"));

        // Above the layer, the wait is the caller's own: tower's limit
        // knows no deadline, and the layer is not asked until the permit is
        // free. The call then fails without a frame, but only then.
        let what = format!("ConcurrencyLimit above the layer, {transport}");
        let stack = stacks!(transport, &endpoint(addr), |channel| ServiceBuilder::new()
            .concurrency_limit(1)
            .layer(ClientDeadlineLayer::new())
            .service(channel));
        let client: Client = ProbeClient::new(stack);
        let (mut first, mut second) = (client.clone(), client);
        let (expired, _, held) = while_one_holds(
            &mut sightings,
            None,
            within(BUDGET, first.call(holding())),
            || async {
                let mut waiting =
                    std::pin::pin!(within(EXPIRING, second.call(CallRequest::default())));
                let early = tokio::time::timeout(EXPIRING + WAIT, &mut waiting).await;
                assert!(
                    early.is_err(),
                    "{what}: the call must still wait for the permit, past its deadline: {early:?}"
                );
                gate.open_one();
                waiting.await
            },
        )
        .await;
        held.unwrap_or_else(|status| panic!("{what}: the first call must succeed: {status:?}"));
        let expired = expired.expect_err("the deadline passed during the wait");
        assert_eq!(
            expired.code(),
            Code::DeadlineExceeded,
            "{what}: once the permit is free, the layer refuses the expired call: {expired:?}"
        );
        sightings.assert_none(&format!(
            "{what}: the call whose deadline passed in the wait"
        ));
    }
}

/// `channel` under tower's `LoadShed` and a `ConcurrencyLimit` of one,
/// above the client layer or below it.
fn shedding<C, B>(channel: C, above: bool) -> Stack
where
    C: tower::Service<Request<Body>, Response = Response<B>> + Clone + Send + Sync + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    if above {
        boxed(
            ServiceBuilder::new()
                .load_shed()
                .concurrency_limit(1)
                .layer(ClientDeadlineLayer::new())
                .service(channel),
        )
    } else {
        boxed(
            ServiceBuilder::new()
                .layer(ClientDeadlineLayer::new())
                .load_shed()
                .concurrency_limit(1)
                .service(channel),
        )
    }
}

/// What tonic makes of tower's `Overloaded`, wherever it comes from.
const SHED: (Code, &str) = (
    Code::ResourceExhausted,
    "Too many active requests for the connection",
);

#[tokio::test]
async fn a_client_that_sheds_load_answers_resource_exhausted_above_or_below_the_layer() {
    let (seer, mut sightings, gate) = Seer::gated(Answer::Echo);
    let endpoint = endpoint(super::serve(seer).await);
    for transport in Transport::BOTH {
        for above in [true, false] {
            let what = format!(
                "LoadShed {} the layer, {transport}",
                if above { "above" } else { "below" }
            );
            // Connected before the first call (a lazy ReadyChannel sheds
            // while it connects: see the next test).
            let stack = match transport {
                Transport::Channel => {
                    shedding(endpoint.connect().await.expect("the server accepts"), above)
                }
                Transport::ReadyChannel => shedding(
                    ReadyChannel::connect(&endpoint)
                        .await
                        .expect("the server accepts"),
                    above,
                ),
            };
            let client: Client = ProbeClient::new(stack);
            let (mut first, mut second) = (client.clone(), client);
            let (shed, seen, held) = while_one_holds(
                &mut sightings,
                Some(&gate),
                within(BUDGET, first.call(holding())),
                || within(BUDGET, second.call(CallRequest::default())),
            )
            .await;
            held.unwrap_or_else(|status| panic!("{what}: the first call must succeed: {status:?}"));
            seen.assert_budget(BUDGET, &what);
            let shed = shed.expect_err("the second call finds the permit taken");
            assert_eq!(
                (shed.code(), shed.message()),
                SHED,
                "{what}: tower's Overloaded, as tonic names it: {shed:?}"
            );
            sightings.assert_none(&format!("{what}: the shed call"));
        }
    }
}

#[tokio::test]
async fn load_shed_over_a_lazy_ready_channel_sheds_calls_until_it_has_connected() {
    let (seer, mut sightings) = Seer::new(Answer::Echo);
    let endpoint = endpoint(super::serve(seer).await);

    // tonic's lazy Channel is ready at once and connects inside, with the
    // first call waiting in it.
    let mut client = ProbeClient::new(shedding(endpoint.connect_lazy(), true));
    within(BUDGET, client.call(CallRequest::default()))
        .await
        .expect("a lazy tonic Channel takes the first call while it connects");
    sightings
        .next()
        .await
        .assert_budget(BUDGET, &"LoadShed over a lazy tonic Channel");

    // A ReadyChannel is ready only once connected (so that the budget on
    // the wire counts the connect): LoadShed takes the connect for
    // overload, and sheds the calls made meanwhile.
    let what = "LoadShed over a lazy ReadyChannel";
    let channel = ReadyChannel::lazy(&endpoint);
    let mut client = ProbeClient::new(shedding(channel.clone(), true));
    let shed = within(BUDGET, client.call(CallRequest::default()))
        .await
        .expect_err("the channel is not connected yet");
    assert_eq!((shed.code(), shed.message()), SHED, "{what}: {shed:?}");
    sightings.assert_none(&what);
    // The shed call's readiness check started the dial.
    tokio::time::timeout(PATIENCE, async {
        while !channel.is_connected() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the channel connects in the background");
    within(BUDGET, client.call(CallRequest::default()))
        .await
        .unwrap_or_else(|status| panic!("{what}: once connected, calls go through: {status:?}"));
    sightings.next().await.assert_budget(BUDGET, &what);
}
