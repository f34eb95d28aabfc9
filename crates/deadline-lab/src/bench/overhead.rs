//! Unary echo throughput and latency: plain tonic vs tonic with both layers.

use std::time::Duration;

use testkit::CallRequest;
use testkit::probe_client::ProbeClient;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic_deadline::ServerDeadlineLayer;

use crate::net::{self, Layered};
use crate::registry::{Experiment, Kind, Spans};
use crate::report::{Outcome, quantile};
use crate::systems::chain::{Hop, Plan};

/// How hard and how long to run.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Connections per variant.
    pub connections: usize,
    /// Calls in flight per connection.
    pub streams: usize,
    /// Rounds per variant; the variants alternate round by round.
    pub rounds: usize,
    /// Length of one round.
    pub round: Duration,
}

impl Default for Load {
    fn default() -> Self {
        Self {
            connections: 4,
            streams: 16,
            rounds: 8,
            round: Duration::from_millis(500),
        }
    }
}

#[derive(Clone)]
enum Client {
    Plain(ProbeClient<Channel>),
    Layered(ProbeClient<Layered>),
}

impl Client {
    async fn echo(&mut self) -> bool {
        let mut request = tonic::Request::new(CallRequest::default());
        // The same per-call deadline for both, so both pay for a timer.
        request.set_timeout(Duration::from_secs(1));
        match self {
            Client::Plain(c) => c.call(request).await.is_ok(),
            Client::Layered(c) => c.call(request).await.is_ok(),
        }
    }
}

#[derive(Default)]
struct Tally {
    calls: u64,
    failed: u64,
    busy: Duration,
    latencies_us: Vec<f64>,
}

async fn round(clients: &[Client], streams: usize, length: Duration, tally: &mut Tally) {
    let end = Instant::now() + length;
    let mut tasks = Vec::new();
    for client in clients {
        for _ in 0..streams {
            let mut client = client.clone();
            tasks.push(tonic_deadline::detach(async move {
                let mut lat = Vec::new();
                let mut failed = 0u64;
                while Instant::now() < end {
                    let t = Instant::now();
                    if !client.echo().await {
                        failed += 1;
                    }
                    lat.push(t.elapsed().as_secs_f64() * 1e6);
                }
                (lat, failed)
            }));
        }
    }
    let started = Instant::now();
    for task in tasks {
        if let Ok((lat, failed)) = task.await {
            tally.calls += lat.len() as u64;
            tally.failed += failed;
            tally.latencies_us.extend(lat);
        }
    }
    tally.busy += started.elapsed();
}

/// The benchmark's result: plain tonic and tonic with both layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Overhead {
    /// Plain tonic, calls per second.
    pub plain_rps: f64,
    /// With both layers, calls per second.
    pub layered_rps: f64,
    /// `layered_rps / plain_rps`.
    pub ratio: f64,
    /// Plain tonic's median latency, microseconds.
    pub plain_p50_us: f64,
    /// With both layers, median latency.
    pub layered_p50_us: f64,
    /// Calls in flight (connections × streams).
    pub concurrency: usize,
    /// Plain calls that failed.
    pub plain_failed: u64,
    /// Layered calls that failed.
    pub layered_failed: u64,
    /// Connections per variant.
    pub connections: usize,
    /// Calls in flight per connection.
    pub streams: usize,
    /// Rounds per variant.
    pub rounds: usize,
    /// Length of one round, in milliseconds.
    pub round_ms: u64,
}

/// The flags of `bench overhead`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[arg(long, default_value_t = 8)]
    rounds: usize,
    #[arg(long, default_value_t = 500)]
    round_ms: u64,
}

/// Runs both variants, round by round.
///
/// # Errors
///
/// When a server cannot be started or connected to.
pub async fn measure(load: Load) -> anyhow::Result<Overhead> {
    let plain_addr = net::serve_with(
        "127.0.0.1:0",
        Hop::new("plain", Plan::default(), None).routes(),
        None,
        net::Guard::LayerOnly,
    )
    .await?;
    let ours_addr = net::serve_with(
        "127.0.0.1:0",
        Hop::new("ours", Plan::default(), None).routes(),
        Some(ServerDeadlineLayer::new()),
        net::Guard::LayerOnly,
    )
    .await?;
    let mut plain = Vec::new();
    let mut ours = Vec::new();
    for _ in 0..load.connections {
        plain.push(Client::Plain(ProbeClient::new(
            net::connect(plain_addr).await?,
        )));
        ours.push(Client::Layered(ProbeClient::new(
            net::connect_layered(ours_addr).await?,
        )));
    }
    // Warm both up before measuring.
    let warm = Duration::from_millis(200);
    round(&plain, load.streams, warm, &mut Tally::default()).await;
    round(&ours, load.streams, warm, &mut Tally::default()).await;

    let (mut p, mut o) = (Tally::default(), Tally::default());
    for i in 0..load.rounds {
        // ABBA order, so slow drift of the machine hits both alike.
        if i % 2 == 0 {
            round(&plain, load.streams, load.round, &mut p).await;
            round(&ours, load.streams, load.round, &mut o).await;
        } else {
            round(&ours, load.streams, load.round, &mut o).await;
            round(&plain, load.streams, load.round, &mut p).await;
        }
    }
    let rps = |t: &Tally| t.calls as f64 / t.busy.as_secs_f64();
    let p50 = |t: &mut Tally| {
        t.latencies_us.sort_by(f64::total_cmp);
        quantile(&t.latencies_us, 0.5)
    };
    let (plain_rps, layered_rps) = (rps(&p), rps(&o));
    let (plain_p50, layered_p50) = (p50(&mut p), p50(&mut o));
    let ratio = layered_rps / plain_rps;
    Ok(Overhead {
        plain_rps: plain_rps.round(),
        layered_rps: layered_rps.round(),
        ratio: (ratio * 1000.0).round() / 1000.0,
        plain_p50_us: plain_p50.round(),
        layered_p50_us: layered_p50.round(),
        concurrency: load.connections * load.streams,
        plain_failed: p.failed,
        layered_failed: o.failed,
        connections: load.connections,
        streams: load.streams,
        rounds: load.rounds,
        round_ms: load.round.as_millis() as u64,
    })
}

impl Experiment for Overhead {
    const NAME: &'static str = "overhead";
    const ABOUT: &'static str = "Unary throughput and latency, plain tonic vs both layers";
    const PRINTS: &'static str =
        "unary throughput and p50, plain tonic vs both layers, interleaved";
    const KIND: Kind = Kind::Bench;
    type Args = Args;

    /// Half the rounds of `bench overhead`, to keep the demo short.
    fn demo_args() -> Args {
        Args {
            rounds: 4,
            round_ms: 500,
        }
    }

    async fn run(args: Args, _: Spans) -> anyhow::Result<Self> {
        measure(Load {
            rounds: args.rounds,
            round: Duration::from_millis(args.round_ms),
            ..Default::default()
        })
        .await
    }

    fn outcome(&self) -> Outcome {
        Outcome {
            title: format!(
                "bench overhead: unary echo, {} connections x {} streams, {} alternating rounds of {} ms",
                self.connections, self.streams, self.rounds, self.round_ms
            ),
            json: crate::report::to_json(self),
            columns: vec!["variant", "req/s", "p50 us", "failed"],
            rows: vec![
                vec![
                    "plain tonic".into(),
                    format!("{:.0}", self.plain_rps),
                    format!("{:.0}", self.plain_p50_us),
                    self.plain_failed.to_string(),
                ],
                vec![
                    "tonic + both layers".into(),
                    format!("{:.0}", self.layered_rps),
                    format!("{:.0}", self.layered_p50_us),
                    self.layered_failed.to_string(),
                ],
            ],
            notes: vec![format!(
                "ratio layered/plain throughput: {:.3} (goal >= 0.97)",
                self.ratio
            )],
        }
    }
}
