//! The integration tests, in one binary so that the shared helpers in
//! `common` and the crate's dev-dependencies are compiled and linked once:
//! one module per concern. Modules that need a feature are declared behind
//! it here.
//!
//! One test keeps a binary of its own: `tests/logs.rs` (see there why).

mod common;

mod abandoned;
mod admission_layer;
mod cancellation;
mod chain_budget;
mod compat;
mod edges;
mod failures;
mod layering;
mod lean_build;
mod messages;
mod observe;
mod plain_tonic_baseline;
mod propagation;
#[cfg(feature = "server")]
mod reset_guards;
mod round_trip;
mod seams;
mod wait_for_ready;
mod wire;

#[cfg(feature = "http")]
mod http_server;
#[cfg(feature = "ledger")]
mod ledger;

// The tests that need a live PostgreSQL server are in the lab's tests
// (crates/deadline-lab/tests/it), beside its other tests that need a peer.
