//! Compiles the examples' protos with protox, so no system `protoc` is needed.

const PROTOS: [&str; 3] = ["proto/chain.proto", "proto/work.proto", "proto/store.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure().compile_fds(files)?;
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    Ok(())
}
