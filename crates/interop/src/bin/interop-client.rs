//! The interop client, with the flags of gRPC's official interop clients.
//!
//! ```text
//! interop-client --server_host 127.0.0.1 --server_port 10000 --test_case=empty_unary,cancel_after_begin
//! ```
//!
//! Prints `PASS name` or `FAIL name: why` per case, then `N passed, N failed`;
//! exits non-zero if any case failed.

use clap::Parser;
use interop::client::{Clients, TestCase, run};

/// gRPC interop client on tonic + tonic-deadline.
#[derive(Debug, Parser)]
struct Args {
    /// Server host.
    #[arg(long = "server_host", default_value = "127.0.0.1")]
    server_host: String,
    /// Server port.
    #[arg(long = "server_port", default_value_t = 10000)]
    server_port: u16,
    /// Comma-separated cases, or `all`.
    #[arg(long = "test_case", value_delimiter = ',', default_value = "all")]
    test_case: Vec<String>,
    /// TLS is not supported; only `false` is accepted.
    #[arg(long = "use_tls", default_value = "false", value_parser = ["false"])]
    use_tls: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut cases = Vec::new();
    for name in &args.test_case {
        if name == "all" {
            cases.extend(TestCase::ALL);
        } else {
            cases.push(name.parse::<TestCase>()?);
        }
    }
    let mut clients = Clients::connect(&args.server_host, args.server_port).await?;
    let (mut passed, mut failed) = (0, 0);
    for case in cases {
        match run(case, &mut clients).await {
            Ok(()) => {
                passed += 1;
                println!("PASS {case}");
            }
            Err(e) => {
                failed += 1;
                println!("FAIL {case}: {e:#}");
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
