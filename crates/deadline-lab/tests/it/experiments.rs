//! The lab's experiments measure what they claim, on real loopback services.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use deadline_lab::capture::{Direction, Listening, RecordLine};
use deadline_lab::experiments::im::{self, Case};
use deadline_lab::kit::journal::{self, Hop};
use deadline_lab::{bench, experiments};
use tonic_deadline::timeout_header::decode;

use crate::common::{alone_async, debug_lab, timed};

#[test]
fn wire_experiment_reports_headers_as_received() {
    let wire: experiments::wire::Wire = timed(&["experiment", "wire", "--json"]);
    let rows = &wire.rows;
    let budgets = [
        ("50ms", Duration::from_millis(50)),
        ("1s", Duration::from_secs(1)),
        ("5s", Duration::from_secs(5)),
        ("1m30s", Duration::from_secs(90)),
        ("2h", Duration::from_secs(7200)),
        ("100h", Duration::from_secs(360_000)),
    ];
    for (row, (label, budget)) in rows.iter().zip(budgets) {
        assert_eq!(row.timeout, label);
        let header = row
            .header
            .as_deref()
            .expect("a deadline must put a header on the wire");
        let seen = decode(header.as_bytes()).expect("the header must be valid");
        assert!(
            seen <= budget,
            "{label}: the header must carry the remaining time, not more ({header})"
        );
        assert!(
            budget - seen < Duration::from_millis(50),
            "{label}: {header} is far below the budget"
        );
    }
    assert_eq!(
        rows[1].header.as_deref().map(|h| h.ends_with('u')),
        Some(true),
        "1 s is written in microseconds"
    );
    assert_eq!(
        rows[4].header.as_deref(),
        Some("7200000m"),
        "2 h is written in milliseconds"
    );
    assert_eq!(
        rows[5].header.as_deref(),
        Some("360000S"),
        "100 h is written in seconds"
    );
    assert_eq!(rows[6].timeout, "none");
    assert_eq!(rows[6].header, None, "no deadline must mean no header");
}

#[test]
fn chain_experiment_budget_shrinks_by_each_hop() {
    let chain: experiments::chain::Chain =
        timed(&["experiment", "chain", "--hop-ms", "100", "--json"]);
    assert_eq!(chain.status, "OK");
    let (budget, work) = (chain.budget_ms as f64, chain.hop_ms as f64);
    let hops: Vec<f64> = chain.hops.iter().map(|h| h.remaining_ms).collect();
    assert_eq!(hops.len(), 3, "A, B and C must report");
    assert!(
        hops[0] <= budget,
        "A cannot see more than the client's budget: {hops:?}"
    );
    // What a hop loses beyond its work is transit and processing: less than
    // the work itself even on a loaded machine (a hop that lost a whole
    // extra hop's work would be counting it twice).
    assert!(
        hops[0] > budget - work,
        "A sees about the full budget, less than a hop's work gone: {hops:?}"
    );
    for pair in hops.windows(2) {
        assert!(
            pair[1] <= pair[0] - work,
            "each hop must see at least its predecessor's work less: {hops:?}"
        );
        assert!(
            pair[1] > pair[0] - 2.0 * work,
            "and less than twice the work less: {hops:?}"
        );
    }
}

#[test]
fn propagation_experiment_stops_downstream_unless_detached() {
    let p: experiments::propagation::Propagation = timed(&["experiment", "propagation", "--json"]);
    assert_eq!(p.propagate.client_status, "DEADLINE_EXCEEDED");
    assert_eq!(
        p.propagate.b_completed, 0,
        "B must stop when the client gives up"
    );
    assert_eq!(
        p.propagate.c_completed, 0,
        "C must stop when the client gives up"
    );
    assert_eq!(p.detached.client_status, "DEADLINE_EXCEEDED");
    assert_eq!(p.detached.b_completed, 1, "a detached call runs to the end");
    assert_eq!(p.detached.c_completed, 1, "a detached call runs to the end");
}

#[test]
fn expired_experiment_sends_zero_frames() {
    let e: experiments::expired::Expired = timed(&["experiment", "expired", "--json"]);
    assert_eq!(e.status, "DEADLINE_EXCEEDED");
    assert_eq!(
        e.frames, 0,
        "an expired call must put nothing on the wire: {e:?}"
    );
    assert!(e.elapsed_ms < 50.0, "it fails locally, at once");
}

#[test]
fn benchmarks_report_both_variants() {
    let overhead: bench::overhead::Overhead = timed(&[
        "bench",
        "overhead",
        "--rounds",
        "2",
        "--round-ms",
        "100",
        "--json",
    ]);
    assert!(overhead.plain_rps > 0.0, "{overhead:?}");
    assert!(overhead.layered_rps > 0.0, "{overhead:?}");
    assert_eq!(overhead.layered_failed, 0, "no layered call may fail");
    let cancel: bench::cancel::Cancel = timed(&[
        "bench",
        "cancel",
        "--runs",
        "10",
        "--threads",
        "1",
        "--json",
    ]);
    for (name, figure) in [
        ("p50_us", cancel.p50_us),
        ("p99_us", cancel.p99_us),
        ("aborted_p50_us", cancel.aborted_p50_us),
        ("aborted_p99_us", cancel.aborted_p99_us),
        ("spawned_p50_us", cancel.spawned_p50_us),
        ("spawned_p99_us", cancel.spawned_p99_us),
        ("plain_p50_us", cancel.plain_p50_us),
        ("plain_p99_us", cancel.plain_p99_us),
    ] {
        assert!(figure > 0.0, "{name} must be measured: {cancel:?}");
    }
    for (name, steps) in [
        ("steps_p50_us", cancel.steps_p50_us),
        ("aborted_steps_p50_us", cancel.aborted_steps_p50_us),
        ("plain_steps_p50_us", cancel.plain_steps_p50_us),
    ] {
        assert!(
            steps.iter().all(|&us| us > 0.0),
            "{name}: every step must be measured: {cancel:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_chain_prints_its_address_first_and_answers() {
    let mut child = Command::new(debug_lab())
        .args(["serve", "chain", "--hop-ms", "10"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("deadline-lab must start");
    let stdout = child.stdout.take().expect("stdout is piped");
    #[allow(clippy::disallowed_methods)] // reading a child's stdout, no request
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await
    .expect("reader task")
    .expect("the first line must be readable");
    let addr = line
        .trim()
        .parse()
        .expect("the first line must be the entry address");
    let result = async {
        let mut client = deadline_lab::kit::calls::layered_client(addr).await?;
        let scope = tonic_deadline::Scope::background().with_timeout(Duration::from_secs(5));
        let reply = scope
            .enter(client.call(testkit::CallRequest::default()))
            .await?;
        anyhow::Ok(reply.into_inner().hops.len())
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        result.expect("the chain must answer"),
        3,
        "A, B and C must each report"
    );
}

#[test]
fn handler_experiment_watching_stops_ignoring_is_a_detected_zombie() {
    let handler: experiments::handler::Handler = timed(&["experiment", "handler", "--json"]);
    let (watching, ignoring) = (&handler.watching, &handler.ignoring);
    let (budget, work) = (handler.budget_ms as f64, handler.work_ms as f64);
    // Every figure is read on the client's clock from the start of the call;
    // the server's deadline is the client's moved by the transit, so it
    // cannot come before the client's (a millisecond for rounding).
    for v in [watching, ignoring] {
        assert_eq!(v.client_status, "DEADLINE_EXCEEDED", "{handler:?}");
        assert!(
            v.client_ms >= budget - 1.0 && v.client_ms < work,
            "the client gives up at its deadline, not before and not at the end of the work: {handler:?}"
        );
    }
    assert_eq!(
        watching.completed, 0,
        "watching work must stop: {handler:?}"
    );
    let noticed = watching
        .server_noticed_ms
        .expect("the watching server must notice the end of its scope");
    assert!(
        noticed >= budget - 1.0 && noticed < work,
        "the server notices at the deadline, not after its 1 s of work: {handler:?}"
    );
    assert_eq!(
        ignoring.completed, 1,
        "ignoring work runs to the end: {handler:?}"
    );
    let (ended, done) = (
        ignoring
            .scope_ended_ms
            .expect("the ignoring handler's scope must end"),
        ignoring
            .work_done_ms
            .expect("the ignoring work must finish"),
    );
    assert!(
        ended < work && done >= work,
        "its scope ends at the deadline, its work a full second after it began: {handler:?}"
    );
    assert!(
        ignoring.zombie_ms.is_some_and(|z| z >= work - ended - 1.0),
        "it outlives its scope by the rest of its second: {handler:?}"
    );
    assert!(
        ignoring.outlived_detected.is_some_and(|n| n >= 1),
        "the library must detect the work that outlived its scope: {handler:?}"
    );
    let wire = watching.wire.join("\n");
    assert!(
        wire.contains("grpc-timeout=")
            && (wire.contains("grpc-status=4") || wire.contains("RST_STREAM")),
        "the capture shows the budget going out and the call ending at the deadline \
         (the server's DEADLINE_EXCEEDED or the client's reset, whichever is first): {wire}"
    );
}

/// What a budget figure may be off by: the server's is rounded to 0.1 ms,
/// `grpc-timeout` rounds up to its unit, and the call's start is read an
/// instant after its scope was made.
const SLACK_MS: f64 = 2.0;

/// The budget the server received in `row`'s `grpc-timeout`, in ms.
fn header_ms(row: &experiments::drift::Row) -> f64 {
    let header = row
        .header
        .as_deref()
        .unwrap_or_else(|| panic!("the call must carry grpc-timeout: {row:?}"));
    decode(header.as_bytes())
        .unwrap_or_else(|e| panic!("the header must be valid ({e}): {row:?}"))
        .as_secs_f64()
        * 1000.0
}

// The client's deadline is fixed when the call begins; the server's is set
// from `grpc-timeout` when the header arrives. So, within one call, the
// server sees more than the client has by the transit between the two
// (less any allowance the client deducted), and the transit is at least the
// delay the proxy injects and at most how late the request reached the
// handler. Both bounds are measured in the same call: a loaded machine
// moves them, not the law.
#[test]
fn drift_experiment_server_sees_the_full_budget_the_client_does_not() {
    let drift: experiments::drift::Drift = timed(&["experiment", "drift", "--json"]);
    let budget = drift.budget_ms as f64;
    let delays: Vec<u64> = drift.rows.iter().map(|r| r.delay_ms).collect();
    assert_eq!(delays, [0, 100, 300]);
    let server_sees = |r: &experiments::drift::Row| {
        r.server_sees_ms
            .unwrap_or_else(|| panic!("the call must reach the server: {r:?}"))
    };
    for row in &drift.rows {
        let delay = row.delay_ms as f64;
        let (server, client) = (server_sees(row), row.client_left_ms);
        assert!(
            row.arrived_late_ms >= delay,
            "the proxy delays the request by {delay} ms: {row:?}"
        );
        assert!(
            server <= budget + SLACK_MS,
            "the server cannot see more than the budget: {row:?}"
        );
        assert!(
            budget - server <= row.arrived_late_ms - delay + SLACK_MS,
            "the server loses only the time spent on this machine, never the delay: {row:?}"
        );
        assert!(
            client <= budget - delay,
            "the client really has the delay less: {row:?}"
        );
        let gap = server - client;
        assert!(
            gap >= delay - SLACK_MS && gap <= row.arrived_late_ms + SLACK_MS,
            "the server sees more than the client has by the transit ({gap:.1} ms), \
             at least the delay and at most the request's lateness: {row:?}"
        );
    }

    let compensated = &drift.compensated;
    let allowance = compensated.transit_allowance_ms as f64;
    assert_eq!(
        allowance, compensated.delay_ms as f64,
        "the allowance is the known one-way delay: {compensated:?}"
    );
    assert!(
        header_ms(compensated) <= budget - allowance + SLACK_MS,
        "the client must deduct its allowance from the header: {compensated:?}"
    );
    let gap = server_sees(compensated) - compensated.client_left_ms;
    assert!(
        gap >= -SLACK_MS && gap <= compensated.arrived_late_ms - allowance + SLACK_MS,
        "with the one-way delay as transit allowance, server and client must agree \
         up to the time the request spent on this machine ({gap:.1} ms): {compensated:?}"
    );

    let rtt = &drift.rtt_compensated;
    let one_way = rtt.delay_ms as f64;
    let measured = rtt
        .measured_rtt_ms
        .expect("the round trip must be measured");
    assert!(
        measured >= 2.0 * one_way,
        "a PING cannot come back faster than the link's delay both ways: {rtt:?}"
    );
    // The estimate is the least round trip seen so far, so the half the
    // client deducted when it sent the call is at least half the figure
    // read afterwards.
    assert!(
        header_ms(rtt) <= budget - measured / 2.0 + SLACK_MS,
        "the client must deduct half the measured round trip from the header: {rtt:?}"
    );
    // On a loaded machine the PINGs wait for the CPU too, so half the round
    // trip may overpay the transit: the server may then see less than the
    // client has, by what the measurement read too much. A second PING may
    // have lowered the estimate after the call was sent; a quarter of the
    // round trip covers that, and a deduction of the whole round trip
    // (twice the transit) would still be far outside.
    let gap = server_sees(rtt) - rtt.client_left_ms;
    assert!(
        gap >= one_way - measured / 2.0 - measured / 4.0 - SLACK_MS
            && gap <= rtt.arrived_late_ms - measured / 2.0 + SLACK_MS,
        "with half the measured round trip deducted, the server must see what the client has, \
         less what the measurement overpaid ({gap:.1} ms): {rtt:?}"
    );
}

fn hop<'a>(hops: &'a [Hop], service: &str) -> &'a Hop {
    journal::find(hops, service).unwrap_or_else(|| panic!("{service} must report: {hops:?}"))
}

fn entry(hops: &[Hop], service: &str) -> f64 {
    hop(hops, service)
        .entry_ms
        .unwrap_or_else(|| panic!("{service} must have a deadline on entry: {hops:?}"))
}

fn gave(case: &Case, service: &str, to: &str) -> f64 {
    hop(&case.hops, service)
        .gave_to(to)
        .and_then(|g| g.ms)
        .unwrap_or_else(|| panic!("{service} must give {to} a budget: {case:?}"))
}

#[test]
fn im_experiment_every_hop_hands_on_less_than_it_had() {
    let result: im::Im = timed(&["experiment", "im", "--json"]);
    let normal = &result.normal;
    assert_eq!(normal.status, "OK", "{normal:?}");
    let gateway = entry(&normal.hops, "gateway");
    assert!(gateway <= 800.0 && gateway > 700.0, "{normal:?}");
    let to_logic = gave(normal, "gateway", "logic");
    assert!(
        to_logic <= 500.0 && to_logic > 450.0,
        "gateway caps logic at 500 ms: {normal:?}"
    );
    let logic = entry(&normal.hops, "logic");
    assert!(logic <= to_logic, "{normal:?}");
    let to_route = gave(normal, "logic", "route");
    assert!(
        to_route <= 200.0 && to_route > 150.0,
        "logic caps route at 200 ms: {normal:?}"
    );
    let to_push = gave(normal, "logic", "push");
    // Logic calls push after route answered: what it hands on is what it
    // had on entry, less the time since (measured in the same run), less
    // its 50 ms reserve.
    let pushed_at = hop(&normal.hops, "logic")
        .gave_to("push")
        .and_then(|g| g.at_ms)
        .unwrap_or_else(|| panic!("logic must say when it called push: {normal:?}"));
    let expected = logic - pushed_at - 50.0;
    assert!(
        to_push <= expected + 1.0 && to_push > expected - 10.0,
        "logic keeps 50 ms for itself ({expected:.1} ms expected): {normal:?}"
    );
    let stall = &result.route_stall;
    assert_eq!(stall.status, "DEADLINE_EXCEEDED", "{stall:?}");
    assert!(
        stall.client_ms < 600.0,
        "a stalled route fails the request at its 200 ms cap, long before 800 ms: {stall:?}"
    );
    let none = &result.no_deadline;
    let logic_own = entry(&none.hops, "logic");
    assert!(
        logic_own <= 500.0 && logic_own > 450.0,
        "logic gives itself 500 ms when no deadline arrives: {none:?}"
    );
}

#[test]
fn shop_experiment_pricing_gets_what_is_left_not_a_fresh_budget() {
    let shop: experiments::shop::Shop = timed(&["experiment", "shop", "--json"]);
    assert_eq!(shop.propagated.status, "OK", "{shop:?}");
    let figure = |v: Option<f64>, what: &str| {
        v.unwrap_or_else(|| panic!("{what} must have a deadline on entry: {shop:?}"))
    };
    let inventory = figure(shop.inventory_budget_ms, "inventory");
    assert!(inventory <= 900.0 && inventory > 800.0, "{shop:?}");
    let pricing = figure(shop.pricing_budget_ms, "pricing");
    // Pricing is called after inventory's work, with the reserve kept back:
    // it can have at most what inventory had less both.
    let most = inventory - shop.inventory_ms as f64 - shop.reserve_ms as f64;
    assert!(
        pricing <= most + 1.0 && pricing > most - 80.0,
        "pricing gets 900 − 650 − 50 ms, about 200 (at most {most:.1}): {shop:?}"
    );
    let cache = figure(shop.cache_budget_ms, "the cache");
    assert!(
        cache <= 20.0 && cache > 10.0,
        "the cache is capped at 20 ms: {shop:?}"
    );
    let fixed_pricing = entry(&shop.fixed_timeouts.hops, "pricing");
    assert!(
        fixed_pricing > 700.0,
        "fixed timeouts give pricing a fresh 800 ms: {shop:?}"
    );
    let quotes = &shop.fan_out.pricing_entries_ms;
    assert_eq!(quotes.len(), 3, "{shop:?}");
    let spread = quotes.iter().copied().fold(f64::MIN, f64::max)
        - quotes.iter().copied().fold(f64::MAX, f64::min);
    // Quotes made one after another would differ by a quote's work each
    // (100 ms); parallel ones only by when each was sent.
    assert!(
        spread < 50.0,
        "parallel children share one deadline: {quotes:?}"
    );
}

#[test]
fn orders_experiment_stalled_payment_is_cancelled_and_writes_nothing() {
    let orders: experiments::orders::Orders = timed(&["experiment", "orders", "--json"]);
    assert_eq!(orders.client_status, "DEADLINE_EXCEEDED", "{orders:?}");
    assert!(orders.payment_cancelled, "{orders:?}");
    assert!(!orders.order_written, "{orders:?}");
    let late = &orders.late_reply;
    assert_eq!(late.client_status, "DEADLINE_EXCEEDED", "{orders:?}");
    assert!(
        late.order_written,
        "DEADLINE_EXCEEDED is outcome unknown: the order may exist: {orders:?}"
    );
    assert_eq!(late.retry_status, "OK", "{orders:?}");
    assert_eq!(
        late.charges, 1,
        "an idempotent retry must not charge twice: {orders:?}"
    );
    assert!(!orders.outcome_unknown.is_empty());
}

/// A `deadline-lab` child process, killed when dropped.
struct Lab {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Lab {
    fn spawn(args: &[&str]) -> Self {
        let mut child = Command::new(debug_lab())
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("deadline-lab must start");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    fn line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .expect("deadline-lab must print a line")
    }

    fn addr(&self) -> std::net::SocketAddr {
        self.line()
            .trim()
            .parse()
            .expect("the first line must be an address")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The client's budget in the tests that run a system as separate
/// processes of the debug lab. They show the wiring and what crosses the
/// wire, not timing: the first call connects every hop, which on a loaded
/// machine can take longer than a second.
const PROCESS_BUDGET: Duration = Duration::from_secs(10);

/// The header the proxy read carries the client's budget, less at most a
/// second spent before the request left.
fn sent_whole(on_the_wire: Duration) -> bool {
    on_the_wire <= PROCESS_BUDGET && on_the_wire > PROCESS_BUDGET - Duration::from_secs(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn im_runs_as_separate_processes_through_the_capture_proxy() {
    let _alone = alone_async().await;
    let route = Lab::spawn(&["serve", "im", "--role", "route"]);
    let push = Lab::spawn(&["serve", "im", "--role", "push"]);
    let (route_addr, push_addr) = (route.addr(), push.addr());
    let logic = Lab::spawn(&[
        "serve",
        "im",
        "--role",
        "logic",
        "--peer",
        &format!("route={route_addr}"),
        "--peer",
        &format!("push={push_addr}"),
    ]);
    let logic_addr = logic.addr();
    let gateway = Lab::spawn(&[
        "serve",
        "im",
        "--role",
        "gateway",
        "--peer",
        &format!("logic={logic_addr}"),
    ]);
    let gateway_addr = gateway.addr();
    let (capture, entry) = capture_in_front_of(gateway_addr);

    let reply = async {
        let mut client = deadline_lab::systems::im::client(entry).await?;
        let scope = tonic_deadline::Scope::background().with_timeout(PROCESS_BUDGET);
        let reply = scope
            .enter(client.push(deadline_lab::pb::PushReq {
                uid: 7,
                text: "hi".into(),
                route_ms: 1,
                push_ms: 1,
                route_blocks: false,
            }))
            .await?;
        anyhow::Ok(reply.into_inner())
    }
    .await
    .expect("the chain across four processes must answer");
    let services: Vec<&str> = reply
        .trace
        .iter()
        .filter(|t| t.target.is_empty())
        .map(|t| t.service.as_str())
        .collect();
    assert_eq!(services, ["gateway", "logic", "route", "push"]);

    let mut request_timeout = None;
    let mut reply_status = None;
    for _ in 0..200 {
        let Ok(line) = capture.lines.recv_timeout(Duration::from_secs(5)) else {
            break;
        };
        let frame: RecordLine = serde_json::from_str(&line).expect("one frame record a line");
        if frame.is_headers(Direction::ClientToServer) {
            request_timeout = frame.headers.get("grpc-timeout").cloned();
        }
        if frame.is_headers(Direction::ServerToClient)
            && let Some(status) = frame.headers.get("grpc-status")
        {
            reply_status = Some(status.clone());
            break;
        }
    }
    let header = request_timeout.expect("the proxy must decode the request's grpc-timeout");
    let budget = decode(header.as_bytes()).expect("a valid header");
    assert!(sent_whole(budget), "{header}");
    assert_eq!(
        reply_status.as_deref(),
        Some("0"),
        "grpc-status OK decoded from the trailers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chain_runs_as_separate_processes_through_the_capture_proxy() {
    let _alone = alone_async().await;
    let c = Lab::spawn(&["serve", "chain", "--role", "C", "--hop-ms", "20"]);
    let c_addr = c.addr().to_string();
    let b = Lab::spawn(&[
        "serve", "chain", "--role", "B", "--hop-ms", "20", "--next", &c_addr,
    ]);
    let b_addr = b.addr().to_string();
    let a = Lab::spawn(&[
        "serve", "chain", "--role", "A", "--hop-ms", "20", "--next", &b_addr,
    ]);
    let (capture, entry) = capture_in_front_of(a.addr());

    let hops = async {
        let mut client = deadline_lab::kit::calls::layered_client(entry).await?;
        let scope = tonic_deadline::Scope::background().with_timeout(PROCESS_BUDGET);
        let reply = scope
            .enter(client.call(testkit::CallRequest::default()))
            .await?;
        anyhow::Ok(reply.into_inner().hops)
    }
    .await
    .expect("the chain across three processes must answer");
    let names: Vec<&str> = hops.iter().map(|h| h.service.as_str()).collect();
    assert_eq!(names, ["A", "B", "C"]);
    for pair in hops.windows(2) {
        assert!(
            pair[1].remaining_us <= pair[0].remaining_us - 20_000,
            "each process must see at least the previous hop's work less: {hops:?}"
        );
    }
    let measured = first_wire_timeout(&capture);
    assert!(sent_whole(measured), "{measured:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shop_and_orders_serve_their_entry_with_reflection() {
    for system in ["shop", "orders"] {
        let lab = Lab::spawn(&["serve", system]);
        let addr = lab.addr();
        let channel = deadline_lab::net::connect(addr)
            .await
            .expect("the entry must accept connections");
        let mut reflection =
            tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient::new(
                channel,
            );
        let request = tonic_reflection::pb::v1::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(
                tonic_reflection::pb::v1::server_reflection_request::MessageRequest::ListServices(
                    String::new(),
                ),
            ),
        };
        let mut replies = reflection
            .server_reflection_info(tokio_stream::iter([request]))
            .await
            .expect("reflection must be on")
            .into_inner();
        let reply = replies
            .message()
            .await
            .expect("a reflection reply")
            .expect("one message");
        let listed = format!("{reply:?}");
        let expected = if system == "shop" {
            "lab.v1.Shop"
        } else {
            "lab.v1.Orders"
        };
        assert!(listed.contains(expected), "{system}: {listed}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_answers_in_v1alpha_too_for_older_tools() {
    for system in ["chain", "im"] {
        let lab = Lab::spawn(&["serve", system]);
        let channel = deadline_lab::net::connect(lab.addr())
            .await
            .expect("the entry must accept connections");
        use tonic_reflection::pb::v1alpha::{
            ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
            server_reflection_request::MessageRequest,
        };
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let reply = ServerReflectionClient::new(channel)
            .server_reflection_info(tokio_stream::iter([request]))
            .await
            .expect("v1alpha reflection must be on")
            .into_inner()
            .message()
            .await
            .expect("a reflection reply")
            .expect("one message");
        let listed = format!("{reply:?}");
        assert!(
            listed.contains("ServerReflection"),
            "{system}: the listing must come from a v1alpha server: {listed}"
        );
    }
}

/// A capture proxy process in front of `upstream`: the proxy and its address.
fn capture_in_front_of(upstream: std::net::SocketAddr) -> (Lab, std::net::SocketAddr) {
    let capture = Lab::spawn(&["capture", "--upstream", &upstream.to_string(), "--json"]);
    let hello: Listening =
        serde_json::from_str(&capture.line()).expect("the first line must say where it listens");
    let entry = hello.listen.parse().expect("the proxy's address");
    (capture, entry)
}

/// The first `grpc-timeout` the capture proxy decoded from the client.
fn first_wire_timeout(capture: &Lab) -> Duration {
    for _ in 0..200 {
        let Ok(line) = capture.lines.recv_timeout(Duration::from_secs(5)) else {
            break;
        };
        let frame: RecordLine = serde_json::from_str(&line).expect("one frame record a line");
        if frame.is_headers(Direction::ClientToServer)
            && let Some(header) = frame.headers.get("grpc-timeout")
        {
            return decode(header.as_bytes()).expect("a valid header");
        }
    }
    panic!("the proxy must decode the call's grpc-timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shop_runs_as_separate_processes_through_the_capture_proxy() {
    let _alone = alone_async().await;
    let inventory = Lab::spawn(&["serve", "shop", "--role", "inventory"]);
    let pricing = Lab::spawn(&["serve", "shop", "--role", "pricing"]);
    let cache = Lab::spawn(&["serve", "shop", "--role", "cache"]);
    let peers = [
        format!("inventory={}", inventory.addr()),
        format!("pricing={}", pricing.addr()),
        format!("cache={}", cache.addr()),
    ];
    let api = Lab::spawn(&[
        "serve", "shop", "--role", "api", "--peer", &peers[0], "--peer", &peers[1], "--peer",
        &peers[2],
    ]);
    let (capture, entry) = capture_in_front_of(api.addr());
    let reply = async {
        let mut client = deadline_lab::systems::shop::client(entry).await?;
        let scope = tonic_deadline::Scope::background().with_timeout(PROCESS_BUDGET);
        let request = deadline_lab::pb::CheckoutReq {
            sku: "sku-1".into(),
            inventory_ms: 50,
            pricing_ms: 5,
            cache_ms: 1,
            fixed_timeouts: false,
        };
        anyhow::Ok(scope.enter(client.checkout(request)).await?.into_inner())
    }
    .await
    .expect("the shop across four processes must answer");
    let entered = |service: &str| {
        reply
            .trace
            .iter()
            .find(|t| t.service == service && t.target.is_empty())
            .map(|t| t.remaining_us)
            .unwrap_or_else(|| panic!("{service} must report its entry: {:?}", reply.trace))
    };
    assert!(
        entered("pricing") <= entered("inventory") - 50_000,
        "pricing gets what inventory's 50 ms left: {:?}",
        reply.trace
    );
    let budget = first_wire_timeout(&capture);
    assert!(sent_whole(budget), "{budget:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_runs_as_separate_processes_through_the_capture_proxy() {
    let _alone = alone_async().await;
    let payments = Lab::spawn(&["serve", "orders", "--role", "payments"]);
    let peer = format!("payments={}", payments.addr());
    let orders = Lab::spawn(&["serve", "orders", "--role", "orders", "--peer", &peer]);
    let (capture, entry) = capture_in_front_of(orders.addr());
    let (created, fetched) = async {
        let mut client = deadline_lab::systems::orders::client(entry).await?;
        let scope = tonic_deadline::Scope::background().with_timeout(PROCESS_BUDGET);
        let request = deadline_lab::pb::CreateOrderReq {
            order_id: "order-1".into(),
            amount_cents: 1250,
            payment_ms: 5,
            reply_ms: 0,
        };
        let created = scope
            .enter(client.create_order(request))
            .await?
            .into_inner();
        let fetched = client
            .get_order(deadline_lab::pb::GetOrderReq {
                order_id: "order-1".into(),
            })
            .await?
            .into_inner();
        anyhow::Ok((created, fetched))
    }
    .await
    .expect("orders across two processes must answer");
    assert!(
        !created.payment_id.is_empty(),
        "the payment must have run: {created:?}"
    );
    assert_eq!(
        fetched.payment_id, created.payment_id,
        "the row must be written"
    );
    let budget = first_wire_timeout(&capture);
    assert!(sent_whole(budget), "{budget:?}");
}

#[test]
fn seams_every_way_keeps_the_budget_or_reports_the_break() {
    let seams: deadline_lab::experiments::seams::Seams = timed(&["experiment", "seams", "--json"]);
    let row = |way: &str| {
        seams
            .rows
            .iter()
            .find(|r| r.way == way)
            .unwrap_or_else(|| panic!("the experiment must have a row {way:?}"))
    };
    let budget = deadline_lab::experiments::seams::BUDGET.as_secs_f64() * 1000.0;
    // A call that waits 100 ms for its connection has about 100 ms left when
    // it reaches the next hop; on a loaded machine the rest of its way may
    // take longer, and the client's deadline ends first. Nothing is lost
    // then: the next hop never ran, and the client gave up at its deadline.
    let expired_on_the_way = |r: &deadline_lab::experiments::seams::Row| {
        r.next_hop_stopped_ms.is_none()
            && !r.next_hop_completed
            && r.client_status == "DEADLINE_EXCEEDED"
            && r.client_ms >= budget - 1.0
    };
    for r in &seams.rows {
        assert!(
            r.next_hop_remaining_ms.is_some() || r.reported || expired_on_the_way(r),
            "{}: a call that lost its budget must be reported: {r:?}",
            r.way
        );
    }
    let kept = [
        "direct",
        "tonic_deadline::spawn",
        "tonic_deadline::JoinSet",
        "Scope::spawn_blocking",
        "futures join",
        "FuturesUnordered",
        "buffer above + capture_scope",
        "buffer below",
        "lazy connect 100ms",
        "reconnect",
    ];
    for way in kept {
        let r = row(way);
        if way.starts_with("lazy connect") || way == "reconnect" {
            // Only these wait for a connection (see `expired_on_the_way`).
            if expired_on_the_way(r) {
                assert!(!r.reported, "{way}: nothing was broken, nothing to report");
                continue;
            }
        }
        let excess = r
            .excess_ms
            .unwrap_or_else(|| panic!("{way}: the next hop must get a deadline"));
        assert!(
            excess < 50.0,
            "{way}: the next hop must not be told more than the client had (+{excess} ms)"
        );
        assert_eq!(r.client_status, "DEADLINE_EXCEEDED", "{way}");
        assert!(!r.next_hop_completed, "{way}: the next hop must be stopped");
        assert!(!r.reported, "{way}: nothing was broken, nothing to report");
    }
    for way in [
        "tokio::spawn",
        "JoinSet",
        "spawn_blocking + block_on",
        "buffer above",
    ] {
        let r = row(way);
        assert_eq!(r.next_hop_remaining_ms, None, "{way}: the budget is lost");
        assert!(r.reported, "{way}: and the loss must be reported");
    }
    assert!(
        row("tokio::spawn").next_hop_completed,
        "nothing stops a call made from tokio::spawn"
    );
    let denied = row("tokio::spawn, Unscoped::Deny");
    assert_eq!(denied.client_status, "FAILED_PRECONDITION");
    assert_eq!(
        denied.next_hop_stopped_ms, None,
        "nothing may reach the next hop"
    );
    for way in [
        "lazy connect 100ms, plain tonic Channel",
        "reconnect, plain tonic Channel",
    ] {
        let r = row(way);
        let excess = r.excess_ms.expect("a plain Channel still sends a deadline");
        assert!(
            excess > 90.0,
            "{way}: a plain Channel overstates the budget by the connect time (+{excess} ms)"
        );
        // The layer watches the first of every 64 calls: the lazy row's
        // call is a first one; the reconnect row's is the second, and a
        // reconnect is reported only when a watched call meets it.
        if way.starts_with("lazy") {
            assert!(r.reported, "{way}: the watched first call must say so");
        }
    }
}
