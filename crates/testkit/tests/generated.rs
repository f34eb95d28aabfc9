//! `src/generated/` is what `proto/` compiles to.

#[test]
fn the_generated_code_is_what_the_protos_compile_to() {
    let crate_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    if let Err(stale) =
        testkit::codegen::check(crate_dir, &["probe.proto"], "probe.v1", "probe_descriptor")
    {
        panic!("{stale}");
    }
}
