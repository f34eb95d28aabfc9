//! The `probe.v1.Probe` service definition, generated at build time.
//!
//! Shared by the library's integration tests and by `deadline-lab`.

#![allow(missing_docs, unreachable_pub, clippy::all)]

tonic::include_proto!("probe.v1");

/// The encoded file descriptor set, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("probe_descriptor");
