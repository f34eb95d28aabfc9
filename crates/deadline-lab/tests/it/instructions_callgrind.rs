//! The instruction ratios of `bench instructions` stay under their bounds.
//!
//! Instruction counts under callgrind move by about 0.3 % from run to run,
//! whatever else the machine does, so this guard cannot flake on a busy
//! machine; it runs beside the runs that time things, at the lowest CPU
//! priority. It measures the release build (the figure the bench reports; a
//! debug build's ratios mean nothing), building it first.
//!
//! Needs valgrind and libfaketime, so it is only built with the
//! `callgrind-tests` feature (`scripts/test-all` installs both and enables
//! it through `--all-features`); there a missing one fails this test with
//! the command that installs it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use deadline_lab::bench::instructions::{Case, Instructions};

use crate::common::{counting, lowest_priority, release_lab};

/// The bounds of one case: its instruction ratio ours / plain and its
/// allocations per request above plain tonic, and the least a unit (a
/// request, or a streamed message) can cost when the count is real.
struct Bound {
    case: Case,
    ratio: f64,
    extra_allocs: f64,
    least: f64,
}

/// A request through tonic costs tens of thousands of instructions; fewer
/// than this means the bench counted nothing.
const A_REQUEST: f64 = 10_000.0;
/// A message of a server stream costs about a thousand.
const A_MESSAGE: f64 = 500.0;

// Today's figures (release build, N = 200, 4 connections x 16 streams) plus
// a margin of about 0.005: a change elsewhere in the binary moves plain
// tonic's count as well as ours (adding the metrics and tracing code left our
// counts within 0.2 % and cut plain tonic's chain by 0.5 %). The goals
// (server layer <= 1.02, one hop <= 1.03, the chain <= 1.02 of the
// hand-written one, a streamed message <= 1.01; allocations server <=
// plain + 1, one hop <= plain + 2) are not reached: what is left is listed
// in docs/performance.md. A change that costs more on the
// request path fails here; one that cuts cost tightens the bound.
const BOUNDS: [Bound; 8] = [
    Bound {
        case: Case::Server,
        ratio: SERVER_RATIO,
        extra_allocs: SERVER_ALLOCS,
        least: A_REQUEST,
    },
    Bound {
        case: Case::ServerHeader,
        ratio: SERVER_HEADER_RATIO,
        extra_allocs: SERVER_HEADER_ALLOCS,
        least: A_REQUEST,
    },
    Bound {
        case: Case::OneHop,
        ratio: ONE_HOP_RATIO,
        extra_allocs: ONE_HOP_ALLOCS,
        least: A_REQUEST,
    },
    Bound {
        case: Case::Chain,
        ratio: CHAIN_RATIO,
        extra_allocs: CHAIN_ALLOCS,
        least: A_REQUEST,
    },
    Bound {
        case: Case::ChainByHand,
        ratio: CHAIN_BY_HAND_RATIO,
        extra_allocs: CHAIN_BY_HAND_ALLOCS,
        least: A_REQUEST,
    },
    Bound {
        case: Case::Streaming,
        ratio: STREAMING_RATIO,
        extra_allocs: STREAMING_ALLOCS,
        least: A_MESSAGE,
    },
    Bound {
        case: Case::ServerGuard,
        ratio: SERVER_GUARD_RATIO,
        extra_allocs: SERVER_GUARD_ALLOCS,
        least: A_REQUEST,
    },
    Bound {
        case: Case::ServerGuardHeader,
        ratio: SERVER_GUARD_HEADER_RATIO,
        extra_allocs: SERVER_GUARD_ALLOCS,
        least: A_REQUEST,
    },
];
// Today's figures at N = 200 (the test's), and at N = 1000 (the docs'):
// the smaller run moves plain tonic's count by up to 0.4 %, and plain
// tonic's count in the lab binary moves by up to 0.5 % from one build of
// our crates to the next (shared generic code is compiled anew; two
// builds differing only in the demo's scheduling: 65 572 and 65 267 in
// the server rows, then 65 122 in a run of a build that differs from the
// second only in tests and a comment), so each bound sits about 0.7 %
// above the N = 200 figure (one row measured 1.0494 and 1.0516 in those
// last two builds, against a bound of 1.051 then). The lab turns the
// `ledger` feature on: it adds about 100 instructions to a server request
// with a deadline and 260 to one hop (both layers), in every row below;
// since the response body carries the hop's entry too (a stream cut at its
// deadline gets its ledger), about 240 more per server request with a
// deadline: 170 of them copying the larger body (callgrind, function by
// function, against the build before it). In that same pair of builds
// plain tonic's own count moved by 0.66 % (h2's code laid out anew).

/// `server layer, no header`: today 1.0494–1.0516 (N = 1000: 1.0497 on
/// an earlier build); goal 1.02.
const SERVER_RATIO: f64 = 1.058;
/// `server layer, header`: today 1.0592 (N = 1000: 1.0572); goal 1.02.
const SERVER_HEADER_RATIO: f64 = 1.066;
/// `one hop, both layers`: today 1.0664 (N = 1000: 1.0660); goal 1.03.
const ONE_HOP_RATIO: f64 = 1.074;
/// `3-hop chain` (ours propagates the budget, plain tonic does not): today
/// 1.1017–1.1021 (N = 1000: 1.1013).
const CHAIN_RATIO: f64 = 1.110;
/// `3-hop chain, hand-written` (plain tonic passes the budget on by hand):
/// today 1.0680–1.0686 (N = 1000: 1.0681); goal 1.02.
const CHAIN_BY_HAND_RATIO: f64 = 1.076;
/// `server streaming`, per message: today 1.0310 (N = 1000 and 200 alike:
/// one call of 10 000 messages against five); goal 1.01.
const STREAMING_RATIO: f64 = 1.040;
/// `server layer and reset guard`: today 1.0585 (N = 1000: 1.0551 on an
/// earlier build). Two builds that differ only in the demo's scheduling
/// code measured 1.0573 and 1.0585 (suite's build, N = 200): plain tonic's
/// count moved from 65 572 to 65 267 (-0.47 %), ours from 69 332 to 69 085
/// (-0.36 %), so the bound sits 0.55 % above today's figure.
const SERVER_GUARD_RATIO: f64 = 1.064;
/// `server layer and reset guard, header`: today 1.0679 (N = 1000: 1.0659).
const SERVER_GUARD_HEADER_RATIO: f64 = 1.075;
/// What the reset guard may add to the layer alone per request, as a share
/// of plain tonic's request: the README's server costs the layer alone plus
/// about 1 %, held here to 1.5 %. It moves with the lab's own code: two
/// builds whose only difference was a constant and three help strings of
/// `experiment metastable` measured +540 and +747 without a header (0.82 %
/// and 1.14 % of plain tonic's 65 653 and 65 584), +622 and +552 with one.
const GUARD_ALONE_SHARE: f64 = 0.015;
/// Extra allocations per request, server layer without a header: today 2.0; goal 1.
const SERVER_ALLOCS: f64 = 2.5;
/// Extra allocations per request, server layer with a header: today 2.04; goal 1.
const SERVER_HEADER_ALLOCS: f64 = 2.5;
/// Extra allocations per request, one hop: today 4.04; goal 2.
const ONE_HOP_ALLOCS: f64 = 4.5;
/// Extra allocations per request, 3-hop chain: today 16.18.
const CHAIN_ALLOCS: f64 = 16.7;
/// Extra allocations per request, the chain against the hand-written one:
/// today 12.2.
const CHAIN_BY_HAND_ALLOCS: f64 = 12.7;
/// Extra allocations per streamed message: today 0.00.
const STREAMING_ALLOCS: f64 = 0.05;
/// Extra allocations per request with the reset guard: today 2.0.
const SERVER_GUARD_ALLOCS: f64 = 2.5;

#[test]
fn layer_instruction_ratios_stay_under_their_bounds() {
    let valgrind = Command::new("valgrind").arg("--version").output();
    assert!(
        valgrind.is_ok_and(|o| o.status.success()),
        "this test needs valgrind on PATH: install it with \
         `apt-get update && apt-get install -y valgrind faketime` (scripts/test-all does)"
    );
    let lab = release_lab();
    let _counting = counting();
    let out = lowest_priority(lab)
        .args(["bench", "instructions", "--json", "--requests", "200"])
        .output()
        .expect("the release lab must run");
    assert!(
        out.status.success(),
        "bench instructions must succeed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let measured: Instructions =
        serde_json::from_slice(&out.stdout).expect("bench instructions must print its JSON");
    for bound in &BOUNDS {
        let row = measured
            .row(bound.case)
            .unwrap_or_else(|| panic!("the bench must measure {}", bound.case.label()));
        assert!(
            row.plain > bound.least && row.ours > bound.least,
            "{}: a unit ({}) must cost more than {} instructions, got {row:?}",
            row.case,
            row.counted,
            bound.least
        );
        assert!(
            row.ratio <= bound.ratio,
            "{}: ours/plain = {:.4} ({:.0} vs {:.0} instructions per request) must stay <= {}",
            row.case,
            row.ratio,
            row.ours,
            row.plain,
            bound.ratio
        );
        let extra = row.ours_allocs - row.plain_allocs;
        assert!(
            extra <= bound.extra_allocs,
            "{}: allocations per request {:.2} vs plain {:.2} must stay within +{}",
            row.case,
            row.ours_allocs,
            row.plain_allocs,
            bound.extra_allocs
        );
    }
    for (alone, guarded) in [
        (Case::Server, Case::ServerGuard),
        (Case::ServerHeader, Case::ServerGuardHeader),
    ] {
        let (alone, guarded) = (
            measured.row(alone).expect("measured"),
            measured.row(guarded).expect("measured"),
        );
        let guard = guarded.ours - alone.ours;
        assert!(
            guard <= GUARD_ALONE_SHARE * alone.plain,
            "{}: the reset guard adds {guard:.0} instructions per request to the layer alone, \
             more than {:.0} % of plain tonic's {:.0}",
            guarded.case,
            GUARD_ALONE_SHARE * 100.0,
            alone.plain
        );
    }
}

/// Requests per run of the baseline test; a second run sends five times as
/// many, and the difference divided by the extra requests is the cost of
/// one request, start-up and shutdown cancelled out.
const BASELINE_REQUESTS: u64 = 1000;

/// `deadline-lab serve echo --plain`, the server every plain-tonic figure
/// of the lab is measured on, costs per request what plain tonic costs in a
/// binary of its own (`plain-echo`: the same health service, the same
/// server settings, no subscriber, no counting allocator, nothing else of
/// the lab), both loaded by the same external client (`h2load`).
///
/// A lab whose own machinery (an unfiltered log layer, once) made every
/// request dearer would flatter every ratio it prints. Loaded the same way,
/// the README's server (`serve echo`: the reset guard and the layer) costs
/// the layer alone (`serve echo --layer-only`) plus about 1 % of plain
/// tonic's request (held here to 2.5 %: loaded from outside, the figures
/// move from run to run).
#[test]
fn plain_tonic_in_the_lab_costs_what_it_costs_in_a_binary_of_its_own() {
    for (tool, package) in [("valgrind", "valgrind"), ("h2load", "nghttp2-client")] {
        assert!(
            Command::new(tool)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success()),
            "this test needs {tool} on PATH: `apt-get install -y {package}` (scripts/test-all does)"
        );
    }
    let lab = release_lab();
    let own = lab.with_file_name("plain-echo");
    let _counting = counting();
    let in_lab = per_request(
        lab,
        &["serve", "echo", "--plain", "--listen", "127.0.0.1:0"],
    );
    let on_its_own = per_request(&own, &["127.0.0.1:0"]);
    // The README's server, and the layer without the guard: what the guard
    // costs, loaded from outside.
    let layer_alone = per_request(
        lab,
        &["serve", "echo", "--layer-only", "--listen", "127.0.0.1:0"],
    );
    let readme = per_request(lab, &["serve", "echo", "--listen", "127.0.0.1:0"]);
    eprintln!(
        "instructions per request through h2load: plain tonic on its own {on_its_own:.0}, in the \
         lab {in_lab:.0}, the layer alone {layer_alone:.0}, the README's server {readme:.0} \
         ({:.4} x plain tonic on its own; the guard {:+.0})",
        readme / on_its_own,
        readme - layer_alone
    );
    // Loaded from outside, how h2load's requests fall into reads and writes
    // moves each server's figure by a few hundred instructions from run to
    // run (the two runs go side by side): the guard measured +250 to
    // +1 160 here (one request at a time on one connection moves it as
    // much). The bench's own count, made in one process, holds the guard
    // to 1 % exactly; here, against a gross regression: within 2.5 %.
    assert!(
        readme - layer_alone <= 0.025 * on_its_own,
        "the README's server must cost the layer alone plus at most 2.5 % of plain tonic's \
         request: {readme:.0} against {layer_alone:.0}, plain tonic {on_its_own:.0}"
    );
    let ratio = in_lab / on_its_own;
    assert!(
        on_its_own > 10_000.0,
        "a request must cost thousands of instructions, got {on_its_own:.0}"
    );
    assert!(
        (0.95..=1.05).contains(&ratio),
        "plain tonic in the lab ({in_lab:.0} instructions per request) must cost within 5 % of \
         plain tonic in a binary of its own ({on_its_own:.0}): {ratio:.3}"
    );
}

/// Instructions per request of the server `exe ARGS` (which prints its
/// address first and exits at SIGINT), under callgrind, loaded by h2load.
///
/// The two runs go side by side, one a core: callgrind's counts do not
/// depend on what else runs.
fn per_request(exe: &Path, args: &[&str]) -> f64 {
    let (small, large) = std::thread::scope(|s| {
        let small = s.spawn(|| instructions(exe, args, BASELINE_REQUESTS));
        let large = instructions(exe, args, 5 * BASELINE_REQUESTS);
        (small.join().expect("the smaller run must not panic"), large)
    });
    (large - small) as f64 / (4 * BASELINE_REQUESTS) as f64
}

/// The total instructions of one run of the server serving `requests`.
fn instructions(exe: &Path, args: &[&str], requests: u64) -> u64 {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = dir.path().join("callgrind.out");
    let mut server = lowest_priority("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("valgrind must start");
    let mut first = String::new();
    BufReader::new(server.stdout.take().expect("piped stdout"))
        .read_line(&mut first)
        .expect("the server prints its address");
    let addr = first.trim();
    assert!(!addr.is_empty(), "{} must print its address", exe.display());
    let body = dir.path().join("empty-request");
    // One gRPC message frame: uncompressed, zero bytes long.
    std::fs::write(&body, [0u8; 5]).expect("the request body is written");
    let load = lowest_priority("h2load")
        .args(["-n", &requests.to_string(), "-c", "4", "-m", "16", "-d"])
        .arg(&body)
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .arg(format!("http://{addr}/grpc.health.v1.Health/Check"))
        .output()
        .expect("h2load must start");
    let report = String::from_utf8_lossy(&load.stdout);
    assert!(
        report.contains(&format!("{requests} succeeded, 0 failed")),
        "every request must succeed: {report}"
    );
    let pid = rustix::process::Pid::from_raw(i32::try_from(server.id()).expect("a pid fits"))
        .expect("a live pid");
    rustix::process::kill_process(pid, rustix::process::Signal::INT).expect("SIGINT is sent");
    let status = server.wait().expect("the server exits");
    assert!(
        status.success(),
        "the server must exit cleanly at SIGINT: {status}"
    );
    let text = std::fs::read_to_string(&out).expect("callgrind writes its counts at exit");
    text.lines()
        .find_map(|line| line.strip_prefix("summary: "))
        .and_then(|n| n.trim().parse().ok())
        .expect("callgrind's output has a summary line")
}
