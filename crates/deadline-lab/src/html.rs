//! What the experiments draw in the demo's report ([`crate::page`]): the
//! report's [`Section`]s, a [`Part`] of one, and the charts (inline SVG).

pub mod chart;
mod section;

pub(crate) use section::Drawn;
pub use section::{Part, Section};
