//! The pools stand on the core and no gRPC stack: `cargo tree` of the
//! crate with every driver names no tonic, hyper or h2; the feature `tonic`
//! adds tonic and nothing of tonic-deadline's; and the tests that call
//! through the official `grpc` crate build no tonic but the codec core
//! that crate itself depends on.
//!
//! Read from `cargo tree` (offline: the lock file already names every
//! crate).

use std::process::Command;

/// Every driver of the crate.
const DRIVERS: &str = "sqlite,postgres,sqlx-postgres,sqlx-sqlite";

/// The crates the pools must not pull in without the feature `tonic`.
const STACKS: [&str; 5] = ["tonic", "hyper", "h2", "tower", "tonic-deadline"];

/// The names of the packages `cargo tree` prints for `args`.
fn tree(args: &[&str]) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--offline", "--locked", "-p", "grpc-deadline-db"])
        .args(["--prefix", "none", "--format", "{p}"])
        .args(args)
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
fn the_pools_depend_on_no_grpc_stack() {
    let names = tree(&["-e", "normal", "--features", DRIVERS]);
    assert!(
        names.iter().any(|n| n == "sqlx-postgres"),
        "the tree was read with every driver: {names:?}"
    );
    let stacks: Vec<_> = names
        .iter()
        .filter(|n| STACKS.contains(&n.as_str()))
        .collect();
    assert!(
        stacks.is_empty(),
        "the pools must need no gRPC stack, and pull in {stacks:?}"
    );
}

#[test]
fn the_tonic_feature_adds_tonic_and_nothing_of_tonic_deadline() {
    let names = tree(&["-e", "normal", "--features", "sqlite,tonic"]);
    assert!(
        names.iter().any(|n| n == "tonic"),
        "the feature brings tonic's status: {names:?}"
    );
    assert!(
        !names.iter().any(|n| n.starts_with("tonic-deadline")),
        "the pools never depend on tonic-deadline: {names:?}"
    );
}

#[test]
fn the_grpc_crate_tests_build_no_tonic_of_their_own() {
    // What depends on tonic in the tests' build: only the `grpc` crate
    // (its codec core, feature `codegen`), nothing of ours.
    let dependents = tree(&[
        "-e",
        "normal,dev",
        "--features",
        "sqlite",
        "--invert",
        "tonic",
        "--depth",
        "1",
    ]);
    assert_eq!(
        dependents,
        ["tonic", "grpc"],
        "tonic must come with the grpc crate alone"
    );
    let names = tree(&["-e", "normal,dev", "--features", "sqlite"]);
    assert!(
        !names.iter().any(|n| n.starts_with("tonic-deadline")),
        "no tonic-deadline in the tests' build: {names:?}"
    );
}
