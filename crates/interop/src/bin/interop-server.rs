//! The interop server, with the flags of gRPC's official interop servers.
//!
//! ```text
//! interop-server --port 10000
//! ```
//!
//! Listens on loopback only; `--port 0` picks a free port. The first line on
//! stdout is `listening on ADDR`. Runs until interrupted.

use clap::Parser;

/// gRPC interop server (grpc.testing.TestService) on tonic + tonic-deadline.
#[derive(Debug, Parser)]
struct Args {
    /// Port to listen on, on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 10000)]
    port: u16,
    /// TLS is not supported; only `false` is accepted.
    #[arg(long = "use_tls", default_value = "false", value_parser = ["false"])]
    use_tls: String,
    /// Also report the handler's remaining budget in a response header.
    #[arg(long = "report_budget")]
    report_budget: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    println!("listening on {}", listener.local_addr()?);
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    if args.report_budget {
        interop::server::serve_reporting_budget(listener, shutdown).await?;
    } else {
        interop::server::serve(listener, shutdown).await?;
    }
    Ok(())
}
