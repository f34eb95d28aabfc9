//! Faults below a hop: a downstream process killed, the
//! connection cut in the middle of a reply message, a downstream process
//! stopped. The upstream answers with the right status, in time, and
//! releases everything it held.

use std::sync::OnceLock;

use deadline_lab::experiments::faults::{Case, Faults, KILL_DETECTED_WITHIN_MS};

use crate::common::timed;

/// One run of `experiment faults --json`, shared by the tests below.
fn faults() -> &'static Faults {
    static RUN: OnceLock<Faults> = OnceLock::new();
    RUN.get_or_init(|| timed(&["experiment", "faults", "--json"]))
}

fn case(name: &str) -> &'static Case {
    faults()
        .cases
        .iter()
        .find(|c| c.case == name)
        .unwrap_or_else(|| panic!("the case {name:?} must be measured"))
}

fn released_everything(case: &Case) {
    assert!(
        case.upstream_scope_ended,
        "the upstream's request scope must end: {case:?}"
    );
    assert_eq!(
        (case.leaked, case.permits_held, case.tasks_running),
        (0, 0, 0),
        "the upstream must release its permit and its task: {case:?}"
    );
}

#[test]
fn killed_downstream_is_unavailable_upstream_within_50_ms() {
    let killed = case("downstream killed");
    assert_eq!(killed.status, "UNAVAILABLE", "{killed:?}");
    assert!(
        killed.detected_ms <= KILL_DETECTED_WITHIN_MS,
        "a dead process closes its sockets: the upstream must answer within {KILL_DETECTED_WITHIN_MS} ms, not at the deadline: {killed:?}"
    );
    released_everything(killed);
}

#[test]
fn connection_cut_in_the_middle_of_a_reply_message_is_internal() {
    let cut = case("connection cut mid-message");
    assert_eq!(cut.status, "INTERNAL", "{cut:?}");
    assert!(
        cut.detected_ms.is_finite() && cut.answered_ms < cut.deadline_ms / 2.0,
        "a cut connection must fail at once, not at the deadline: {cut:?}"
    );
    released_everything(cut);
}

#[test]
fn hung_downstream_is_deadline_exceeded_at_the_deadline_and_nothing_leaks() {
    let hung = case("downstream hung");
    assert_eq!(hung.status, "DEADLINE_EXCEEDED", "{hung:?}");
    // The hop above it answers, what its layer keeps for the answer
    // before the deadline (with the ledger).
    assert!(
        hung.answered_ms >= hung.deadline_ms - 1.0 - crate::common::reserve_ms(hung.deadline_ms),
        "a stopped process answers nothing: the call ends at its deadline, not before: {hung:?}"
    );
    assert!(
        hung.answered_ms <= hung.deadline_ms + 250.0,
        "and at the deadline, not long after: {hung:?}"
    );
    released_everything(hung);
}
