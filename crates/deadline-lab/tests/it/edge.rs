//! `experiment edge`: one budget crosses HTTP → gRPC → SQL (and → reqwest →
//! REST) and the work stops where it runs — the query on the database
//! server — with the pool whole afterwards.
//!
//! Needs PostgreSQL (`TONIC_DEADLINE_PG_URL`, or Debian's server binaries):
//! built by the `postgres-tests` feature, which `scripts/test-all` turns on.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use deadline_lab::experiments::edge::{EDGE_BUDGET, Edge, LAYERS};

use crate::common::timed;

fn edge() -> Edge {
    timed(&["experiment", "edge", "--json"])
}

#[test]
fn edge_experiment_one_budget_crosses_http_grpc_and_sql_and_stops_on_the_database() {
    let edge = edge();
    let budget = EDGE_BUDGET.as_secs_f64() * 1000.0;
    let mut last_entry = f64::MAX;
    for layer in LAYERS {
        let row = edge
            .row(layer)
            .unwrap_or_else(|| panic!("a row for {layer}: {edge:?}"));
        let entry = row
            .remaining_on_entry_ms
            .unwrap_or_else(|| panic!("{layer} must see a deadline: {row:?}"));
        assert!(
            entry <= budget && entry > budget - 100.0,
            "{layer} must see what is left of the edge's 900 ms: {row:?}"
        );
        if layer != "reqwest call" {
            assert!(
                entry <= last_entry,
                "down the chain the budget only shrinks: {layer} {entry} after {last_entry}"
            );
            last_entry = entry;
        }
        assert!(
            row.stopped_on_server,
            "{layer} must stop where it runs, not run on: {row:?}"
        );
        let stopped = row.stopped_ms.expect("stopped");
        assert!(
            stopped >= edge.client_gave_up_ms - 5.0 && stopped < edge.client_gave_up_ms + 1000.0,
            "{layer} must stop when the client gives up ({} ms), not at its own end: {row:?}",
            edge.client_gave_up_ms
        );
    }
    assert!(
        (250.0..1000.0).contains(&edge.client_gave_up_ms),
        "the client gives up at 300 ms: {}",
        edge.client_gave_up_ms
    );
    assert!(
        edge.pool.whole,
        "the pool must be whole after the run: {:?}",
        edge.pool
    );
    assert_eq!(edge.pool.queries_still_active, 0, "{:?}", edge.pool);
    assert!(edge.pool.cancels_sent >= 1, "stopped by a cancel request");
    assert!(
        edge.plain_sqlx.still_active_after_drop && edge.plain_sqlx.next_query_waited_ms > 1000.0,
        "the contrast: plain sqlx leaves the dropped query running and the next one waits: {:?}",
        edge.plain_sqlx
    );
    let costs = &edge.sqlx_costs;
    assert!(
        costs.plain_statement_us.is_finite()
            && costs.plain_statement_us > 0.0
            && costs.scoped_statement_us.is_finite()
            && costs.scoped_statement_us > 0.0,
        "both statement costs must be measured: {costs:?}"
    );
    assert!(
        costs.plain_call_us.is_finite()
            && costs.plain_call_us > 0.0
            && costs.scoped_call_us.is_finite()
            && costs.scoped_call_us > 0.0,
        "both call costs must be measured: {costs:?}"
    );
}
