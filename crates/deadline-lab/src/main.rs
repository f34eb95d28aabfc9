//! `deadline-lab`: runs the seed systems on one machine and prints every
//! deadline claim as a measured table (or, with `--json`, one JSON object).

use deadline_lab::kit::allocated::Allocated;

/// Counts every allocation and its size, for `bench instructions`
/// (allocations and bytes per request). Each allocation and deallocation
/// costs two uncontended atomic adds on top of the system allocator (on
/// x86-64 the crate's `SeqCst` adds are the same `lock xadd` a relaxed add
/// would be); both variants of every benchmark pay it alike.
#[global_allocator]
static ALLOCATOR: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

fn allocated() -> Allocated {
    let stats = ALLOCATOR.stats();
    Allocated {
        allocations: stats.allocations as u64,
        bytes: stats.bytes_allocated as u64,
        freed: stats.bytes_deallocated as u64,
    }
}

fn main() -> anyhow::Result<()> {
    deadline_lab::cli::main(allocated)
}
