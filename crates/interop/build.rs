//! Compiles the crate's own protos with protox, so neither a system `protoc`
//! nor gRPC's proto package is needed to build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/grpc_testing.proto", "proto/relay.proto"];
    let files = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure().compile_fds(files)?;
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    Ok(())
}
