//! The default build compiles nothing that tonic itself does not: every
//! crate in tonic-deadline's dependency tree with its default features is
//! the core (grpc-deadline), the reset guard (tonic-deadline-guard), tonic
//! or one of tonic's own dependencies. Metrics, service config, the
//! databases, HTTP and OpenTelemetry are features; so is the reset guard,
//! which a server without the default features does not compile.
//!
//! Read from `cargo tree` (offline: the lock file already names every
//! crate).

use std::collections::BTreeSet;
use std::process::Command;

/// `(depth, crate name)` for each line of `cargo tree --prefix depth`.
fn parse(line: &str) -> Option<(usize, &str)> {
    let digits = line.find(|c: char| !c.is_ascii_digit())?;
    let depth = line[..digits].parse().ok()?;
    let name = line[digits..].split(' ').next()?;
    Some((depth, name))
}

#[test]
fn the_default_build_compiles_nothing_plain_tonic_does_not() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--offline", "--locked", "-p", "tonic-deadline"])
        .args([
            "-e",
            "normal",
            "--no-dedupe",
            "--prefix",
            "depth",
            "--format",
            "{p}",
        ])
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut all = BTreeSet::new();
    let mut tonics = BTreeSet::new();
    let mut under_tonic = false;
    for line in text.lines() {
        let (depth, name) = parse(line).unwrap_or_else(|| panic!("a cargo tree line: {line:?}"));
        all.insert(name);
        if depth == 1 {
            under_tonic = name == "tonic";
        } else if under_tonic {
            tonics.insert(name);
        }
    }
    assert!(
        all.contains("tonic") && tonics.contains("h2"),
        "the tree names tonic and its dependencies:\n{text}"
    );
    let extra: Vec<_> = all
        .iter()
        .filter(|name| {
            ![
                "tonic-deadline",
                "grpc-deadline",
                "tonic-deadline-guard",
                "tonic",
            ]
            .contains(name)
                && !tonics.contains(*name)
        })
        .collect();
    assert!(
        extra.is_empty(),
        "the default features compile crates tonic does not: {extra:?} (make them a feature)"
    );
}

#[test]
fn a_server_without_the_default_features_compiles_no_reset_guard() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--offline", "--locked", "-p", "tonic-deadline"])
        .args(["--no-default-features", "--features", "server"])
        .args(["-e", "normal", "--prefix", "none", "--format", "{p} [{f}]"])
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let guard = text
        .lines()
        .find(|line| line.starts_with("tonic-deadline-guard "))
        .unwrap_or_else(|| panic!("the frame module's crate is in every build:\n{text}"));
    assert!(
        guard.ends_with("[]"),
        "with `server` alone the guard crate must be its frame module, no feature on: {guard}"
    );
    assert!(
        !text.contains("tokio-rustls"),
        "nor may the guard's TLS be built:\n{text}"
    );
}
