//! The `deadline-lab` command line: its arguments and what each command runs.
//!
//! It lives in the library, not in the binary, so that the futures it awaits
//! are compiled once: a release binary instantiates again every generic
//! future it polls that the library already compiled.

use std::marker::PhantomData;
use std::time::Duration;

use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::catalog;
use crate::registry::{self, Entry, Kind, Spans};
use crate::report::Outcome;
use crate::{bench, systems};

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
        which: Chosen<Experiments>,
        /// Print exactly one JSON object instead of the table.
        #[arg(long, global = true)]
        json: bool,
        /// Print the table as markdown, as `docs/` quotes it.
        #[arg(long, global = true, conflicts_with = "json")]
        markdown: bool,
        /// Export spans over OTLP/gRPC to this collector (`http://HOST:PORT`).
        #[arg(long, global = true)]
        otlp_endpoint: Option<String>,
    },
    /// Runs one benchmark (plain tonic and ours, interleaved in one process).
    Bench {
        #[command(subcommand)]
        which: Chosen<Benchmarks>,
        /// Print exactly one JSON object instead of the table.
        #[arg(long, global = true)]
        json: bool,
    },
    /// One step of the demo in a process of its own (run by the demo itself).
    #[command(hide = true)]
    DemoStep {
        /// The step: `chain`, `bench soak`.
        name: String,
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
        /// Run only this hop (A, B, C, or D for a fourth); it calls
        /// `--next`.
        #[arg(long)]
        role: Option<String>,
        /// Keep the server layer's default reserve for the answer's way
        /// back (`server::default_reply_reserve`), as a server with nothing
        /// set does; otherwise each hop keeps none, so the budgets it
        /// reports are exact.
        #[arg(long, requires = "role")]
        default_reply_reserve: bool,
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
    /// milliseconds (`ServerDeadlineLayer::reply_reserve`; unset: the
    /// layer's default, `server::default_reply_reserve`), so that a
    /// DEADLINE_EXCEEDED and its ledger reach the caller in time.
    #[arg(long)]
    reply_reserve_ms: Option<u64>,
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

/// The subcommands of `experiment` (or `bench`): one per entry of that
/// kind in the lists, with its flags; the one given, and its flags as given.
#[derive(Debug, Clone)]
struct Chosen<G> {
    entry: &'static Entry,
    matches: ArgMatches,
    group: PhantomData<G>,
}

/// Which entries a group of subcommands offers.
trait Group {
    /// Entries of this kind.
    const KIND: Kind;
}

/// `experiment NAME`.
#[derive(Debug, Clone)]
struct Experiments;

impl Group for Experiments {
    const KIND: Kind = Kind::Experiment;
}

/// `bench NAME`.
#[derive(Debug, Clone)]
struct Benchmarks;

impl Group for Benchmarks {
    const KIND: Kind = Kind::Bench;
}

impl<G: Group> Chosen<G> {
    /// Runs it with its flags, taking spans from `spans`.
    fn run(&self, spans: Spans) -> registry::Run {
        self.entry.run(&self.matches, spans)
    }
}

impl<G: Group> FromArgMatches for Chosen<G> {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let Some((name, matches)) = matches.subcommand() else {
            return Err(clap::Error::new(clap::error::ErrorKind::MissingSubcommand));
        };
        let entry = catalog::find(G::KIND, name)
            .ok_or_else(|| clap::Error::new(clap::error::ErrorKind::InvalidSubcommand))?;
        Ok(Self {
            entry,
            matches: matches.clone(),
            group: PhantomData,
        })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl<G: Group> Subcommand for Chosen<G> {
    fn augment_subcommands(command: clap::Command) -> clap::Command {
        catalog::entries()
            .filter(|e| e.kind == G::KIND)
            .fold(command, |command, e| command.subcommand(e.command()))
    }

    fn augment_subcommands_for_update(command: clap::Command) -> clap::Command {
        Self::augment_subcommands(command)
    }

    fn has_subcommand(name: &str) -> bool {
        catalog::find(G::KIND, name).is_some()
    }
}

fn print(outcome: &Outcome, json: bool) {
    print_as(outcome, json, false);
}

/// Prints `outcome` as JSON, as markdown, or as the human table.
fn print_as(outcome: &Outcome, json: bool, markdown: bool) {
    if markdown {
        print!("{}", outcome.markdown());
    } else if json {
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
pub fn main(allocated: fn() -> crate::kit::allocated::Allocated) -> anyhow::Result<()> {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
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
            Command::DemoStep { name } => crate::demo::step(&name).await,
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
                        default_reply_reserve,
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
                                    systems::chain::EXACT.filter(|_| !default_reply_reserve),
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
                                    split.reply_reserve_ms.map(Duration::from_millis),
                                )
                                .await?,
                            ],
                            None => {
                                systems::im::start_with_reserve(
                                    &split.listen,
                                    &journal,
                                    split.reply_reserve_ms.map(Duration::from_millis),
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
                                    split.reply_reserve_ms.map(Duration::from_millis),
                                )
                                .await?,
                            ],
                            None => {
                                systems::shop::start_with_reserve(
                                    &split.listen,
                                    &journal,
                                    split.reply_reserve_ms.map(Duration::from_millis),
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
            Command::Experiment {
                which,
                json,
                markdown,
                ..
            } => {
                let run = which.run(Spans::Collected(traces.receiver().cloned()));
                let outcome = interruptible(registry::quietly(run)).await?;
                print_as(&outcome, json, markdown);
                Ok(())
            }
            Command::Bench { which, json } => {
                let outcome = which.run(Spans::default()).await?;
                print(&outcome, json);
                Ok(())
            }
        }
    }));
    telemetry.shutdown();
    out
}

/// The `service.name` spans are exported as, where to (`--otlp-endpoint`),
/// and whether the command collects its own spans (an experiment that
/// [collects its spans](registry::Experiment::COLLECTS_SPANS)).
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
            which.entry.collects_spans,
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
