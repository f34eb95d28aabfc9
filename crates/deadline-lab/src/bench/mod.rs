//! Benchmarks: plain tonic and ours side by side in one process.
//!
//! A benchmark is an [`Experiment`](crate::registry::Experiment) of kind
//! [`Bench`](crate::registry::Kind::Bench): one file, and its line in the
//! list below.

crate::registry::entries! {
    /// Every benchmark, in the order the demo runs those it runs.
    ALL:
    overhead::Overhead,
    cancel::Cancel,
    overload::Overload,
    soak::Soak,
    retry_storm::Storm,
    instructions::Instructions,
    memory::Memory,
}
