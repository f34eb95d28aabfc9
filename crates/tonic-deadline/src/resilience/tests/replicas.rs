//! Retried methods over a balanced channel that says which replica
//! answered: a retry goes to another replica than the one that failed.

use std::time::Duration;

use http::Request;
use tonic::Code;
use tower::{Layer, Service, ServiceExt};

use super::retry::{config, pushback_told};
use super::*;
use crate::Scope;
use crate::client::{Avoid, Balanced, Replica, ReplicaFailed};

/// A failure the hop below marked as spent for the chain.
fn marked(code: Code, after_ms: u64) -> Step {
    Step {
        pushback: Some("-1"),
        ..fail(code, after_ms)
    }
}

/// The resilience layer over a round-robin of `servers`, each behind the
/// client layer.
fn balanced(
    layer: ResilienceLayer,
    servers: &[Server],
) -> impl Service<
    Request<tonic::body::Body>,
    Response = Response<crate::client::ClientBody<tonic::body::Body>>,
    Error = BoxError,
> + Clone {
    layer.layer(Balanced::new(
        servers
            .iter()
            .map(|s| ClientDeadlineLayer::new().layer(s.service())),
    ))
}

fn unavailable() -> ResilienceLayer {
    ResilienceLayer::from_service_config(&config(false, r#""UNAVAILABLE""#, "")).expect("valid")
}

fn attempts(servers: &[Server]) -> Vec<usize> {
    servers.iter().map(|s| s.seen().len()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_failure_marked_for_the_chain_is_retried_once_on_another_replica() {
    let servers = [
        Server::new(vec![marked(Code::Unavailable, 5)]),
        Server::new(vec![answer(5)]),
        Server::new(vec![answer(5)]),
    ];
    let mut service = balanced(unavailable(), &servers);
    let scope = Scope::background().with_timeout(Duration::from_secs(2));
    let (code, _) = outcome(&mut service, &scope).await;
    assert_eq!(code, Code::Ok, "the retry on a healthy replica must answer");
    assert_eq!(
        attempts(&servers),
        vec![1, 1, 0],
        "one attempt at the replica that failed, one at the next"
    );
}

#[tokio::test(start_paused = true)]
async fn a_marked_failure_is_never_retried_on_the_replica_that_failed() {
    // One replica: there is no other, so the mark holds.
    let servers = [Server::new(vec![marked(Code::Unavailable, 5); 5])];
    let mut service = balanced(unavailable(), &servers);
    let scope = Scope::background().with_timeout(Duration::from_secs(2));
    let told = pushback_told(&mut service, &scope).await;
    assert_eq!(told, (Code::Unavailable, Some("-1".to_owned())));
    assert_eq!(attempts(&servers), vec![1], "no second attempt at it");
}

#[tokio::test(start_paused = true)]
async fn a_failure_of_every_replica_is_retried_by_no_hop_above() {
    let servers: Vec<Server> = (0..3)
        .map(|_| Server::new(vec![marked(Code::Unavailable, 5); 10]))
        .collect();
    let mut service = balanced(unavailable(), &servers);
    let scope = Scope::background().with_timeout(Duration::from_secs(2));
    // The first call learns that each one fails, once each.
    let told = pushback_told(&mut service, &scope).await;
    assert_eq!(told, (Code::Unavailable, Some("-1".to_owned())));
    assert_eq!(attempts(&servers), vec![1, 1, 1], "each replica once");
    // Every replica failed: the next calls are sent once, and marked.
    for _ in 0..6 {
        let told = pushback_told(&mut service, &scope).await;
        assert_eq!(told, (Code::Unavailable, Some("-1".to_owned())));
    }
    assert_eq!(
        attempts(&servers).iter().sum::<usize>(),
        9,
        "one attempt for each later call: {:?}",
        attempts(&servers)
    );
}

#[tokio::test(start_paused = true)]
async fn a_replica_that_failed_rests_while_another_is_at_hand() {
    let servers = [
        Server::new(vec![fail(Code::Unavailable, 5)]),
        Server::new(Vec::new()),
    ];
    let mut service = balanced(unavailable(), &servers);
    let scope = Scope::background().with_timeout(Duration::from_secs(10));
    assert_eq!(outcome(&mut service, &scope).await.0, Code::Ok);
    assert_eq!(attempts(&servers), vec![1, 1], "retried on the other one");
    for _ in 0..4 {
        assert_eq!(outcome(&mut service, &scope).await.0, Code::Ok);
    }
    assert_eq!(
        attempts(&servers),
        vec![1, 5],
        "calls during the rest go to the other replica"
    );
    tokio::time::sleep(shared::DEFAULT_REPLICA_REST).await;
    for _ in 0..2 {
        assert_eq!(outcome(&mut service, &scope).await.0, Code::Ok);
    }
    assert_eq!(
        attempts(&servers)[0],
        2,
        "after its rest the replica takes calls again"
    );
}

#[tokio::test(start_paused = true)]
async fn per_hop_retries_go_wherever_the_balancer_sends_them() {
    let servers = [
        Server::new(vec![marked(Code::Unavailable, 5); 2]),
        Server::new(Vec::new()),
    ];
    let layer = unavailable().chain_budget(false);
    let mut service = balanced(layer, &servers);
    let scope = Scope::background().with_timeout(Duration::from_secs(2));
    // The pushback stops the call; no replica is left out.
    assert_eq!(outcome(&mut service, &scope).await.0, Code::Unavailable);
    assert_eq!(outcome(&mut service, &scope).await.0, Code::Ok);
    assert_eq!(attempts(&servers), vec![1, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_marked_deadline_at_the_end_of_an_attempts_own_timeout_is_retried() {
    let layer = || {
        ResilienceLayer::from_service_config(&config(true, r#""DEADLINE_EXCEEDED""#, ""))
            .expect("valid")
            .per_attempt_timeout(Duration::from_millis(100))
    };
    // The hop below ran out of the 100 ms this attempt had: the call has
    // 2 s, and tries again (one replica, so not by the replica rule).
    let server = Server::new(vec![marked(Code::DeadlineExceeded, 97)]);
    let mut service = stack(layer(), &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(2));
    assert_eq!(outcome(&mut service, &scope).await.0, Code::Ok);
    assert_eq!(server.seen().len(), 2);
    // Long before the attempt's end it is the hop below's word: not retried.
    let server = Server::new(vec![marked(Code::DeadlineExceeded, 20)]);
    let mut service = stack(layer(), &server);
    let told = pushback_told(&mut service, &scope).await;
    assert_eq!(told, (Code::DeadlineExceeded, Some("-1".to_owned())));
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_balanced_channel_tags_each_answer_and_honours_avoid() {
    let servers = [
        Server::new(Vec::new()),
        Server::new(Vec::new()),
        Server::new(Vec::new()),
    ];
    let mut channel = Balanced::new(servers.iter().map(Server::service));
    let mut replicas = Vec::new();
    for _ in 0..4 {
        let response = channel
            .ready()
            .await
            .expect("ready")
            .call(request(PATH))
            .await;
        let replica = response
            .expect("answered")
            .extensions()
            .get::<Replica>()
            .copied();
        replicas.push(replica.map(|r| (r.id(), r.replicas())));
    }
    assert_eq!(
        replicas,
        vec![Some((0, 3)), Some((1, 3)), Some((2, 3)), Some((0, 3))],
        "in turn, each answer naming its replica"
    );
    let mut avoid = Avoid::default();
    avoid.insert(1);
    let mut req = request(PATH);
    req.extensions_mut().insert(avoid.clone());
    let response = channel.ready().await.expect("ready").call(req).await;
    assert_eq!(
        response
            .expect("answered")
            .extensions()
            .get::<Replica>()
            .map(Replica::id),
        Some(2),
        "replica 1's turn passes to the next one"
    );
    avoid.insert(0);
    avoid.insert(2);
    let mut req = request(PATH);
    req.extensions_mut().insert(avoid);
    let err = channel
        .ready()
        .await
        .expect("ready")
        .call(req)
        .await
        .expect_err("none left");
    assert_eq!(tonic::Status::from_error(err).code(), Code::Unavailable);
    assert_eq!(
        attempts(&servers),
        vec![2, 1, 2],
        "nothing sent when all are avoided"
    );
}

#[tokio::test(start_paused = true)]
async fn a_local_failure_names_its_replica_and_keeps_its_status() {
    let failing = tower::service_fn(|_: Request<tonic::body::Body>| async {
        Err::<Response<tonic::body::Body>, BoxError>(Box::new(tonic::Status::unavailable(
            "connection refused",
        )))
    });
    let mut channel = Balanced::new([failing]);
    let err = channel
        .ready()
        .await
        .expect("ready")
        .call(request(PATH))
        .await
        .expect_err("fails");
    let failed = err
        .downcast_ref::<ReplicaFailed>()
        .expect("tagged with its replica");
    assert_eq!(failed.replica(), Replica::new(0, 1));
    assert_eq!(tonic::Status::from_error(err).code(), Code::Unavailable);
}

#[tokio::test(start_paused = true)]
async fn behind_a_balancer_that_names_no_replica_a_marked_failure_is_not_retried() {
    // Two replicas in turn, as tonic's balancer or tower's p2c would pick
    // them: nothing in the answer says which one it was.
    let servers = [
        Server::new(vec![marked(Code::Unavailable, 5)]),
        Server::new(Vec::new()),
    ];
    let replicas: Vec<_> = servers.iter().map(Server::service).collect();
    let turn = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let untagged = tower::service_fn(move |request: Request<tonic::body::Body>| {
        let i = turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % replicas.len();
        replicas[i].clone().oneshot(request)
    });
    let mut service = unavailable().layer(ClientDeadlineLayer::new().layer(untagged));
    let scope = Scope::background().with_timeout(Duration::from_secs(2));
    let told = pushback_told(&mut service, &scope).await;
    assert_eq!(
        told,
        (Code::Unavailable, Some("-1".to_owned())),
        "the mark holds: the replica that failed is unknown"
    );
    assert_eq!(attempts(&servers), vec![1, 0], "no retry was sent");
}

#[tokio::test(start_paused = true)]
async fn a_marked_failure_is_retried_on_another_replica_only_if_the_deadline_fits() {
    let servers = [
        Server::new(vec![marked(Code::Unavailable, 50)]),
        Server::new(Vec::new()),
    ];
    let mut service = balanced(unavailable(), &servers);
    // 50 ms to answer leaves 10 ms: an attempt that took 50 ms cannot fit.
    let scope = Scope::background().with_timeout(Duration::from_millis(60));
    let told = pushback_told(&mut service, &scope).await;
    assert_eq!(
        told,
        (Code::Unavailable, Some("-1".to_owned())),
        "the call ends with the marked failure"
    );
    assert_eq!(attempts(&servers), vec![1, 0], "no retry that cannot fit");
}
