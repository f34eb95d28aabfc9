//! Tests that need a peer process the test run does not start itself (a
//! PostgreSQL server) are built only with the `live` feature. A run without it
//! says so in one line, with how many it left out and how to run them,
//! instead of passing in silence.

use std::io::Write;
use std::path::Path;
use std::process::Command;

/// The feature that builds the tests needing a live PostgreSQL.
const POSTGRES_FEATURE: &str = "live";

/// The modules `main.rs` declares behind `feature`, read from its source.
fn gated_modules(feature: &str) -> Vec<&'static str> {
    let main = include_str!("main.rs");
    let needle = format!("feature = \"{feature}\"");
    let mut lines = main.lines().map(str::trim);
    let mut modules = Vec::new();
    while let Some(line) = lines.next() {
        if line.starts_with("#[cfg(") && line.contains(&needle) {
            let name = lines
                .next()
                .and_then(|l| l.strip_prefix("mod "))
                .and_then(|l| l.strip_suffix(';'))
                .expect("a cfg line in main.rs must be followed by the `mod` it gates");
            modules.push(name);
        }
    }
    modules
}

/// How many tests the module's source file declares.
fn tests_in(module: &str) -> usize {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/it")
        .join(format!("{module}.rs"));
    let source = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("the module {module} must be at {}: {e}", path.display()));
    source
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("#[test]") || l.starts_with("#[tokio::test"))
        .count()
}

/// The tests this binary's harness lists, one `path::name: test` a line.
fn listed() -> String {
    let exe = std::env::current_exe().expect("the test binary");
    let out = Command::new(exe)
        .arg("--list")
        .output()
        .expect("the test binary lists its tests");
    assert!(out.status.success(), "`--list` must succeed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// How many of the `listed` tests are in `module`.
fn listed_in(listed: &str, module: &str) -> usize {
    let prefix = format!("{module}::");
    listed
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.ends_with(": test"))
        .count()
}

#[test]
fn tests_that_need_postgres_are_counted_and_named_when_not_built() {
    let modules = gated_modules(POSTGRES_FEATURE);
    assert!(
        !modules.is_empty(),
        "main.rs must declare the PostgreSQL modules behind `{POSTGRES_FEATURE}`"
    );
    let listed = if cfg!(feature = "live") {
        listed()
    } else {
        String::new()
    };
    let mut total = 0;
    for module in &modules {
        let n = tests_in(module);
        assert!(n > 0, "the module {module} must hold tests");
        if cfg!(feature = "live") {
            assert_eq!(
                listed_in(&listed, module),
                n,
                "the harness must list as many tests in {module} as its source declares"
            );
        }
        total += n;
    }
    if !cfg!(feature = "live") {
        // Straight to the process's stderr: the harness captures `eprintln!`
        // in a passing test, and this line is for the person running it.
        let line = format!(
            "postgres-tests: {total} tonic-deadline tests against PostgreSQL not built \
             (feature {POSTGRES_FEATURE}; scripts/test-all starts a private PostgreSQL and runs them)\n"
        );
        std::io::stderr()
            .write_all(line.as_bytes())
            .expect("stderr is writable");
    }
}
