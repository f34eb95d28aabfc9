//! Retried methods: attempts one after another inside the one deadline.

use std::time::Duration;

use tokio::time::Instant;
use tonic::Code;
use tower::{Service, ServiceExt};

use super::super::shared;
use super::super::*;
use super::{PATH, Server, Step, answer, cancel_after, code_of, fail, outcome, request, stack};
use crate::Scope;
use crate::observe::Metrics;

pub(super) fn config(idempotent: bool, codes: &str, extra: &str) -> String {
    format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "kv.Store"}}], "idempotent": {idempotent},
            "retryPolicy": {{"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "1s",
                            "backoffMultiplier": 2, "retryableStatusCodes": [{codes}]}}}}]{extra}}}"#
    )
}
#[tokio::test(start_paused = true)]
async fn a_call_retried_to_success_tells_the_server_less_at_each_attempt() {
    let server = Server::new(vec![
        fail(Code::Unavailable, 10),
        fail(Code::Unavailable, 10),
        answer(10),
    ]);
    let metrics = Metrics::new();
    let layer = ResilienceLayer::from_service_config(&config(false, r#""UNAVAILABLE""#, ""))
        .expect("valid")
        .metrics(&metrics);
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(2));
    let (code, _) = outcome(&mut service, &scope).await;
    assert_eq!(code, Code::Ok, "the third attempt must succeed");
    let seen = server.seen();
    assert_eq!(seen.len(), 3, "three attempts must reach the server");
    assert_eq!(
        seen.iter().map(|s| s.previous.clone()).collect::<Vec<_>>(),
        vec![None, Some("1".into()), Some("2".into())],
        "grpc-previous-rpc-attempts must count the earlier attempts"
    );
    let budgets: Vec<Duration> = seen
        .iter()
        .map(|s| s.budget.expect("a deadline travels"))
        .collect();
    assert!(budgets[0] <= Duration::from_secs(2));
    assert!(
        budgets.windows(2).all(|w| w[1] < w[0]),
        "each attempt must carry less: {budgets:?}"
    );
    for (s, b) in seen.iter().zip(&budgets) {
        assert_eq!(
            s.at + *b,
            seen[0].at + budgets[0],
            "every attempt must end at the caller's one deadline"
        );
        assert_eq!(
            s.body, b"\0\0\0\0\x02hi",
            "the request body must be replayed whole"
        );
    }
    assert_eq!(metrics.resilient_calls(), 1);
    assert_eq!(metrics.call_attempts(), 3);
    assert_eq!(metrics.call_retries().count, 1);
    assert_eq!(metrics.call_retries().sum, 2.0, "two retries for this call");
    let text = metrics.encode();
    for series in [
        r#"grpc_client_call_retries_count{grpc_method="kv.Store/Get"} 1"#,
        r#"grpc_client_call_retries_sum{grpc_method="kv.Store/Get"} 2"#,
        r#"grpc_client_call_retry_delay_seconds_count{grpc_method="kv.Store/Get"} 1"#,
    ] {
        assert!(
            text.lines().any(|line| line.starts_with(series)),
            "the retry metrics must be labelled with the method: {series}\n{text}"
        );
    }
    let delay = metrics.call_retry_delay();
    assert!(
        delay.sum <= 0.1 + 0.2,
        "the backoff is random(0, 100 ms) then random(0, 200 ms): {delay:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn backoff_beyond_the_deadline_answers_deadline_exceeded_with_no_attempt_after_it() {
    // Backoff bounds of 1 s against 300 ms left: most backoffs cannot fit.
    // The backoff is random, so one scope may see only short ones; twenty
    // scopes all doing so would take a chance below 10^-20.
    let json = config(false, r#""UNAVAILABLE""#, "").replace("\"0.1s\"", "\"1s\"");
    let server = Server::new(vec![fail(Code::Unavailable, 10); 2000]);
    let metrics = Metrics::new();
    let layer = ResilienceLayer::from_service_config(&json)
        .expect("valid")
        .metrics(&metrics);
    let mut service = stack(layer, &server);
    for _ in 0..20 {
        let scope = Scope::background().with_timeout(Duration::from_millis(300));
        let deadline = scope.deadline().expect("a deadline");
        let seen_before = server.seen().len();
        let mut outcomes = Vec::new();
        for _ in 0..20 {
            outcomes.push(outcome(&mut service, &scope).await);
            if scope.is_ended() {
                break;
            }
        }
        for (code, took) in &outcomes {
            assert!(
                *took <= Duration::from_millis(300),
                "never beyond the deadline: {took:?}"
            );
            assert!(
                matches!(code, Code::DeadlineExceeded | Code::Unavailable),
                "{code:?}"
            );
        }
        assert!(
            server.seen()[seen_before..].iter().all(|s| s.at < deadline),
            "no attempt may start at or after the deadline"
        );
    }
    assert!(
        metrics.attempts_refused_for_time() > 0,
        "the doomed backoffs must be counted"
    );
}

#[tokio::test(start_paused = true)]
async fn the_backoff_ends_when_the_caller_cancels() {
    let server = Server::new(vec![fail(Code::Unavailable, 10); 5]);
    let json = config(false, r#""UNAVAILABLE""#, "")
        .replace("\"0.1s\"", "\"1s\"")
        .replace("\"1s\",", "\"10s\",");
    let layer = ResilienceLayer::from_service_config(&json).expect("valid");
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(60));
    let cancel = cancel_after(&scope, Duration::from_millis(50));
    let ((code, took), ()) = tokio::join!(outcome(&mut service, &scope), cancel);
    assert_eq!(code, Code::Cancelled, "a cancelled caller gets CANCELLED");
    assert!(
        took <= Duration::from_millis(50),
        "at once, not after the backoff: {took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn negative_or_malformed_pushback_stops_retrying() {
    for value in ["-1", "soon", "1.5", ""] {
        let server = Server::new(vec![
            Step {
                pushback: Some(value),
                ..fail(Code::Unavailable, 5)
            },
            answer(5),
        ]);
        let metrics = Metrics::new();
        let layer = ResilienceLayer::from_service_config(&config(false, r#""UNAVAILABLE""#, ""))
            .expect("valid")
            .metrics(&metrics);
        let mut service = stack(layer, &server);
        let scope = Scope::background().with_timeout(Duration::from_secs(2));
        let (code, _) = outcome(&mut service, &scope).await;
        assert_eq!(
            code,
            Code::Unavailable,
            "pushback {value:?} must stop the retries"
        );
        assert_eq!(
            server.seen().len(),
            1,
            "pushback {value:?}: one attempt only"
        );
        assert_eq!(metrics.pushback_stops(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_valid_pushback_replaces_the_backoff() {
    let server = Server::new(vec![
        Step {
            pushback: Some("250"),
            ..fail(Code::Unavailable, 10)
        },
        fail(Code::Unavailable, 10),
        answer(10),
    ]);
    let layer = ResilienceLayer::from_service_config(&config(false, r#""UNAVAILABLE""#, ""))
        .expect("valid");
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(5));
    let (code, _) = outcome(&mut service, &scope).await;
    assert_eq!(code, Code::Ok);
    let seen = server.seen();
    assert_eq!(
        seen[1].at - seen[0].at,
        Duration::from_millis(260),
        "the second attempt must start exactly 250 ms after the first answered"
    );
    assert!(
        seen[2].at - seen[1].at <= Duration::from_millis(110),
        "after a pushback the backoff starts afresh at initialBackoff (100 ms)"
    );
}

#[tokio::test(start_paused = true)]
async fn deadline_exceeded_is_retried_only_for_idempotent_methods() {
    for idempotent in [false, true] {
        let server = Server::new(vec![fail(Code::DeadlineExceeded, 10), answer(10)]);
        let json = config(
            idempotent,
            r#""UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED""#,
            "",
        );
        let layer = ResilienceLayer::from_service_config(&json).expect("valid");
        let mut service = stack(layer, &server);
        let scope = Scope::background().with_timeout(Duration::from_secs(2));
        let (code, _) = outcome(&mut service, &scope).await;
        if idempotent {
            assert_eq!(
                code,
                Code::Ok,
                "an idempotent method is retried after DEADLINE_EXCEEDED"
            );
            assert_eq!(server.seen().len(), 2);
        } else {
            assert_eq!(
                code,
                Code::DeadlineExceeded,
                "the outcome is unknown: no retry"
            );
            assert_eq!(server.seen().len(), 1);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_per_attempt_timeout_gives_way_to_the_next_attempt_of_an_idempotent_method() {
    let server = Server::new(vec![answer(5_000), answer(10)]);
    let layer = ResilienceLayer::from_service_config(&config(true, r#""DEADLINE_EXCEEDED""#, ""))
        .expect("valid")
        .per_attempt_timeout(Duration::from_millis(100));
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(2));
    let (code, took) = outcome(&mut service, &scope).await;
    assert_eq!(code, Code::Ok);
    assert!(
        took < Duration::from_millis(400),
        "the hung attempt is cut at 100 ms: {took:?}"
    );
    let seen = server.seen();
    assert_eq!(
        seen[0].budget,
        Some(Duration::from_millis(100)),
        "the cap travels on the wire"
    );
    assert!(
        seen[0].dropped.lock().expect("not poisoned").is_some(),
        "the capped attempt was dropped (reset)"
    );
}

#[tokio::test(start_paused = true)]
async fn a_per_request_timeout_counts_from_the_call_not_from_each_attempt() {
    let server = Server::new(vec![fail(Code::Unavailable, 100); 5]);
    let json = config(false, r#""UNAVAILABLE""#, "").replace("\"0.1s\"", "\"0.001s\"");
    let layer = ResilienceLayer::from_service_config(&json).expect("valid");
    let mut service = stack(layer, &server);
    let mut req = request(PATH);
    req.headers_mut()
        .insert("grpc-timeout", "250m".parse().expect("valid"));
    let started = Instant::now();
    let result = Scope::background()
        .enter(service.ready().await.expect("ready").call(req))
        .await;
    assert!(
        started.elapsed() <= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    let code = match &result {
        Ok(answer) => code_of(answer),
        Err(e) => e
            .downcast_ref::<tonic::Status>()
            .map_or(Code::Unknown, tonic::Status::code),
    };
    assert_eq!(
        code,
        Code::Unavailable,
        "at 200 ms, 50 ms cannot fit a 100 ms attempt: the last answer is the call's"
    );
    let seen = server.seen();
    assert!(
        seen.len() <= 3,
        "250 ms fit three 100 ms attempts at most, not five: {}",
        seen.len()
    );
    assert!(seen[1].budget.expect("set") < Duration::from_millis(160));
}

#[tokio::test(start_paused = true)]
async fn an_attempt_the_learned_latency_cannot_fit_is_not_sent() {
    // Teach the layer that an answer takes 100 ms.
    let mut steps = vec![answer(100); 10];
    steps.push(fail(Code::Unavailable, 100));
    steps.push(answer(100));
    let server = Server::new(steps);
    let json = config(false, r#""UNAVAILABLE""#, "").replace("\"0.1s\"", "\"0.001s\"");
    let metrics = Metrics::new();
    let layer = ResilienceLayer::from_service_config(&json)
        .expect("valid")
        .metrics(&metrics);
    let mut service = stack(layer, &server);
    for _ in 0..10 {
        let scope = Scope::background().with_timeout(Duration::from_secs(1));
        assert_eq!(outcome(&mut service, &scope).await.0, Code::Ok);
    }
    // 150 ms: the first attempt fails after 100 ms, and 50 ms cannot fit another.
    let scope = Scope::background().with_timeout(Duration::from_millis(150));
    let (code, took) = outcome(&mut service, &scope).await;
    assert_eq!(
        code,
        Code::Unavailable,
        "a doomed attempt is not sent; the last attempt's status is the answer"
    );
    assert!(
        took <= Duration::from_millis(101),
        "answered at once: {took:?}"
    );
    assert_eq!(server.seen().len(), 11, "no attempt after the failure");
    assert_eq!(metrics.attempts_refused_for_time(), 1);
}

#[tokio::test(start_paused = true)]
async fn from_the_first_answered_failure_on_no_attempt_starts_that_cannot_fit() {
    // Every attempt is answered UNAVAILABLE after 150 ms; 400 ms of budget.
    let server = Server::new(vec![fail(Code::Unavailable, 150); 5]);
    let json = config(false, r#""UNAVAILABLE""#, "").replace("\"0.1s\"", "\"0.001s\"");
    let metrics = Metrics::new();
    let layer = ResilienceLayer::from_service_config(&json)
        .expect("valid")
        .metrics(&metrics);
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_millis(400));
    let started = Instant::now();
    let mut call = request(PATH);
    call.extensions_mut().insert(scope.clone());
    let answer = service
        .ready()
        .await
        .expect("ready")
        .call(call)
        .await
        .expect("the server's trailers-only answer");
    let took = started.elapsed();
    assert_eq!(
        server.seen().len(),
        2,
        "after two 150 ms answers, about 100 ms is left: no third attempt"
    );
    assert_eq!(
        code_of(&answer),
        Code::Unavailable,
        "the deadline has not passed: the answer is what the last attempt said \
         (nothing was done, safe to try later), not an unknown outcome"
    );
    assert_eq!(
        answer.headers().get("grpc-message").map(|v| v.as_bytes()),
        Some(shared::NO_TIME_LEFT.as_bytes()),
        "the message must say why no further attempt was made"
    );
    assert!(
        took < Duration::from_millis(310),
        "answered when the second attempt failed, not at the deadline: {took:?}"
    );
    assert_eq!(metrics.attempts_refused_for_time(), 1);
}

#[test]
fn an_answer_no_attempt_could_follow_keeps_its_code_details_and_metadata() {
    let mut metadata = tonic::metadata::MetadataMap::new();
    metadata.insert("x-shard", "7".parse().expect("ascii"));
    let status = tonic::Status::with_details_and_metadata(
        Code::Unavailable,
        "shard 7 down",
        bytes::Bytes::from_static(b"\x08\x0e"),
        metadata,
    );
    let err = shared::no_time_left::<()>(Err(Box::new(status))).expect_err("stays an error");
    let status = err.downcast::<tonic::Status>().expect("a status");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.message(),
        format!("shard 7 down; {}", shared::NO_TIME_LEFT)
    );
    assert_eq!(status.details(), b"\x08\x0e");
    assert_eq!(
        status.metadata().get("x-shard").map(|v| v.as_bytes()),
        Some(&b"7"[..])
    );

    // A trailers-only answer: its percent-encoded grpc-message, extended.
    let mut response = Response::new(());
    response
        .headers_mut()
        .insert("grpc-status", "14".parse().expect("ascii"));
    response
        .headers_mut()
        .insert("grpc-message", "shard%207%20down".parse().expect("ascii"));
    let response = shared::no_time_left(Ok(response)).expect("stays an answer");
    let status = tonic::Status::from_header_map(response.headers()).expect("a status");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.message(),
        format!("shard 7 down; {}", shared::NO_TIME_LEFT)
    );
}

#[tokio::test(start_paused = true)]
async fn throttling_stops_retries_once_half_the_tokens_are_gone() {
    let server = Server::new(vec![fail(Code::Unavailable, 1); 100]);
    let json = config(
        false,
        r#""UNAVAILABLE""#,
        r#", "retryThrottling": {"maxTokens": 4, "tokenRatio": 0.5}"#,
    )
    .replace("\"0.1s\"", "\"0.001s\"");
    let metrics = Metrics::new();
    let layer = ResilienceLayer::from_service_config(&json)
        .expect("valid")
        .metrics(&metrics);
    let service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(10));
    let mut attempts = Vec::new();
    for _ in 0..4 {
        let before = server.seen().len();
        outcome(&mut service.clone(), &scope).await;
        attempts.push(server.seen().len() - before);
    }
    // 4 tokens: each failure takes one, and no retry while 2 or fewer are left.
    assert_eq!(
        attempts,
        vec![2, 1, 1, 1],
        "tokens 4 → 3 (retry) → 2 (stop): then single attempts"
    );
    assert!(metrics.retries_throttled() >= 1);
}

#[tokio::test(start_paused = true)]
async fn a_retry_budget_bounds_retries_to_its_ratio() {
    let server = Server::new(vec![fail(Code::Unavailable, 1); 1000]);
    let json = config(false, r#""UNAVAILABLE""#, "").replace("\"0.1s\"", "\"0.001s\"");
    let metrics = Metrics::new();
    let layer = ResilienceLayer::from_service_config(&json)
        .expect("valid")
        .budget(RetryBudget::new(0.1, 0))
        .metrics(&metrics);
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(100));
    for _ in 0..100 {
        outcome(&mut service, &scope).await;
    }
    let amplification = metrics.call_attempts() as f64 / metrics.resilient_calls() as f64;
    assert!(
        amplification <= 1.1,
        "retries may add 10 % of the calls: {amplification}"
    );
    assert!(
        amplification >= 1.05,
        "and the budget is used: {amplification}"
    );
}

#[tokio::test(start_paused = true)]
async fn response_headers_commit_the_call() {
    let server = Server::new(vec![answer(10)]);
    let layer = ResilienceLayer::from_service_config(&config(false, r#""UNAVAILABLE""#, ""))
        .expect("valid");
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(1));
    let (code, _) = outcome(&mut service, &scope).await;
    assert_eq!(code, Code::Ok);
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_live_request_stream_or_an_oversized_body_is_sent_once() {
    let metrics = Metrics::new();
    let server = Server::new(vec![fail(Code::Unavailable, 1), answer(1)]);
    let layer = ResilienceLayer::from_service_config(&config(false, r#""UNAVAILABLE""#, ""))
        .expect("valid")
        .replay_buffer(4)
        .metrics(&metrics);
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(1));
    let (code, _) = outcome(&mut service, &scope).await;
    assert_eq!(
        code,
        Code::Unavailable,
        "a 7-byte body over a 4-byte buffer is not retried"
    );
    assert_eq!(
        server.seen()[0].body,
        b"\0\0\0\0\x02hi",
        "but it is sent whole"
    );
    assert_eq!(metrics.committed_unreplayable(), 1);

    let server = Server::new(vec![fail(Code::Unavailable, 1), answer(1)]);
    let layer = ResilienceLayer::from_service_config(&config(false, r#""UNAVAILABLE""#, ""))
        .expect("valid");
    let mut service = stack(layer, &server);
    let (tx, rx) =
        tokio::sync::mpsc::channel::<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>(1);
    let mut req = request(PATH);
    *req.body_mut() = tonic::body::Body::new(http_body_util::StreamBody::new(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    ));
    req.extensions_mut().insert(scope.clone());
    let pending = service.ready().await.expect("ready").call(req);
    // The call is under way before the stream yields anything: it is live.
    let send = async move {
        tokio::time::sleep(Duration::from_millis(1)).await;
        tx.send(Ok(http_body::Frame::data(bytes::Bytes::from_static(b"x"))))
            .await
            .expect("sent");
    };
    let (response, ()) = tokio::join!(pending, send);
    let response = response.expect("a trailers-only answer");
    assert_eq!(
        code_of(&response),
        Code::Unavailable,
        "a live stream is not replayed"
    );
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn methods_without_a_retry_policy_pass_straight_through() {
    let server = Server::new(vec![fail(Code::Unavailable, 1), answer(1)]);
    let metrics = Metrics::new();
    let layer = ResilienceLayer::from_service_config(&config(false, r#""UNAVAILABLE""#, ""))
        .expect("valid")
        .metrics(&metrics);
    let mut service = stack(layer, &server);
    let mut req = request("/other.Svc/Call");
    req.extensions_mut()
        .insert(Scope::background().with_timeout(Duration::from_secs(1)));
    let response = service
        .ready()
        .await
        .expect("ready")
        .call(req)
        .await
        .expect("answered");
    assert_eq!(code_of(&response), Code::Unavailable);
    assert_eq!(server.seen().len(), 1);
    assert_eq!(
        metrics.resilient_calls(),
        0,
        "a passed-through call is no retried call"
    );
}

#[test]
fn backoff_is_random_below_the_exponential_bound() {
    let config =
        crate::service_config::ServiceConfig::from_json(&config(false, r#""UNAVAILABLE""#, ""))
            .expect("valid");
    let Some(crate::service_config::Policy::Retry(policy)) = config.methods[0].policy.clone()
    else {
        panic!("a retry policy");
    };
    let core = shared::Core::new(config, shared::Settings::default());
    for n in 1..=6u32 {
        let bound = Duration::from_millis(100 * 2u64.pow(n - 1)).min(Duration::from_secs(1));
        let draws: Vec<Duration> = (0..200)
            .map(|_| retry::backoff(&core, &policy, n))
            .collect();
        assert!(
            draws.iter().all(|d| *d < bound),
            "retry {n}: below {bound:?}"
        );
        assert!(
            draws.iter().any(|d| *d > bound / 2),
            "retry {n}: spread up to the bound"
        );
        assert!(
            draws.iter().any(|d| *d < bound / 2),
            "retry {n}: and below half of it"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn one_layer_shares_its_throttle_across_the_services_it_builds() {
    let server = Server::new(vec![fail(Code::Unavailable, 1); 100]);
    let json = config(
        false,
        r#""UNAVAILABLE""#,
        r#", "retryThrottling": {"maxTokens": 4, "tokenRatio": 0.5}"#,
    )
    .replace("\"0.1s\"", "\"0.001s\"");
    let layer = ResilienceLayer::from_service_config(&json).expect("valid");
    // Two connections to the same server, one layer.
    let mut first = stack(layer.clone(), &server);
    let mut second = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(10));
    outcome(&mut first, &scope).await;
    assert_eq!(server.seen().len(), 2, "4 → 3 tokens: one retry");
    outcome(&mut second, &scope).await;
    assert_eq!(
        server.seen().len(),
        3,
        "the second connection sees the 2 tokens the first left: no retry"
    );
}

/// Calls `PATH` in `scope`: the code, and the `grpc-retry-pushback-ms` the
/// caller is told (from a trailers-only answer, or an error's metadata).
pub(super) async fn pushback_told<S, RB>(service: &mut S, scope: &Scope) -> (Code, Option<String>)
where
    S: Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<RB>,
            Error = crate::BoxError,
        >,
{
    let mut req = super::request(PATH);
    req.extensions_mut().insert(scope.clone());
    let result = service.ready().await.expect("ready").call(req).await;
    match result {
        Ok(response) => (
            code_of(&response),
            response
                .headers()
                .get(shared::PUSHBACK)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        ),
        Err(err) => {
            let status = err.downcast::<tonic::Status>().expect("a status");
            (
                status.code(),
                status
                    .metadata()
                    .get(crate::wire::PUSHBACK_KEY)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
            )
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_whose_retries_are_spent_tells_its_caller_not_to_retry() {
    let server = Server::new(vec![fail(Code::Unavailable, 10); 5]);
    let metrics = Metrics::new();
    let layer = ResilienceLayer::from_service_config(&config(false, r#""UNAVAILABLE""#, ""))
        .expect("valid")
        .metrics(&metrics);
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(10));
    let told = pushback_told(&mut service, &scope).await;
    assert_eq!(server.seen().len(), 5, "maxAttempts attempts were sent");
    assert_eq!(
        told,
        (Code::Unavailable, Some("-1".to_owned())),
        "the last failure, with gRPC's \"do not retry\""
    );
    assert_eq!(metrics.retries_spent(), 1);

    // Told not to retry by its own server: spent, and said on.
    let server = Server::new(vec![Step {
        pushback: Some("-1"),
        ..fail(Code::Unavailable, 10)
    }]);
    let layer = ResilienceLayer::from_service_config(&config(false, r#""UNAVAILABLE""#, ""))
        .expect("valid");
    let mut service = stack(layer, &server);
    let told = pushback_told(&mut service, &scope).await;
    assert_eq!(server.seen().len(), 1);
    assert_eq!(told, (Code::Unavailable, Some("-1".to_owned())));
}

#[tokio::test(start_paused = true)]
async fn a_status_the_policy_does_not_retry_or_a_per_hop_layer_tells_nothing() {
    // Not listed: the caller's own policy decides, as it would without us.
    let server = Server::new(vec![fail(Code::InvalidArgument, 10)]);
    let layer = ResilienceLayer::from_service_config(&config(false, r#""UNAVAILABLE""#, ""))
        .expect("valid");
    let mut service = stack(layer, &server);
    let scope = Scope::background().with_timeout(Duration::from_secs(10));
    assert_eq!(
        pushback_told(&mut service, &scope).await,
        (Code::InvalidArgument, None)
    );
    // Retries spent, but every hop retries for itself.
    let server = Server::new(vec![fail(Code::Unavailable, 10); 5]);
    let layer = ResilienceLayer::from_service_config(&config(false, r#""UNAVAILABLE""#, ""))
        .expect("valid")
        .chain_budget(false);
    let mut service = stack(layer, &server);
    assert_eq!(
        pushback_told(&mut service, &scope).await,
        (Code::Unavailable, None)
    );
}
