//! The lab's own service definitions (`lab.v1`: the IM chain, the shop, orders
//! and payments, and a worker), generated at build time from `proto/`.

#![allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all
)]

tonic::include_proto!("lab.v1");

/// The encoded file descriptor set, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("lab_descriptor");
