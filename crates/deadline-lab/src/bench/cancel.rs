//! Time from a client's explicit cancel to the last hop of client → A → B → C
//! noticing, ours vs plain tonic, interleaved in one process.

use std::time::Duration;

use probe::probe_client::ProbeClient;
use probe::probe_server::{Probe, ProbeServer};
use probe::{CallReply, CallRequest};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::service::Routes;
use tonic::{Request, Response, Status, Streaming};
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::net;
use crate::report::{Outcome, quantile};
use crate::systems::chain::{Hop, Next, Plan};

/// C: reports when it is entered and when it learns of the cancel.
#[derive(Debug, Clone)]
struct Watcher {
    ours: bool,
    entered: mpsc::UnboundedSender<()>,
    noticed: mpsc::UnboundedSender<Instant>,
}

/// Sends the time it is dropped: how plain tonic learns of a cancel.
struct DropClock(mpsc::UnboundedSender<Instant>);

impl Drop for DropClock {
    fn drop(&mut self) {
        let _ = self.0.send(Instant::now());
    }
}

type Never = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<CallReply, Status>> + Send>>;

#[tonic::async_trait]
impl Probe for Watcher {
    async fn call(&self, _: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        if self.ours {
            // The scope is what every piece of work under the request sees.
            let scope = Scope::current();
            let noticed = self.noticed.clone();
            tonic_deadline::detach(async move {
                scope.ended().await;
                let _ = noticed.send(Instant::now());
            });
            let _ = self.entered.send(());
            std::future::pending().await
        } else {
            let _clock = DropClock(self.noticed.clone());
            let _ = self.entered.send(());
            std::future::pending().await
        }
    }

    type WatchStream = Never;

    async fn watch(&self, _: Request<CallRequest>) -> Result<Response<Never>, Status> {
        Err(Status::unimplemented("not used"))
    }

    type ChatStream = Never;

    async fn chat(&self, _: Request<Streaming<CallRequest>>) -> Result<Response<Never>, Status> {
        Err(Status::unimplemented("not used"))
    }
}

struct Rig {
    entry: Next,
    entered: mpsc::UnboundedReceiver<()>,
    noticed: mpsc::UnboundedReceiver<Instant>,
}

async fn rig(ours: bool) -> anyhow::Result<Rig> {
    let (entered_tx, entered) = mpsc::unbounded_channel();
    let (noticed_tx, noticed) = mpsc::unbounded_channel();
    let layer = || ours.then(ServerDeadlineLayer::new);
    let watcher = Watcher {
        ours,
        entered: entered_tx,
        noticed: noticed_tx,
    };
    let mut addr = net::serve(
        "127.0.0.1:0",
        Routes::new(ProbeServer::new(watcher)),
        layer(),
    )
    .await?;
    for name in ["B", "A"] {
        let next = client(ours, addr).await?;
        addr = net::serve(
            "127.0.0.1:0",
            Hop::new(name, Plan::default(), Some(next)).routes(),
            layer(),
        )
        .await?;
    }
    Ok(Rig {
        entry: client(ours, addr).await?,
        entered,
        noticed,
    })
}

async fn client(ours: bool, addr: std::net::SocketAddr) -> anyhow::Result<Next> {
    Ok(if ours {
        Next::Layered(ProbeClient::new(net::connect_layered(addr).await?))
    } else {
        Next::Plain(ProbeClient::new(net::connect(addr).await?))
    })
}

/// One cancel: start a call, wait until C runs, cancel, time C noticing.
async fn once(rig: &mut Rig, ours: bool) -> anyhow::Result<Duration> {
    let entry = rig.entry.clone();
    let scope = Scope::background();
    let in_scope = scope.clone();
    let call =
        tonic_deadline::detach(
            async move { in_scope.enter(entry.call(CallRequest::default())).await },
        );
    rig.entered
        .recv()
        .await
        .ok_or_else(|| anyhow::anyhow!("C never ran"))?;
    let cancelled = Instant::now();
    if ours {
        scope.cancel();
    } else {
        call.abort();
    }
    let noticed = tokio::time::timeout(Duration::from_secs(5), rig.noticed.recv())
        .await?
        .ok_or_else(|| anyhow::anyhow!("C never noticed"))?;
    Ok(noticed.saturating_duration_since(cancelled))
}

/// The benchmark's result: from the client's cancel until C notices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cancel {
    /// Cancels per variant.
    pub runs: usize,
    /// Ours (C's scope ends), median, microseconds.
    pub p50_us: f64,
    /// Ours, 99th percentile.
    pub p99_us: f64,
    /// Plain tonic (C's handler dropped), median.
    pub plain_p50_us: f64,
    /// Plain tonic, 99th percentile.
    pub plain_p99_us: f64,
    /// The runtime's worker threads.
    pub threads: usize,
}

/// Runs `runs` cancels through each chain, alternating.
async fn run(runs: usize, threads: usize) -> anyhow::Result<Outcome> {
    let mut ours_rig = rig(true).await?;
    let mut plain_rig = rig(false).await?;
    // Warm-up: connections and code paths.
    for _ in 0..20 {
        once(&mut ours_rig, true).await?;
        once(&mut plain_rig, false).await?;
    }
    let (mut ours, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        ours.push(once(&mut ours_rig, true).await?.as_secs_f64() * 1e6);
        plain.push(once(&mut plain_rig, false).await?.as_secs_f64() * 1e6);
    }
    ours.sort_by(f64::total_cmp);
    plain.sort_by(f64::total_cmp);
    let (p50, p99) = (quantile(&ours, 0.5), quantile(&ours, 0.99));
    let (pp50, pp99) = (quantile(&plain, 0.5), quantile(&plain, 0.99));
    Ok(Outcome {
        title: format!(
            "bench cancel: client cancel -> C notices, client -> A -> B -> C on loopback, {runs} runs each, {threads} runtime thread(s)"
        ),
        json: crate::report::to_json(&Cancel {
            runs,
            p50_us: p50.round(),
            p99_us: p99.round(),
            plain_p50_us: pp50.round(),
            plain_p99_us: pp99.round(),
            threads,
        }),
        columns: vec!["variant", "p50 us", "p99 us", "grpc-go 1.33 (SPEC K)"],
        rows: vec![
            vec![
                "ours: C's scope ends".into(),
                format!("{p50:.0}"),
                format!("{p99:.0}"),
                "p50 320, p99 500".into(),
            ],
            vec![
                "plain tonic: C's handler dropped".into(),
                format!("{pp50:.0}"),
                format!("{pp99:.0}"),
                String::new(),
            ],
        ],
        notes: vec![format!(
            "p99 ratio ours/plain: {:.2} (goal <= 1.15, p99 < 500 us)",
            p99 / pp99
        )],
    })
}

/// Runs the benchmark on a runtime of its own with `threads` worker threads
/// (1: a current-thread runtime, where client, A, B and C share one scheduler
/// and the figure measures the protocol path rather than cross-thread
/// wake-ups; the same for both variants).
pub async fn run_on_own_runtime(runs: usize, threads: usize) -> anyhow::Result<Outcome> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let runtime = if threads <= 1 {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        } else {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .enable_all()
                .build()
        };
        let result = match runtime {
            Ok(runtime) => runtime.block_on(run(runs, threads.max(1))),
            Err(err) => Err(err.into()),
        };
        let _ = tx.send(result);
    });
    rx.await?
}
