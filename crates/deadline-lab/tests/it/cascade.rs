//! `experiment amplification` and `experiment metastable`: the cascades
//! that outlive or outgrow what set them off — retries multiplied across
//! hops, and overload that stays after its trigger has gone — measured on
//! real loopback services and read back into the experiments' own types.

use deadline_lab::experiments::amplification::{self, Amplification};
use deadline_lab::experiments::metastable::{self, Metastable};

use crate::common::timed as lab;

#[test]
fn amplification_one_retry_budget_for_the_whole_chain() {
    // One run (about 10 s): the laws below are counts of attempts, the
    // same in every run, or ratios with wide margins.
    let result: Amplification = lab(&[
        "experiment",
        "amplification",
        "--fan-in-ms",
        "1000",
        "--runs=1",
        "--json",
    ]);
    let row = |case: &str, stack: &str| {
        result
            .row(case, stack)
            .unwrap_or_else(|| panic!("a row {case:?} / {stack:?}: {result:?}"))
    };
    let [
        outage,
        throttled,
        failures,
        fan_in,
        slow,
        replica_down,
        replica_slow,
        two_down,
        every_down,
    ] = amplification::CASES;

    // Down for good: every hop's policy allows 3 attempts. Per hop they
    // multiply (3 × 3 × 3); with the chain's one budget the failing leaf
    // sees the 3 of the hop in front of it, and nobody above retries.
    let (ours, per_hop) = (row(outage, "ours"), row(outage, "per-hop"));
    assert!(ours.root_calls > 0 && per_hop.root_calls > 0);
    assert_eq!(
        (ours.attempts_at_leaf_per_root, ours.first_attempts_at_leaf),
        (3.0, 3.0),
        "maxAttempts at the leaf per root call from the first on, not its power: {ours:?}"
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
        ours.attempts_at_leaf_per_root <= 1.2,
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

    // Retries at the edge alone: the root's 3 attempts, each down the
    // whole chain once.
    let edge = row(outage, "edge only");
    assert_eq!(
        (edge.attempts_at_a_per_root, edge.attempts_at_leaf_per_root),
        (3.0, 3.0),
        "the root retries, no hop below it does: {edge:?}"
    );

    // Attempts that run out of time: each hop caps an attempt at 100 ms,
    // so a retry below the root finds its caller's time spent. No stack
    // sends C more than the root's attempts.
    for stack in amplification::STACKS {
        let r = row(slow, stack);
        assert!(
            r.attempts_at_leaf_per_root <= 3.0 && r.root_ok_share == 0.0,
            "{stack}: slow failures are bounded by the time, not the policy: {r:?}"
        );
    }

    // Three replicas of B, one whose path to C is broken. B1 spends its
    // retries and marks the failure; A, told which replica failed, retries
    // it once on another: the chain's one budget costs no call.
    let (ours, per_hop) = (row(replica_down, "ours"), row(replica_down, "per-hop"));
    assert!(
        ours.root_ok_share >= 0.99,
        "a marked failure at one replica is retried on another: {ours:?}"
    );
    assert!(
        ours.attempts_at_leaf_per_root <= per_hop.attempts_at_leaf_per_root,
        "and costs C no more than per-hop retries: {ours:?} vs {per_hop:?}"
    );
    // B1's path hangs: every hop's attempt runs out of its 100 ms together;
    // the root's own timeout is retried whatever the mark, and A sends it
    // past the replica whose attempt ran out.
    let ours = row(replica_slow, "ours");
    assert!(
        ours.root_ok_runs.iter().all(|ok| *ok >= 0.98),
        "a hanging path costs no call, in every run: {ours:?}"
    );
    // Two of three paths broken: the retry goes to the one that answers.
    let (ours, per_hop) = (row(two_down, "ours"), row(two_down, "per-hop"));
    assert!(
        ours.root_ok_share >= per_hop.root_ok_share,
        "no worse than per-hop retries: {ours:?} vs {per_hop:?}"
    );
    assert!(
        ours.attempts_at_leaf_per_root < per_hop.attempts_at_leaf_per_root,
        "with fewer attempts at C: {ours:?} vs {per_hop:?}"
    );
    // Every replica's path broken: the whole service is down, and no hop
    // above B retries it once each replica has failed.
    let ours = row(every_down, "ours");
    assert!(
        ours.attempts_at_leaf_per_root <= 3.3 && ours.root_ok_share == 0.0,
        "a failure of every replica costs C maxAttempts per call: {ours:?}"
    );
}

/// The short timeline the suite runs: 1 s of load, a 2 s trigger, 2 s
/// after it; three runs, each of both triggers, plain tonic's stacks and
/// ours apart (12 timelines of about 6.5 s, some 80 s in all). Long
/// enough after the trigger for a stack that stays down to be seen
/// staying down, and for "back, and staying back" to fail.
const SHORT: [&str; 10] = [
    "experiment",
    "metastable",
    "--before-ms",
    "1000",
    "--trigger-ms",
    "2000",
    "--after-ms",
    "2000",
    "--json",
    "--runs=3",
];

#[test]
fn metastable_goodput_returns_on_ours_and_what_each_stack_does() {
    let result: Metastable = lab(&SHORT);
    assert_eq!(result.runs, 3, "each figure is the median of three runs");
    for trigger in metastable::TRIGGERS {
        let row = |stack: &str| {
            result
                .row(stack, trigger)
                .unwrap_or_else(|| panic!("a row {stack:?} / {trigger:?}: {result:?}"))
        };
        let [no_retries, careful, retry_loop, ours] = metastable::STACKS.map(row);
        assert_eq!(ours.goodput.len(), 5, "a figure a second: {ours:?}");
        assert_eq!(
            ours.recovery_s_runs.len(),
            3,
            "every run's recovery: {ours:?}"
        );

        // Ours: serves what the trigger leaves (a generous bound: a busy
        // machine costs every stack some), is back after it and stays
        // back, and starts no query for a caller gone.
        assert!(
            ours.during_share_of_remaining >= 0.7,
            "{trigger}: during the trigger ours serves what capacity is left: {ours:?}"
        );
        assert!(
            ours.recovery_s.is_some(),
            "{trigger}: ours is back after the trigger, to the end of the run: {ours:?}"
        );
        assert!(
            ours.expired_work_share <= 0.01,
            "{trigger}: no work for callers already gone: {ours:?}"
        );
        assert!(
            ours.attempts_per_call <= 1.05,
            "{trigger}: ours's refusals are DEADLINE_EXCEEDED, which its policy does not retry: {ours:?}"
        );

        // The hand-written retry loop multiplies the load and stays down
        // after the trigger: the collapse is the loop's.
        assert!(
            retry_loop.recovery_s.is_none(),
            "{trigger}: the hand-written loop does not come back: {retry_loop:?}"
        );
        assert!(
            retry_loop.attempts_per_call > 2.0 && retry_loop.expired_work_share >= 0.1,
            "{trigger}: the loop sends several attempts a call, and the pool works for callers gone: {retry_loop:?}"
        );

        // Plain tonic with the deadline sent and no retries: one attempt a
        // call, and FIFO queueing serves almost nothing in time while the
        // trigger lasts.
        assert!(
            no_retries.attempts_per_call <= 1.01,
            "{trigger}: one attempt a call: {no_retries:?}"
        );
        assert!(
            no_retries.during_share_of_remaining < 0.5 * ours.during_share_of_remaining,
            "{trigger}: a FIFO queue of callers that wait out their deadline: {no_retries:?} vs {ours:?}"
        );

        // Careful plain tonic: load shedding keeps it serving during the
        // trigger, and its budgeted retries do engage.
        assert!(
            careful.during_share_of_remaining > 2.0 * no_retries.during_share_of_remaining
                && careful.during_share_of_remaining >= 0.5,
            "{trigger}: shedding what the limit cannot take keeps goodput: {careful:?} vs {no_retries:?}"
        );
        assert!(
            careful.attempts_per_call > 1.0,
            "{trigger}: tower::retry retries what was shed: {careful:?}"
        );
        assert!(
            careful.attempts_per_call < retry_loop.attempts_per_call,
            "{trigger}: the budget bounds the retries the loop multiplies: {careful:?} vs {retry_loop:?}"
        );

        // A bounded queue refuses with RESOURCE_EXHAUSTED, which ours's
        // policy retries: the one stack of ours whose retries engage.
        let bounded = row("ours, bounded queue");
        assert!(
            bounded.attempts_per_s_during > ours.attempts_per_s_during,
            "{trigger}: the bounded queue's refusals are retried: {bounded:?} vs {ours:?}"
        );
    }
    // Without newest-first, a standing queue under twice the load hands
    // the connections to the callers who waited longest. The gap is 0.14
    // on an idle machine (0.77 against 0.91); beside a busy core, where
    // every stack serves fewer calls from the queue, 0.04 (0.875 against
    // 0.915): the law is the order, with a margin the noise of one median
    // of three does not reach.
    let spike = |stack: &str| {
        result
            .row(stack, "spike")
            .map_or(0.0, |r| r.during_share_of_remaining)
    };
    assert!(
        spike("ours, FIFO queue") < spike("ours") - 0.02,
        "newest-first does the work under the spike: {result:?}"
    );
}
