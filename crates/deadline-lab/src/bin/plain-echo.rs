//! `plain-echo ADDR`: plain tonic serving `grpc.health.v1.Health/Check` in a
//! binary of its own, with none of the lab around it: no subscriber, no
//! counting allocator, no telemetry. The baseline's baseline: what
//! `deadline-lab serve echo --plain` must cost per request (the instruction
//! test compares the two under callgrind).
//!
//! Served as the lab serves plain tonic (`net::serve`): `TCP_NODELAY`, the
//! same HTTP/2 reset guards set by hand, tokio's multi-thread runtime. The
//! first line printed is the bound address; it exits on Ctrl-C (SIGINT).

use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::Routes;
use tonic::transport::Server;
use tonic_deadline::server::{LOCAL_ERROR_RESETS, PENDING_ACCEPT_RESETS};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // No subscriber would leave tracing's `log` fallback on (sqlx turns on
    // tracing's `log` feature for every crate of the lab's build): each span
    // would then build a log record nobody reads. A subscriber that wants
    // nothing is what a plain tonic binary without logging costs.
    tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default())?;
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".to_owned());
    let listener = TcpListener::bind(&addr).await?;
    println!("{}", listener.local_addr()?);
    let incoming = TcpListenerStream::new(listener).map(|conn| {
        conn.inspect(|stream| {
            let _ = stream.set_nodelay(true);
        })
    });
    let (_reporter, health) = tonic_health::server::health_reporter();
    let server = Server::builder()
        .http2_max_pending_accept_reset_streams(Some(PENDING_ACCEPT_RESETS))
        .http2_max_local_error_reset_streams(Some(LOCAL_ERROR_RESETS))
        .add_routes(Routes::new(health))
        .serve_with_incoming(incoming);
    // On a task of its own, as the lab serves; the process ends at Ctrl-C.
    #[allow(clippy::disallowed_methods)]
    tokio::spawn(server);
    tokio::signal::ctrl_c().await?;
    Ok(())
}
