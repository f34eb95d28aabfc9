//! The one list of what the lab runs: `experiments::ALL` then `bench::ALL`,
//! in the order the demo runs them, and the lookups over it.

use crate::registry::{Entry, Kind};
use crate::{bench, experiments};

/// Every experiment, then every benchmark, in the order the demo runs them.
pub fn entries() -> impl Iterator<Item = &'static Entry> {
    experiments::ALL.iter().chain(bench::ALL)
}

/// The steps of the demo, in the order it runs them.
pub fn demo_steps() -> impl Iterator<Item = &'static Entry> {
    entries().filter(|e| e.in_demo)
}

/// The entry of `kind` called `name` on the command line.
pub fn find(kind: Kind, name: &str) -> Option<&'static Entry> {
    entries().find(|e| e.kind == kind && e.name == name)
}

/// The experiment called `name` on the command line.
pub fn experiment(name: &str) -> Option<&'static Entry> {
    find(Kind::Experiment, name)
}

/// The entry whose demo step is called `step` (`chain`, `bench soak`).
pub fn by_step(step: &str) -> Option<&'static Entry> {
    entries().find(|e| e.step() == step)
}
