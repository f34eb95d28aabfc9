//! HTTP/2 Rapid Reset floods (`experiment rapid-reset`, release build):
//! whatever the flood's shape — faster or slower than the accept loop, on
//! one connection or four, each reconnecting as soon as it is cut off, in
//! the clear or over TLS — ours cuts every flooding connection off within
//! 1 000 streams and no honest call fails; the layer alone is no weaker
//! than plain tonic.

use deadline_lab::experiments::rapid_reset::{
    CUT_WITHIN, HONEST_P50_VS_BEFORE, HONEST_P50_VS_PLAIN, RapidReset, Row, SERVERS, SHAPES,
};

use crate::common::timed;

/// How many times the flood runs at most before the honest client's
/// latency is judged: other test binaries share the machine's two cores,
/// and a burst of theirs can double a median by itself.
const TRIALS: usize = 3;

/// Each row floods for a second: long enough for a reconnecting flood to
/// meet its probation, short enough for twenty rows.
fn run() -> RapidReset {
    timed(&["experiment", "rapid-reset", "--json", "--flood-ms", "1000"])
}

/// Ours, and the plain tonic it is held to: in the clear and over TLS.
const OURS_BESIDE_PLAIN: [(&str, &str); 2] =
    [("ours", "plain tonic"), ("ours, TLS", "plain tonic, TLS")];

fn row<'a>(floods: &'a RapidReset, shape: &str, server: &str) -> &'a Row {
    floods
        .row(shape, server)
        .unwrap_or_else(|| panic!("{shape}, {server}: a row must be measured"))
}

/// The laws every run must hold, whatever shares the machine.
fn every_flood_is_cut_off_without_an_honest_failure(floods: &RapidReset) {
    let measured: Vec<(&str, &str)> = floods
        .rows
        .iter()
        .map(|r| (r.shape.as_str(), r.server.as_str()))
        .collect();
    let expected: Vec<(&str, &str)> = SHAPES
        .iter()
        .flat_map(|(shape, ..)| SERVERS.iter().map(move |server| (*shape, *server)))
        .collect();
    assert_eq!(measured, expected, "every shape against every server");
    for (shape, connections, _) in SHAPES {
        for (server, _) in OURS_BESIDE_PLAIN {
            ours_cuts_every_flooding_connection(floods, shape, server, connections);
        }
        layer_alone_is_no_weaker_than_plain_tonic(floods, shape);
    }
}

fn ours_cuts_every_flooding_connection(
    floods: &RapidReset,
    shape: &str,
    server: &str,
    connections: usize,
) {
    let ours = row(floods, shape, server);
    assert!(
        ours.connections_cut >= connections as u64,
        "{shape}, {server}: every flooding connection must be cut off: {ours:?}"
    );
    let most = ours
        .streams_before_cut_max
        .expect("ours cuts connections off");
    assert!(
        most <= CUT_WITHIN,
        "{shape}, {server}: ours must cut a flooding connection off within {CUT_WITHIN} streams: {ours:?}"
    );
    assert!(
        ours.streams_uncut_max.unwrap_or(0) <= CUT_WITHIN,
        "{shape}, {server}: no connection may flood past {CUT_WITHIN} streams uncut: {ours:?}"
    );
    assert!(
        ours.cut_by
            .keys()
            .all(|how| how == "GOAWAY ENHANCE_YOUR_CALM" || how == "closed"),
        "{shape}, {server}: a GOAWAY must say why: {ours:?}"
    );
    assert!(
        ours.guard_counted
            .is_some_and(|n| n >= ours.connections_cut),
        "{shape}, {server}: every connection cut off is counted by the guard: {ours:?}"
    );
    assert_eq!(
        ours.honest_failures, 0,
        "{shape}, {server}: no honest call may fail beside a flood: {ours:?}"
    );
    assert!(
        ours.honest_calls > 100,
        "{shape}, {server}: the honest client kept calling: {ours:?}"
    );
}

/// The most streams one connection carried, cut off or not.
fn most_per_connection(row: &Row) -> u32 {
    row.streams_before_cut_max
        .max(row.streams_uncut_max)
        .unwrap_or(0)
}

fn layer_alone_is_no_weaker_than_plain_tonic(floods: &RapidReset, shape: &str) {
    let plain = row(floods, shape, "plain tonic");
    let layer = row(floods, shape, "layer alone");
    // A flood faster than the accept loop trips hyper's guard at once, on
    // every connection; one slower than it, only when the server falls
    // behind for a moment, on either server: there the order of magnitude
    // of what a connection carried is compared.
    if plain.rate.is_none() {
        assert!(
            layer.connections_cut >= layer.connections as u64
                && plain.connections_cut >= plain.connections as u64,
            "{shape}: hyper's guard cuts a fast flood off, with the layer as without: {plain:?} {layer:?}"
        );
    }
    assert!(
        most_per_connection(layer) <= 10 * most_per_connection(plain).max(1),
        "{shape}: the layer alone lets a connection carry no more than plain tonic's order of magnitude: {plain:?} {layer:?}"
    );
    assert_eq!(
        (plain.honest_failures, layer.honest_failures),
        (0, 0),
        "{shape}: {plain:?} {layer:?}"
    );
}

/// The shapes (and whether over TLS) under which ours kept the honest
/// client's median within [`HONEST_P50_VS_PLAIN`] × plain tonic's,
/// measured beside it, and within [`HONEST_P50_VS_BEFORE`] × its own before
/// the flood.
fn honest_latency_kept(floods: &RapidReset) -> Vec<(&'static str, &'static str)> {
    SHAPES
        .iter()
        .flat_map(|(shape, ..)| OURS_BESIDE_PLAIN.iter().map(move |pair| (*shape, *pair)))
        .filter(|(shape, (ours, plain))| {
            let ours = row(floods, shape, ours);
            let plain = row(floods, shape, plain).honest_p50_during_ms;
            ours.honest_p50_during_ms <= plain * HONEST_P50_VS_PLAIN
                && ours.honest_p50_during_ms <= ours.honest_p50_before_ms * HONEST_P50_VS_BEFORE
        })
        .map(|(shape, (ours, _))| (shape, ours))
        .collect()
}

#[test]
fn rapid_reset_floods_are_cut_off_within_1000_streams_and_honest_calls_go_on() {
    let mut kept = std::collections::BTreeSet::new();
    let mut trials = Vec::new();
    for _ in 0..TRIALS {
        let floods = run();
        every_flood_is_cut_off_without_an_honest_failure(&floods);
        kept.extend(honest_latency_kept(&floods));
        let medians: Vec<String> = floods
            .rows
            .iter()
            .map(|r| {
                format!(
                    "{}, {}: {:.3} ms before, {:.3} ms during",
                    r.shape, r.server, r.honest_p50_before_ms, r.honest_p50_during_ms
                )
            })
            .collect();
        trials.push(medians.join("; "));
        if kept.len() == SHAPES.len() * OURS_BESIDE_PLAIN.len() {
            return;
        }
    }
    panic!(
        "under every flood, ours must keep the honest client's median within {HONEST_P50_VS_PLAIN} × plain tonic's beside the same flood and within {HONEST_P50_VS_BEFORE} × its own before, in one trial of {TRIALS} at least: {}",
        trials.join(" | ")
    );
}

/// Honest clients that end streams early (`experiment honest-resets`,
/// release build): against ours, no pattern fails more calls than against
/// plain tonic, or sees a status plain tonic's calls did not; each pattern
/// did what it is named for.
#[test]
fn honest_clients_that_end_streams_early_fare_no_worse_against_ours_than_plain_tonic() {
    use deadline_lab::experiments::honest_resets::{HonestResets, PATTERNS, SERVERS};
    let run: HonestResets = timed(&[
        "experiment",
        "honest-resets",
        "--json",
        "--window-ms",
        "500",
    ]);
    for pattern in PATTERNS {
        for server in SERVERS {
            let row = run
                .row(pattern, server)
                .unwrap_or_else(|| panic!("{pattern}, {server}: a row must be measured"));
            assert!(
                row.calls > 20,
                "{pattern}, {server}: calls were made: {row:?}"
            );
        }
        let ours = run.row(pattern, "ours").expect("measured");
        let plain = run.row(pattern, "plain tonic").expect("measured");
        assert!(
            ours.failures <= plain.failures
                && ours
                    .failure_statuses
                    .iter()
                    .all(|s| plain.failure_statuses.contains(s)),
            "{pattern}: ours may fail no more calls than plain tonic, with no other status: ours {ours:?}, plain tonic {plain:?}"
        );
    }
    assert!(run.ours_never_harsher, "the run's own verdict agrees");
    // The patterns did what they are named for.
    let count = |pattern: &str, outcome: &str| {
        run.row(pattern, "ours")
            .and_then(|r| r.outcomes.get(outcome).copied())
            .unwrap_or(0)
    };
    assert!(count("deadline storm", "DEADLINE_EXCEEDED") > 20, "{run:?}");
    assert!(
        count("client timeout 1 ms", "client timeout") > 100,
        "{run:?}"
    );
    assert!(
        count("client timeout 8 ms", "client timeout") > 100,
        "{run:?}"
    );
    assert!(
        count("cancel most", "cancelled by the client") > 20,
        "{run:?}"
    );
    let nat = run
        .row("NAT neighbours of a flood", "ours")
        .expect("measured");
    assert!(
        nat.cut_by_guard.is_some_and(|n| n >= 1),
        "the flood beside the neighbours was cut off: {nat:?}"
    );
}
