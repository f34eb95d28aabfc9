//! The middle hop of the mixed-language chains.
//!
//! ```text
//! interop-relay --port 0 --downstream 127.0.0.1:50052
//! ```
//!
//! Listens on loopback only. The first line on stdout is `listening on ADDR`.
//! With `--service_config JSON` the relay's calls downstream go through a
//! `ResilienceLayer` configured by it (one retry budget for the chain, or
//! retries at this hop alone with `--per_hop_retries`). With
//! `--reply_reserve_ms N` it answers `N` ms before its deadline (at most a
//! twentieth of the budget): its `DEADLINE_EXCEEDED`, with its ledger, then
//! reaches the caller before the caller's own timer. With
//! `--default_reply_reserve` it keeps the layer's default
//! (`server::default_reply_reserve`), as a user who sets nothing does.
//! `--downstream` given more than once (with `--service_config`) names
//! replicas of the downstream, called in turn through
//! `tonic_deadline::client::Balanced`: a retry goes to another replica than
//! the one that failed.

use clap::Parser;

/// conformance.relay.Relay on tonic + tonic-deadline, forwarding to one
/// downstream `conformance.relay.Downstream`.
#[derive(Debug, Parser)]
struct Args {
    /// Port to listen on, on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// The downstream service, `host:port`; more than once: its replicas
    /// (with `--service_config`).
    #[arg(long, required = true)]
    downstream: Vec<String>,
    /// A gRPC service config for the calls downstream (retries).
    #[arg(long = "service_config")]
    service_config: Option<String>,
    /// With `--service_config`: retry at this hop without telling the
    /// caller the retries were spent (`ResilienceLayer::chain_budget(false)`).
    #[arg(long = "per_hop_retries")]
    per_hop_retries: bool,
    /// Answer this many milliseconds before the deadline
    /// (`ServerDeadlineLayer::reply_reserve`).
    #[arg(long = "reply_reserve_ms", default_value_t = 0)]
    reply_reserve_ms: u64,
    /// Keep the server layer's default reserve, as a user who sets nothing
    /// does (instead of `--reply_reserve_ms`).
    #[arg(long = "default_reply_reserve", conflicts_with = "reply_reserve_ms")]
    default_reply_reserve: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let relay = match (&args.service_config, args.downstream.as_slice()) {
        (None, [one]) => interop::relay::Relay::connect_lazy(one)?,
        (None, _) => anyhow::bail!("replicas (--downstream more than once) need --service_config"),
        (Some(json), replicas) => {
            let resilience =
                tonic_deadline::resilience::ResilienceLayer::from_service_config(json)?
                    .chain_budget(!args.per_hop_retries);
            match replicas {
                [one] => interop::relay::Relay::connect_lazy_with(one, &resilience)?,
                _ => interop::relay::Relay::connect_lazy_balanced(replicas, &resilience)?,
            }
        }
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    println!("listening on {}", listener.local_addr()?);
    let layer = tonic_deadline::ServerDeadlineLayer::new();
    let layer = if args.default_reply_reserve {
        layer
    } else {
        layer.reply_reserve(std::time::Duration::from_millis(args.reply_reserve_ms))
    };
    interop::relay::serve_with(listener, relay, layer, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
