//! Metrics of real tonic services (R-30): where each request's budget went,
//! counted in a handle the test makes itself.

use crate::common;

use std::time::Duration;

use common::{Client, Events, Node, PATIENCE, channel, code, serve};
use testkit::CallRequest;
use testkit::probe_client::ProbeClient;
use tonic_deadline::observe::{Metrics, ScopeEnding, Stage};
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer};

const METHOD: &str = "probe.v1.Probe/Call";

async fn client_with(addr: std::net::SocketAddr, metrics: &Metrics) -> Client {
    ProbeClient::new(
        tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new().metrics(metrics))
            .service(channel(addr).await),
    )
}

fn work(ms: u64) -> CallRequest {
    CallRequest {
        work_ms: ms,
        ..CallRequest::default()
    }
}

/// The value of the sample `series` (name and labels as written) in `text`.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{series} must be exposed:\n{text}"))
}

#[tokio::test]
async fn budgets_calls_and_scope_causes_are_counted_in_the_given_handle() {
    let metrics = Metrics::new();
    let (_events, tx) = Events::new();
    let downstream = serve(
        ServerDeadlineLayer::new().metrics(&metrics),
        Node::new("B", &tx),
    )
    .await;
    let entry = serve(
        ServerDeadlineLayer::new().metrics(&metrics),
        Node::new("A", &tx).calling(client_with(downstream, &metrics).await),
    )
    .await;
    let mut client = client_with(entry, &metrics).await;

    Scope::background()
        .with_timeout(PATIENCE)
        .enter(client.call(work(0)))
        .await
        .expect("a call with time to spare must succeed");
    let expired = Scope::background()
        .with_timeout(Duration::from_millis(100))
        .enter(client.call(work(2_000)))
        .await;
    assert_eq!(code(&expired), tonic::Code::DeadlineExceeded);
    // The servers count a scope when it ends; give the expired one a moment.
    let mut text = metrics.encode();
    // The entry hop's scope ends by its own timer (deadline exceeded), or by
    // the client's reset when the client's timer fires in the same tick
    // (abandoned): on one thread either may run first.
    let expired = || {
        metrics.scopes_ended(ScopeEnding::DeadlineExceeded)
            + metrics.scopes_ended(ScopeEnding::Abandoned)
    };
    for _ in 0..100 {
        if expired() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        text = metrics.encode();
    }

    assert_eq!(
        sample(
            &text,
            &format!(r#"grpc_server_call_started_total{{grpc_method="{METHOD}"}}"#)
        ),
        3.0,
        "the quick call reached both hops; the slow one ended on the entry hop, mid-work"
    );
    assert_eq!(
        metrics.budget_on_entry(METHOD).count,
        3,
        "every request brought a budget"
    );
    assert!(
        metrics.scopes_ended(ScopeEnding::Completed) >= 2,
        "the quick call's scopes completed on both hops"
    );
    assert_eq!(
        expired(),
        1,
        "the slow call's scope must end once, at its deadline:\n{text}"
    );
    assert_eq!(
        sample(
            &text,
            &format!(r#"grpc_client_attempt_started_total{{grpc_method="{METHOD}"}}"#)
        ),
        3.0,
        "the test's client sent two, the entry hop's one"
    );
    assert_eq!(
        sample(
            &text,
            &format!(
                r#"tonic_deadline_client_budget_granted_seconds_count{{grpc_method="{METHOD}"}}"#
            )
        ),
        3.0,
        "every outbound call was granted a budget"
    );
    assert!(
        sample(
            &text,
            &format!(
                r#"grpc_client_call_duration_seconds_count{{grpc_method="{METHOD}",grpc_status="DEADLINE_EXCEEDED"}}"#
            )
        ) >= 1.0,
        "the expired call is timed under its status"
    );
}

#[tokio::test]
async fn a_deadline_set_by_the_servers_cap_is_counted_as_local_cap() {
    let metrics = Metrics::new();
    let (_events, tx) = Events::new();
    let addr = serve(
        ServerDeadlineLayer::new()
            .max_timeout(Duration::from_millis(50))
            .metrics(&metrics),
        Node::new("A", &tx),
    )
    .await;
    let mut client = client_with(addr, &Metrics::new()).await;
    // No scope on the caller's side: the request carries no deadline, and
    // the server's cap gives it one.
    let outcome = client.call(work(1_000)).await;
    assert_eq!(code(&outcome), tonic::Code::DeadlineExceeded);
    assert_eq!(
        metrics.scopes_ended(ScopeEnding::LocalCap),
        1,
        "an expiry of the server's own cap is not the caller's deadline"
    );
    assert_eq!(metrics.scopes_ended(ScopeEnding::DeadlineExceeded), 0);
    let text = metrics.encode();
    assert_eq!(
        sample(
            &text,
            &format!(r#"tonic_deadline_server_no_deadline_total{{grpc_method="{METHOD}"}}"#)
        ),
        1.0,
        "a request without a deadline is counted apart"
    );
}

#[tokio::test]
async fn an_outbound_call_of_an_expired_scope_is_refused_and_counted() {
    let metrics = Metrics::new();
    let (_events, tx) = Events::new();
    let addr = serve(ServerDeadlineLayer::new(), Node::new("A", &tx)).await;
    let mut client = client_with(addr, &metrics).await;
    let scope = Scope::background().with_timeout(Duration::from_millis(1));
    tokio::time::sleep(Duration::from_millis(5)).await;
    let outcome = scope.enter(client.call(work(0))).await;
    assert_eq!(code(&outcome), tonic::Code::DeadlineExceeded);
    assert_eq!(metrics.refused_expired(Stage::Client), 1);
    let text = metrics.encode();
    assert!(
        !text.contains("grpc_client_attempt_started_total{"),
        "a call refused locally sends no attempt:\n{text}"
    );
}

#[tokio::test]
async fn a_call_dropped_with_its_expired_handler_is_counted_as_deadline_exceeded() {
    let metrics = Metrics::new();
    let (_events, tx) = Events::new();
    let slow = serve(ServerDeadlineLayer::new(), Node::new("B", &tx)).await;
    // Only A's outbound call reports: A's handler is dropped by A's server
    // layer at A's 100 ms cap, and its call to B with it, unanswered. The
    // test's client has all the time it needs, so no reset of its own can
    // reach A first and end A's scope as abandoned instead (on a loaded
    // machine the client's timer could otherwise beat A's by a tick). B's
    // deadline is A's plus the transit: if B's timer still wins, its
    // answer is DEADLINE_EXCEEDED too.
    let entry = serve(
        ServerDeadlineLayer::new().max_timeout(Duration::from_millis(100)),
        Node::new("A", &tx)
            .working(Duration::ZERO)
            .calling(client_with(slow, &metrics).await),
    )
    .await;
    let mut client = client_with(entry, &Metrics::new()).await;
    let outcome = Scope::background()
        .with_timeout(PATIENCE)
        .enter(client.call(work(2_000)))
        .await;
    assert_eq!(code(&outcome), tonic::Code::DeadlineExceeded);
    let series = |status: &str| {
        format!(
            r#"grpc_client_attempt_duration_seconds_count{{grpc_method="{METHOD}",grpc_status="{status}"}}"#
        )
    };
    let mut text = metrics.encode();
    for _ in 0..100 {
        if text.contains(&series("DEADLINE_EXCEEDED")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        text = metrics.encode();
    }
    assert_eq!(
        sample(&text, &series("DEADLINE_EXCEEDED")),
        1.0,
        "an attempt given up because its caller's deadline passed is DEADLINE_EXCEEDED:\n{text}"
    );
    assert!(
        !text.contains(&series("CANCELLED")),
        "nobody cancelled it:\n{text}"
    );
}
