//! The service definitions the examples share, generated at build time from
//! `proto/`, and the one piece of set-up every example repeats: a listener on
//! a free loopback port.
//!
//! The examples themselves are the files next to this one; run one with
//! `cargo run -p tonic-deadline-examples --example NAME`.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

/// `chain.v1`: a hop that reports the budget it saw and calls the next.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod chain {
    tonic::include_proto!("chain.v1");
}

/// `work.v1`: a handler that starts background work.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod work {
    tonic::include_proto!("work.v1");
}

/// `store.v1`: a service with a database behind it.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod store {
    tonic::include_proto!("store.v1");
}

/// Binds a free port on 127.0.0.1, for `Server::serve_with_incoming`.
///
/// # Errors
///
/// The port could not be bound.
pub async fn loopback() -> std::io::Result<(SocketAddr, TcpListenerStream)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    Ok((listener.local_addr()?, TcpListenerStream::new(listener)))
}

/// A duration in milliseconds with one decimal, as the examples print them.
pub fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1e3)
}
