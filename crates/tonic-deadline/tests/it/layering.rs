//! The crate's modules import one way: the wire format, then the scope
//! (the core's, re-exported: grpc-deadline), then what maps and reads them,
//! then the layers, then observability. A module never imports what is
//! built on it.
//!
//! Read from the source: every `crate::MODULE` a file names (in a `use` or a
//! path), outside its comments.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Each top-level module and its floor; a module may name only modules on
/// floors below its own, or on its own floor when that floor allows it.
const FLOORS: &[(&str, u8)] = &[
    ("wire", 0),
    ("scope", 1),
    ("status", 2),
    ("service_config", 2),
    ("forwarded", 2),
    ("ledger", 1),
    ("server", 3),
    ("client", 3),
    ("admission", 3),
    ("resilience", 3),
    ("observe", 4),
];

/// The layers build on each other (a pool takes an admission, the
/// resilience layer marks calls for the client's channel); the floors below
/// them do not.
const SHARED_FLOOR: u8 = 3;

fn floor(module: &str) -> Option<u8> {
    FLOORS.iter().find(|(m, _)| *m == module).map(|&(_, f)| f)
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the source directory is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module `path` belongs to (`src/client/channel.rs` →
/// `client`); `None` for the crate root.
fn module_of(src: &Path, path: &Path) -> Option<String> {
    let first = path.strip_prefix(src).ok()?.components().next()?;
    let name = first.as_os_str().to_str()?.trim_end_matches(".rs");
    (name != "lib").then(|| name.to_owned())
}

/// Every `crate::NAME` in `text`, comments left out; tests of a module
/// (`tests.rs`, `tests/`) may reach anywhere, and are not read.
fn named(text: &str) -> BTreeSet<String> {
    paths_after(text, "crate::")
}

/// The first segment of every path in `text` that follows `prefix`
/// (`crate::`, `super::`), comments left out.
fn paths_after(text: &str, prefix: &str) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find(prefix) {
        rest = &rest[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a, b::c}`: the first segment of each path in it.
            let group = group.split('}').next().unwrap_or("");
            for path in group.split(',') {
                found.insert(first_segment(path.trim()));
            }
        } else {
            found.insert(first_segment(rest));
        }
    }
    found
}

fn first_segment(path: &str) -> String {
    path.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

#[test]
fn no_module_imports_what_is_built_on_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut wrong = Vec::new();
    let mut seen = BTreeSet::new();
    for path in &files {
        let is_test = path
            .components()
            .any(|c| c.as_os_str() == "tests" || c.as_os_str() == "tests.rs");
        let Some(module) = module_of(&src, path) else {
            continue;
        };
        if is_test {
            continue;
        }
        let own =
            floor(&module).unwrap_or_else(|| panic!("src/{module} has no floor: add it to FLOORS"));
        seen.insert(module.clone());
        let text = std::fs::read_to_string(path).expect("a source file is readable");
        for name in named(&text) {
            let Some(theirs) = floor(&name) else { continue };
            let allowed = theirs < own || (theirs == own && own == SHARED_FLOOR) || name == module;
            if !allowed {
                wrong.push(format!(
                    "{} (floor {own}) names crate::{name} (floor {theirs})",
                    path.strip_prefix(&src).unwrap_or(path).display()
                ));
            }
        }
    }
    assert!(
        seen.contains("wire") && seen.contains("server"),
        "the sources were read"
    );
    assert!(
        wrong.is_empty(),
        "imports that run back up:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_two_files_of_a_module_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    // (directory, file stem) → the siblings it names through `super::`.
    let mut names = std::collections::BTreeMap::new();
    for path in &files {
        let is_test = path
            .components()
            .any(|c| c.as_os_str() == "tests" || c.as_os_str() == "tests.rs");
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if is_test || stem == "mod" || stem == "lib" {
            continue;
        }
        let dir = path.parent().expect("a file has a directory").to_owned();
        let text = std::fs::read_to_string(path).expect("a source file is readable");
        names.insert((dir, stem.to_owned()), paths_after(&text, "super::"));
    }
    assert!(
        names.keys().any(|(_, stem)| stem == "body"),
        "the sources were read"
    );
    let mut circles = Vec::new();
    for ((dir, stem), named) in &names {
        for other in named {
            let back = names.get(&(dir.clone(), other.clone()));
            if stem < other && back.is_some_and(|b| b.contains(stem)) {
                circles.push(format!(
                    "{}: {stem}.rs and {other}.rs import each other",
                    dir.strip_prefix(&src).unwrap_or(dir).display()
                ));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "files of one module that import each other (move what both need to a file of its own):\n{}",
        circles.join("\n")
    );
}

/// The client side (the client layer, the channel, the resilience layer)
/// and the server side stand beside each other: what both need (the
/// metadata a request forwards) lives below them, so neither names the
/// other.
#[test]
fn the_client_and_server_sides_do_not_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut wrong = Vec::new();
    let mut read = 0;
    for path in &files {
        let is_test = path
            .components()
            .any(|c| c.as_os_str() == "tests" || c.as_os_str() == "tests.rs");
        let Some(module) = module_of(&src, path) else {
            continue;
        };
        let other = match module.as_str() {
            "client" | "resilience" => "server",
            "server" => "client",
            _ => continue,
        };
        if is_test {
            continue;
        }
        read += 1;
        let text = std::fs::read_to_string(path).expect("a source file is readable");
        if named(&text).contains(other) {
            wrong.push(format!(
                "{} names crate::{other}",
                path.strip_prefix(&src).unwrap_or(path).display()
            ));
        }
    }
    assert!(read > 10, "the sources were read");
    assert!(
        wrong.is_empty(),
        "a side of the call that imports the other:\n{}",
        wrong.join("\n")
    );
}
