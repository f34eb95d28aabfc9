//! Sends every hostile `grpc-timeout` row to a gRPC server over raw HTTP/2
//! and prints what it answered beside what the spec requires.
//!
//! ```text
//! interop-hostile --server_host 127.0.0.1 --server_port 10000 [--strict]
//! ```
//!
//! Each row, then a plain request on the same connection, which must still be
//! answered. With `--strict` the exit code is non-zero unless every row is
//! answered as the spec requires; without it the table only describes a
//! foreign server. A server that does not report its handler's budget (only
//! ours does, with `interop-server --report_budget`) is held to the status
//! code alone.

use clap::Parser;
use interop::hostile::{Connection, Expect, table};

/// Hostile grpc-timeout values against any gRPC server.
#[derive(Debug, Parser)]
struct Args {
    /// Server host (an IP address).
    #[arg(long = "server_host", default_value = "127.0.0.1")]
    server_host: String,
    /// Server port.
    #[arg(long = "server_port")]
    server_port: u16,
    /// Fail unless every row matches the spec.
    #[arg(long)]
    strict: bool,
    /// Open a new connection for every row.
    #[arg(long = "fresh_connection")]
    fresh_connection: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let addr = format!("{}:{}", args.server_host, args.server_port).parse()?;
    let mut connection = Connection::open(addr).await?;
    let (mut passed, mut failed) = (0, 0);
    println!("| grpc-timeout | origin | spec | answer | then a plain call |");
    println!("|---|---|---|---|---|");
    for row in table() {
        if args.fresh_connection {
            connection = Connection::open(addr).await?;
        }
        let answer = connection.call(&row.values).await;
        let verdict = match &answer {
            Ok(answer) => row.check_code(answer),
            Err(e) => Err(format!("{e:#}")),
        };
        let follow = match connection.call(&[]).await {
            Ok(a) if a.code == Some(tonic::Code::Ok) => "OK".to_owned(),
            Ok(a) => a.to_string(),
            Err(e) => {
                // The connection is gone: open a new one for the next row.
                connection = Connection::open(addr).await?;
                format!("connection lost: {e:#}")
            }
        };
        let spec = match row.expect {
            Expect::Internal => "INTERNAL".to_owned(),
            Expect::Expired => "DEADLINE_EXCEEDED".to_owned(),
            Expect::NoDeadline => "OK, no deadline".to_owned(),
            Expect::Budget(d) => format!("OK, deadline {d:?}"),
        };
        let shown = match &answer {
            Ok(answer) => answer.to_string(),
            Err(e) => format!("error: {e:#}"),
        };
        let mark = if verdict.is_ok() && follow == "OK" {
            passed += 1;
            ""
        } else {
            failed += 1;
            " (differs)"
        };
        println!(
            "| `{}` | {} | {spec} | {shown}{mark} | {follow} |",
            row.shown(),
            row.origin
        );
    }
    println!("{passed} passed, {failed} failed");
    if args.strict && failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
