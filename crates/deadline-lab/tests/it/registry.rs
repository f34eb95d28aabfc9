//! One list of experiments: the registry's names, the tools each needs, and
//! the command line built from it.

use deadline_lab::cli;
use deadline_lab::registry::{self, ENTRIES, Entry, Kind, Missing, Needs, by_step, experiment};

#[test]
fn every_step_has_its_own_name() {
    let mut steps: Vec<String> = ENTRIES.iter().map(Entry::step).collect();
    let all = steps.len();
    steps.sort();
    steps.dedup();
    assert_eq!(steps.len(), all, "two entries must not share a step name");
}

#[test]
fn only_the_entries_with_optional_tools_can_be_skipped() {
    let needing: Vec<&str> = ENTRIES
        .iter()
        .filter(|e| !e.needs.is_empty())
        .map(|e| e.name)
        .collect();
    assert_eq!(needing, ["hosts", "proxy"]);
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
    let mut registered: Vec<&str> = registry::ENTRIES
        .iter()
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
    for entry in registry::ENTRIES
        .iter()
        .filter(|e| e.kind == registry::Kind::Bench)
    {
        assert!(
            bench.find_subcommand(entry.name).is_some(),
            "the demo's `bench {}` must also run as a command",
            entry.name
        );
    }
}
