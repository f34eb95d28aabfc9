//! Hedged methods: attempts racing inside the one deadline.

use std::time::Duration;

use tonic::Code;

use super::super::*;
use super::{Server, Step, answer, cancel_after, fail, outcome, stack};
use crate::Scope;
use crate::observe::Metrics;

fn config(max: u32, delay: &str, non_fatal: &str) -> String {
    format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "kv.Store"}}], "idempotent": true,
            "hedgingPolicy": {{"maxAttempts": {max}, "hedgingDelay": "{delay}",
                              "nonFatalStatusCodes": [{non_fatal}]}}}}]}}"#
    )
}

#[tokio::test(start_paused = true)]
async fn the_first_answer_wins_and_the_slow_attempt_is_dropped_at_once() {
    let server = Server::new(vec![answer(200), answer(5)]);
    let metrics = Metrics::new();
    let layer = ResilienceLayer::from_service_config(&config(3, "0.02s", ""))
        .expect("valid")
        .metrics(&metrics);
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(1));
    let (code, took) = outcome(&mut service, &scope).await;
    assert_eq!(code, Code::Ok);
    assert_eq!(
        took,
        Duration::from_millis(25),
        "the hedge sent at 20 ms answers 5 ms later"
    );
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "no third attempt once one has won");
    assert_eq!(
        seen[1].at - seen[0].at,
        Duration::from_millis(20),
        "the hedge waits hedgingDelay"
    );
    assert_eq!(seen[1].previous.as_deref(), Some("1"));
    assert!(
        seen[1].budget < seen[0].budget,
        "the hedge carries what is left then"
    );
    assert_eq!(
        *seen[0].dropped.lock().expect("not poisoned"),
        Some(seen[0].at + Duration::from_millis(25)),
        "the loser must be dropped (its stream reset) the moment the hedge wins"
    );
    assert_eq!(metrics.hedge_losers_cancelled(), 1);
    assert_eq!(metrics.call_hedges().sum, 1.0, "one hedge for this call");
    let text = metrics.encode();
    assert!(
        text.lines().any(|line| line
            .starts_with(r#"grpc_client_call_hedges_count{grpc_method="kv.Store/Get"} 1"#)),
        "the hedge metric must be labelled with the method:\n{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fast_answer_sends_no_hedge() {
    let server = Server::new(vec![answer(5)]);
    let metrics = Metrics::new();
    let layer = ResilienceLayer::from_service_config(&config(3, "0.02s", ""))
        .expect("valid")
        .metrics(&metrics);
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(1));
    assert_eq!(
        outcome(&mut service, &scope).await,
        (Code::Ok, Duration::from_millis(5))
    );
    assert_eq!(server.seen().len(), 1);
    assert_eq!(
        metrics.call_hedges().count,
        0,
        "a call with no hedge is not recorded"
    );
    assert_eq!(metrics.call_attempts(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_non_fatal_status_sends_the_next_hedge_at_once() {
    let server = Server::new(vec![fail(Code::Unavailable, 3), answer(5)]);
    let layer = ResilienceLayer::from_service_config(&config(3, "0.5s", r#""UNAVAILABLE""#))
        .expect("valid");
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(1));
    let (code, took) = outcome(&mut service, &scope).await;
    assert_eq!(code, Code::Ok);
    assert_eq!(
        took,
        Duration::from_millis(8),
        "not 500 ms: the next hedge follows the failure"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fatal_status_ends_the_call_and_drops_the_rest() {
    let server = Server::new(vec![answer(300), fail(Code::InvalidArgument, 5)]);
    let metrics = Metrics::new();
    let layer = ResilienceLayer::from_service_config(&config(3, "0.01s", r#""UNAVAILABLE""#))
        .expect("valid")
        .metrics(&metrics);
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(1));
    let (code, took) = outcome(&mut service, &scope).await;
    assert_eq!(
        (code, took),
        (Code::InvalidArgument, Duration::from_millis(15))
    );
    assert!(
        server.seen()[0]
            .dropped
            .lock()
            .expect("not poisoned")
            .is_some()
    );
    assert_eq!(server.seen().len(), 2, "no hedge after a fatal answer");
    assert_eq!(metrics.hedge_losers_cancelled(), 1);
}

#[tokio::test(start_paused = true)]
async fn every_non_fatal_answer_gives_the_last_one() {
    let server = Server::new(vec![fail(Code::Unavailable, 2); 3]);
    let layer = ResilienceLayer::from_service_config(&config(3, "0.01s", r#""UNAVAILABLE""#))
        .expect("valid");
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(1));
    let (code, _) = outcome(&mut service, &scope).await;
    assert_eq!(code, Code::Unavailable);
    assert_eq!(server.seen().len(), 3, "maxAttempts in all");
}

#[tokio::test(start_paused = true)]
async fn no_hedge_is_sent_that_the_deadline_cannot_fit() {
    let server = Server::new(vec![answer(500), answer(5)]);
    let metrics = Metrics::new();
    let layer = ResilienceLayer::from_service_config(&config(3, "0.09s", ""))
        .expect("valid")
        .min_attempt_time(Duration::from_millis(20))
        .metrics(&metrics);
    let mut service = stack(layer, &server);
    // 100 ms: at 90 ms only 10 ms are left, less than the 20 ms floor.
    let scope = Scope::background().with_timeout(Duration::from_millis(100));
    let (code, took) = outcome(&mut service, &scope).await;
    assert_eq!(
        (code, took),
        (Code::DeadlineExceeded, Duration::from_millis(100))
    );
    assert_eq!(server.seen().len(), 1, "the hedge would have been doomed");
    assert_eq!(metrics.attempts_refused_for_time(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_hedge_that_cannot_fit_leaves_the_last_answer_saying_so() {
    // Every attempt is answered UNAVAILABLE after 100 ms; 250 ms of budget:
    // the second answer comes at 200 ms, and 50 ms cannot fit a third.
    let server = Server::new(vec![fail(Code::Unavailable, 100); 5]);
    let metrics = Metrics::new();
    let layer = ResilienceLayer::from_service_config(&config(5, "1s", r#""UNAVAILABLE""#))
        .expect("valid")
        .metrics(&metrics);
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_millis(250));
    let mut call = super::request(super::PATH);
    call.extensions_mut().insert(scope.clone());
    let answer = tower::ServiceExt::ready(&mut service)
        .await
        .expect("ready")
        .call(call)
        .await
        .expect("the server's trailers-only answer");
    assert_eq!(server.seen().len(), 2, "no third attempt");
    assert_eq!(
        super::code_of(&answer),
        Code::Unavailable,
        "the last answer's code, not a deadline that has not passed"
    );
    assert_eq!(
        answer.headers().get("grpc-message").map(|v| v.as_bytes()),
        Some(super::super::shared::NO_TIME_LEFT.as_bytes())
    );
    assert_eq!(metrics.attempts_refused_for_time(), 1);
}

#[tokio::test(start_paused = true)]
async fn pushback_delays_the_next_hedge_and_a_negative_one_stops_them() {
    let server = Server::new(vec![
        Step {
            pushback: Some("40"),
            ..fail(Code::Unavailable, 2)
        },
        answer(5),
    ]);
    let layer = ResilienceLayer::from_service_config(&config(3, "0.5s", r#""UNAVAILABLE""#))
        .expect("valid");
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(1));
    let (code, took) = outcome(&mut service, &scope).await;
    assert_eq!(
        (code, took),
        (Code::Ok, Duration::from_millis(47)),
        "2 ms + 40 ms pushback + 5 ms"
    );

    let server = Server::new(vec![
        Step {
            pushback: Some("-1"),
            ..fail(Code::Unavailable, 2)
        },
        answer(5),
    ]);
    let layer = ResilienceLayer::from_service_config(&config(3, "0.01s", r#""UNAVAILABLE""#))
        .expect("valid");
    let mut service = stack(layer, &server);
    let (code, _) = outcome(&mut service, &scope).await;
    assert_eq!(code, Code::Unavailable, "a negative pushback stops hedging");
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_adaptive_delay_waits_for_the_learned_quantile() {
    let mut steps = vec![answer(10); 20];
    steps.push(answer(300));
    steps.push(answer(10));
    let server = Server::new(steps);
    let layer = ResilienceLayer::from_service_config(&config(2, "0.2s", ""))
        .expect("valid")
        .adaptive_hedging_delay(0.95);
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(5));
    for _ in 0..20 {
        outcome(&mut service, &scope).await;
    }
    let (code, took) = outcome(&mut service, &scope).await;
    assert_eq!(code, Code::Ok);
    assert_eq!(
        took,
        Duration::from_millis(20),
        "hedged after the learned p95 (10 ms), not 200 ms"
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_caller_ends_every_attempt() {
    let server = Server::new(vec![answer(500), answer(500)]);
    let layer = ResilienceLayer::from_service_config(&config(2, "0.01s", "")).expect("valid");
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(5));
    let cancel = cancel_after(&scope, Duration::from_millis(50));
    let ((code, took), ()) = tokio::join!(outcome(&mut service, &scope), cancel);
    assert_eq!((code, took), (Code::Cancelled, Duration::from_millis(50)));
    for seen in server.seen() {
        assert!(
            seen.dropped.lock().expect("not poisoned").is_some(),
            "every attempt is reset"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_adaptive_delay_keeps_hedging_delay_until_eight_attempts_were_answered() {
    let mut steps = vec![answer(10); 7];
    steps.extend([answer(300), answer(10), answer(300), answer(10)]);
    let server = Server::new(steps);
    let layer = ResilienceLayer::from_service_config(&config(2, "0.2s", ""))
        .expect("valid")
        .adaptive_hedging_delay(0.95);
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(5));
    for _ in 0..7 {
        outcome(&mut service, &scope).await;
    }
    assert_eq!(
        outcome(&mut service, &scope).await,
        (Code::Ok, Duration::from_millis(210)),
        "seven answers: the hedge still waits hedgingDelay (200 ms)"
    );
    assert_eq!(
        outcome(&mut service, &scope).await,
        (Code::Ok, Duration::from_millis(20)),
        "eight answers: the hedge waits the learned p95 (10 ms)"
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_caller_ends_a_call_waiting_out_a_pushback_at_once() {
    let server = Server::new(vec![
        Step {
            pushback: Some("400"),
            ..fail(Code::Unavailable, 2)
        },
        answer(5),
    ]);
    let layer = ResilienceLayer::from_service_config(&config(3, "0.5s", r#""UNAVAILABLE""#))
        .expect("valid");
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(5));
    let cancel = cancel_after(&scope, Duration::from_millis(50));
    let ((code, took), ()) = tokio::join!(outcome(&mut service, &scope), cancel);
    assert_eq!(
        (code, took),
        (Code::Cancelled, Duration::from_millis(50)),
        "no attempt is in flight to see the cancel: the call itself must"
    );
    assert_eq!(server.seen().len(), 1, "no attempt after the cancel");
}
