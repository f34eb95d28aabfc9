//! `src/generated/` is what `proto/` compiles to.

#[test]
fn the_generated_code_is_what_the_protos_compile_to() {
    let protos = [
        "trace.proto",
        "im.proto",
        "shop.proto",
        "orders.proto",
        "work.proto",
    ];
    let crate_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    if let Err(stale) = testkit::codegen::check(crate_dir, &protos, "lab.v1", "lab_descriptor") {
        panic!("{stale}");
    }
}
