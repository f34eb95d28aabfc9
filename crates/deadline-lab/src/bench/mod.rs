//! Benchmarks: plain tonic and ours side by side in one process.
//!
//! A benchmark is an [`Experiment`](crate::registry::Experiment) of kind
//! [`Bench`](crate::registry::Kind::Bench): one file, and its line in
//! [`ALL`] (beside its `mod` line here).

pub mod cancel;
pub mod instructions;
pub mod memory;
pub mod overhead;
pub mod overload;
pub mod retry_storm;
pub mod soak;

use crate::registry::Entry;

/// Every benchmark, in the order the demo runs those it runs.
pub static ALL: &[Entry] = &[
    Entry::of::<overhead::Overhead>(),
    Entry::of::<cancel::Cancel>(),
    Entry::of::<overload::Overload>(),
    Entry::of::<soak::Soak>(),
    Entry::of::<retry_storm::Storm>(),
    Entry::of::<instructions::Instructions>(),
    Entry::of::<memory::Memory>(),
];
