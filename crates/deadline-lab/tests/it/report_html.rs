//! The report's HTML, drawn by each experiment from its typed result and
//! its own table: every chart and table it promises, and nothing fetched
//! from the network.

use deadline_lab::bench::overload::Overload;
use deadline_lab::bench::retry_storm::{self, Storm};
use deadline_lab::experiments::amplification::{self, Amplification};
use deadline_lab::experiments::hedge::{self, HedgeRows};
use deadline_lab::experiments::metastable::{self, Metastable};
use deadline_lab::experiments::retry::{self, RetryCases};
use deadline_lab::experiments::waterfall::Waterfall;
use deadline_lab::html::chart::{Bar, escape, hbars};
use deadline_lab::kit::traced::{Case, Hop};
use deadline_lab::page::{Skipped, Step, render, render_with_skipped};
use deadline_lab::registry::Experiment;

/// A finished step of the demo with the table `result` prints, as the demo
/// makes it.
fn step(name: &str, result: &impl Experiment) -> Step {
    Step {
        name: name.into(),
        outcome: Ok(result.outcome()),
        seconds: 0.0,
    }
}

/// The section of `page` under the heading `heading`, up to the next one.
fn section<'a>(page: &'a str, heading: &str) -> &'a str {
    page.split("<h2>")
        .find(|s| s.starts_with(&format!("{heading}</h2>")))
        .unwrap_or_else(|| panic!("the report must have the section {heading:?}"))
}

#[test]
fn charts_are_inline_svg_with_bars_and_seed_ticks() {
    let svg = hbars(
        "t",
        "A <title>",
        "ms",
        &[Bar::new("A", 999.9, Some(999.0)), Bar::new("B", 0.0, None)],
    );
    assert!(svg.starts_with("<svg class=\"chart\""));
    assert_eq!(svg.matches("class=\"bar\"").count(), 2, "one bar per row");
    assert_eq!(svg.matches("class=\"seed\"").count(), 1, "a tick per seed");
    assert!(svg.contains("A &lt;title&gt;"), "text must be escaped");
}

#[test]
fn edge_charts_draw_every_layer_from_the_typed_result() {
    use deadline_lab::experiments::edge::{
        Edge, LAYERS, LayerRow, PlainSqlx, PoolAfter, SqlxCosts,
    };
    let edge = Edge {
        rows: LAYERS
            .iter()
            .map(|l| LayerRow {
                layer: (*l).to_owned(),
                remaining_on_entry_ms: Some(899.0),
                stopped_ms: Some(301.0),
                stopped_on_server: true,
                cause: None,
            })
            .collect(),
        edge_budget_ms: 900.0,
        client_gave_up_ms: 300.0,
        pool: PoolAfter {
            size: 1,
            idle: 1,
            max_size: 2,
            cancels_sent: 1,
            discarded: 0,
            whole: true,
            queries_still_active: 0,
        },
        plain_sqlx: PlainSqlx {
            query_ms: 2000.0,
            dropped_at_ms: 300.0,
            still_active_after_drop: true,
            next_query_waited_ms: 1700.0,
        },
        sqlx_costs: SqlxCosts {
            plain_statement_us: 50.0,
            scoped_statement_us: 51.0,
            extra_us: 1.0,
            plain_call_us: 60.0,
            scoped_call_us: 120.0,
            call_extra_us: 60.0,
        },
    };
    let html = render(&[step("edge", &edge)], 1.0);
    assert_eq!(
        html.matches("class=\"bar\"").count(),
        8,
        "two charts, one bar per layer"
    );
    assert!(html.contains("sqlx query") && html.contains("still ran on the server"));
}

#[test]
fn a_skipped_step_is_shown_as_skipped_not_failed() {
    let ran = Step {
        name: "faults".into(),
        outcome: Err("the downstream did not start".into()),
        seconds: 1.0,
    };
    let skipped = Skipped {
        name: "proxy".into(),
        needs: "needs nginx: apt-get install nginx".into(),
    };
    let html = render_with_skipped(&[ran], &[skipped], 1.0);
    assert!(
        html.contains(r#"data-step="proxy" data-status="skipped""#),
        "the skipped step must be listed as skipped"
    );
    assert!(
        html.contains("proxy: skipped (needs nginx: apt-get install nginx)"),
        "its section must say what it needs"
    );
    assert!(
        !html.contains("failed: needs nginx"),
        "a missing tool must not read as a failure"
    );
    assert!(html.contains(r#"data-step="faults" data-status="failed""#));
    let faults = html.find(r#"data-step="faults""#).expect("faults listed");
    let proxy = html.find(r#"data-step="proxy""#).expect("proxy listed");
    assert!(proxy < faults, "steps are listed in the demo's order");
}

#[test]
fn hosts_and_faults_get_their_own_tables() {
    use deadline_lab::experiments::hosts;
    let hosts = hosts::Hosts {
        delay_by: "netem".into(),
        netem_error: String::new(),
        rows: [false, true]
            .map(|compensation| hosts::Row {
                system: "chain".into(),
                hop: "A".into(),
                parent: "client".into(),
                namespace: "dlab-1-0-A".into(),
                one_way_ms: 20,
                compensation,
                deadline_excess_ms: if compensation { 0.7 } else { 20.9 },
                deadline_excess_min_ms: 0.5,
                deadline_excess_max_ms: 21.0,
                remaining_ms: 999.0,
                header: "999000u".into(),
            })
            .into(),
    };
    let html = render(&[step("hosts", &hosts), step("faults", &faults())], 1.0);
    assert!(html.contains("Across hosts, proxies and faults"));
    assert!(
        html.contains("dlab-1-0-A"),
        "the hosts table must list the namespaces"
    );
    assert!(
        html.contains("data-chart=\"hosts\""),
        "and chart the excess"
    );
    assert!(
        html.contains("<td>downstream killed</td><td>UNAVAILABLE</td>"),
        "the faults table must list each case and its status"
    );
}

fn faults() -> deadline_lab::experiments::faults::Faults {
    use deadline_lab::experiments::faults::{Case, Faults};
    Faults {
        cases: vec![Case {
            case: "downstream killed".into(),
            status: "UNAVAILABLE".into(),
            message: String::new(),
            detected_ms: 2.0,
            deadline_ms: 2000.0,
            answered_ms: 102.0,
            upstream_scope_ended: true,
            leaked: 0,
            permits_held: 0,
            tasks_running: 0,
        }],
    }
}

#[test]
fn a_section_draws_the_rows_its_experiment_printed_not_a_copy_made_again() {
    let mut printed = faults().outcome();
    printed.rows[0][1] = "UNAVAILABLE, as printed".into();
    let step = Step {
        name: "faults".into(),
        outcome: Ok(printed),
        seconds: 0.0,
    };
    let html = render(&[step], 1.0);
    let across = section(&html, "Across hosts, proxies and faults");
    assert!(
        across.contains("<td>downstream killed</td><td>UNAVAILABLE, as printed</td>"),
        "the section must show the row as the experiment printed it"
    );
}

#[test]
fn a_failed_step_is_named_in_its_section() {
    let failed = Step {
        name: "edge".into(),
        outcome: Err("needs PostgreSQL".into()),
        seconds: 1.0,
    };
    let html = render(&[failed], 1.0);
    let edge = section(&html, "Beyond tonic: HTTP edge → gRPC → SQL, and → reqwest");
    assert!(edge.contains("edge: failed (needs PostgreSQL)"));
}

#[test]
fn every_section_of_the_report_is_the_home_of_a_step_of_the_demo() {
    use deadline_lab::catalog::demo_steps;
    use deadline_lab::html::Section;
    for section in Section::ALL {
        assert!(
            demo_steps().any(|e| e.section == Some(section)),
            "a demo that runs every step must show the section {:?}",
            section.heading()
        );
    }
}

#[test]
fn overload_plot_draws_one_line_per_variant_over_every_offered_load() {
    use deadline_lab::bench::overload::{Calls, Level};
    let calls = Calls {
        sent: 100,
        good: 90,
        late: 0,
        failed: 10,
    };
    let level = |x: u32, plain: f64| Level {
        offered_x: x,
        offered_rps: 400.0 * f64::from(x),
        plain_goodput: plain,
        plain_calls: calls,
        ours_goodput: 0.95,
        ours_calls: calls,
        ours_fifo_goodput: 0.5,
        ours_fifo_calls: calls,
        ours_lifo_goodput: 0.9,
        ours_lifo_calls: calls,
    };
    let overload = Overload {
        capacity_rps: 400.0,
        capacity_plain_rps: 390.0,
        capacity_ours_rps: 400.0,
        connections: 4,
        query_ms: 10,
        deadline_ms: 100,
        window_s: 3.0,
        rows: vec![level(1, 0.99), level(2, 0.05), level(4, 0.01)],
    };
    let html = render(&[step("bench overload", &overload)], 1.0);
    assert!(
        html.contains("data-chart=\"overload\""),
        "the report must plot bench overload"
    );
    assert_eq!(
        html.matches("<polyline class=\"line").count(),
        4,
        "one line per variant"
    );
    assert_eq!(
        html.matches("<circle class=\"point").count(),
        4 * 3,
        "a point per variant and offered load"
    );
    for label in [
        "plain tonic",
        "ours FIFO",
        "ours LIFO",
        "ours (adaptive LIFO)",
        "1× (400 req/s)",
        "4× (1600 req/s)",
    ] {
        assert!(html.contains(&escape(label)), "the plot must name {label}");
    }
    assert_eq!(
        html.matches("<title>goal at").count(),
        2,
        "the goals at 2× and 4× are drawn"
    );
}

#[test]
fn the_report_plots_goodput_through_a_trigger_and_attempts_across_hops() {
    let row = |stack: &str, trigger: &str, goodput: Vec<f64>| metastable::Row {
        stack: stack.into(),
        trigger: trigger.into(),
        recovery_s: None,
        during_share_of_remaining: 0.5,
        expired_work_share: 0.1,
        offered: vec![180.0; goodput.len()],
        attempts: vec![180.0; goodput.len()],
        expired_share: vec![0.0; goodput.len()],
        goodput,
        ..metastable::Row::default()
    };
    let m = Metastable {
        rows: metastable::TRIGGERS
            .iter()
            .flat_map(|trigger| {
                metastable::STACKS.map(|stack| row(stack, trigger, vec![0.9, 0.2, 0.9, 0.9]))
            })
            .collect(),
        capacity_rps: 200.0,
        offered_rps: 180.0,
        timeline_s: [1.0, 1.0, 2.0],
        runs: 3,
    };
    let a = Amplification {
        rows: amplification::CASES
            .iter()
            .flat_map(|case| {
                amplification::STACKS.map(|stack| amplification::Row {
                    stack: stack.into(),
                    case: (*case).into(),
                    root_calls: 10,
                    attempts_at_leaf_per_root: 3.0,
                    attempts_at_b_per_root: 1.0,
                    attempts_at_a_per_root: 1.0,
                    first_attempts_at_leaf: 3.0,
                    root_ok_share: 0.0,
                    ..amplification::Row::default()
                })
            })
            .collect(),
        fan_in_ms: 2000.0,
        runs: 3,
    };
    let html = render(&[step("metastable", &m), step("amplification", &a)], 1.0);
    for chart in ["metastable-capacity", "metastable-spike"] {
        let svg = html
            .split("<svg ")
            .find(|svg| svg.contains(&format!("data-chart=\"{chart}\"")))
            .unwrap_or_else(|| panic!("the report must plot {chart}"));
        let lines = metastable::STACKS.len() + 1;
        assert_eq!(
            svg.matches("<polyline class=\"line").count(),
            lines,
            "every stack and the offered load in {chart}"
        );
        assert_eq!(
            svg.matches("<circle class=\"point").count(),
            lines * 4,
            "a point per line and second in {chart}"
        );
    }
    let bars = html
        .split("<svg ")
        .find(|svg| svg.contains("data-chart=\"amplification\""))
        .expect("the report must chart experiment amplification");
    let stacks = amplification::STACKS.len();
    assert_eq!(
        bars.matches("<rect class=\"bar s").count(),
        amplification::CASES.len() * stacks + stacks,
        "a bar per case and stack, and a key per stack"
    );
    assert!(
        !bars.contains("the seed's figure"),
        "no seed ticks, so no key for them"
    );
}

#[test]
fn report_needs_nothing_from_the_network() {
    let html = render(&[], 0.0);
    for external in ["http://", "https://", "<link", "src="] {
        assert!(
            !html.contains(external),
            "the report must be self-contained: {external}"
        );
    }
}

fn row(variant: &str, p99: f64) -> hedge::Row {
    hedge::Row {
        variant: variant.to_owned(),
        p50_ms: 5.0,
        p99_ms: p99,
        p999_ms: p99 + 5.0,
        extra_load: 0.05,
        losers: 50,
        losers_cancelled_on_server: 49,
        losers_ended_on_server: 50,
        after_deadline: 0,
        failed: 0,
        cdf_ms: (0..=100).map(|i| if i < 95 { 5.0 } else { p99 }).collect(),
    }
}

#[test]
fn the_section_draws_a_cdf_line_per_variant_and_every_table_from_the_typed_results() {
    let hedge = HedgeRows {
        rows: vec![
            row("none", 205.0),
            row("ours", 27.0),
            row("tower::hedge", 40.0),
        ],
        calls: 1000,
        budget_ms: 1000.0,
        slow_share: 0.05,
    };
    let storm = Storm {
        rows: vec![retry_storm::Row {
            variant: "ours".into(),
            goodput: 0.95,
            amplification: 1.02,
            calls: 100,
            good: 95,
            attempts: 102,
        }],
        capacity_rps: 400.0,
        offered_rps: 800.0,
        failing_share: 0.1,
        deadline_ms: 100.0,
        window_s: 2.0,
    };
    let retry = RetryCases {
        cases: vec![retry::Case {
            case: retry::THIRD_ATTEMPT.into(),
            attempts: 3,
            attempt_starts_ms: vec![0.0, 30.0, 80.0],
            attempt_budgets_ms: vec![1000.0, 970.0, 920.0],
            previous_attempts: vec![0, 1, 2],
            deadline_ms: 1000.0,
            status: "OK".into(),
            client_ms: 90.0,
            attempts_after_deadline: 0,
            expected: String::new(),
        }],
    };
    let page = render(
        &[
            step("retry", &retry),
            step("hedge", &hedge),
            step("bench retry-storm", &storm),
        ],
        1.0,
    );
    let html = section(&page, "Retries and hedging inside one deadline");
    assert_eq!(
        html.matches("<polyline class=\"cdf\"").count(),
        3,
        "one CDF line per variant"
    );
    assert!(html.contains("data-chart=\"hedge-cdf\""));
    assert!(
        html.contains("ours (p99 27 ms, p99.9 32 ms)"),
        "the legend names each tail"
    );
    assert!(
        html.contains("data-chart=\"retry-storm\""),
        "the storm's goodput bars"
    );
    assert!(html.contains("95 % of capacity, 1.02 attempts per call"));
    assert!(
        html.contains("1000 / 970 / 920"),
        "the retry case's budgets on the wire"
    );
    assert!(
        html.contains("<td>50</td><td>49</td><td>50</td>"),
        "the losers, those reset on the server and those ended there, as the hedge's table has them"
    );
}

fn hop(service: &str, start: f64, end: f64) -> Hop {
    Hop {
        service: service.into(),
        kind: "server".into(),
        name: service.into(),
        span_id: format!("id-{service}"),
        parent: None,
        depth: 0,
        start_ms: start,
        end_ms: end,
        budget_on_entry_ms: Some(200.0),
        granted_ms: None,
        cap_ms: Some(200.0),
        cap_bound: true,
        reserve_ms: Some(50.0),
        reserve_bound: true,
        deadline_ms: Some(start + 200.0),
        outcome: "DEADLINE_EXCEEDED".into(),
        cause: None,
        outlived_parent_deadline: false,
        outlived_ms: None,
    }
}

#[test]
fn waterfall_draws_a_bar_per_hop_with_deadlines_caps_reserves_and_ends() {
    let mut work = hop("route: blocking work", 10.0, 410.0);
    work.outlived_parent_deadline = true;
    work.outlived_ms = Some(200.0);
    let waterfall = Waterfall {
        client_budget_ms: 800.0,
        cases: vec![Case {
            case: "route stalls".into(),
            trace_id: "abc".into(),
            status: "DEADLINE_EXCEEDED".into(),
            client_ms: 210.0,
            spans: vec![hop("route", 5.0, 205.0), work],
            ledger: vec!["/lab.v1.Route/GetRoute budget=200.00 took=190.02".into()],
        }],
    };
    let page = render(&[step("waterfall", &waterfall)], 1.0);
    let html = section(&page, "Where the budget went");
    assert!(
        html.contains("<pre>/lab.v1.Route/GetRoute budget=200.00 took=190.02</pre>"),
        "the call's ledger is shown under its waterfall"
    );
    assert!(html.contains("data-chart=\"waterfall-route-stalls\""));
    assert_eq!(
        html.matches("<rect class=\"bar hop").count(),
        2,
        "one bar per hop"
    );
    assert!(
        html.contains("class=\"deadline client\""),
        "the client's deadline is drawn"
    );
    assert!(html.contains("cap 200") && html.contains("reserve 50"));
    assert!(html.contains("✕"), "where the budget ended is marked");
    assert!(html.contains("ran on 200 ms past its deadline"));
}

#[test]
fn rapid_reset_gets_its_own_section_with_every_flood_and_server() {
    use deadline_lab::experiments::rapid_reset::{RapidReset, Row};
    let row = |server: &str, cut: Option<u32>| Row {
        server: server.into(),
        shape: "1 × fast".into(),
        connections: 1,
        rate: None,
        cut: if cut.is_some() {
            "GOAWAY ENHANCE_YOUR_CALM"
        } else {
            "not cut"
        }
        .into(),
        cut_by: cut
            .map(|_| ("GOAWAY ENHANCE_YOUR_CALM".to_owned(), 40))
            .into_iter()
            .collect(),
        connections_opened: 40,
        connections_cut: if cut.is_some() { 40 } else { 0 },
        streams_before_cut_max: cut,
        streams_before_cut_median: cut,
        streams_uncut_max: if cut.is_some() { None } else { Some(25_000) },
        streams_sent: 5_000,
        guard_counted: None,
        honest_p50_before_ms: 0.08,
        honest_p50_during_ms: 0.2,
        honest_calls: 9_000,
        honest_failures: 0,
        honest_first_failure: None,
    };
    let floods = RapidReset {
        rows: vec![row("plain tonic", None), row("ours", Some(129))],
        flooding_ms: 2000.0,
        cut_within: 1000,
        cpus_split: true,
    };
    let html = render(&[step("rapid-reset", &floods)], 1.0);
    assert!(html.contains("Reset floods (HTTP/2 Rapid Reset)"));
    assert!(
        html.contains("<td>1 × fast</td><td>plain tonic</td><td>not cut</td>"),
        "each server's row must say how the flood was cut off, or that it was not"
    );
    assert!(
        html.contains("<td>1 × fast</td><td>ours</td><td>GOAWAY ENHANCE_YOUR_CALM</td><td>40 of 40</td><td>129</td>"),
        "and how many streams the server took before the cut"
    );
}

#[test]
fn the_ledger_section_draws_each_traced_call_beside_its_ledger() {
    use deadline_lab::experiments::ledger::{LedgerResult, Row};
    let mut root = hop("client", 0.0, 280.0);
    root.budget_on_entry_ms = Some(300.0);
    let traced = Case {
        case: "a retried call".into(),
        trace_id: "abc".into(),
        status: "DEADLINE_EXCEEDED".into(),
        client_ms: 280.5,
        spans: vec![root, hop("Probe", 0.2, 280.0)],
        ledger: vec![
            "/probe.v1.Probe/Call budget=299.97 took=280.16 call=/probe.v1.Probe/Call,281.63,271.75,4,l,8.34".into(),
            "/probe.v1.Probe/Call budget=281.63 took=271.38".into(),
        ],
    };
    let result = LedgerResult {
        rows: vec![Row {
            case: "a retried call".into(),
            runs: 10,
            stalled: "/probe.v1.Probe/Call".into(),
            reserve_ms: Some(10.0),
            arrived_share: 1.0,
            named_right_share: 1.0,
            sum_error_share: 0.003,
            max_bytes_per_hop: 144,
            example: "deadline exceeded [ledger] 300.00 ms budget: …".into(),
            example_lines: vec!["/probe.v1.Probe/Call budget=300.00 took=281.31".into()],
            traced: Some(traced),
        }],
    };
    let html = render(&[step("ledger", &result)], 1.0);
    let section = section(&html, "Where the budget went: the ledger");
    assert!(
        section.contains("data-chart=\"waterfall-a-retried-call\""),
        "the traced call's waterfall"
    );
    assert_eq!(section.matches("<rect class=\"bar hop").count(), 2);
    assert!(
        section.contains("/probe.v1.Probe/Call budget=281.63 took=271.38</pre>"),
        "the ledger the traced call brought back, under its waterfall"
    );
    assert!(
        !section.contains("one call traced (trace abc)"),
        "drawn, not printed as text notes"
    );
}
