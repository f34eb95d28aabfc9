//! Compiles the lab's protos with protox, so no system `protoc` is needed.

use prost::Message;

const PROTOS: [&str; 5] = [
    "proto/trace.proto",
    "proto/im.proto",
    "proto/shop.proto",
    "proto/orders.proto",
    "proto/work.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = protox::compile(PROTOS, ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("lab_descriptor.bin"), files.encode_to_vec())?;
    tonic_prost_build::configure().compile_fds(files)?;
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    Ok(())
}
