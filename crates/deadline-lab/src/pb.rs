//! The lab's own service definitions (`lab.v1`: the IM chain, the shop, orders
//! and payments, and a worker), generated from `proto/` into `src/generated/`
//! (the `generated` test checks that it is what `proto/` compiles to).

#![allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all
)]

include!("generated/lab.v1.rs");

/// The encoded file descriptor set, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("generated/lab_descriptor.bin");
