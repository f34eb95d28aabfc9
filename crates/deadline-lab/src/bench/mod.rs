//! Benchmarks: plain tonic and ours side by side in one process.

pub mod cancel;
pub mod instructions;
pub mod memory;
pub mod overhead;
pub mod overload;
pub mod retry_storm;
pub mod soak;
