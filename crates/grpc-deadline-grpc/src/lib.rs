#![doc = include_str!("../README.md")]
//!
//! # How it differs
//!
//! From `CallOptions::set_deadline` alone: the `grpc` crate (0.9) keeps
//! the deadline in the options and acts on nothing. From a
//! `tokio::time::timeout` around the call: that one stops waiting locally
//! but tells the server nothing, answers no gRPC status, and knows nothing
//! of the request the call is made for; here the budget travels and the
//! call follows its request's scope.
//!
//! # Example
//!
//! A call under a scope of 500 ms that the server does not answer in time
//! (here a stand-in for a channel, so that the example runs alone):
//!
//! ```
//! use std::time::Duration;
//! use grpc::client::{CallOptions, InvokeOnce, RecvStream, ResponseStreamItem, SendStream};
//! use grpc::client::interceptor::InvokeOnceExt;
//! use grpc::core::{RecvMessage, RequestHeaders, SendMessage};
//! use grpc_deadline::Scope;
//! use grpc_deadline_grpc::DeadlineInterceptor;
//!
//! /// A server that never answers, and shows the header it was sent.
//! struct Silent;
//! struct Never;
//! impl InvokeOnce for Silent {
//!     type SendStream = Never;
//!     type RecvStream = Never;
//!     async fn invoke_once(self, headers: RequestHeaders, _: CallOptions) -> (Never, Never) {
//!         let sent = headers.metadata().get("grpc-timeout").map(|v| v.to_str().to_owned());
//!         assert_eq!(sent.as_deref(), Some("500000u"));
//!         (Never, Never)
//!     }
//! }
//! impl SendStream for Never {
//!     async fn send(&mut self, _: &dyn SendMessage, _: grpc::client::SendOptions) -> Result<(), ()> {
//!         Ok(())
//!     }
//! }
//! impl RecvStream for Never {
//!     async fn recv(&mut self, _: &mut dyn RecvMessage) -> ResponseStreamItem {
//!         std::future::pending().await
//!     }
//! }
//! # struct Ignore;
//! # impl RecvMessage for Ignore { fn decode(&mut self, _: &mut dyn bytes::Buf) -> Result<(), String> { Ok(()) } }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let scope = Scope::background().with_timeout(Duration::from_millis(500));
//! let call = Silent.with_interceptor(DeadlineInterceptor::new());
//! let (_send, mut recv) = scope.enter(call.invoke_once(RequestHeaders::new(), CallOptions::new())).await;
//! let ResponseStreamItem::Trailers(trailers) = recv.recv(&mut Ignore).await else { panic!() };
//! let status = trailers.status().as_ref().unwrap_err();
//! assert_eq!(status.code(), grpc::StatusCodeError::DeadlineExceeded);
//! # }
//! ```
//!
//! # Features
//!
//! - `ledger`: a call that fails under a request's scope is noted for the
//!   request's ledger (the core's `ledger`), so that the hop's line names
//!   it, as for a call made through the tonic client layer.
//! - `tonic-transport`: `TonicInvoke` (module `invoke`), an `Invoke` that
//!   runs the crate's calls over tonic's transport under tonic-deadline's
//!   client layer, so that a cancel reaches the server also before its
//!   response headers (it gives up the crate's resolver, balancing and
//!   credentials).
// On docs.rs every feature-gated item is marked with the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod interceptor;
#[cfg(feature = "tonic-transport")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic-transport")))]
pub mod invoke;
mod ledger;
mod stats;
mod status;
mod streams;

/// The scope is the core's ([`grpc_deadline::Scope`]), the same whichever
/// crate makes the call: re-exported so that a service needs one
/// dependency for it.
pub use grpc_deadline::Scope;
pub use interceptor::{Abandoned, DeadlineInterceptor, Unscoped};
#[cfg(feature = "tonic-transport")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic-transport")))]
pub use invoke::{TonicInvoke, TonicRecvStream, TonicSendStream};
pub use stats::Stats;
pub use status::{code_name, code_of};
pub use streams::{DeadlineRecvStream, DeadlineSendStream};
