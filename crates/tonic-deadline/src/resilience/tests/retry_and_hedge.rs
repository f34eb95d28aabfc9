//! One layer, one config: retried, hedged and plain methods side by side,
//! under one throttle.

use std::time::Duration;

use tonic::Code;

use super::super::*;
use super::{Server, answer, fail, outcome_of, stack};
use crate::Scope;
use crate::observe::Metrics;

const RETRIED: &str = "/kv.Store/Put";
const HEDGED: &str = "/kv.Store/Get";
const PLAIN: &str = "/kv.Admin/Stats";

/// `Put` retried, `Get` hedged, both on `UNAVAILABLE`; `extra` is appended
/// to the config (throttling).
fn config(extra: &str) -> String {
    format!(
        r#"{{"methodConfig": [
            {{"name": [{{"service": "kv.Store", "method": "Put"}}],
              "retryPolicy": {{"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
                              "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}}},
            {{"name": [{{"service": "kv.Store", "method": "Get"}}],
              "hedgingPolicy": {{"maxAttempts": 3, "hedgingDelay": "0.05s",
                                "nonFatalStatusCodes": ["UNAVAILABLE"]}}}}]{extra}}}"#
    )
}

#[tokio::test(start_paused = true)]
async fn each_method_is_retried_hedged_or_sent_once_as_one_config_says() {
    let server = Server::new(vec![
        // Put: fails twice, answers on its third attempt.
        fail(Code::Unavailable, 10),
        fail(Code::Unavailable, 10),
        answer(10),
        // Get: the first attempt stalls, the hedge answers.
        answer(500),
        answer(5),
        // Stats: fails, and is not repeated.
        fail(Code::Unavailable, 10),
    ]);
    let metrics = Metrics::new();
    let layer = ResilienceLayer::from_service_config(&config(""))
        .expect("valid")
        .metrics(&metrics);
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(5));

    assert_eq!(outcome_of(&mut service, RETRIED, &scope).await.0, Code::Ok);
    let seen = server.seen();
    assert_eq!(
        seen.len(),
        3,
        "Put is retried until its third attempt answers"
    );
    assert!(
        seen.windows(2)
            .all(|w| w[1].at >= w[0].at + Duration::from_millis(10)),
        "retried attempts go one after another"
    );

    assert_eq!(outcome_of(&mut service, HEDGED, &scope).await.0, Code::Ok);
    let seen = server.seen();
    assert_eq!(seen.len(), 5, "Get is hedged once");
    assert_eq!(
        seen[4].at - seen[3].at,
        Duration::from_millis(50),
        "the hedge goes hedgingDelay after the first attempt, while it runs"
    );
    assert!(
        seen[3].dropped.lock().expect("not poisoned").is_some(),
        "the losing attempt is reset"
    );

    assert_eq!(
        outcome_of(&mut service, PLAIN, &scope).await.0,
        Code::Unavailable
    );
    assert_eq!(
        server.seen().len(),
        6,
        "a method without a policy is sent once"
    );

    assert_eq!(metrics.call_retries().count, 1, "one retried call");
    assert_eq!(metrics.call_retries().sum, 2.0, "with two retries");
    assert_eq!(metrics.call_hedges().count, 1, "one hedged call");
    assert_eq!(metrics.call_hedges().sum, 1.0, "with one hedge");
    assert_eq!(metrics.hedge_losers_cancelled(), 1);
    assert_eq!(
        metrics.resilient_calls(),
        2,
        "the call sent once is no retried or hedged call"
    );
}

#[tokio::test(start_paused = true)]
async fn retried_and_hedged_methods_draw_on_one_throttle_per_channel() {
    let server = Server::new(vec![fail(Code::Unavailable, 1); 100]);
    let json = config(r#", "retryThrottling": {"maxTokens": 4, "tokenRatio": 0.5}"#);
    let metrics = Metrics::new();
    let layer = ResilienceLayer::from_service_config(&json)
        .expect("valid")
        .metrics(&metrics);
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(10));

    assert_eq!(
        outcome_of(&mut service, RETRIED, &scope).await.0,
        Code::Unavailable
    );
    assert_eq!(
        server.seen().len(),
        2,
        "tokens 4 → 3 (retry) → 2 (no retry while half or fewer are left)"
    );
    assert_eq!(
        outcome_of(&mut service, HEDGED, &scope).await.0,
        Code::Unavailable
    );
    assert_eq!(
        server.seen().len(),
        3,
        "the hedged method finds the tokens the retried one spent: no hedge"
    );
    assert_eq!(
        metrics.retries_throttled(),
        2,
        "one retry and one hedge refused"
    );
}
