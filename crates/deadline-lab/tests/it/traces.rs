//! Traces on a real OTLP receiver: the IM system's four services, each in
//! its own process exporting over OTLP/gRPC, make one trace with correct
//! parents, budgets that shrink along the chain, and the work that outlived
//! its deadline flagged.

use std::collections::HashSet;
use std::process::Command;
use std::time::Duration;

use deadline_lab::experiments::waterfall::Waterfall;
use deadline_lab::kit::traced::Hop;
use deadline_lab::otlp::{Received, Receiver};
use deadline_lab::pb::PushReq;
use deadline_lab::process::Spawned;
use deadline_lab::systems::im;
use tonic_deadline::Scope;

use crate::common::{alone_async, debug_lab, release_lab};

/// How long spans may take to reach the receiver (they leave every 100 ms).
const ARRIVE_WITHIN: Duration = Duration::from_secs(15);

fn kind(span: &Received) -> i32 {
    span.span.kind
}
const SERVER: i32 = 2;
const CLIENT: i32 = 3;

/// Starts the four IM roles as `serve im --role …` processes exporting to
/// `receiver`; returns them (killed on drop) and the gateway's address.
async fn im_processes(receiver: &Receiver) -> (Vec<Spawned>, std::net::SocketAddr) {
    let mut peers: Vec<(&str, std::net::SocketAddr)> = Vec::new();
    let mut running = Vec::new();
    for role in im::ROLES {
        let mut command = Command::new(debug_lab());
        command.args([
            "serve",
            "im",
            "--role",
            role,
            "--otlp-endpoint",
            &receiver.url(),
        ]);
        for (name, addr) in &peers {
            command.args(["--peer", &format!("{name}={addr}")]);
        }
        let mut process = Spawned::spawn(role, command).expect("a role process must start");
        let addr = process
            .addr()
            .await
            .expect("a role process must print its address");
        peers.push((role, addr));
        running.push(process);
    }
    let gateway = peers.last().expect("the gateway started last").1;
    (running, gateway)
}

/// The spans of the trace whose root is a gateway server span not in
/// `seen`, once `count` of them arrived.
async fn next_trace(receiver: &Receiver, seen: &HashSet<String>, count: usize) -> Vec<Received> {
    let polls = ARRIVE_WITHIN.as_millis() / 50;
    for _ in 0..polls {
        let all = receiver.spans();
        if let Some(root) = all.iter().find(|s| {
            s.service == "im-gateway"
                && kind(s) == SERVER
                && s.parent().is_none()
                && !seen.contains(&s.trace_id())
        }) {
            let trace: Vec<Received> = all
                .iter()
                .filter(|s| s.trace_id() == root.trace_id())
                .cloned()
                .collect();
            if trace.len() >= count {
                return trace;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let got: Vec<String> = receiver
        .spans()
        .iter()
        .map(|s| format!("{} {} {}", s.service, s.span.name, s.trace_id()))
        .collect();
    panic!("a trace of {count} spans must reach the receiver; it got: {got:#?}");
}

fn server<'a>(trace: &'a [Received], service: &str) -> &'a Received {
    trace
        .iter()
        .find(|s| s.service == service && kind(s) == SERVER)
        .unwrap_or_else(|| panic!("{service} must send its server span"))
}

/// The call span `caller` made to `rpc_service`.
fn call<'a>(trace: &'a [Received], caller: &str, rpc_service: &str) -> &'a Received {
    trace
        .iter()
        .find(|s| {
            s.service == caller && kind(s) == CLIENT && s.text("rpc.service") == Some(rpc_service)
        })
        .unwrap_or_else(|| panic!("{caller} must send its call span to {rpc_service}"))
}

fn number(span: &Received, key: &str) -> f64 {
    span.number(key)
        .unwrap_or_else(|| panic!("{} must carry {key}", span.span.name))
}

/// Each server span is the child of its caller's call span, which is the
/// child of the caller's server span, and no two spans share an id.
fn assert_links(trace: &[Received], hops: &[(&str, &str, &str)]) {
    let ids: HashSet<String> = trace.iter().map(Received::span_id).collect();
    assert_eq!(
        ids.len(),
        trace.len(),
        "every hop must have a span id of its own, not a copied one"
    );
    for (caller, rpc_service, callee) in hops {
        let call = call(trace, caller, rpc_service);
        let served = server(trace, callee);
        assert_eq!(
            served.parent(),
            Some(call.span_id()),
            "{callee}'s server span must be the child of {caller}'s call span"
        );
        assert_eq!(
            call.parent(),
            Some(server(trace, caller).span_id()),
            "{caller}'s call to {callee} must be the child of {caller}'s server span"
        );
    }
}

fn push(route_ms: u64, route_blocks: bool) -> PushReq {
    PushReq {
        uid: 3,
        text: "hi".into(),
        route_ms,
        push_ms: 1,
        route_blocks,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn im_request_is_one_trace_across_four_processes_on_a_real_otlp_receiver() {
    let _alone = alone_async().await;
    let receiver = Receiver::start().expect("the OTLP receiver must listen");
    let (_running, gateway) = im_processes(&receiver).await;
    let mut client = im::client(gateway)
        .await
        .expect("the gateway must accept a connection");
    let mut seen = HashSet::new();

    // A normal request: gateway → logic → route, then logic → push.
    Scope::background()
        .with_timeout(im::CLIENT_BUDGET)
        .enter(client.push(push(1, false)))
        .await
        .expect("a normal request must succeed");
    let trace = next_trace(&receiver, &seen, 7).await;
    seen.insert(trace[0].trace_id());
    let services: HashSet<&str> = trace.iter().map(|s| s.service.as_str()).collect();
    assert_eq!(
        services,
        HashSet::from(["im-gateway", "im-logic", "im-route", "im-push"]),
        "one trace id must span the four services' processes"
    );
    assert_links(
        &trace,
        &[
            ("im-gateway", "lab.v1.Logic", "im-logic"),
            ("im-logic", "lab.v1.Route", "im-route"),
            ("im-logic", "lab.v1.Pusher", "im-push"),
        ],
    );
    let gateway_entry = number(server(&trace, "im-gateway"), "budget_on_entry_ms");
    let to_logic = call(&trace, "im-gateway", "lab.v1.Logic");
    let logic_entry = number(server(&trace, "im-logic"), "budget_on_entry_ms");
    let to_route = call(&trace, "im-logic", "lab.v1.Route");
    let route_entry = number(server(&trace, "im-route"), "budget_on_entry_ms");
    let to_push = call(&trace, "im-logic", "lab.v1.Pusher");
    let push_entry = number(server(&trace, "im-push"), "budget_on_entry_ms");
    let chain = [
        gateway_entry,
        number(to_logic, "granted_ms"),
        logic_entry,
        number(to_route, "granted_ms"),
        route_entry,
    ];
    // `grpc-timeout` rounds up to its unit (here 1 µs), so a server may
    // start with up to one unit more than its caller's span wrote.
    const UNIT_MS: f64 = 0.0011;
    assert!(
        chain.windows(2).all(|w| w[0] + UNIT_MS >= w[1]) && gateway_entry > route_entry,
        "the budget must shrink along gateway → logic → route: {chain:?}"
    );
    assert!(
        gateway_entry <= 800.0 && gateway_entry > 700.0,
        "gateway must see the client's 800 ms: {gateway_entry}"
    );
    assert_eq!(
        to_logic.number("cap_ms"),
        Some(500.0),
        "gateway's call must show its 500 ms cap"
    );
    assert_eq!(
        to_route.number("cap_ms"),
        Some(200.0),
        "logic's call to route must show its 200 ms cap"
    );
    assert_eq!(
        (to_push.number("reserve_ms"), to_push.flag("reserve_bound")),
        (Some(50.0), Some(true)),
        "logic's call to push must show the 50 ms it kept back"
    );
    assert!(
        push_entry <= number(to_push, "granted_ms") + UNIT_MS && push_entry < logic_entry - 49.0,
        "push must get less than logic had, by its reserve: push {push_entry}, logic {logic_entry}"
    );
    for span in trace.iter().filter(|s| kind(s) == SERVER) {
        assert_eq!(
            span.text("cause"),
            Some("request completed"),
            "{}: a request answered in time ends its scope as completed",
            span.service
        );
        assert_eq!(span.flag("outlived_parent_deadline"), Some(false));
    }

    // Route stalls in blocking work that ignores its scope.
    let stalled = Scope::background()
        .with_timeout(im::CLIENT_BUDGET)
        .enter(client.push(push(400, true)))
        .await
        .expect_err("a request whose route stalls must fail");
    assert_eq!(stalled.code(), tonic::Code::DeadlineExceeded);
    let trace = next_trace(&receiver, &seen, 6).await;
    let route = server(&trace, "im-route");
    // Route's timer and logic's reset (logic's own deadline, a transit
    // earlier) arrive within a millisecond of each other: either ends it.
    assert!(
        matches!(
            route.text("cause"),
            Some("deadline exceeded" | "abandoned before the answer")
        ),
        "route's scope must end at its deadline: {:?}",
        route.text("cause")
    );
    let work = trace
        .iter()
        .find(|s| s.span.name == "blocking work")
        .expect("route's blocking work must send its span");
    assert_eq!(work.service, "im-route");
    assert_eq!(
        work.parent(),
        Some(route.span_id()),
        "the blocking work must be the child of route's server span"
    );
    assert_eq!(
        work.flag("outlived_parent_deadline"),
        Some(true),
        "work that ran on after its parent's deadline must be flagged"
    );
    assert!(
        work.span.end_time_unix_nano > route.span.end_time_unix_nano,
        "the child must end after its parent did"
    );
    assert!(
        number(work, "outlived_ms") > 100.0,
        "it ran on for ~200 ms past route's deadline: {:?}",
        work.number("outlived_ms")
    );
}

fn hop<'a>(spans: &'a [Hop], service: &str) -> &'a Hop {
    spans
        .iter()
        .find(|h| h.service == service)
        .unwrap_or_else(|| panic!("the waterfall must show {service}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waterfall_draws_both_cases_and_also_exports_to_the_given_endpoint() {
    #[allow(clippy::disallowed_methods)] // builds the release lab, no request
    let lab = tokio::task::spawn_blocking(release_lab)
        .await
        .expect("the release lab must be built");
    let _alone = alone_async().await;
    let receiver = Receiver::start().expect("the OTLP receiver must listen");
    let out = tokio::process::Command::new(lab)
        .args(["experiment", "waterfall", "--json", "--otlp-endpoint"])
        .arg(receiver.url())
        .output()
        .await
        .expect("deadline-lab must start");
    assert!(
        out.status.success(),
        "experiment waterfall must succeed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let waterfall: Waterfall =
        serde_json::from_slice(&out.stdout).expect("--json must print the waterfall");
    let cases: Vec<&str> = waterfall.cases.iter().map(|c| c.case.as_str()).collect();
    assert_eq!(cases, ["normal", "route stalls"]);

    let normal = &waterfall.cases[0];
    assert_eq!(normal.status, "OK");
    let ids: HashSet<&str> = normal.spans.iter().map(|h| h.span_id.as_str()).collect();
    assert_eq!(
        ids.len(),
        normal.spans.len(),
        "each hop has its own span id"
    );
    let entries: Vec<f64> = ["gateway", "logic", "route"]
        .iter()
        .map(|s| {
            hop(&normal.spans, s)
                .budget_on_entry_ms
                .expect("every hop has a deadline")
        })
        .collect();
    assert!(
        entries.windows(2).all(|w| w[0] > w[1]),
        "budgets on entry must decrease along the chain: {entries:?}"
    );
    let to_route = hop(&normal.spans, "logic → route");
    assert_eq!(
        hop(&normal.spans, "route").parent.as_deref(),
        Some(to_route.span_id.as_str())
    );
    assert!(to_route.cap_bound, "route's 200 ms cap sets its deadline");

    let stall = &waterfall.cases[1];
    assert_eq!(stall.status, "DEADLINE_EXCEEDED");
    let work = hop(&stall.spans, "route: blocking work");
    let route = hop(&stall.spans, "route");
    assert!(
        work.outlived_parent_deadline,
        "the blocking work is flagged"
    );
    assert!(
        work.end_ms > route.end_ms + 100.0,
        "it runs on well after route answered: {} vs {}",
        work.end_ms,
        route.end_ms
    );
    assert!(
        stall.spans.iter().all(|h| h.service != "push"),
        "push is never called when route stalls"
    );
    // The same call as its ledger tells it: gateway, logic, route, and
    // route is where the time went.
    assert!(normal.ledger.is_empty(), "an OK call carries no ledger");
    let methods: Vec<&str> = stall
        .ledger
        .iter()
        .map(|line| line.split(' ').next().unwrap_or_default())
        .collect();
    assert_eq!(
        methods,
        [
            "/lab.v1.Gateway/Push",
            "/lab.v1.Logic/Push",
            "/lab.v1.Route/GetRoute"
        ],
        "{:?}",
        stall.ledger
    );

    // The same spans went to --otlp-endpoint as well.
    let exported = receiver
        .trace(&stall.trace_id, ARRIVE_WITHIN, |s| {
            s.len() >= stall.spans.len()
        })
        .await;
    assert_eq!(
        exported.len(),
        stall.spans.len(),
        "--otlp-endpoint must receive every span of the traced request"
    );
}
