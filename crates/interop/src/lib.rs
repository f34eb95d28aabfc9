//! gRPC's official interop cases on tonic + `tonic-deadline`, and the tools
//! that hold our deadline handling against gRPC stacks we did not write.
//!
//! - [`server`]: `grpc.testing.TestService` behind [`ServerDeadlineLayer`],
//!   for official interop clients (`interop-server --port N`);
//! - [`client`]: one function per official test case, including the three
//!   deadline and cancellation cases tonic's own interop client leaves
//!   unimplemented (`interop-client --server_port N --test_case=a,b`);
//! - [`relay`]: the middle hop of the mixed-language chains — a foreign client
//!   calls it, it calls a foreign service under the request's scope;
//! - [`hostile`]: malformed and edge-case `grpc-timeout` values sent over raw
//!   HTTP/2, with the answer the spec requires for each;
//! - [`grpc_crate`]: the deadline and cancel cases through the official
//!   `grpc` crate's client under `grpc-deadline-grpc`'s interceptor
//!   (`interop-grpc-client --server_port N --test_case=a,b`);
//! - `interop-retry`: one call through our resilience layer, for the check
//!   against a foreign server that fails the first attempts.
//!
//! How it differs from tonic's interop crate: that one leaves
//! `timeout_on_sleeping_server`, `cancel_after_begin` and
//! `cancel_after_first_response` unimplemented, because plain tonic can only
//! drop a call, not cancel it with a status. Here a call runs inside a
//! [`Scope`](tonic_deadline::Scope); cancelling the scope ends the call with
//! `CANCELLED` and resets the stream, and its deadline ends it with
//! `DEADLINE_EXCEEDED`.
//!
//! # Example
//!
//! ```no_run
//! use interop::{client, server};
//!
//! # async fn run() -> anyhow::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let addr = listener.local_addr()?;
//! tokio::spawn(server::serve(listener, std::future::pending()));
//! let mut clients = client::Clients::connect(&addr.ip().to_string(), addr.port()).await?;
//! for case in client::TestCase::ALL {
//!     client::run(case, &mut clients).await?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! [`ServerDeadlineLayer`]: tonic_deadline::ServerDeadlineLayer

pub mod client;
pub mod grpc_crate;
pub mod hostile;
pub mod relay;
pub mod server;
pub mod spec;

/// The `grpc.testing` messages and services, generated at build time from
/// this crate's own `proto/grpc_testing.proto`.
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all
)]
pub mod pb {
    tonic::include_proto!("grpc.testing");
}

/// The mixed-language chain's messages and services (`proto/relay.proto`).
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all
)]
pub mod relay_pb {
    tonic::include_proto!("conformance.relay");
}
