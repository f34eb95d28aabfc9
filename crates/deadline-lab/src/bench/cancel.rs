//! Time from a client's explicit cancel to the last hop of client → A → B → C
//! noticing, ours vs plain tonic, interleaved in one process.
//!
//! Every variant is timed at the same event: C's handler being dropped
//! (hyper drops it when the reset reaches C). Ours also checks that C's
//! scope had ended by then, and times a task spawned under the scope
//! learning of it: the one thing plain tonic has no counterpart for, which
//! costs one more wake-up of a task and is reported on its own row.
//!
//! The client's call is also stamped when it is let go, and every hop's
//! handler when it is dropped unfinished, so the time splits into steps:
//! the client, then each hop (→ A, A → B, B → C), the same events for ours
//! and plain tonic.
//!
//! The client gives up in two ways. Plain tonic can only drop the call (the
//! task making it is aborted); ours is timed that way too, and with
//! `Scope::cancel`, where the call is woken and returns `CANCELLED` to its
//! caller before its stream is reset.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use testkit::{CallReply, CallRequest};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::server::NamedService;
use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tonic_deadline::{Scope, ServerDeadlineLayer};
use tower::Service;

use crate::net;
use crate::registry::{Experiment, Kind, Spans};
use crate::report::{Outcome, quantile};
use crate::systems::chain::{Hop, Next, Plan};

/// C: reports when it is entered and when it learns of the cancel.
#[derive(Debug, Clone)]
struct Watcher {
    ours: bool,
    entered: mpsc::UnboundedSender<()>,
    noticed: mpsc::UnboundedSender<Noticed>,
    spawned: mpsc::UnboundedSender<Instant>,
}

/// When C's handler was dropped, and (ours) whether its scope had ended by
/// then.
#[derive(Debug)]
struct Noticed {
    at: Instant,
    scope_ended: bool,
}

/// Sends the time it is dropped with the handler.
struct DropClock {
    scope: Option<Scope>,
    noticed: mpsc::UnboundedSender<Noticed>,
}

impl Drop for DropClock {
    fn drop(&mut self) {
        let at = Instant::now();
        let scope_ended = self.scope.as_ref().is_none_or(Scope::is_ended);
        let _ = self.noticed.send(Noticed { at, scope_ended });
    }
}

/// A hop (0: A, 1: B, 2: C) and when its handler was dropped unfinished;
/// or the client ([`CLIENT`]) and when its call was let go: dropped, or
/// answered to its caller.
type Stamp = (usize, Instant);

/// The client's place in a [`Stamp`].
const CLIENT: usize = 3;

/// The steps a cancel is timed in: the client, then each hop.
const STEPS: usize = 4;

/// A hop's service, stamping the moment its handler is dropped before it
/// answered.
#[derive(Debug, Clone)]
struct StampDrop<S> {
    inner: S,
    hop: usize,
    stamps: mpsc::UnboundedSender<Stamp>,
}

impl<S> StampDrop<S> {
    fn new(inner: S, hop: usize, stamps: &mpsc::UnboundedSender<Stamp>) -> Self {
        Self {
            inner,
            hop,
            stamps: stamps.clone(),
        }
    }
}

impl<S: NamedService> NamedService for StampDrop<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, R> Service<R> for StampDrop<S>
where
    S: Service<R>,
    S::Future: Unpin,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Stamped<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        Stamped {
            inner: Some(self.inner.call(request)),
            stamp: Some((self.hop, self.stamps.clone())),
            when_ready: false,
        }
    }
}

/// The future of [`StampDrop`]: dropped before it is ready, it drops the
/// handler and then stamps; `when_ready`, it stamps when ready too.
struct Stamped<F> {
    inner: Option<F>,
    stamp: Option<(usize, mpsc::UnboundedSender<Stamp>)>,
    when_ready: bool,
}

impl<F: Future + Unpin> Future for Stamped<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(inner) = self.inner.as_mut() else {
            panic!("Stamped polled after completion");
        };
        let polled = Pin::new(inner).poll(cx);
        if polled.is_ready() {
            self.inner = None;
            if !self.when_ready {
                self.stamp = None;
            }
        }
        polled
    }
}

impl<F> Drop for Stamped<F> {
    fn drop(&mut self) {
        drop(self.inner.take());
        if let Some((hop, stamps)) = self.stamp.take() {
            let _ = stamps.send((hop, Instant::now()));
        }
    }
}

#[tonic::async_trait]
impl testkit::CallOnly for Watcher {
    async fn call(&self, _: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        let scope = self.ours.then(Scope::current);
        if let Some(scope) = scope.clone() {
            // The scope is what every piece of work under the request sees.
            let spawned = self.spawned.clone();
            tonic_deadline::detach(async move {
                scope.ended().await;
                let _ = spawned.send(Instant::now());
            });
        }
        let _clock = DropClock {
            scope,
            noticed: self.noticed.clone(),
        };
        let _ = self.entered.send(());
        std::future::pending().await
    }
}

struct Rig {
    /// Both layers on every hop (else plain tonic).
    ours: bool,
    entry: Next,
    entered: mpsc::UnboundedReceiver<()>,
    noticed: mpsc::UnboundedReceiver<Noticed>,
    spawned: mpsc::UnboundedReceiver<Instant>,
    stamps: mpsc::UnboundedReceiver<Stamp>,
    stamps_tx: mpsc::UnboundedSender<Stamp>,
}

async fn rig(ours: bool) -> anyhow::Result<Rig> {
    let (entered_tx, entered) = mpsc::unbounded_channel();
    let (noticed_tx, noticed) = mpsc::unbounded_channel();
    let (spawned_tx, spawned) = mpsc::unbounded_channel();
    let (stamps_tx, stamps) = mpsc::unbounded_channel();
    let layer = || ours.then(ServerDeadlineLayer::new);
    let watcher = Watcher {
        ours,
        entered: entered_tx,
        noticed: noticed_tx,
        spawned: spawned_tx,
    };
    let mut addr = net::serve_with(
        "127.0.0.1:0",
        Routes::new(StampDrop::new(ProbeServer::new(watcher), 2, &stamps_tx)),
        layer(),
        net::Guard::LayerOnly,
    )
    .await?;
    for (name, hop) in [("B", 1), ("A", 0)] {
        let next = client(ours, addr).await?;
        let server = ProbeServer::new(Hop::new(name, Plan::default(), Some(next)));
        let hop = StampDrop::new(server, hop, &stamps_tx);
        addr = net::serve_with(
            "127.0.0.1:0",
            Routes::new(hop),
            layer(),
            net::Guard::LayerOnly,
        )
        .await?;
    }
    Ok(Rig {
        ours,
        entry: client(ours, addr).await?,
        entered,
        noticed,
        spawned,
        stamps,
        stamps_tx,
    })
}

async fn client(ours: bool, addr: std::net::SocketAddr) -> anyhow::Result<Next> {
    Ok(if ours {
        Next::Layered(ProbeClient::new(net::connect_layered(addr).await?))
    } else {
        Next::Plain(ProbeClient::new(net::connect(addr).await?))
    })
}

/// One cancel's timings, from the client's cancel.
struct Timed {
    /// Until C's handler was dropped (ours: with its scope ended).
    dropped: Duration,
    /// Ours: until a task spawned under C's scope learned of its end.
    spawned: Option<Duration>,
    /// Step by step: the give-up until the client's call was let go
    /// (dropped, or its status handed to its caller), then until A's
    /// handler was dropped, then B's, then C's.
    steps: [Duration; STEPS],
}

/// How the client gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GiveUp {
    /// `Scope::cancel` on the call's scope (ours only).
    Cancel,
    /// The task making the call is aborted: the call is dropped.
    Abort,
}

/// One cancel: start a call, wait until C runs, give up, time C noticing.
async fn once(rig: &mut Rig, give_up: GiveUp) -> anyhow::Result<Timed> {
    let entry = rig.entry.clone();
    let scope = Scope::background();
    let in_scope = scope.clone();
    let call = tonic_deadline::detach(Stamped {
        inner: Some(Box::pin(async move {
            in_scope.enter(entry.call(CallRequest::default())).await
        })),
        stamp: Some((CLIENT, rig.stamps_tx.clone())),
        when_ready: true,
    });
    rig.entered
        .recv()
        .await
        .ok_or_else(|| anyhow::anyhow!("C never ran"))?;
    while rig.stamps.try_recv().is_ok() {}
    let cancelled = Instant::now();
    match give_up {
        GiveUp::Cancel => scope.cancel(),
        GiveUp::Abort => call.abort(),
    }
    let noticed = tokio::time::timeout(Duration::from_secs(5), rig.noticed.recv())
        .await?
        .ok_or_else(|| anyhow::anyhow!("C never noticed"))?;
    anyhow::ensure!(
        noticed.scope_ended,
        "C's handler was dropped before its scope ended"
    );
    let spawned = if rig.ours {
        let at = tokio::time::timeout(Duration::from_secs(5), rig.spawned.recv())
            .await?
            .ok_or_else(|| anyhow::anyhow!("the task spawned under C's scope never noticed"))?;
        Some(at.saturating_duration_since(cancelled))
    } else {
        None
    };
    let mut at = [None; STEPS];
    while at.iter().any(Option::is_none) {
        let (hop, when) = tokio::time::timeout(Duration::from_secs(5), rig.stamps.recv())
            .await?
            .ok_or_else(|| anyhow::anyhow!("a step was never stamped"))?;
        at[hop] = Some(when);
    }
    let [Some(a), Some(b), Some(c), Some(client)] = at else {
        anyhow::bail!("the loop ends only once every step is stamped");
    };
    Ok(Timed {
        dropped: noticed.at.saturating_duration_since(cancelled),
        spawned,
        steps: [
            client.saturating_duration_since(cancelled),
            a.saturating_duration_since(client),
            b.saturating_duration_since(a),
            c.saturating_duration_since(b),
        ],
    })
}

/// The benchmark's result: from the client's cancel until C notices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cancel {
    /// Cancels per variant.
    pub runs: usize,
    /// Ours (C's scope ended and its handler dropped), median, microseconds.
    pub p50_us: f64,
    /// Ours, 99th percentile.
    pub p99_us: f64,
    /// Ours, the client's task aborted as plain tonic's is: C's scope
    /// ended and its handler dropped, median.
    pub aborted_p50_us: f64,
    /// The same, 99th percentile.
    pub aborted_p99_us: f64,
    /// Ours: a task spawned under C's scope learns of its end, median.
    pub spawned_p50_us: f64,
    /// The same, 99th percentile.
    pub spawned_p99_us: f64,
    /// Plain tonic (C's handler dropped), median.
    pub plain_p50_us: f64,
    /// Plain tonic, 99th percentile.
    pub plain_p99_us: f64,
    /// Ours with `Scope::cancel`, each step's median, microseconds: the
    /// cancel until the client's call was let go (its status handed to its
    /// caller), then until A's handler was dropped, then B's, then C's.
    pub steps_p50_us: [f64; STEPS],
    /// The same, ours with the call's task aborted (the call let go: its
    /// future dropped).
    pub aborted_steps_p50_us: [f64; STEPS],
    /// The same, plain tonic.
    pub plain_steps_p50_us: [f64; STEPS],
    /// The runtime's worker threads.
    pub threads: usize,
    /// Ours aborted ÷ plain tonic aborted, at the same event (C's handler
    /// dropped), medians.
    pub aborted_vs_plain_p50: f64,
    /// The same, 99th percentiles.
    pub aborted_vs_plain_p99: f64,
    /// Ours with `Scope::cancel` ÷ plain tonic aborted, medians.
    pub cancel_vs_plain_p50: f64,
    /// The same, 99th percentiles.
    pub cancel_vs_plain_p99: f64,
}

/// The flags of `bench cancel`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[arg(long, default_value_t = 1000)]
    runs: usize,
    /// Runtime worker threads; 1 runs everything on one scheduler thread.
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

/// Runs `runs` cancels through each chain, alternating.
async fn measure(runs: usize, threads: usize) -> anyhow::Result<Cancel> {
    let mut ours_rig = rig(true).await?;
    let mut plain_rig = rig(false).await?;
    // Warm-up: connections and code paths.
    for _ in 0..20 {
        once(&mut ours_rig, GiveUp::Cancel).await?;
        once(&mut ours_rig, GiveUp::Abort).await?;
        once(&mut plain_rig, GiveUp::Abort).await?;
    }
    // By variant: ours with `Scope::cancel`, ours aborted, plain aborted.
    let mut dropped: [Vec<f64>; 3] = Default::default();
    let mut steps: [[Vec<f64>; STEPS]; 3] = Default::default();
    let mut spawned = Vec::new();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    // The variants take turns at going first: a cancel right after one
    // through the other chain finds that chain's code and data out of the
    // caches, and is several microseconds slower for it (with a fixed
    // order, ours aborted always followed ours cancelled, and read 1.03 to
    // 1.09 × plain tonic, which always came after ours; in turns, 1.1).
    for run in 0..runs {
        for variant in (0..3).map(|k| (run + k) % 3) {
            let timed = match variant {
                0 => once(&mut ours_rig, GiveUp::Cancel).await?,
                1 => once(&mut ours_rig, GiveUp::Abort).await?,
                _ => once(&mut plain_rig, GiveUp::Abort).await?,
            };
            dropped[variant].push(us(timed.dropped));
            if variant == 0 {
                spawned.extend(timed.spawned.map(us));
            }
            for (step, took) in steps[variant].iter_mut().zip(timed.steps) {
                step.push(us(took));
            }
        }
    }
    for figures in dropped
        .iter_mut()
        .chain(steps.iter_mut().flatten())
        .chain([&mut spawned])
    {
        figures.sort_by(f64::total_cmp);
    }
    // Medians to a tenth of a microsecond: a hop takes a few tens.
    let step_p50 = |variant: &[Vec<f64>; STEPS]| {
        variant
            .each_ref()
            .map(|step| (quantile(step, 0.5) * 10.0).round() / 10.0)
    };
    let [sc, sa, sp] = steps.each_ref().map(step_p50);
    let [ours, aborted, plain] = &dropped;
    let (p50, p99) = (quantile(ours, 0.5), quantile(ours, 0.99));
    let (ap50, ap99) = (quantile(aborted, 0.5), quantile(aborted, 0.99));
    let (sp50, sp99) = (quantile(&spawned, 0.5), quantile(&spawned, 0.99));
    let (pp50, pp99) = (quantile(plain, 0.5), quantile(plain, 0.99));
    Ok(Cancel {
        runs,
        p50_us: p50.round(),
        p99_us: p99.round(),
        aborted_p50_us: ap50.round(),
        aborted_p99_us: ap99.round(),
        spawned_p50_us: sp50.round(),
        spawned_p99_us: sp99.round(),
        plain_p50_us: pp50.round(),
        plain_p99_us: pp99.round(),
        steps_p50_us: sc,
        aborted_steps_p50_us: sa,
        plain_steps_p50_us: sp,
        threads,
        aborted_vs_plain_p50: ap50 / pp50,
        aborted_vs_plain_p99: ap99 / pp99,
        cancel_vs_plain_p50: p50 / pp50,
        cancel_vs_plain_p99: p99 / pp99,
    })
}

/// Runs the benchmark on a runtime of its own with `threads` worker threads
/// (1: a current-thread runtime, where client, A, B and C share one scheduler
/// and the figure measures the protocol path rather than cross-thread
/// wake-ups; the same for both variants).
pub async fn run_on_own_runtime(runs: usize, threads: usize) -> anyhow::Result<Cancel> {
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
            Ok(runtime) => runtime.block_on(measure(runs, threads.max(1))),
            Err(err) => Err(err.into()),
        };
        let _ = tx.send(result);
    });
    rx.await?
}

impl Experiment for Cancel {
    const NAME: &'static str = "cancel";
    const ABOUT: &'static str = "Cancel propagation latency across three hops";
    const PRINTS: &'static str =
        "client gives up → last hop's handler dropped (and its scope ended), p50/p99: ours with the call's task aborted and with `Scope::cancel`, vs plain tonic aborted; when a task spawned under the last hop's scope learns";
    const KIND: Kind = Kind::Bench;
    type Args = Args;

    async fn run(args: Args, _: Spans) -> anyhow::Result<Self> {
        run_on_own_runtime(args.runs, args.threads).await
    }

    fn outcome(&self) -> Outcome {
        let row = |variant: &str, p50: f64, p99: f64, go: &str| {
            vec![
                variant.to_owned(),
                format!("{p50:.0}"),
                format!("{p99:.0}"),
                go.to_owned(),
            ]
        };
        Outcome {
            title: format!(
                "bench cancel: client gives up -> C notices, client -> A -> B -> C on loopback, {} runs each, {} runtime thread(s)",
                self.runs, self.threads
            ),
            json: crate::report::to_json(self),
            columns: vec!["variant", "p50 us", "p99 us", "grpc-go 1.33 (SPEC K)"],
            rows: vec![
                row(
                    "ours, Scope::cancel: C's scope ended, its handler dropped",
                    self.p50_us,
                    self.p99_us,
                    "p50 320, p99 500",
                ),
                row(
                    "ours, Scope::cancel: a task spawned under C's scope learns",
                    self.spawned_p50_us,
                    self.spawned_p99_us,
                    "",
                ),
                row(
                    "ours, call task aborted: C's scope ended, its handler dropped",
                    self.aborted_p50_us,
                    self.aborted_p99_us,
                    "",
                ),
                row(
                    "plain tonic, call task aborted: C's handler dropped",
                    self.plain_p50_us,
                    self.plain_p99_us,
                    "",
                ),
            ],
            notes: vec![
                format!(
                    "each step's median, us (give-up -> client's call let go -> A's handler dropped -> B's -> C's): ours Scope::cancel {}, ours aborted {}, plain tonic aborted {}",
                    steps_line(self.steps_p50_us),
                    steps_line(self.aborted_steps_p50_us),
                    steps_line(self.plain_steps_p50_us)
                ),
                format!(
                    "ratio ours/plain, both aborted, at the same event (C's handler dropped): p50 {:.2}, p99 {:.2} (goal <= 1.10)",
                    self.aborted_vs_plain_p50, self.aborted_vs_plain_p99
                ),
                format!(
                    "ratio ours with Scope::cancel / plain aborted: p50 {:.2}, p99 {:.2} (the call also returns CANCELLED to its caller; p99 < 500 us)",
                    self.cancel_vs_plain_p50, self.cancel_vs_plain_p99
                ),
            ],
        }
    }
}

/// The steps' medians as `client / a / b / c`.
fn steps_line(steps: [f64; STEPS]) -> String {
    steps.map(|us| format!("{us:.1}")).join(" / ")
}
