//! tonic's own timeouts beside the layers, where our answers differ on
//! purpose. tonic answers a timeout of its own as `CANCELLED` ("Timeout
//! expired"); a deadline is `DEADLINE_EXCEEDED` in gRPC, and that is what
//! the layers answer. What each of tonic's timeouts does with the layers:
//!
//! - `tonic::Request::set_timeout` writes `grpc-timeout`: the client layer
//!   takes it as the call's deadline (the earlier of it and the scope's),
//!   tells the server, and answers `DEADLINE_EXCEEDED`;
//! - `Endpoint::timeout` is a timer inside tonic's channel, which the layer
//!   cannot see: shorter than the scope, it still answers `CANCELLED`, and
//!   the server is told the scope's budget, not it;
//! - `Server::timeout` is tonic's timer outside every layer: see
//!   `seams::tonic_server_timeout_next_to_the_layer_is_never_called_a_caller_cancel`
//!   and `seams::max_timeout_replaces_tonic_server_timeout_with_deadline_exceeded`;
//! - a `grpc-timeout` the server must enforce itself, which tonic's server
//!   also times outside the layer: the layer answers first.

use std::time::Duration;

use testkit::CallRequest;
use tokio::time::Instant;
use tonic::Code;
use tonic_deadline::Scope;

use crate::common::{raw_call, raw_client};

use super::{
    Answer, BUDGET, EXPIRING, PATIENCE, SLOW_MS, Seer, Transport, endpoint, plain_client, serve,
    serve_plain, within,
};

/// tonic's own timeout in these tests: far inside [`BUDGET`].
const TONIC_TIMEOUT: Duration = Duration::from_millis(100);

fn slow() -> CallRequest {
    CallRequest {
        work_ms: SLOW_MS,
        ..CallRequest::default()
    }
}

#[tokio::test]
async fn request_set_timeout_is_the_layers_deadline_and_answers_deadline_exceeded() {
    let (seer, mut sightings) = Seer::new(Answer::Echo);
    let addr = serve(seer).await;

    // Plain tonic on both ends: the channel times the call from the header
    // and answers CANCELLED.
    let (seer, _) = Seer::new(Answer::Echo);
    let plain = endpoint(serve_plain(seer).await);
    let mut request = tonic::Request::new(slow());
    request.set_timeout(TONIC_TIMEOUT);
    let plain = tokio::time::timeout(PATIENCE, plain_client(&plain).call(request))
        .await
        .expect("tonic's timer ends the call")
        .expect_err("the handler works far beyond the timeout");
    assert_eq!(
        (plain.code(), plain.message()),
        (Code::Cancelled, "Timeout expired"),
        "plain tonic answers its own timeout as CANCELLED: {plain:?}"
    );

    for transport in Transport::BOTH {
        let what = format!("Request::set_timeout, {transport}");
        let mut client = transport.client(&endpoint(addr));

        // A scope without a deadline: set_timeout alone is the deadline.
        let mut request = tonic::Request::new(slow());
        request.set_timeout(TONIC_TIMEOUT);
        let status =
            tokio::time::timeout(PATIENCE, Scope::background().enter(client.call(request)))
                .await
                .expect("the layer ends the call at the timeout")
                .expect_err("the handler works far beyond the timeout");
        assert_eq!(
            status.code(),
            Code::DeadlineExceeded,
            "{what}: the layer answers a per-request timeout as the deadline it is: {status:?}"
        );

        // Shorter than the scope's budget, it is what the server is told.
        let mut request = tonic::Request::new(CallRequest::default());
        request.set_timeout(TONIC_TIMEOUT);
        within(BUDGET, client.call(request))
            .await
            .unwrap_or_else(|status| panic!("{what}: the call must succeed, got {status:?}"));
        sightings.next().await.assert_budget(TONIC_TIMEOUT, &what);

        // Longer, the scope's budget is.
        let mut request = tonic::Request::new(CallRequest::default());
        request.set_timeout(10 * BUDGET);
        within(BUDGET, client.call(request))
            .await
            .unwrap_or_else(|status| panic!("{what}: the call must succeed, got {status:?}"));
        sightings.next().await.assert_budget(BUDGET, &what);
    }
}

#[tokio::test]
async fn endpoint_timeout_stays_tonics_cancelled_and_the_server_is_told_the_scopes_budget() {
    let (seer, mut sightings) = Seer::new(Answer::Echo);
    let addr = serve(seer).await;
    for transport in Transport::BOTH {
        let what = format!("Endpoint::timeout, {transport}");
        let mut client = transport.client(&endpoint(addr).timeout(TONIC_TIMEOUT));
        let started = Instant::now();
        let status = tokio::time::timeout(PATIENCE, within(BUDGET, client.call(slow())))
            .await
            .expect("tonic's timer ends the call")
            .expect_err("the handler works far beyond the timeout");
        assert_eq!(
            (status.code(), status.message()),
            (Code::Cancelled, "Timeout expired"),
            "{what}: tonic's channel timer, below the layer, answers as tonic does: {status:?}"
        );
        assert!(
            started.elapsed() < BUDGET / 2,
            "{what}: tonic's timer, not the scope's deadline, ended the call"
        );

        // The layer cannot see tonic's timer: the server is told the scope's
        // budget.
        within(BUDGET, client.call(CallRequest::default()))
            .await
            .unwrap_or_else(|status| panic!("{what}: a quick call must succeed, got {status:?}"));
        let seen = sightings.next().await;
        seen.assert_budget(BUDGET, &what);
        assert!(
            seen.remaining.expect("checked above") > TONIC_TIMEOUT,
            "{what}: the server is told the scope's budget, not tonic's timeout"
        );

        // A timeout longer than the budget leaves the deadline to the layer.
        let mut client = transport.client(&endpoint(addr).timeout(10 * BUDGET));
        let status = tokio::time::timeout(PATIENCE, within(EXPIRING, client.call(slow())))
            .await
            .expect("the layer ends the call at the deadline")
            .expect_err("the handler works far beyond the budget");
        assert_eq!(status.code(), Code::DeadlineExceeded, "{what}: {status:?}");
    }
}

#[tokio::test]
async fn a_deadline_left_to_the_server_is_deadline_exceeded_not_tonics_cancelled() {
    // A caller that does not time its own call (a proxy, curl, a gRPC-Web
    // client): tonic's server times the same header outside the layer, and
    // would answer CANCELLED (`plain_tonic_reports_its_own_timeout_as_cancelled`).
    let (seer, _sightings) = Seer::new(Answer::Echo);
    let addr = serve(seer).await;
    let mut connection = raw_client(addr).await;
    for attempt in 0..10 {
        let answer = raw_call(&mut connection, addr, Some(b"20m"), &slow()).await;
        assert_eq!(
            answer.status.code(),
            Code::DeadlineExceeded,
            "attempt {attempt}: the layer's timer must answer before tonic's: {:?}",
            answer.status
        );
    }
}
