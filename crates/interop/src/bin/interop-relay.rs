//! The middle hop of the mixed-language chains.
//!
//! ```text
//! interop-relay --port 0 --downstream 127.0.0.1:50052
//! ```
//!
//! Listens on loopback only. The first line on stdout is `listening on ADDR`.

use clap::Parser;

/// conformance.relay.Relay on tonic + tonic-deadline, forwarding to one
/// downstream `conformance.relay.Downstream`.
#[derive(Debug, Parser)]
struct Args {
    /// Port to listen on, on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// The downstream service, `host:port`.
    #[arg(long)]
    downstream: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let relay = interop::relay::Relay::connect_lazy(&args.downstream)?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    println!("listening on {}", listener.local_addr()?);
    interop::relay::serve(listener, relay, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
