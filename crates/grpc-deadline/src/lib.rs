#![doc = include_str!("../README.md")]
//!
//! The methods a layer needs and a handler does not are grouped under "For
//! layers" in [`Scope`]'s docs: a root scope carrying the layer's
//! [`Attachment`](scope::Attachment), [`Scope::end`] with the cause a
//! layer sees, [`Scope::enter_sync`] around a service's `call`.
//!
//! # Features
//!
//! - `tonic`: `?` from [`Ended`] (and from an admission's
//!   [`Refused`](admission::Refused)) into `tonic::Status` (and the right
//!   code in tonic's `Status::from_error` for a boxed one), conversions
//!   between [`Code`] and `tonic::Code`. Rust lets only the crate that defines a type
//!   or the one that defines the trait write such a conversion, so it is
//!   here, behind a feature; nothing else of tonic is used.
// On docs.rs every feature-gated item is marked with the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admission;
mod code;
pub mod deadline_headers;
#[cfg(feature = "ledger")]
#[cfg_attr(docsrs, doc(cfg(feature = "ledger")))]
pub mod ledger;
pub mod rate_limited_warnings;
pub mod scope;
pub mod timeout_header;
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub mod tonic_status;
mod unscoped;

/// The former path of [`rate_limited_warnings`], kept for one release.
#[doc(hidden)]
pub mod warn_limit {
    pub use crate::rate_limited_warnings::WarnLimit;
}

pub use code::Code;
pub use scope::{Cause, Ended, JoinSet, Scope, detach, spawn};
pub use unscoped::Unscoped;
