//! Compiles the proto with protox, so no system `protoc` is needed.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = protox::compile(["proto/probe.proto"], ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("probe_descriptor.bin"), files.encode_to_vec())?;
    tonic_prost_build::configure().compile_fds(files)?;
    println!("cargo:rerun-if-changed=proto/probe.proto");
    Ok(())
}
