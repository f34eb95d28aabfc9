//! The registry's series and labels, and what the layers report into it.

// Tests start tasks and threads that belong to no request.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::metrics::{MAX_METHODS, ScopeEnding, Stage};
use super::*;
use crate::{Cause, Scope};

/// The value of the sample `series` (name and labels as written) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.split(' ').next()?.parse().ok())
}

#[test]
fn exposition_names_the_grpc_series_in_prometheus_form() {
    let metrics = Metrics::new();
    let m = metrics.method("/lab.Chain/Call");
    metrics.server_started(&m, Some(Duration::from_millis(250)));
    metrics.server_ended(&m, tonic::Code::DeadlineExceeded, Duration::from_millis(3));
    metrics.attempt_started(&m, Some(Duration::from_millis(100)));
    metrics.attempt_ended(&m, tonic::Code::Ok, Duration::from_millis(2));
    let text = metrics.encode();
    assert_eq!(
        sample(
            &text,
            r#"grpc_server_call_started_total{grpc_method="lab.Chain/Call"}"#
        ),
        Some(1.0),
        "a started call must be counted under the method without its leading slash:\n{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"grpc_server_call_duration_seconds_count{grpc_method="lab.Chain/Call",grpc_status="DEADLINE_EXCEEDED"}"#
        ),
        Some(1.0),
        "the duration must be labelled with the status name:\n{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"grpc_client_attempt_started_total{grpc_method="lab.Chain/Call"}"#
        ),
        Some(1.0)
    );
    for series in [
        r#"grpc_client_attempt_duration_seconds_count{grpc_method="lab.Chain/Call",grpc_status="OK"}"#,
        r#"grpc_client_call_duration_seconds_count{grpc_method="lab.Chain/Call",grpc_status="OK"}"#,
        r#"tonic_deadline_client_budget_granted_seconds_count{grpc_method="lab.Chain/Call"}"#,
        r#"tonic_deadline_server_budget_on_entry_seconds_count{grpc_method="lab.Chain/Call"}"#,
    ] {
        assert_eq!(
            sample(&text, series),
            Some(1.0),
            "{series} must carry one sample:\n{text}"
        );
    }
    assert_eq!(
        sample(
            &text,
            r#"tonic_deadline_server_budget_on_entry_seconds_bucket{le="0.25",grpc_method="lab.Chain/Call"}"#
        ),
        Some(1.0),
        "250 ms falls in the 0.25 s bucket (bounds are inclusive)"
    );
    assert!(
        text.ends_with("# EOF\n"),
        "OpenMetrics text must end with # EOF"
    );
}

#[test]
fn requests_without_a_deadline_are_counted_apart_from_budgets() {
    let metrics = Metrics::new();
    let m = metrics.method("/svc.S/M");
    metrics.server_started(&m, None);
    assert_eq!(
        metrics.budget_on_entry("svc.S/M").count,
        0,
        "no budget to observe"
    );
    let text = metrics.encode();
    assert_eq!(
        sample(
            &text,
            r#"tonic_deadline_server_no_deadline_total{grpc_method="svc.S/M"}"#
        ),
        Some(1.0),
        "a request without a deadline must be counted apart:\n{text}"
    );
}

#[test]
fn methods_past_the_bound_are_labelled_other() {
    let metrics = Metrics::new();
    for i in 0..MAX_METHODS {
        let _ = metrics.method(&format!("/s.S/M{i}"));
    }
    let extra = metrics.method("/s.S/OneTooMany");
    assert_eq!(extra.name, "other", "the label set must stay bounded");
    let known = metrics.method("/s.S/M0");
    assert_eq!(known.name, "s.S/M0", "known methods keep their own label");
}

#[test]
fn scope_causes_and_refusals_read_back_by_label() {
    let metrics = Metrics::new();
    metrics.scope_ended(ScopeEnding::LocalCap);
    metrics.refused(Stage::Admission);
    assert_eq!(metrics.scopes_ended(ScopeEnding::LocalCap), 1);
    assert_eq!(metrics.scopes_ended(ScopeEnding::Completed), 0);
    assert_eq!(metrics.refused_expired(Stage::Admission), 1);
    assert_eq!(metrics.refused_expired(Stage::Client), 0);
    let text = metrics.encode();
    assert_eq!(
        sample(
            &text,
            r#"tonic_deadline_scope_ended_total{cause="local_cap"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"tonic_deadline_refused_expired_total{stage="admission"}"#
        ),
        Some(1.0),
        "{text}"
    );
}

#[test]
fn every_scope_ending_counts_under_its_own_label() {
    let metrics = Metrics::new();
    let endings = [
        ScopeEnding::Completed,
        ScopeEnding::Failed,
        ScopeEnding::DeadlineExceeded,
        ScopeEnding::LocalCap,
        ScopeEnding::Abandoned,
        ScopeEnding::Cancelled,
    ];
    for (times, ending) in (1..).zip(endings) {
        for _ in 0..times {
            metrics.scope_ended(ending);
        }
    }
    let text = metrics.encode();
    for (times, ending) in (1..).zip(endings) {
        assert_eq!(
            metrics.scopes_ended(ending),
            times,
            "{ending:?} must read back its own count"
        );
        let series = format!(
            r#"tonic_deadline_scope_ended_total{{cause="{}"}}"#,
            ending.as_str()
        );
        assert_eq!(sample(&text, &series), Some(times as f64), "{text}");
    }
}

#[test]
fn two_handles_keep_their_counts_apart() {
    let a = Metrics::new();
    let b = Metrics::new();
    a.unscoped_call();
    assert_eq!(a.unscoped_calls(), 1);
    assert_eq!(
        b.unscoped_calls(),
        0,
        "nothing may be shared between handles"
    );
    assert_eq!(a.clone().unscoped_calls(), 1, "clones share the series");
}

/// A root scope as the server layer makes it when given `metrics`.
fn root_reporting_to(metrics: &Metrics) -> Scope {
    let reporting = Reporting {
        metrics: Some(metrics.clone()),
        spans: false,
    };
    let attached = crate::forwarded::Attached::new(None, Some(Arc::new(reporting)));
    Scope::root_attached(None, Some(Arc::new(attached)))
}

#[tokio::test(start_paused = true)]
async fn spawn_blocking_returns_the_work_output_in_time() {
    let metrics = Metrics::new();
    let root = root_reporting_to(&metrics);
    let scope = root.with_timeout(Duration::from_secs(1));
    let out = scope
        .spawn_blocking(|scope| {
            assert!(scope.check().is_ok(), "the work must see its live scope");
            scope.deadline()
        })
        .await
        .expect("work that finishes in time must return its output");
    assert_eq!(
        out,
        scope.deadline(),
        "the work's scope must share the deadline"
    );
    assert_eq!(
        metrics.outlived(),
        0,
        "work that finished within its scope must not be counted"
    );
}

#[tokio::test(start_paused = true)]
async fn spawn_blocking_returns_at_scope_end_and_counts_outliving_work() {
    let metrics = Metrics::new();
    let root = root_reporting_to(&metrics);
    let scope = root.with_timeout(Duration::from_secs(10));
    let (started_tx, started_rx) = oneshot::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (finished_tx, finished_rx) = std::sync::mpsc::channel::<()>();
    let canceller = scope.clone();
    tokio::spawn(async move {
        started_rx.await.expect("the work starts");
        canceller.cancel();
    });

    // The work ignores its scope: it blocks until released.
    let ended = scope
        .spawn_blocking(move |_scope| {
            let _ = started_tx.send(());
            release_rx.recv().expect("the test releases the work");
            let _ = finished_tx.send(());
        })
        .await
        .expect_err("spawn_blocking must return when the scope ends, not when the work does");
    assert_eq!(ended.cause(), Cause::Cancelled);
    assert!(
        finished_rx.try_recv().is_err(),
        "the work must still be running when spawn_blocking returns"
    );

    release_tx.send(()).expect("the work is waiting");
    let counted = tokio::task::spawn_blocking(move || {
        finished_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the released work must finish");
        // The count is taken just after the work returns, on its thread.
        for _ in 0..10_000 {
            if metrics.outlived() > 0 {
                return metrics.outlived();
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        0
    })
    .await
    .expect("no panic");
    assert_eq!(
        counted, 1,
        "work that outlived its scope must be counted exactly once, in its root's metrics"
    );
}
