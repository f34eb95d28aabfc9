//! HTTP/2's guards against reset streams, set for deadlines.

use tonic::transport::Server;

/// How many streams a client may have reset before the server accepted
/// them, at one time on one connection, under [`reset_guards`] (hyper's
/// default is 20). Public for a server built on hyper directly (axum, plain
/// HTTP), to set the same guard:
/// `http2_max_pending_accept_reset_streams(Some(PENDING_ACCEPT_RESETS))`.
///
/// ```
/// assert!(tonic_deadline::server::PENDING_ACCEPT_RESETS > 20);
/// ```
pub const PENDING_ACCEPT_RESETS: usize = 4096;

/// How many streams the server may reset for a client's protocol errors
/// on one connection under [`reset_guards`]: hyper's own default, which
/// tonic's `Server` turns off. Public for a server built on hyper directly,
/// to set the same guard:
/// `http2_max_local_error_reset_streams(Some(LOCAL_ERROR_RESETS))`.
///
/// ```
/// assert_eq!(tonic_deadline::server::LOCAL_ERROR_RESETS, 1024);
/// ```
pub const LOCAL_ERROR_RESETS: usize = 1024;

/// A tonic server builder with HTTP/2's guards against reset streams set
/// for deadlines, keeping a bound on reset floods.
///
/// Every call that ends before its answer — at its deadline, or cancelled —
/// resets its stream. With deadlines propagated, short ones under load make
/// many, often before the server has even accepted the stream (its
/// connection task had no CPU for a moment, say). hyper closes a connection
/// on which a client has more than 20 such streams at one time
/// (`GOAWAY ENHANCE_YOUR_CALM`), and every call on it fails: that guard is
/// there for *Rapid Reset* (CVE-2023-44487), a client that opens streams
/// and resets them at once, as fast as the socket takes them, so that the
/// server does work no stream limit bounds.
///
/// This sets:
///
/// - `http2_max_pending_accept_reset_streams` to [`PENDING_ACCEPT_RESETS`]:
///   room for an honest client's deadline storm while the server is busy.
///   A flood still passes it — the server reads all that has arrived before
///   it accepts a stream, and a flood keeps the socket full — so the
///   flooding connection is still cut off, within its first read of a few
///   thousand streams, and honest connections keep their latency. The
///   price: a connection may hold that many reset, not yet accepted streams
///   (a few hundred bytes each) before it is closed.
/// - `http2_max_local_error_reset_streams` to [`LOCAL_ERROR_RESETS`]: the
///   bound on streams the server resets for a client's protocol errors
///   (another way to make a server work for nothing), which hyper sets and
///   tonic's builder leaves off.
///
/// Calls on a connection a guard closes still fail, with a status that says
/// so (when the client runs the client layer).
///
/// ```no_run
/// use tonic_deadline::ServerDeadlineLayer;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let (_, health) = tonic_health::server::health_reporter();
/// tonic_deadline::server::reset_guards(tonic::transport::Server::builder())
///     .layer(ServerDeadlineLayer::new())
///     .add_service(health)
///     .serve("127.0.0.1:50051".parse()?)
///     .await?;
/// # Ok(())
/// # }
/// ```
pub fn reset_guards<L>(server: Server<L>) -> Server<L> {
    server
        .http2_max_pending_accept_reset_streams(Some(PENDING_ACCEPT_RESETS))
        .http2_max_local_error_reset_streams(Some(LOCAL_ERROR_RESETS))
}
