//! What a process allocated, as the lab binary's global allocator counts it.

use serde::{Deserialize, Serialize};

/// Allocation totals of a process, from the lab binary's global allocator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocated {
    /// Allocation calls (`alloc` and `alloc_zeroed`; reallocations are not
    /// counted as new allocations).
    pub allocations: u64,
    /// Bytes requested, including what reallocations grew by.
    pub bytes: u64,
    /// Bytes given back (for the live heap: `bytes - freed`).
    #[serde(default)]
    pub freed: u64,
}
