//! The `probe.v1.Probe` service definition, generated at build time, and the
//! HTTP/2 frame decoder ([`frames`]).
//!
//! Shared by the library's integration tests and by `deadline-lab`.

pub mod frames;

#[allow(missing_docs, unreachable_pub, clippy::all)]
mod generated {
    tonic::include_proto!("probe.v1");
}
pub use generated::*;

/// The encoded file descriptor set, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("probe_descriptor");
