//! Checks the code a crate generates from its protos and keeps in its
//! source tree (`src/generated/`), so that building the crate needs
//! neither protox nor tonic-prost-build: each crate's `generated` test
//! compiles `proto/` again and compares.
//!
//! ```no_run
//! // In a crate's tests: fails if `src/generated/` is stale, and with
//! // `REGENERATE=1` in the environment rewrites it instead.
//! testkit::codegen::check(
//!     std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
//!     &["probe.proto"],
//!     "probe.v1",
//!     "probe_descriptor",
//! )
//! .unwrap();
//! ```

use std::path::Path;

use prost::Message;

/// Compiles `protos` (file names under `crate_dir/proto`) and compares
/// the result with `src/generated/{package}.rs` and
/// `src/generated/{descriptor}.bin`: an error names each stale file and
/// the command that rewrites it. With `REGENERATE` set in the environment
/// the files are rewritten instead.
///
/// # Errors
///
/// When a proto does not compile, or a generated file is missing or not
/// what `proto/` compiles to.
pub fn check(
    crate_dir: &Path,
    protos: &[&str],
    package: &str,
    descriptor: &str,
) -> Result<(), String> {
    let proto_dir = crate_dir.join("proto");
    let files = protox::compile(protos.iter().map(|p| proto_dir.join(p)), [&proto_dir])
        .map_err(|e| format!("the protos do not compile: {e}"))?;
    let out = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    let encoded = files.encode_to_vec();
    tonic_prost_build::configure()
        .out_dir(out.path())
        .compile_fds(files)
        .map_err(|e| format!("code generation failed: {e}"))?;
    let code = std::fs::read(out.path().join(format!("{package}.rs")))
        .map_err(|e| format!("tonic-prost-build wrote no {package}.rs: {e}"))?;

    let generated = crate_dir.join("src/generated");
    let regenerate = std::env::var_os("REGENERATE").is_some();
    let mut stale = Vec::new();
    for (name, fresh) in [
        (format!("{package}.rs"), code),
        (format!("{descriptor}.bin"), encoded),
    ] {
        let path = generated.join(name);
        if std::fs::read(&path).is_ok_and(|kept| kept == fresh) {
            continue;
        }
        if regenerate {
            std::fs::write(&path, fresh).map_err(|e| format!("{}: {e}", path.display()))?;
        } else {
            stale.push(path.display().to_string());
        }
    }
    if stale.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "not what proto/ compiles to: {}; run this test again with REGENERATE=1 to rewrite them",
            stale.join(", ")
        ))
    }
}
