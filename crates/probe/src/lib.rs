//! The `probe.v1.Probe` service definition, generated from `proto/` into
//! `src/generated/` (checked by [`codegen`] in the `generated` test), and
//! the HTTP/2 frame decoder ([`frames`]), a Rapid Reset flood from a
//! raw client ([`flood`]), in the clear or over TLS with certificates made
//! for the run ([`tls`]).
//!
//! Shared by the library's integration tests and by `deadline-lab`.

#[cfg(feature = "codegen")]
pub mod codegen;
pub mod flood;
pub mod frames;
pub mod tls;

#[allow(missing_docs, unreachable_pub, clippy::all)]
mod generated {
    include!("generated/probe.v1.rs");
}
pub use generated::*;

/// The encoded file descriptor set, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("generated/probe_descriptor.bin");
