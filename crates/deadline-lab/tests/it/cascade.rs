//! `experiment amplification` and `experiment metastable`: the cascades
//! that outlive or outgrow what set them off — retries multiplied across
//! hops, and overload that stays after its trigger has gone — measured on
//! real loopback services and read back into the experiments' own types.

use deadline_lab::experiments::amplification::{self, Amplification};
use deadline_lab::experiments::metastable::{self, Metastable};

use crate::common::timed as lab;

#[test]
fn amplification_one_retry_budget_for_the_whole_chain() {
    let result: Amplification = lab(&[
        "experiment",
        "amplification",
        "--fan-in-ms",
        "1000",
        "--json",
    ]);
    let row = |case: &str, stack: &str| {
        result
            .row(case, stack)
            .unwrap_or_else(|| panic!("a row {case:?} / {stack:?}: {result:?}"))
    };
    let [outage, throttled, failures, fan_in] = amplification::CASES;

    // Down for good: every hop's policy allows 3 attempts. Per hop they
    // multiply (3 × 3 × 3); with the chain's one budget the failing leaf
    // sees the 3 of the hop in front of it, and nobody above retries.
    let (ours, per_hop) = (row(outage, "ours"), row(outage, "per-hop"));
    assert!(ours.root_calls > 0 && per_hop.root_calls > 0);
    assert_eq!(
        ours.attempts_at_leaf_per_root, 3.0,
        "maxAttempts at the leaf per root call, not its power: {ours:?}"
    );
    assert_eq!(
        (ours.attempts_at_a_per_root, ours.attempts_at_b_per_root),
        (1.0, 1.0),
        "the hops above the failure send their call once: {ours:?}"
    );
    assert_eq!(
        per_hop.attempts_at_leaf_per_root, 27.0,
        "retrying at every hop multiplies: {per_hop:?}"
    );

    // With retryThrottling, the first call (before any throttle has seen a
    // failure) is where per-hop retries burst: ours stays at maxAttempts.
    let (ours, per_hop) = (row(throttled, "ours"), row(throttled, "per-hop"));
    assert!(
        ours.first_attempts_at_leaf <= 3.0,
        "the first call, throttle still full: {ours:?}"
    );
    assert!(
        per_hop.first_attempts_at_leaf > ours.first_attempts_at_leaf,
        "per hop the full throttles burst: {per_hop:?} vs {ours:?}"
    );
    assert!(
        ours.attempts_at_leaf_per_root <= per_hop.attempts_at_leaf_per_root,
        "{ours:?} vs {per_hop:?}"
    );
    assert!(
        ours.attempts_at_leaf_per_root <= 1.5,
        "throttled, the outage costs the leaf little more than one attempt a call: {ours:?}"
    );

    // Honest transient failures are still retried where they happen: the
    // budget costs the caller nothing.
    let ours = row(failures, "ours");
    assert!(ours.root_calls >= 100, "{ours:?}");
    assert!(
        ours.root_ok_share >= 0.995,
        "5 % failures, retried at the leaf's hop, leave the root OK: {ours:?}"
    );

    // Many callers, one failing leaf, throttled: one attempt a call.
    let (ours, per_hop) = (row(fan_in, "ours"), row(fan_in, "per-hop"));
    assert!(
        ours.attempts_at_leaf_per_root <= 1.1,
        "fan-in, throttled: at most 10 % retries in the whole chain: {ours:?}"
    );
    assert!(
        ours.attempts_at_leaf_per_root < per_hop.attempts_at_leaf_per_root,
        "{ours:?} vs {per_hop:?}"
    );
}

#[test]
fn metastable_goodput_returns_when_the_trigger_ends() {
    let result: Metastable = lab(&[
        "experiment",
        "metastable",
        "--before-ms",
        "1000",
        "--trigger-ms",
        "2000",
        "--after-ms",
        "2000",
        "--json",
    ]);
    for trigger in metastable::TRIGGERS {
        let row = |stack: &str| {
            result
                .row(stack, trigger)
                .unwrap_or_else(|| panic!("a row {stack:?} / {trigger:?}: {result:?}"))
        };
        let (ours, plain) = (row("ours"), row("plain"));
        assert_eq!(ours.goodput.len(), 5, "a figure a second: {ours:?}");
        assert!(
            ours.during_share_of_remaining >= 0.9,
            "{trigger}: during the trigger ours serves what capacity is left: {ours:?}"
        );
        assert!(
            ours.recovery_s.is_some_and(|s| s <= 1.0),
            "{trigger}: ours is back within a second of the trigger's end: {ours:?}"
        );
        assert!(
            ours.expired_work_share <= 0.01,
            "{trigger}: no work for callers already gone: {ours:?}"
        );
        // The same trigger on plain tonic is the experiment's reason to
        // exist: it must hurt, and outlast itself.
        assert!(
            plain.expired_work_share >= 0.1,
            "{trigger}: plain tonic queues work for callers gone: {plain:?}"
        );
        let last = |r: &metastable::Row| r.goodput.last().copied().unwrap_or(0.0);
        assert!(
            last(plain) < 0.5 * last(ours),
            "{trigger}: plain tonic is still down after the trigger: {plain:?} vs {ours:?}"
        );
    }
}
