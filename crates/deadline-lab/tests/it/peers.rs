//! The modules that need a peer the test run does not start itself
//! (PostgreSQL, root for network namespaces, valgrind, Prometheus, nginx,
//! Chromium) are built only with their feature. A run without them says so
//! in one line, with how many tests it left out and where they run, instead
//! of passing in silence.

use std::io::Write;
use std::path::Path;

/// Each feature that gates modules, and the peer its tests need.
const GATES: [(&str, &str, bool); 6] = [
    (
        "postgres-tests",
        "PostgreSQL",
        cfg!(feature = "postgres-tests"),
    ),
    (
        "netns-tests",
        "network namespaces",
        cfg!(feature = "netns-tests"),
    ),
    (
        "callgrind-tests",
        "valgrind",
        cfg!(feature = "callgrind-tests"),
    ),
    (
        "prometheus-tests",
        "Prometheus",
        cfg!(feature = "prometheus-tests"),
    ),
    ("nginx-tests", "nginx", cfg!(feature = "nginx-tests")),
    (
        "chromium-tests",
        "Chromium",
        cfg!(feature = "chromium-tests"),
    ),
];

/// The modules `main.rs` declares behind `feature`, read from its source.
fn gated_modules(feature: &str) -> Vec<&'static str> {
    let main = include_str!("main.rs");
    let needle = format!("#[cfg(feature = \"{feature}\")]");
    let mut lines = main.lines().map(str::trim);
    let mut modules = Vec::new();
    while let Some(line) = lines.next() {
        if line == needle {
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

#[test]
fn tests_that_need_a_peer_are_counted_and_named_when_not_built() {
    let mut left = Vec::new();
    let mut total = 0;
    for (feature, peer, built) in GATES {
        let modules = gated_modules(feature);
        assert!(
            !modules.is_empty(),
            "main.rs must declare a module behind `{feature}`"
        );
        let n: usize = modules.iter().map(|m| tests_in(m)).sum();
        assert!(n > 0, "the modules behind {feature} must hold tests");
        if !built {
            left.push(format!("{n} {peer}"));
            total += n;
        }
    }
    if !left.is_empty() {
        // Straight to the process's stderr: the harness captures `eprintln!`
        // in a passing test, and this line is for the person running it.
        let line = format!(
            "deadline-lab: {total} tests that need a peer not built ({}; \
             scripts/test-all installs the peers and runs them with --all-features)\n",
            left.join(", ")
        );
        std::io::stderr()
            .write_all(line.as_bytes())
            .expect("stderr is writable");
    }
}
