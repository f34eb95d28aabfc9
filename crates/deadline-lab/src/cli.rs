//! The `deadline-lab` command line: its arguments and what each command runs.
//!
//! It lives in the library, not in the binary, so that the futures it awaits
//! are compiled once: a release binary instantiates again every generic
//! future it polls that the library already compiled.

use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::registry::{self, Params, Spans};
use crate::report::Outcome;
use crate::{bench, experiments, systems};

/// The command line, as clap describes it (its subcommands and their help).
pub fn command() -> clap::Command {
    Cli::command()
}

#[derive(Debug, Parser)]
#[command(
    name = "deadline-lab",
    about = "Measures deadline propagation and cancellation on real gRPC services"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs every experiment and benchmark, prints the tables and writes an
    /// HTML report.
    Demo {
        /// Where to write the HTML report.
        #[arg(long, default_value = "target/deadline-lab/report.html")]
        report: std::path::PathBuf,
    },
    /// A TCP proxy that prints every HTTP/2 frame going through it, both ways.
    Capture {
        /// Where to listen (the first line printed is the bound address).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// The server to forward to.
        #[arg(long)]
        upstream: std::net::SocketAddr,
        /// Delay each chunk the client sends by this many milliseconds.
        #[arg(long, default_value_t = 0)]
        delay_ms: u64,
        /// Delay each chunk the server sends back by this many milliseconds.
        #[arg(long, default_value_t = 0)]
        reply_delay_ms: u64,
        /// One JSON object per line instead of text.
        #[arg(long)]
        json: bool,
        /// Print only the address: forward (and delay) without decoding.
        #[arg(long)]
        quiet: bool,
    },
    /// Serves one of the systems until killed; the first line is its address.
    Serve {
        #[command(subcommand)]
        system: System,
        /// Serve the metrics of every layer at `http://ADDR/metrics`
        /// (Prometheus text); the second line names the address.
        #[arg(long, global = true, value_name = "ADDR")]
        metrics_listen: Option<String>,
        /// Export spans over OTLP/gRPC to this collector (`http://HOST:PORT`).
        #[arg(long, global = true)]
        otlp_endpoint: Option<String>,
    },
    /// Runs one experiment.
    Experiment {
        #[command(subcommand)]
        which: Experiment,
        /// Print exactly one JSON object instead of the table.
        #[arg(long, global = true)]
        json: bool,
        /// Export spans over OTLP/gRPC to this collector (`http://HOST:PORT`).
        #[arg(long, global = true)]
        otlp_endpoint: Option<String>,
    },
    /// Runs one benchmark (plain tonic and ours, interleaved in one process).
    Bench {
        #[command(subcommand)]
        which: Bench,
        /// Print exactly one JSON object instead of the table.
        #[arg(long, global = true)]
        json: bool,
    },
    /// One side of one `bench instructions` variant (run by the bench itself).
    #[command(hide = true)]
    BenchChild(bench::instructions::ChildArgs),
    /// One variant of `bench memory` (run by the bench itself).
    #[command(hide = true)]
    MemoryChild(bench::memory::ChildArgs),
}

#[derive(Debug, Subcommand)]
enum System {
    /// A → B → C, each spending `--hop-ms` before calling the next.
    Chain {
        /// A's address (or the role's, with `--role`).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        #[arg(long, default_value_t = 100)]
        hop_ms: u64,
        /// Run only this hop (A, B or C); it calls `--next`.
        #[arg(long)]
        role: Option<String>,
        /// The address of the hop this one calls.
        #[arg(long)]
        next: Option<std::net::SocketAddr>,
        /// Transit compensation: tell the next hop this many milliseconds
        /// less than what is left (0: none).
        #[arg(long, default_value_t = 0)]
        transit_allowance_ms: u64,
        /// Transit compensation: half the round trip measured with HTTP/2
        /// PINGs on the connection to the next hop.
        #[arg(long)]
        transit_from_round_trip: bool,
    },
    /// grpc.health.v1.Health/Check, as the README serves it (the reset
    /// guard and our server layer), plain tonic with `--plain`, the layer
    /// without the guard with `--layer-only`.
    Echo {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        #[arg(long)]
        plain: bool,
        #[arg(long, conflicts_with = "plain")]
        layer_only: bool,
    },
    /// The IM chain gateway → logic → route / push (roles: push, route, logic, gateway).
    Im(Split),
    /// The API in front of inventory, pricing and cache (roles: inventory, pricing, cache, api).
    Shop(Split),
    /// Orders (SQLite) calling payments (roles: payments, orders).
    Orders {
        #[command(flatten)]
        split: Split,
        /// An SQLite file instead of the in-memory database.
        #[arg(long)]
        db: Option<std::path::PathBuf>,
    },
    /// One worker of the PostgreSQL job queue (no address; first line:
    /// `ready NAME`).
    JobsWorker {
        /// The PostgreSQL server holding the queue.
        #[arg(long)]
        pg_url: String,
        /// The queue's table (effects go to `<table>_effects`).
        #[arg(long, default_value = "lab_jobs")]
        table: String,
        /// The name this worker's effects carry.
        #[arg(long)]
        name: String,
        /// How long a claim stands without renewal.
        #[arg(long, default_value_t = 600)]
        lease_ms: u64,
        /// How long each job works.
        #[arg(long, default_value_t = 100)]
        job_ms: u64,
    },
}

/// Where a system listens, and which part of it runs in this process.
#[derive(Debug, clap::Args)]
struct Split {
    /// The entry service's address (or the role's, with `--role`).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Run only this service; the services it calls come from `--peer`.
    #[arg(long)]
    role: Option<String>,
    /// `name=addr` of a service this role calls (repeatable).
    #[arg(long = "peer")]
    peers: Vec<String>,
    /// Transit compensation: tell every peer this many milliseconds less
    /// than what is left (0: none).
    #[arg(long, default_value_t = 0)]
    transit_allowance_ms: u64,
    /// Transit compensation: half the round trip measured with HTTP/2 PINGs
    /// on each peer's connection.
    #[arg(long)]
    transit_from_round_trip: bool,
    /// What each service keeps of its budget for its answer's way back, in
    /// milliseconds (`ServerDeadlineLayer::reply_reserve`; 0: none), so
    /// that a DEADLINE_EXCEEDED and its ledger reach the caller in time.
    #[arg(long, default_value_t = 0)]
    reply_reserve_ms: u64,
}

impl Split {
    fn peers(&self) -> anyhow::Result<systems::Peers> {
        Ok(
            systems::Peers::parse(self.peers.iter().map(String::as_str))?.with_transit(
                crate::net::Transit::from_flags(
                    self.transit_allowance_ms,
                    self.transit_from_round_trip,
                ),
            ),
        )
    }
}

/// One subcommand per experiment of the registry, for its flags; what each
/// does and how it runs are the registry's (`crate::registry`).
#[derive(Debug, Subcommand)]
enum Experiment {
    #[command(about = about("wire"))]
    Wire,
    #[command(about = about("chain"))]
    Chain {
        #[arg(long, default_value_t = experiments::chain::DEFAULT_HOP_MS)]
        hop_ms: u64,
    },
    #[command(about = about("propagation"))]
    Propagation,
    #[command(about = about("expired"))]
    Expired,
    #[command(about = about("db-cancel"))]
    DbCancel,
    #[command(about = about("handler"))]
    Handler,
    #[command(about = about("drift"))]
    Drift,
    #[command(about = about("im"))]
    Im,
    #[command(about = about("shop"))]
    Shop,
    #[command(about = about("orders"))]
    Orders,
    #[command(about = about("seams"))]
    Seams,
    #[command(about = about("edge"))]
    Edge,
    #[command(about = about("proxy"))]
    Proxy,
    #[command(about = about("faults"))]
    Faults,
    #[command(about = about("rapid-reset"))]
    RapidReset {
        /// How long each server is flooded with each shape, in milliseconds.
        #[arg(long, default_value_t = experiments::rapid_reset::FLOOD_MS)]
        flood_ms: u64,
    },
    #[command(about = about("honest-resets"))]
    HonestResets {
        /// How long each pattern runs against each server, in milliseconds
        /// (at least 1 000: the latency spike of the client-timeout
        /// patterns lasts a second).
        #[arg(long, default_value_t = experiments::honest_resets::WINDOW_MS)]
        window_ms: u64,
    },
    #[command(about = about("retry"))]
    Retry,
    #[command(about = about("metastable"))]
    Metastable {
        /// Milliseconds of load before the trigger.
        #[arg(long, default_value_t = experiments::metastable::TIMELINE_MS[0])]
        before_ms: u64,
        /// How long the trigger lasts, in milliseconds.
        #[arg(long, default_value_t = experiments::metastable::TIMELINE_MS[1])]
        trigger_ms: u64,
        /// Milliseconds of load after it.
        #[arg(long, default_value_t = experiments::metastable::TIMELINE_MS[2])]
        after_ms: u64,
    },
    #[command(about = about("amplification"))]
    Amplification {
        /// How long C is down in the fan-in case, in milliseconds.
        #[arg(long, default_value_t = experiments::amplification::FAN_IN_MS)]
        fan_in_ms: u64,
    },
    #[command(about = about("hedge"))]
    Hedge,
    #[command(about = about("hosts"))]
    Hosts {
        /// One-way latency of every link, in milliseconds (repeatable).
        #[arg(long = "one-way-ms", default_values_t = experiments::hosts::ONE_WAY_MS)]
        one_way_ms: Vec<u64>,
    },
    #[command(about = about("jobs"))]
    Jobs,
    #[command(about = about("ledger"))]
    Ledger {
        /// Runs of each stall case.
        #[arg(long, default_value_t = experiments::ledger::RUNS)]
        runs: usize,
    },
    #[command(about = about("waterfall"))]
    Waterfall,
}

impl Experiment {
    /// What the flags say; everything else as the demo runs it, except the
    /// waterfall and the ledger, which collect their spans in this process.
    fn params(&self, spans: Option<&crate::otlp::Receiver>) -> Params {
        let mut params = Params {
            spans: Spans::Collected(spans.cloned()),
            ..Params::default()
        };
        match self {
            Experiment::Chain { hop_ms } => params.hop = Duration::from_millis(*hop_ms),
            Experiment::Hosts { one_way_ms } => params.one_way_ms.clone_from(one_way_ms),
            Experiment::RapidReset { flood_ms } => {
                params.flood = Duration::from_millis((*flood_ms).clamp(100, 60_000));
            }
            Experiment::Metastable {
                before_ms,
                trigger_ms,
                after_ms,
            } => {
                params.timeline = [*before_ms, *trigger_ms, *after_ms]
                    .map(|ms| Duration::from_millis(ms.clamp(1_000, 120_000)));
            }
            Experiment::Amplification { fan_in_ms } => {
                params.fan_in = Duration::from_millis((*fan_in_ms).clamp(500, 60_000));
            }
            Experiment::Ledger { runs } => params.runs = (*runs).clamp(1, 100_000),
            Experiment::HonestResets { window_ms } => {
                params.window = Duration::from_millis((*window_ms).clamp(1_000, 60_000));
            }
            _ => {}
        }
        params
    }
}

/// The registry's line on the experiment called `name`.
fn about(name: &str) -> &'static str {
    registry::experiment(name).map_or("", |e| e.about)
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// Unary throughput and latency, plain tonic vs both layers.
    Overhead {
        #[arg(long, default_value_t = 8)]
        rounds: usize,
        #[arg(long, default_value_t = 500)]
        round_ms: u64,
    },
    /// Cancel propagation latency across three hops.
    Cancel {
        #[arg(long, default_value_t = 1000)]
        runs: usize,
        /// Runtime worker threads; 1 runs everything on one scheduler thread.
        #[arg(long, default_value_t = 1)]
        threads: usize,
    },
    /// Instructions and allocations per request under callgrind, ours vs plain tonic.
    Instructions {
        /// N: every variant runs with N and with 5N requests.
        #[arg(long, default_value_t = 2000)]
        requests: u64,
        /// Client connections.
        #[arg(long, default_value_t = 4)]
        connections: usize,
        /// Calls in flight per connection.
        #[arg(long, default_value_t = 16)]
        streams: usize,
        /// Measure only these cases (repeatable; all by default).
        #[arg(long = "case", value_enum)]
        cases: Vec<bench::instructions::Case>,
        /// Children run at the same time.
        #[arg(long, default_value_t = 2)]
        jobs: usize,
        /// Keep callgrind's output files in this directory, for callgrind_annotate.
        #[arg(long)]
        keep: Option<std::path::PathBuf>,
        /// Our layers report to a metrics handle (the cost of turning it on).
        #[arg(long)]
        metrics: bool,
    },
    /// Memory per call in flight through one hop, ours vs plain tonic.
    Memory {
        /// Calls held open at once.
        #[arg(long, default_value_t = 10_000)]
        calls: usize,
    },
    /// The overload setup at 2x capacity with a downstream failing 10 % of
    /// calls: no retries, naive retries, ours.
    RetryStorm {
        /// Seconds of open-loop load per variant.
        #[arg(long, default_value_t = 2.0)]
        window_s: f64,
    },
    /// Goodput at 1x, 2x and 4x capacity: a pooled ~10 ms query, 100 ms deadlines.
    Overload {
        /// Seconds of open-loop load per server and level.
        #[arg(long, default_value_t = 3.0)]
        window_s: f64,
    },
    /// Many calls through A -> B -> C with random deadlines and client
    /// cancels; then memory, tasks, permits and connections left over.
    Soak {
        /// Calls in all, warm-up (a tenth) included.
        #[arg(long, default_value_t = 1_000_000)]
        calls: u64,
        /// Stop issuing calls after this many seconds, whatever is left.
        #[arg(long, default_value_t = 900)]
        max_seconds: u64,
        /// Client loops calling at the same time.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        /// Streams a client may have reset before the server accepted them,
        /// at one time on one connection, before the server closes it
        /// (hyper's rapid-reset guard; hyper's default is 20). Without it,
        /// what a `tonic_deadline::server::ResetGuard`'s builder sets.
        #[arg(long)]
        max_pending_accept_resets: Option<usize>,
        /// Streams each client connection remembers having reset, so that
        /// late frames on them are ignored (h2's default is 50); h2 charges
        /// each small DATA frame it ignores to a budget that closes the
        /// connection when spent. Without it, `ReadyChannel`'s default: none.
        #[arg(long)]
        remembered_resets: Option<usize>,
    },
}

fn print(outcome: &Outcome, json: bool) {
    if json {
        println!("{}", outcome.json);
    } else {
        println!("{}", outcome.table());
    }
}

/// The entry service of a started system: the last one started.
fn entry(started: &[systems::Started]) -> anyhow::Result<std::net::SocketAddr> {
    started
        .last()
        .map(|s| s.addr)
        .ok_or_else(|| anyhow::anyhow!("nothing was started"))
}

/// Runs the capture proxy until killed, printing every frame as it passes.
async fn capture(
    listen: String,
    upstream: std::net::SocketAddr,
    (delay_ms, reply_delay_ms): (u64, u64),
    json: bool,
    quiet: bool,
) -> anyhow::Result<()> {
    use crate::capture::{Capture, Listening, Options, Record};
    use std::io::Write;
    let observer = std::sync::Arc::new(move |record: &Record| {
        let line = if json {
            crate::report::to_json(&record.json()).to_string()
        } else {
            record.line()
        };
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    });
    let capture = Capture::start_with(
        upstream,
        Options {
            listen: Some(listen),
            delay: Duration::from_millis(delay_ms),
            reply_delay: Duration::from_millis(reply_delay_ms),
            observer: (!quiet).then_some(observer as crate::capture::Observer),
            forget: true,
            ..Options::default()
        },
    )
    .await?;
    if json {
        let listening = Listening {
            listen: capture.addr().to_string(),
            upstream: upstream.to_string(),
        };
        println!("{}", crate::report::to_json(&listening));
    } else {
        println!("{}", capture.addr());
    }
    tokio::signal::ctrl_c().await?;
    Ok(())
}

/// Runs `work` until it finishes or Ctrl-C; on Ctrl-C the work is dropped,
/// so whatever it made (processes, network namespaces) is removed.
async fn interruptible<T>(work: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::select! {
        out = work => out,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted; everything it started was stopped and removed"),
    }
}

/// Runs the `deadline-lab` command line: parses the process's arguments and
/// runs the command they name.
///
/// `allocated` reads the binary's counting allocator (only the binary can
/// install a global allocator), for `bench instructions`.
///
/// # Errors
///
/// When the command fails.
pub fn main(allocated: fn() -> bench::instructions::Allocated) -> anyhow::Result<()> {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // `experiment NAME`: the name the registry knows it by.
    let experiment = matches
        .subcommand_matches("experiment")
        .and_then(|m| m.subcommand_name())
        .map(str::to_owned);
    let command = match cli.command {
        // A single-threaded runtime of its own, so its count is repeatable.
        Command::BenchChild(args) => return bench::instructions::child(args, allocated),
        Command::MemoryChild(args) => return bench::memory::child(args, allocated),
        command => command,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let metrics = match &command {
        Command::Serve {
            metrics_listen: Some(_),
            ..
        } => Some(tonic_deadline::observe::Metrics::new()),
        _ => None,
    };
    let mut telemetry = {
        let _runtime = runtime.enter();
        let (service, endpoint, own_receiver) = telemetry_plan(&command);
        crate::otlp::Telemetry::install(&service, endpoint, own_receiver)?
    };
    let traces = &telemetry;
    let out = runtime.block_on(crate::metrics::maybe_with(metrics, async move {
        match command {
            Command::BenchChild(_) | Command::MemoryChild(_) => {
                anyhow::bail!("bench children run before the runtime starts")
            }
            Command::Demo { report } => crate::demo::run(&report).await,
            Command::Capture {
                listen,
                upstream,
                delay_ms,
                reply_delay_ms,
                json,
                quiet,
            } => capture(listen, upstream, (delay_ms, reply_delay_ms), json, quiet).await,
            Command::Serve {
                system,
                metrics_listen,
                ..
            } => {
                let addr = match system {
                    System::Chain {
                        listen,
                        hop_ms,
                        role,
                        next,
                        transit_allowance_ms,
                        transit_from_round_trip,
                    } => {
                        let plan = systems::chain::Plan {
                            work: Duration::from_millis(hop_ms),
                            ..Default::default()
                        };
                        match role {
                            Some(role) => {
                                let name = systems::chain::hop_name(&role)?;
                                systems::chain::start_hop(
                                    name,
                                    &listen,
                                    plan,
                                    next,
                                    crate::net::Transit::from_flags(
                                        transit_allowance_ms,
                                        transit_from_round_trip,
                                    ),
                                    true,
                                )
                                .await?
                                .0
                            }
                            None => systems::chain::start(&listen, [plan; 3], true).await?.entry,
                        }
                    }
                    System::Echo {
                        listen,
                        plain,
                        layer_only,
                    } => systems::echo::start(&listen, plain, layer_only).await?,
                    System::Im(split) => {
                        let journal = systems::trace::Journal::new();
                        let started = match &split.role {
                            Some(role) => vec![
                                systems::im::start_role(
                                    role,
                                    &split.listen,
                                    &split.peers()?,
                                    &journal,
                                    Duration::from_millis(split.reply_reserve_ms),
                                )
                                .await?,
                            ],
                            None => {
                                systems::im::start_with_reserve(
                                    &split.listen,
                                    &journal,
                                    Duration::from_millis(split.reply_reserve_ms),
                                )
                                .await?
                            }
                        };
                        entry(&started)?
                    }
                    System::Shop(split) => {
                        let journal = systems::trace::Journal::new();
                        let started = match &split.role {
                            Some(role) => vec![
                                systems::shop::start_role(
                                    role,
                                    &split.listen,
                                    &split.peers()?,
                                    &journal,
                                    Duration::from_millis(split.reply_reserve_ms),
                                )
                                .await?,
                            ],
                            None => {
                                systems::shop::start_with_reserve(
                                    &split.listen,
                                    &journal,
                                    Duration::from_millis(split.reply_reserve_ms),
                                )
                                .await?
                            }
                        };
                        entry(&started)?
                    }
                    System::Orders { split, db } => {
                        let mut shared = systems::orders::Shared::in_memory()?;
                        if let Some(path) = db {
                            shared.db = systems::orders::Db::open(&path)?;
                        }
                        let started = match &split.role {
                            Some(role) => vec![
                                systems::orders::start_role(
                                    role,
                                    &split.listen,
                                    &split.peers()?,
                                    &shared,
                                )
                                .await?,
                            ],
                            None => systems::orders::start(&split.listen, &shared).await?,
                        };
                        entry(&started)?
                    }
                    System::JobsWorker {
                        pg_url,
                        table,
                        name,
                        lease_ms,
                        job_ms,
                    } => {
                        let setup = systems::jobs::Setup {
                            url: pg_url,
                            table,
                            lease: Duration::from_millis(lease_ms),
                            job_time: Duration::from_millis(job_ms),
                        };
                        return systems::jobs::serve_worker(setup, &name).await;
                    }
                };
                println!("{addr}");
                if let (Some(listen), Some(metrics)) = (metrics_listen, crate::metrics::current()) {
                    let at = crate::metrics::serve(&listen, metrics).await?;
                    println!("metrics: http://{at}/metrics");
                }
                tokio::signal::ctrl_c().await?;
                Ok(())
            }
            Command::Experiment { which, json, .. } => {
                let name = experiment.unwrap_or_default();
                let entry = registry::experiment(&name)
                    .ok_or_else(|| anyhow::anyhow!("no experiment called {name:?}"))?;
                let outcome = interruptible(entry.run(which.params(traces.receiver()))).await?;
                print(&outcome, json);
                Ok(())
            }
            Command::Bench { which, json } => {
                let outcome = match which {
                    Bench::Overhead { rounds, round_ms } => {
                        bench::overhead::run(bench::overhead::Load {
                            rounds,
                            round: Duration::from_millis(round_ms),
                            ..Default::default()
                        })
                        .await?
                    }
                    Bench::Cancel { runs, threads } => {
                        bench::cancel::run_on_own_runtime(runs, threads).await?
                    }
                    Bench::Instructions {
                        requests,
                        connections,
                        streams,
                        cases,
                        jobs,
                        keep,
                        metrics,
                    } => {
                        let options = bench::instructions::Options {
                            requests,
                            connections,
                            streams,
                            cases: if cases.is_empty() {
                                bench::instructions::Case::ALL.to_vec()
                            } else {
                                cases
                            },
                            jobs,
                            keep,
                            exe: None,
                            metrics,
                        };
                        // Runs valgrind child processes; no request is involved.
                        #[allow(clippy::disallowed_methods)]
                        tokio::task::spawn_blocking(move || bench::instructions::measure(&options))
                            .await??
                            .outcome()?
                    }
                    Bench::Memory { calls } => {
                        // Runs child processes; no request is involved.
                        #[allow(clippy::disallowed_methods)]
                        tokio::task::spawn_blocking(move || bench::memory::measure(calls))
                            .await??
                            .outcome()?
                    }
                    Bench::RetryStorm { window_s } => {
                        bench::retry_storm::run(bench::overload::Load {
                            window: Duration::from_secs_f64(window_s.clamp(0.5, 30.0)),
                            ..Default::default()
                        })
                        .await?
                    }
                    Bench::Overload { window_s } => {
                        bench::overload::run(bench::overload::Load {
                            window: Duration::from_secs_f64(window_s.clamp(0.5, 30.0)),
                            ..Default::default()
                        })
                        .await?
                    }
                    Bench::Soak {
                        calls,
                        max_seconds,
                        concurrency,
                        max_pending_accept_resets,
                        remembered_resets,
                    } => bench::soak::run_on_own_runtime(bench::soak::Load {
                        calls,
                        max: Duration::from_secs(max_seconds),
                        concurrency: concurrency.clamp(1, 4096),
                        pending_accept_resets: max_pending_accept_resets,
                        remembered_resets,
                        ..Default::default()
                    })
                    .await?
                    .outcome()?,
                };
                print(&outcome, json);
                Ok(())
            }
        }
    }));
    telemetry.shutdown();
    out
}

/// The `service.name` spans are exported as, where to (`--otlp-endpoint`),
/// and whether the command collects its own spans (`experiment waterfall`,
/// `experiment ledger`).
fn telemetry_plan(command: &Command) -> (String, Option<&str>, bool) {
    match command {
        Command::Serve {
            system,
            otlp_endpoint,
            ..
        } => (service_name(system), otlp_endpoint.as_deref(), false),
        Command::Experiment {
            which,
            otlp_endpoint,
            ..
        } => (
            "deadline-lab experiment".to_owned(),
            otlp_endpoint.as_deref(),
            matches!(which, Experiment::Waterfall | Experiment::Ledger { .. }),
        ),
        _ => (String::new(), None, false),
    }
}

/// `im-gateway`, `chain-B`, `im` (the whole system in one process).
fn service_name(system: &System) -> String {
    let (name, role) = match system {
        System::Chain { role, .. } => ("chain", role.as_deref()),
        System::Echo { .. } => ("echo", None),
        System::Im(split) => ("im", split.role.as_deref()),
        System::Shop(split) => ("shop", split.role.as_deref()),
        System::Orders { split, .. } => ("orders", split.role.as_deref()),
        System::JobsWorker { name, .. } => ("jobs-worker", Some(name.as_str())),
    };
    match role {
        Some(role) => format!("{name}-{role}"),
        None => name.to_owned(),
    }
}
