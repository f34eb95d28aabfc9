//! The core depends on no gRPC stack, HTTP/2 implementation or transport:
//! `cargo tree -e normal` of its default build, and with the ledger, names
//! none of them.
//!
//! Read from `cargo tree` (offline: the lock file already names every
//! crate).

use std::process::Command;

/// The crates the core must never pull in by default.
const STACKS: [&str; 6] = ["tonic", "hyper", "h2", "grpc", "hyper-util", "tower"];

fn tree(features: &[&str]) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--offline", "--locked", "-p", "grpc-deadline"])
        .args(["-e", "normal", "--prefix", "none", "--format", "{p}"])
        .args(features)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split(' ').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_core_depends_on_no_grpc_stack() {
    assert_no_stack(&[]);
}

#[test]
fn the_ledger_adds_no_grpc_stack() {
    let names = assert_no_stack(&["--features", "ledger"]);
    assert!(
        names.iter().any(|n| n == "prost"),
        "the ledger's format is read with prost: {names:?}"
    );
}

/// The tree with `features` names tokio and no stack; returns its names.
fn assert_no_stack(features: &[&str]) -> Vec<String> {
    let names = tree(features);
    assert!(
        names.iter().any(|n| n == "tokio"),
        "the tree was read: {names:?}"
    );
    let stacks: Vec<_> = names
        .iter()
        .filter(|n| STACKS.contains(&n.as_str()))
        .collect();
    assert!(
        stacks.is_empty(),
        "the core's build ({features:?}) must know no stack, and pulls in {stacks:?}"
    );
    names
}

#[test]
fn the_tonic_feature_adds_tonic_and_nothing_of_ours() {
    let names = tree(&["--features", "tonic"]);
    assert!(
        names.iter().any(|n| n == "tonic"),
        "the feature brings tonic's conversions: {names:?}"
    );
    assert!(
        !names.iter().any(|n| n.starts_with("tonic-deadline")),
        "the core never depends on what stands on it"
    );
}
