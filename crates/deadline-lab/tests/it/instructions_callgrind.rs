//! The instruction ratios of `bench instructions` stay under their bounds.
//!
//! Instruction counts under callgrind are the same from run to run, so this
//! guard cannot flake on a busy machine. It measures the release build (the
//! figure the bench reports; a debug build's ratios mean nothing), building
//! it first.
//!
//! Needs valgrind and libfaketime, so it is only built with the
//! `callgrind-tests` feature (`scripts/test-all` installs both and enables
//! it through `--all-features`); there a missing one fails this test with
//! the command that installs it.

use std::process::Command;

use deadline_lab::bench::instructions::{Case, Instructions};

use crate::common::{alone, release_lab};

/// The bounds of one case: its instruction ratio ours / plain and its
/// allocations per request above plain tonic.
struct Bound {
    case: Case,
    ratio: f64,
    extra_allocs: f64,
}

// Today's figures (release build, N = 200, 4 connections x 16 streams) plus
// a margin of about 0.005: a change elsewhere in the binary moves plain
// tonic's count as well as ours (adding the metrics and tracing code left our
// counts within 0.2 % and cut plain tonic's chain by 0.5 %). The goals of SPEC K (server layer <= 1.02, one hop
// <= 1.03, allocations <= plain tonic + 2) are not reached: what is left is
// listed in docs/performance.md. A change that costs more on the
// request path fails here; one that cuts cost tightens the bound.
const BOUNDS: [Bound; 4] = [
    Bound {
        case: Case::Server,
        ratio: SERVER_RATIO,
        extra_allocs: SERVER_ALLOCS,
    },
    Bound {
        case: Case::ServerHeader,
        ratio: SERVER_HEADER_RATIO,
        extra_allocs: SERVER_HEADER_ALLOCS,
    },
    Bound {
        case: Case::OneHop,
        ratio: ONE_HOP_RATIO,
        extra_allocs: ONE_HOP_ALLOCS,
    },
    Bound {
        case: Case::Chain,
        ratio: CHAIN_RATIO,
        extra_allocs: CHAIN_ALLOCS,
    },
];
/// `server layer, no header`: today 1.0452; goal 1.02. Six builds whose
/// changes were on the client's path measured it at 1.0421 to 1.0447
/// (N = 1000): the layout of the binary moves it by ±0.002.
const SERVER_RATIO: f64 = 1.050;
/// `server layer, header`: today 1.0522; goal 1.02.
const SERVER_HEADER_RATIO: f64 = 1.057;
/// `one hop, both layers`: today 1.0611; goal 1.03.
const ONE_HOP_RATIO: f64 = 1.066;
/// `3-hop chain` (ours propagates the budget, plain tonic does not): today 1.0972.
const CHAIN_RATIO: f64 = 1.102;
/// Extra allocations per request, server layer without a header: today 2.0; goal 2.
const SERVER_ALLOCS: f64 = 2.5;
/// Extra allocations per request, server layer with a header: today 2.04; goal 2.
const SERVER_HEADER_ALLOCS: f64 = 2.5;
/// Extra allocations per request, one hop: today 5.0; goal 2.
const ONE_HOP_ALLOCS: f64 = 5.5;
/// Extra allocations per request, 3-hop chain: today 19.19.
const CHAIN_ALLOCS: f64 = 19.7;

#[test]
fn layer_instruction_ratios_stay_under_their_bounds() {
    let valgrind = Command::new("valgrind").arg("--version").output();
    assert!(
        valgrind.is_ok_and(|o| o.status.success()),
        "this test needs valgrind on PATH: install it with \
         `apt-get update && apt-get install -y valgrind faketime` (scripts/test-all does)"
    );
    let lab = release_lab();
    // The counts do not depend on the machine's load, but valgrind's
    // children are load for the runs that time things.
    let _alone = alone();
    let out = Command::new(lab)
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
            row.plain > 10_000.0 && row.ours > 10_000.0,
            "{}: a request must cost thousands of instructions, got {row:?}",
            row.case
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
}
