//! Memory per call in flight through one hop (client → server), ours vs
//! plain tonic: a proxy holds thousands of calls open, and each carries its
//! scope, its timers and our wrappers.
//!
//! Each variant runs in a child process of its own (this binary re-run
//! with a hidden `memory-child` command), so that one variant's freed
//! memory cannot serve the other's. The child warms its connections up with
//! calls that complete, reads its resident memory and its live heap, then
//! opens `calls` calls whose handler holds them until all have arrived,
//! reads both again, and lets them finish. Per call: the difference over
//! `calls`. Both sides of the hop are in the child, as in a proxy that is
//! a server and a client at once.
//!
//! | | ours | plain |
//! |---|---|---|
//! | client | `ClientDeadlineLayer` over a `ReadyChannel`, each call in a 60 s `Scope` | a tonic `Channel`, each call with `set_timeout(60 s)` |
//! | server | `ServerDeadlineLayer` | plain tonic |

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use testkit::{CallReply, CallRequest};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::kit::allocated::Allocated;
use crate::kit::ours_or_plain::Variant;
use crate::net;
use crate::registry::{Experiment, Kind, Spans};
use crate::report::Outcome;

/// Every call's budget: longer than any run, so no timer fires.
const BUDGET: Duration = Duration::from_secs(60);

/// Client connections the calls are spread over.
const CONNECTIONS: usize = 8;

/// What one child measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Held {
    /// Calls held open at once.
    pub calls: usize,
    /// Resident memory before the calls were opened and while all were
    /// held, bytes.
    pub rss_before: u64,
    /// See `rss_before`.
    pub rss_held: u64,
    /// Live heap bytes (allocated less freed), before and while held.
    pub heap_before: u64,
    /// See `heap_before`.
    pub heap_held: u64,
}

impl Held {
    fn rss_per_call(&self) -> f64 {
        self.rss_held.saturating_sub(self.rss_before) as f64 / self.calls.max(1) as f64
    }

    fn heap_per_call(&self) -> f64 {
        self.heap_held.saturating_sub(self.heap_before) as f64 / self.calls.max(1) as f64
    }
}

/// The result of `bench memory`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// Calls held open at once, in each variant.
    pub calls: usize,
    /// Resident memory per call in flight, ours.
    pub ours_bytes_per_call: f64,
    /// Resident memory per call in flight, plain tonic.
    pub plain_bytes_per_call: f64,
    /// `ours − plain`, resident.
    pub extra_bytes_per_call: f64,
    /// Live heap per call in flight, ours.
    pub ours_heap_bytes_per_call: f64,
    /// Live heap per call in flight, plain tonic.
    pub plain_heap_bytes_per_call: f64,
    /// What each child measured.
    pub ours: Held,
    /// See `ours`.
    pub plain: Held,
}

/// The flags of `bench memory`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Calls held open at once.
    #[arg(long, default_value_t = 10_000)]
    calls: usize,
}

impl Experiment for Memory {
    const NAME: &'static str = "memory";
    const ABOUT: &'static str = "Memory per call in flight through one hop, ours vs plain tonic";
    const PRINTS: &'static str =
        "resident memory and live heap per call in flight through one hop (10 000 calls held open by the handler), ours vs plain tonic, each in a child process of its own";
    const KIND: Kind = Kind::Bench;
    /// Run alone (`bench memory`), not in the demo.
    const IN_DEMO: bool = false;
    type Args = Args;

    async fn run(args: Args, _: Spans) -> anyhow::Result<Self> {
        // Runs child processes; no request is involved.
        #[allow(clippy::disallowed_methods)]
        tokio::task::spawn_blocking(move || measure(args.calls)).await?
    }

    fn outcome(&self) -> Outcome {
        let row = |name: &str, held: &Held| {
            vec![
                name.to_owned(),
                format!("{:.0}", held.rss_per_call()),
                format!("{:.0}", held.heap_per_call()),
                format!("{:.1}", held.rss_before as f64 / 1e6),
                format!("{:.1}", held.rss_held as f64 / 1e6),
            ]
        };
        Outcome {
            title: format!(
                "bench memory: {} calls held open through one hop (client and server in one process), per call",
                self.calls
            ),
            json: crate::report::to_json(self),
            columns: vec![
                "variant",
                "RSS bytes per call",
                "heap bytes per call",
                "RSS before MB",
                "RSS held MB",
            ],
            rows: vec![row("ours", &self.ours), row("plain tonic", &self.plain)],
            notes: vec![format!(
                "ours - plain: {:+.0} bytes of RSS, {:+.0} of heap per call in flight (goal: <= +1 KiB)",
                self.extra_bytes_per_call,
                self.ours_heap_bytes_per_call - self.plain_heap_bytes_per_call
            )],
        }
    }
}

/// Runs both variants, each in a child process.
///
/// # Errors
///
/// A child that fails or prints no result.
pub fn measure(calls: usize) -> anyhow::Result<Memory> {
    let exe = std::env::current_exe()?;
    let run = |variant: Variant| -> anyhow::Result<Held> {
        let output = Command::new(&exe)
            .args(["memory-child", "--variant"])
            .arg(variant.arg())
            .arg("--calls")
            .arg(calls.to_string())
            .stdin(Stdio::null())
            .output()?;
        anyhow::ensure!(
            output.status.success(),
            "memory child {variant:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        let last = stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last)
            .map_err(|e| anyhow::anyhow!("memory child printed {last:?}, not its result: {e}"))
    };
    let ours = run(Variant::Ours)?;
    let plain = run(Variant::Plain)?;
    Ok(Memory {
        calls,
        ours_bytes_per_call: ours.rss_per_call().round(),
        plain_bytes_per_call: plain.rss_per_call().round(),
        extra_bytes_per_call: (ours.rss_per_call() - plain.rss_per_call()).round(),
        ours_heap_bytes_per_call: ours.heap_per_call().round(),
        plain_heap_bytes_per_call: plain.heap_per_call().round(),
        ours,
        plain,
    })
}

/// The hidden `memory-child` command.
#[derive(Debug, Clone, clap::Args)]
pub struct ChildArgs {
    /// Ours or plain tonic.
    #[arg(long, value_enum)]
    pub variant: Variant,
    /// Calls to hold open at once.
    #[arg(long)]
    pub calls: usize,
}

/// Resident memory of this process, bytes (`/proc/self/statm`).
fn rss() -> anyhow::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("/proc/self/statm without a resident count: {statm}"))?;
    Ok(pages * 4096)
}

/// The server's handler: counts the calls that arrived and holds each
/// until released.
#[derive(Debug, Clone)]
struct Holder {
    arrived: Arc<AtomicUsize>,
    release: watch::Receiver<bool>,
}

#[tonic::async_trait]
impl testkit::CallOnly for Holder {
    async fn call(&self, _: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        self.arrived.fetch_add(1, Ordering::Relaxed);
        let mut release = self.release.clone();
        let _ = release.wait_for(|released| *released).await;
        Ok(Response::new(CallReply::default()))
    }
}

/// A client of one variant.
#[derive(Clone)]
enum Client {
    Ours(ProbeClient<net::Layered>),
    Plain(ProbeClient<tonic::transport::Channel>),
}

impl Client {
    async fn call(&mut self) -> Result<(), Status> {
        match self {
            Client::Ours(client) => Scope::background()
                .with_timeout(BUDGET)
                .enter(client.call(CallRequest::default()))
                .await
                .map(drop),
            Client::Plain(client) => {
                let mut request = Request::new(CallRequest::default());
                request.set_timeout(BUDGET);
                client.call(request).await.map(drop)
            }
        }
    }
}

/// Runs one variant and prints what it measured as its last line.
/// `allocated` reads the binary's allocation counters.
///
/// # Errors
///
/// A port that cannot be bound, or a call that fails.
pub fn child(args: ChildArgs, allocated: fn() -> Allocated) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let held = runtime.block_on(hold(&args, allocated))?;
    println!("{}", serde_json::to_string(&held)?);
    // Exit at once: the calls and connections need no orderly end.
    std::process::exit(0)
}

async fn hold(args: &ChildArgs, allocated: fn() -> Allocated) -> anyhow::Result<Held> {
    let ours = args.variant == Variant::Ours;
    let arrived = Arc::new(AtomicUsize::new(0));
    let (release, released) = watch::channel(false);
    let holder = Holder {
        arrived: arrived.clone(),
        release: released,
    };
    let layer = ours.then(ServerDeadlineLayer::new);
    let addr = net::serve_with(
        "127.0.0.1:0",
        Routes::new(ProbeServer::new(holder)),
        layer,
        net::Guard::LayerOnly,
    )
    .await?;
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(if ours {
            Client::Ours(ProbeClient::new(net::connect_layered(addr).await?))
        } else {
            Client::Plain(ProbeClient::new(net::connect(addr).await?))
        });
    }
    let heap = || {
        let a = allocated();
        a.bytes.saturating_sub(a.freed)
    };
    // Warm-up: as many calls as will be held, opened and released, so that
    // buffers, slabs and the allocator's pools have grown to their size.
    for round in 0..2 {
        let calls = open(&clients, args.calls);
        wait_for(&arrived, (round + 1) * args.calls).await?;
        release.send_replace(true);
        for call in calls {
            call.await??;
        }
        release.send_replace(false);
    }
    let (rss_before, heap_before) = (rss()?, heap());
    let calls = open(&clients, args.calls);
    wait_for(&arrived, 3 * args.calls).await?;
    let (rss_held, heap_held) = (rss()?, heap());
    release.send_replace(true);
    for call in calls {
        call.await??;
    }
    Ok(Held {
        calls: args.calls,
        rss_before,
        rss_held,
        heap_before,
        heap_held,
    })
}

/// Opens `calls` calls spread over `clients`, each on a task of its own.
fn open(clients: &[Client], calls: usize) -> Vec<tokio::task::JoinHandle<Result<(), Status>>> {
    (0..calls)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            // The load generator is no request's work.
            #[allow(clippy::disallowed_methods)]
            tokio::spawn(async move { client.call().await })
        })
        .collect()
}

/// Waits until `n` calls have arrived in all.
async fn wait_for(arrived: &AtomicUsize, n: usize) -> anyhow::Result<()> {
    let give_up = Instant::now() + Duration::from_secs(60);
    while arrived.load(Ordering::Relaxed) < n {
        anyhow::ensure!(
            Instant::now() < give_up,
            "only {} of {n} calls arrived within 60 s",
            arrived.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}
