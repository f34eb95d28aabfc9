//! What the experiments and benchmarks share, so that none of them imports
//! another: calls as the lab's client makes them, the journals and traces
//! a chain leaves, a PostgreSQL server of its own, and the sides a
//! benchmark compares.

pub mod allocated;
pub mod calls;
pub mod journal;
pub mod ours_or_plain;
pub mod postgres;
pub mod pseudo_random;
pub mod traced;
