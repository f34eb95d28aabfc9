//! A real proxy hop: Debian's nginx (`grpc_pass`) between two hops; and
//! a ledger through it.
//!
//! Needs nginx, so it is only built with the `nginx-tests` feature
//! (`scripts/test-all` installs nginx and enables it through
//! `--all-features`); there a missing nginx fails these tests.

use std::process::Command;
use std::sync::OnceLock;

use deadline_lab::experiments::proxy::Proxy;
use tonic_deadline::timeout_header::decode;

use crate::common::{debug_lab, timed};

/// One run of `experiment proxy --json` (it needs nginx installed), shared
/// by the tests below.
fn proxy() -> &'static Proxy {
    static RUN: OnceLock<Proxy> = OnceLock::new();
    RUN.get_or_init(|| timed(&["experiment", "proxy", "--json"]))
}

#[test]
fn nginx_forwards_grpc_timeout_unchanged() {
    let p = proxy();
    assert!(p.proxy.starts_with("nginx/"), "{p:?}");
    let sent = decode(p.header_sent.as_bytes()).expect("A must send a valid grpc-timeout");
    assert!(
        sent <= std::time::Duration::from_secs(1) && sent > std::time::Duration::from_millis(900),
        "A sends what is left of its 1 s budget: {p:?}"
    );
    assert_eq!(
        p.header_received, p.header_sent,
        "nginx must pass the header on as it is"
    );
    assert_eq!(p.keepalive.header_received, p.keepalive.header_sent);
    assert!(p.header_unchanged);
}

#[test]
fn the_hop_through_nginx_gains_its_transit_and_no_more() {
    let p = proxy();
    for transit in [p.transit_ms, p.keepalive.transit_ms] {
        assert!(
            (0.0..50.0).contains(&transit),
            "B's deadline must be A's plus the transit through nginx (loopback: well under 50 ms): {p:?}"
        );
    }
}

#[test]
fn a_client_reset_through_nginx_reaches_the_downstream_handler() {
    let p = proxy();
    for (reset, cause) in [
        (p.reset_reaches_downstream_ms, &p.downstream_cause),
        (
            p.keepalive.reset_reaches_downstream_ms,
            &p.keepalive.downstream_cause,
        ),
    ] {
        assert_eq!(
            cause, "Abandoned",
            "B's scope must end because its caller went away: {p:?}"
        );
        assert!(
            reset < 100.0,
            "the cancel must reach B within milliseconds, not at B's deadline: {p:?}"
        );
    }
}

#[test]
fn nginx_read_timeout_below_the_deadline_cuts_the_call_early() {
    let r = &proxy().read_timeout;
    assert_eq!(r.status, "INTERNAL", "{r:?}");
    assert!(
        r.answered_ms >= r.grpc_read_timeout_ms && r.answered_ms < r.deadline_ms,
        "nginx answers at its own timeout, before the deadline: {r:?}"
    );
    assert_eq!(
        r.downstream_cause, "Abandoned",
        "and B learns its caller is gone: {r:?}"
    );
}

#[test]
fn missing_nginx_fails_with_a_clear_message() {
    let out = Command::new(debug_lab())
        .args(["experiment", "proxy", "--json"])
        .env(deadline_lab::nginx::NGINX_ENV, "/nonexistent/nginx")
        .output()
        .expect("deadline-lab must start");
    assert!(
        !out.status.success(),
        "without nginx the experiment must fail, never skip"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("nginx") && stderr.contains("apt-get install nginx"),
        "the failure must say how to get nginx: {stderr}"
    );
}

/// nginx (`grpc_pass`) between the caller and a hop of ours that stalls:
/// the hop's answer, with its ledger in `grpc-status-details-bin` and its
/// line in `grpc-message`, reaches the caller through the proxy unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_passes_through_nginx_unchanged() {
    use std::time::Duration;

    use deadline_lab::nginx::{Config, Nginx};
    use deadline_lab::systems::chain::{Hop, Plan};
    use tonic_deadline::ledger::Ledger;
    use tonic_deadline::{Scope, ServerDeadlineLayer};

    let stalls = Hop::new(
        "B",
        Plan {
            work: Duration::from_secs(30),
            ..Plan::default()
        },
        None,
    );
    let b = deadline_lab::net::serve(
        "127.0.0.1:0",
        stalls.routes(),
        Some(ServerDeadlineLayer::new().reply_reserve(Duration::from_millis(25))),
    )
    .await
    .expect("B serves");
    let nginx = Nginx::grpc_proxy(b, &Config::default())
        .await
        .expect("nginx must run here (scripts/test-all installs it)");
    let mut client = testkit::probe_client::ProbeClient::new(
        deadline_lab::net::connect_layered(nginx.addr())
            .await
            .expect("nginx listens"),
    );
    let mut through = 0;
    for _ in 0..5 {
        let status = Scope::background()
            .with_timeout(Duration::from_millis(600))
            .enter(client.call(testkit::CallRequest::default()))
            .await
            .expect_err("B stalls");
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        if let Some(ledger) = Ledger::from_status(&status) {
            through += 1;
            assert_eq!(ledger.hops().len(), 1, "{ledger:?}");
            assert_eq!(ledger.hops()[0].method, "/probe.v1.Probe/Call");
            assert!(
                status.message().contains(" [ledger] "),
                "{}",
                status.message()
            );
        }
    }
    // B answers 25 ms before the deadline it was told (timers here fire up
    // to a few ms late, in the debug build the test runs B in, and nginx
    // adds its own hop); on a loaded machine an answer may still lose the
    // race now and then. The test is about what nginx does to the answer.
    assert!(
        through >= 4,
        "the ledger came through nginx {through} of 5 times"
    );
}
