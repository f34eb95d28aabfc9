// The README is also the crates.io page, so its `[guide]` link points at
// docs.rs; this definition comes first and therefore wins in rustdoc.
//! [guide]: crate::guide
#![doc = include_str!("../README.md")]
// On docs.rs (nightly, `--cfg docsrs`) every feature-gated item is marked
// with the feature it needs; `doc_cfg` now includes what `doc_auto_cfg` did.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admission;
pub mod client;
mod forwarded;
pub mod observe;
#[cfg(feature = "service-config")]
#[cfg_attr(docsrs, doc(cfg(feature = "service-config")))]
pub mod resilience;
pub mod server;
#[cfg(feature = "service-config")]
#[cfg_attr(docsrs, doc(cfg(feature = "service-config")))]
pub mod service_config;
pub mod status;
mod wire;

pub use client::ClientDeadlineLayer;
/// The ledger is the core's too: its format and reader are the same
/// whichever stack writes or reads it; the layers here keep it.
#[cfg(feature = "ledger")]
#[cfg_attr(docsrs, doc(cfg(feature = "ledger")))]
pub use grpc_deadline::ledger;
/// The scope and the `grpc-timeout` codec are the core's
/// ([`grpc_deadline`]), the same for every stack; re-exported here so that
/// a tonic service needs one dependency.
pub use grpc_deadline::{
    Cause, Code, Ended, JoinSet, Scope, deadline_headers, detach, scope, spawn, timeout_header,
};
pub use server::ServerDeadlineLayer;

/// The error type that crosses service boundaries (as in tower and tonic).
///
/// ```
/// use tonic_deadline::BoxError;
/// let err: BoxError = "no route to pricing".into();
/// assert_eq!(err.to_string(), "no route to pricing");
/// ```
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[doc = include_str!("../docs/propagation.md")]
pub mod guide {}
