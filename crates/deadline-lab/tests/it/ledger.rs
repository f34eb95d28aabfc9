//! `experiment ledger`: the ledger of a `DEADLINE_EXCEEDED` as the root
//! caller receives it, for the lab's stall cases on real loopback services
//! (the IM chain with route stalled, the shop with pricing late, a retried
//! call), read back into the experiment's own type.

use deadline_lab::experiments::ledger::{FOUR_PROCESSES, LedgerResult};
use tonic_deadline::ledger::MAX_ENTRY_BYTES;

use crate::common::timed as lab;

#[test]
fn the_root_receives_the_ledger_and_it_names_the_stalled_hop() {
    let result: LedgerResult = lab(&[
        "experiment",
        "ledger",
        "--runs",
        "60",
        "--at-once",
        "5",
        "--json",
    ]);
    assert_eq!(result.rows.len(), 7, "{result:?}");
    // With the defaults (no reserve set anywhere) the server layer's own
    // reserve brings the ledger back, also across four processes.
    for row in &result.rows[3..] {
        assert!(row.case.ends_with(", defaults"), "{row:?}");
        assert_eq!(row.runs, 60, "{row:?}");
        assert_eq!(row.reserve_ms, None, "{row:?}");
        assert!(row.traced.is_none(), "{row:?}");
        assert!(row.arrived_share >= floor(row), "{}: {row:?}", row.case);
        assert!(row.named_right_share >= floor(row), "{}: {row:?}", row.case);
    }
    let four = &result.rows[6];
    assert_eq!(four.case, FOUR_PROCESSES, "{four:?}");
    assert!(
        four.example_lines.len() == 4 && four.example.contains("(stalled here)"),
        "A, B, C and D each wrote a line, D's the stalled one: {four:?}"
    );
    for row in &result.rows[..3] {
        assert_eq!(row.runs, 60, "{row:?}");
        // The answers race their callers' timers; each hop's reserve wins
        // the race for nearly all (the suite runs a debug build beside
        // other tests; with no reserve 4-29 % arrive).
        assert!(row.arrived_share >= floor(row), "{}: {row:?}", row.case);
        assert!(row.named_right_share >= floor(row), "{}: {row:?}", row.case);
        assert!(row.sum_error_share < 0.05, "{}: {row:?}", row.case);
        assert!(row.max_bytes_per_hop <= MAX_ENTRY_BYTES, "{row:?}");
        assert!(
            row.example.contains(" [ledger] ") && row.example.contains("(stalled here)"),
            "{row:?}"
        );
        assert!(row.example_lines.len() >= 2, "{row:?}");
        // One more call, traced: its waterfall beside its own ledger.
        let traced = row.traced.as_ref().expect("a traced call");
        assert_eq!(traced.status, "DEADLINE_EXCEEDED", "{traced:?}");
        assert!(traced.ledger.len() >= 2, "{traced:?}");
        let (_, method) = row.stalled.rsplit_once('.').expect("a path");
        let service = method.split('/').next().expect("a service");
        assert!(
            traced
                .spans
                .iter()
                .any(|h| h.kind == "server" && h.name.contains(service)),
            "the stalled hop's span: {traced:?}"
        );
    }
    // The retried call's trace shows both attempts, as its ledger does.
    let retried = result.rows[2].traced.as_ref().expect("a traced call");
    let attempts = retried
        .spans
        .iter()
        .filter(|h| h.kind == "client" && h.depth > 1)
        .count();
    assert_eq!(attempts, 2, "{retried:?}");
    assert_eq!(
        retried.ledger[0].matches(" call=").count(),
        2,
        "{retried:?}"
    );
}

/// The share of runs whose ledger must arrive. The test sends 5 calls at
/// once, not the experiment's 25: a wave reaches the stalled hop's
/// deadline in the same millisecond, and the reserve (10 ms) races the
/// answers of the whole wave, so one late wakeup on a busy machine loses a
/// wave together. With 25 at once (three waves in 60 runs), beside the
/// suite's other tests, the IM chain's explicit-reserve row once arrived in
/// 40 of 60 and an earlier build saw 43 % of the shop's; alone, on an idle
/// 2-core host or beside one CPU-bound process, every row arrives whole in
/// every run (docs/ledger.md). The shop's calls reach the pricing hop's
/// deadline together whatever the wave: 0.3; the others: 0.8.
fn floor(row: &deadline_lab::experiments::ledger::Row) -> f64 {
    if row.case.starts_with("shop") {
        0.3
    } else {
        0.8
    }
}
