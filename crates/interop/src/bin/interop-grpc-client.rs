//! The deadline and cancel cases through the official `grpc` crate's
//! client under `grpc-deadline-grpc`'s interceptor, with the flags of
//! gRPC's official interop clients.
//!
//! ```text
//! interop-grpc-client --server_port 10000 --test_case=timeout_on_sleeping_server,cancel_after_begin
//! interop-grpc-client --server_port 50052 --test_case=downstream_budget --budget_ms 500 --tag t1
//! ```
//!
//! Prints `PASS name` or `FAIL name: why` per case, what the interceptor
//! counted, then `N passed, N failed`; exits non-zero if any case failed.

use std::time::Duration;

use clap::Parser;
use interop::grpc_crate::{Case, Client, run};

/// gRPC interop cases on the grpc crate + grpc-deadline-grpc.
#[derive(Debug, Parser)]
struct Args {
    /// Server host (an IP address).
    #[arg(long = "server_host", default_value = "127.0.0.1")]
    server_host: String,
    /// Server port.
    #[arg(long = "server_port", default_value_t = 10000)]
    server_port: u16,
    /// Comma-separated cases.
    #[arg(
        long = "test_case",
        value_delimiter = ',',
        default_value = "timeout_on_sleeping_server,cancel_after_begin"
    )]
    test_case: Vec<Case>,
    /// `downstream_budget`: the scope's budget.
    #[arg(long = "budget_ms", default_value_t = 500)]
    budget_ms: u64,
    /// `downstream_budget`: the tag the server reports under.
    #[arg(long, default_value = "grpc-crate")]
    tag: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = Client::connect(&args.server_host, args.server_port).await?;
    let budget = Duration::from_millis(args.budget_ms);
    let (mut passed, mut failed) = (0, 0);
    for case in args.test_case {
        match run(case, &client, budget, &args.tag).await {
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
    let stats = client.interceptor().stats();
    println!(
        "interceptor: {} refused expired, {} cancels not carried to the server",
        stats.refused_expired(),
        stats.cancels_not_reset()
    );
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
