//! A guard against HTTP/2 reset floods that knows deadlines, for tonic
//! servers.
//!
//! What it adds beside [`tonic-deadline`](https://docs.rs/tonic-deadline),
//! which re-exports it as `tonic_deadline::server::ResetGuard`: a server
//! whose clients propagate deadlines resets many streams honestly, and this
//! guard lets those through while it cuts off floods. It needs nothing of
//! the deadline layers (it reads the connection's bytes), so it stands on
//! the core, [`grpc-deadline`](https://docs.rs/grpc-deadline), for the
//! `grpc-timeout` codec alone.
//!
//!
//! Every call that ends before its answer resets its stream: at its
//! deadline, or when its caller cancels. With deadlines propagated, short
//! ones under load make many resets, often before the server has accepted
//! the stream (its connection task had no CPU for a moment). HTTP/2 Rapid
//! Reset (CVE-2023-44487) is made of the same frames: a client opens
//! streams and resets them at once, so that the server does work no stream
//! limit bounds. hyper's guard counts resets of streams not yet accepted
//! and closes a connection with more than 20 at once: it takes a deadline
//! storm on a busy server for a flood, and misses a flood slower than the
//! server's accept loop, whose streams are accepted before they are reset.
//!
//! [`ResetGuard`] tells the two apart by what an honest reset looks like.
//! It follows each connection's frames (an I/O wrapper on the accepted
//! stream, [`Guarded`]): the streams the client opens, the `grpc-timeout`
//! each carries (read from the header block with a shadow of the server's
//! HPACK table, which decodes no other header), the streams the server
//! answers, and the streams the client resets. A reset is *early* when it
//! comes before the server answered the stream, less than 0.5 ms after its
//! HEADERS (a client that gives up after its own timeout, 1 ms or more,
//! without telling the server, is never early), and more than 10 ms before
//! its deadline, if it has one. A reset that its deadline explains is never
//! early: a server kept off the CPU reads a while of its client's frames at
//! once, HEADERS and resets together, so a stream's age is taken at the
//! most its reads allow (since the read before its HEADERS). Early resets
//! spend an allowance of 32 per connection; every stream that ends by
//! itself or at its deadline earns 4 back (a hedged call's winner pays for
//! its losers, reset as soon as it is answered), and time 100 a second, up
//! to 32. A connection whose client spends more is sent
//! `GOAWAY ENHANCE_YOUR_CALM` and closed; the guard logs the rule it broke
//! (a `WARN`, at most one every 10 s) and counts it
//! (its [`Observer`]: tonic-deadline's `Metrics` is one).
//!
//! What an honest client cannot do is reset streams within half a
//! millisecond of opening them, long before their deadlines, faster than
//! its calls end: a client that cancels most of its calls the moment it
//! makes them is, on the wire, a flood.
//!
//! A flood that connects again as soon as it is cut off costs the server
//! a connection each time (its accept, its handshake, its allowance). So
//! the guard remembers the addresses it cut off: for 10 s after its last
//! cut, an address's new connections are on *probation*. They are read as
//! any other, but start with no allowance: one that resets a stream early
//! is held unread for a second before it is cut off
//! ([`ResetGuard::hold_after_cut`]), so that a flood's thread has one
//! connection a second read; beyond 20 held at once from one address, the
//! rest are cut off at once. What is held is only what floods again: a
//! client sharing the address (behind a NAT, or a proxy that hides its
//! clients' addresses) is served as any other. The guard says so when it
//! holds or cuts one (a `WARN` naming the address, at most one every 10 s,
//! and its [`Observer`] is told).
//!
//! hyper's own guard stays as a backstop, raised out of the way of honest
//! storms ([`PENDING_ACCEPT_RESETS`]) by the
//! builder the guard gives ([`ResetGuard::builder`]). A server of that
//! builder must therefore never serve what the guard cannot read, and it
//! does not: its router serves only connections the guard wraps
//! ([`GuardedRouter`]: an address it binds, [`ResetGuard::incoming`], or
//! `incoming_tls`), and a server serving anything else does not compile.
//! TLS set on tonic's `Server` (through [`GuardedServer::configure`]; it
//! encrypts after the incoming stream, so that the guard would read
//! ciphertext) has every TLS connection refused, said at once as an
//! `ERROR` naming the fix, and counted
//! (its [`Observer`] is told).
//! For TLS, the guard terminates it itself ([`GuardedRouter::serve_tls`],
//! `ResetGuard::incoming_tls`, the `tls` feature): rustls as tonic's
//! `tls-ring` builds it, and the handlers see the client's certificates and
//! address as under tonic's own TLS.
//!
//! # Example
//!
//! ```no_run
//! # #[cfg(feature = "server")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tonic_deadline_guard::ResetGuard;
//!
//! let (_, health) = tonic_health::server::health_reporter();
//! ResetGuard::new()
//!     .builder() // tonic's `Server` builder: `.layer(ServerDeadlineLayer::new())` goes here
//!     .add_service(health)
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(())
//! # }
//! ```

pub mod frames;
mod go_away;
mod hyper_limits;

#[cfg(feature = "server")]
mod builder;
#[cfg(feature = "server")]
mod connection;
#[cfg(feature = "server")]
mod guard;
#[cfg(feature = "server")]
mod hpack;
#[cfg(feature = "server")]
mod observer;
#[cfg(feature = "server")]
mod probation;
#[cfg(feature = "server")]
mod reset_account;
#[cfg(feature = "server")]
mod rules;
#[cfg(feature = "server")]
mod shared;
#[cfg(feature = "tls")]
mod tls;

#[cfg(feature = "server")]
pub use builder::{GuardedIncoming, GuardedRouter, GuardedServer, ServeError};
#[cfg(feature = "server")]
pub use connection::{Guarded, Incoming};
pub use go_away::FLOOD_GO_AWAY;
#[cfg(feature = "server")]
pub use guard::ResetGuard;
pub use hyper_limits::{LOCAL_ERROR_RESETS, PENDING_ACCEPT_RESETS};
#[cfg(feature = "server")]
pub use observer::Observer;
#[cfg(feature = "server")]
pub use probation::PeerAddress;
#[cfg(feature = "tls")]
pub use tls::{ServerTls, TlsError, TlsIncoming};
