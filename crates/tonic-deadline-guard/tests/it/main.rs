//! The guard's integration tests, in one binary so that the shared helpers
//! in `common` and the crate's dev-dependencies are compiled and linked
//! once: one module per concern. Real tonic servers on loopback, flooded by
//! raw HTTP/2 clients (the workspace's `probe`), answering plain tonic
//! clients: the guard needs nothing of the deadline layers, and neither do
//! its tests.
//!
//! How tonic-deadline's own clients, layers and metrics meet the guard (a
//! deadline storm of its clients, `Metrics` as the guard's observer, the
//! layers' budgets through the TLS the guard terminates, TLS set on tonic's
//! `Server` refused) is tested in tonic-deadline's `tests/it/reset_guards.rs`
//! and `tests/it/compat/tls.rs`.

mod common;

mod floods;
mod probation;
