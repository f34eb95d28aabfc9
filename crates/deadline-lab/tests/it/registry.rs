//! One list of experiments: the registry's names, the tools each needs, and
//! the command line built from it.

use deadline_lab::catalog::{by_step, entries, experiment};
use deadline_lab::cli;
use deadline_lab::registry::{self, Entry, Kind, Missing, Needs};

#[test]
fn every_step_has_its_own_name() {
    let mut steps: Vec<String> = entries().map(Entry::step).collect();
    let all = steps.len();
    steps.sort();
    steps.dedup();
    assert_eq!(steps.len(), all, "two entries must not share a step name");
}

#[test]
fn only_the_entries_with_optional_tools_can_be_skipped() {
    let needing: Vec<&str> = entries()
        .filter(|e| !e.needs.is_empty())
        .map(|e| e.name)
        .collect();
    assert_eq!(needing, ["hosts", "proxy"]);
}

#[test]
fn every_flag_has_a_default_so_that_the_demo_can_run_every_entry() {
    for entry in entries() {
        let command = entry.command().no_binary_name(true);
        assert!(
            command.try_get_matches_from(Vec::<String>::new()).is_ok(),
            "`{}` must run with no flag given",
            entry.step()
        );
    }
}

#[test]
fn a_missing_tool_says_how_to_get_it() {
    let missing = Missing {
        needs: Needs::Nginx,
        why: "nginx is not installed".into(),
    };
    assert_eq!(missing.to_string(), "needs nginx: apt-get install nginx");
}

#[test]
fn experiments_and_benchmarks_are_found_by_their_names() {
    assert_eq!(experiment("db-cancel").map(|e| e.name), Some("db-cancel"));
    assert!(
        experiment("overload").is_none(),
        "a benchmark is not an experiment"
    );
    assert_eq!(
        by_step("bench retry-storm").map(|e| e.kind),
        Some(Kind::Bench)
    );
}

#[test]
fn every_experiment_of_the_registry_has_its_subcommand_and_no_other() {
    let cli = cli::command();
    let experiment = cli
        .find_subcommand("experiment")
        .expect("`experiment` must be a subcommand");
    let mut subcommands: Vec<&str> = experiment
        .get_subcommands()
        .map(|c| c.get_name())
        .filter(|name| *name != "help")
        .collect();
    let mut registered: Vec<&str> = entries()
        .filter(|e| e.kind == registry::Kind::Experiment)
        .map(|e| e.name)
        .collect();
    subcommands.sort_unstable();
    registered.sort_unstable();
    assert_eq!(
        subcommands, registered,
        "`experiment NAME` must offer exactly the registry's experiments"
    );
    for sub in experiment.get_subcommands() {
        assert!(
            sub.get_about().is_some_and(|a| !a.to_string().is_empty()),
            "{} must have the registry's line as its help",
            sub.get_name()
        );
    }
}

#[test]
fn the_benchmarks_of_the_demo_are_benchmarks_on_the_command_line() {
    let cli = cli::command();
    let bench = cli
        .find_subcommand("bench")
        .expect("`bench` must be a subcommand");
    for entry in entries().filter(|e| e.kind == registry::Kind::Bench && e.in_demo) {
        assert!(
            bench.find_subcommand(entry.name).is_some(),
            "the demo's `bench {}` must also run as a command",
            entry.name
        );
    }
}

#[test]
fn the_steps_the_demo_runs_side_by_side_wait_and_none_times_the_machine() {
    // Each experiment declares whether it is light (`Experiment::LIGHT`);
    // what times the machine must not: a benchmark, or an experiment whose
    // flags size a flood, a load or a window of traffic.
    for entry in entries().filter(|e| e.light) {
        assert_eq!(
            entry.kind,
            Kind::Experiment,
            "{}: a benchmark times the machine",
            entry.name
        );
        let usage = entry.usage();
        for load in [
            "--flood-ms",
            "--window-ms",
            "--window-s",
            "--before-ms",
            "--calls",
            "--requests",
        ] {
            assert!(
                !usage.contains(load),
                "{}: a light step runs beside others in the demo; one that sizes a load with {load} must not",
                entry.name
            );
        }
    }
    let light = entries().filter(|e| e.light).count();
    assert!(
        light * 2 > entries().filter(|e| e.in_demo).count(),
        "most of the demo's steps wait on deadlines and run side by side: {light} light"
    );
}

#[test]
fn a_demo_step_run_in_a_child_prints_the_result_its_table_is_drawn_from() {
    let printed: serde_json::Value =
        crate::common::json(crate::common::debug_lab(), &["demo-step", "chain"]);
    let entry = by_step("chain").expect("the demo has a chain step");
    let table = entry
        .outcome(printed["result"].clone())
        .expect("the result reads back as the chain's");
    assert_eq!(table.json, printed["result"]);
    let hops: Vec<&str> = table.rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(hops, ["A", "B", "C"], "{}", table.table());
    assert!(
        printed["warnings"].is_null(),
        "the chain provokes no warning: {printed}"
    );

    let out = std::process::Command::new(crate::common::debug_lab())
        .args(["demo-step", "no-such-step"])
        .output()
        .expect("the lab starts");
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("no demo step called \"no-such-step\""),
        "{said}"
    );
}
