//! Instructions per request, counted by valgrind's callgrind: ours vs plain
//! tonic on the same requests.
//!
//! Wall-clock throughput on a shared 2-core machine moves by ±10 % from run
//! to run, too much to see a layer that costs a few percent. Instruction
//! counts do not depend on what else the machine is doing, so they are the
//! decision figure. How the count is made exact:
//!
//! - Every variant runs as a child process — this binary re-executed with a
//!   hidden `bench-child` command — under `valgrind --tool=callgrind`, on a
//!   single-threaded tokio runtime, so the order of events inside the child
//!   does not depend on thread scheduling.
//! - Each child runs twice, with `N` and with `5N` requests. The per-request
//!   figure is `(count(5N) − count(N)) / 4N`: start-up, connection set-up
//!   and shutdown are the same in both runs and cancel out.
//! - The same requests at the same fixed concurrency for both variants
//!   (`--connections` × `--streams` calls in flight).
//! - The clocks of the counted child stand still (libfaketime, both the
//!   wall clock and the monotonic clock). Under valgrind a request takes
//!   fifty times longer than natively, so whatever depends on elapsed time
//!   happened fifty times more often per request, and differently from run
//!   to run: hyper's `date` header (a new value, and a new HPACK table
//!   entry, every second), the timer wheel moving 5 s timers down its
//!   levels, and the remaining budget written into `grpc-timeout` (a new
//!   value every request). With the clocks stopped two runs give the same
//!   count. The cost of the last one is real: a budget that changes with
//!   every request is never found in the HPACK table; see the profile in
//!   the report of this bench for its size.
//!
//! The cases:
//!
//! | case | what is counted | ours | plain |
//! |---|---|---|---|
//! | `server layer, no header` | the server's tasks only (`Health/Check`, as `serve echo`), driven by a plain tonic client in the same process that is not counted | `ServerDeadlineLayer` | plain tonic |
//! | `server layer, header` | the same, every request carrying `grpc-timeout: 5S` | 〃 | 〃 |
//! | `one hop, both layers` | one process: a client calling a server on loopback | `ClientDeadlineLayer` with a 5 s `Scope` per call → `ServerDeadlineLayer` | plain client with `set_timeout(5 s)` → plain server |
//! | `3-hop chain` | one process: client → A → B → C | both layers everywhere, the budget propagates | plain tonic: only the call to A carries a header |
//! | `server layer and reset guard` (`, header`) | as the server rows | the layer and `server::ResetGuard`, as the README serves | plain tonic |
//!
//! Allocations are counted by the lab binary's global allocator (every
//! allocation and its requested size) for the whole child process — in the
//! server cases the plain client's too, the same for both variants — read
//! by the child when it exits and differenced the same way.
//!
//! The server cases count only the server's tasks (`--toggle-collect` on
//! the functions that poll and drop them), not the runtime's scheduler and
//! I/O driver that the client shares; measured from a separate process
//! (the whole server process, driven by an external load generator) the
//! same layers cost the same extra instructions, but the order in which the
//! two processes interleave moved the figure by about 0.1 % between runs.

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use testkit::probe_client::ProbeClient;
use testkit::probe_server::{Probe, ProbeServer};
use testkit::{CallReply, CallRequest};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic::metadata::MetadataValue;
use tonic::service::Routes;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};
use tonic_deadline::{Scope, ServerDeadlineLayer};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::net::{self, Layered};
use crate::kit::allocated::Allocated;
use crate::kit::ours_or_plain::Variant;
use crate::registry::{Experiment, Kind, Spans};
use crate::report::Outcome;
use crate::systems::chain::Next;

/// The budget every deadline-carrying request gets: far longer than any
/// request takes, even under valgrind, so no timer ever fires.
const BUDGET: Duration = Duration::from_secs(5);

/// The header the server-layer case sends (as in the figures of SPEC K).
const HEADER: &str = "5S";

/// One measured case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Case {
    /// The server process only, requests without `grpc-timeout`.
    Server,
    /// The server process only, every request with `grpc-timeout: 5S`.
    ServerHeader,
    /// Client layer and server layer on one call, in one process.
    OneHop,
    /// Client → A → B → C in one process.
    Chain,
    /// The same chain, against plain tonic whose handlers pass the
    /// deadline on by hand.
    ChainByHand,
    /// One long server stream, per message.
    Streaming,
    /// The server process, with the reset guard as well as the layer.
    ServerGuard,
    /// The same, every request with `grpc-timeout: 5S`.
    ServerGuardHeader,
}

/// Messages per call of the streaming case.
pub const STREAMED: u64 = 10_000;

impl Case {
    /// Every case, in the order of the table.
    pub const ALL: [Case; 8] = [
        Case::Server,
        Case::ServerHeader,
        Case::OneHop,
        Case::Chain,
        Case::ChainByHand,
        Case::Streaming,
        Case::ServerGuard,
        Case::ServerGuardHeader,
    ];

    /// The row name (the `case` key of the JSON contract).
    pub fn label(self) -> &'static str {
        match self {
            Case::Server => "server layer, no header",
            Case::ServerHeader => "server layer, header",
            Case::OneHop => "one hop, both layers",
            Case::Chain => "3-hop chain",
            Case::ChainByHand => "3-hop chain, hand-written",
            Case::Streaming => "server streaming",
            Case::ServerGuard => "server layer and reset guard",
            Case::ServerGuardHeader => "server layer and reset guard, header",
        }
    }

    /// What one unit of the per-unit figures is: a request, or a streamed
    /// message.
    fn unit(self) -> u64 {
        match self {
            Case::Streaming => STREAMED,
            _ => 1,
        }
    }

    /// The calls a child of `requests` requests makes: the streaming case
    /// streams [`STREAMED`] messages a call, so it makes a thousandth (at
    /// least one).
    fn calls(self, requests: u64) -> u64 {
        match self {
            Case::Streaming => (requests / 1000).max(1),
            _ => requests,
        }
    }

    /// What the count covers.
    fn counted(self) -> &'static str {
        match self {
            Case::Server | Case::ServerHeader | Case::ServerGuard | Case::ServerGuardHeader => {
                "server tasks"
            }
            Case::OneHop => "client + server, one process",
            Case::Chain | Case::ChainByHand => "client + A + B + C, one process",
            Case::Streaming => "client + server, one process, per message",
        }
    }

    /// `--case` value of the child command.
    fn arg(self) -> &'static str {
        match self {
            Case::Server => "server",
            Case::ServerHeader => "server-header",
            Case::OneHop => "one-hop",
            Case::Chain => "chain",
            Case::ChainByHand => "chain-by-hand",
            Case::Streaming => "streaming",
            Case::ServerGuard => "server-guard",
            Case::ServerGuardHeader => "server-guard-header",
        }
    }
}

/// How many requests, how concurrent, and where to keep callgrind's files.
#[derive(Debug, Clone)]
pub struct Options {
    /// `N`: the runs make `N` and `5N` requests.
    pub requests: u64,
    /// Client connections.
    pub connections: usize,
    /// Calls in flight per connection.
    pub streams: usize,
    /// The cases to measure.
    pub cases: Vec<Case>,
    /// Children run at the same time (each is single-threaded).
    pub jobs: usize,
    /// Keep callgrind's output files here (for `callgrind_annotate`);
    /// a temporary directory, removed afterwards, when `None`.
    pub keep: Option<PathBuf>,
    /// The lab binary to run the children from (this one by default).
    pub exe: Option<PathBuf>,
    /// Our layers report to a metrics handle (plain tonic is unchanged).
    pub metrics: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            requests: 2_000,
            connections: 4,
            streams: 16,
            cases: Case::ALL.to_vec(),
            jobs: 2,
            keep: None,
            exe: None,
            metrics: false,
        }
    }
}

/// The result of `bench instructions`: one row per case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instructions {
    /// `N`: each variant ran with `N` and with `5N` requests.
    pub requests: u64,
    /// Client connections.
    pub connections: usize,
    /// Calls in flight per connection.
    pub streams: usize,
    /// One row per case.
    pub rows: Vec<Row>,
}

/// One case: per-request costs of ours and of plain tonic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The case (`server layer, no header`, …).
    pub case: String,
    /// What the count covers (the server process, or the whole process).
    pub counted: String,
    /// Instructions per request with our layers.
    pub ours: f64,
    /// Instructions per request with plain tonic.
    pub plain: f64,
    /// `ours / plain`.
    pub ratio: f64,
    /// `ours − plain`: what our layers cost per request.
    pub extra: f64,
    /// Allocations per request with our layers.
    pub ours_allocs: f64,
    /// Allocations per request with plain tonic.
    pub plain_allocs: f64,
    /// Bytes allocated per request with our layers.
    pub ours_bytes: f64,
    /// Bytes allocated per request with plain tonic.
    pub plain_bytes: f64,
}

impl Instructions {
    /// The row of `case`, if it was measured.
    pub fn row(&self, case: Case) -> Option<&Row> {
        self.rows.iter().find(|r| r.case == case.label())
    }
}

/// The flags of `bench instructions`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
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
    cases: Vec<Case>,
    /// Children run at the same time.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// Keep callgrind's output files in this directory, for callgrind_annotate.
    #[arg(long)]
    keep: Option<PathBuf>,
    /// Our layers report to a metrics handle (the cost of turning it on).
    #[arg(long)]
    metrics: bool,
}

impl Experiment for Instructions {
    const NAME: &'static str = "instructions";
    const ABOUT: &'static str =
        "Instructions and allocations per request under callgrind, ours vs plain tonic";
    const PRINTS: &'static str =
        "instructions (callgrind), allocations and bytes per request, ours vs plain tonic, case by case (needs valgrind and libfaketime) ([more](#bench-instructions))";
    const KIND: Kind = Kind::Bench;
    /// It needs valgrind; run alone (`bench instructions`), not in the demo.
    const IN_DEMO: bool = false;
    type Args = Args;

    async fn run(args: Args, _: Spans) -> anyhow::Result<Self> {
        let options = Options {
            requests: args.requests,
            connections: args.connections,
            streams: args.streams,
            cases: if args.cases.is_empty() {
                Case::ALL.to_vec()
            } else {
                args.cases
            },
            jobs: args.jobs,
            keep: args.keep,
            exe: None,
            metrics: args.metrics,
        };
        // Runs valgrind child processes; no request is involved.
        #[allow(clippy::disallowed_methods)]
        tokio::task::spawn_blocking(move || measure(&options)).await?
    }

    fn outcome(&self) -> Outcome {
        Outcome {
            title: format!(
                "bench instructions: per request, callgrind, (count(5N) - count(N)) / 4N with N = {}, {} connections x {} streams",
                self.requests, self.connections, self.streams
            ),
            json: crate::report::to_json(self),
            columns: vec![
                "case",
                "counted",
                "ours",
                "plain",
                "ratio",
                "extra",
                "allocs ours/plain",
                "bytes ours/plain",
            ],
            rows: self
                .rows
                .iter()
                .map(|r| {
                    vec![
                        r.case.clone(),
                        r.counted.clone(),
                        format!("{:.0}", r.ours),
                        format!("{:.0}", r.plain),
                        format!("{:.4}", r.ratio),
                        format!("{:+.0}", r.extra),
                        format!("{:.2} / {:.2}", r.ours_allocs, r.plain_allocs),
                        format!("{:.0} / {:.0}", r.ours_bytes, r.plain_bytes),
                    ]
                })
                .collect(),
            notes: vec![
                "instructions: valgrind --tool=callgrind, Ir; within about 0.3 % from run to run, whatever else the machine does".into(),
                "goals: server layer <= 1.02, one hop <= 1.03, the chain <= 1.02 of the hand-written one, a streamed message <= 1.01; allocations: server <= plain + 1, one hop <= plain + 2".into(),
            ],
        }
    }
}

/// What one child run counted.
#[derive(Debug, Clone, Copy)]
struct Counted {
    instructions: u64,
    allocated: Allocated,
}

/// Runs every case, ours and plain, each with `N` and `5N` requests.
///
/// # Errors
///
/// valgrind missing, a child that fails, or an output file without totals.
pub fn measure(options: &Options) -> anyhow::Result<Instructions> {
    check_valgrind()?;
    let faketime = faketime()?;
    let exe = match &options.exe {
        Some(exe) => exe.clone(),
        None => std::env::current_exe()?,
    };
    let scratch;
    let dir = match &options.keep {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            dir.clone()
        }
        None => {
            scratch = Scratch::new()?;
            scratch.0.clone()
        }
    };
    let n = options.requests.max(1);
    let mut runs = Vec::new();
    for &case in &options.cases {
        for variant in [Variant::Ours, Variant::Plain] {
            for requests in [case.calls(n), 5 * case.calls(n)] {
                runs.push((case, variant, requests));
            }
        }
    }
    let results = run_all(&runs, options, &exe, &faketime, &dir)?;
    let counted = |case, variant, requests| {
        runs.iter()
            .position(|r| *r == (case, variant, requests))
            .map(|i| results[i])
            .ok_or_else(|| anyhow::anyhow!("no run for {case:?} {variant:?} {requests}"))
    };
    let per_unit = |case: Case, small: Counted, large: Counted| {
        let span = (4 * case.calls(n) * case.unit()) as f64;
        (
            (large.instructions as f64 - small.instructions as f64) / span,
            (large.allocated.allocations as f64 - small.allocated.allocations as f64) / span,
            (large.allocated.bytes as f64 - small.allocated.bytes as f64) / span,
        )
    };
    let mut rows = Vec::new();
    for &case in &options.cases {
        let calls = case.calls(n);
        let (ours, ours_allocs, ours_bytes) = per_unit(
            case,
            counted(case, Variant::Ours, calls)?,
            counted(case, Variant::Ours, 5 * calls)?,
        );
        let (plain, plain_allocs, plain_bytes) = per_unit(
            case,
            counted(case, Variant::Plain, calls)?,
            counted(case, Variant::Plain, 5 * calls)?,
        );
        // A per-request count of zero (or less) is not a cheap layer but a
        // measurement that did not happen: in the server cases, collection
        // toggled on by function names that no symbol of this build has.
        anyhow::ensure!(
            ours > 0.0 && plain > 0.0,
            "{}: callgrind counted {ours:.1} (ours) and {plain:.1} (plain) instructions \
             per request; {}",
            case.label(),
            match case {
                Case::Server | Case::ServerHeader | Case::ServerGuard | Case::ServerGuardHeader =>
                    format!(
                        "no function of this build matched the server tasks' names \
                     ({SERVER_TASKS:?}): a change of symbol mangling or of tonic/hyper \
                     renamed them"
                    ),
                _ => "the child ran no requests".to_owned(),
            }
        );
        rows.push(Row {
            case: case.label().to_owned(),
            counted: case.counted().to_owned(),
            ours: round(ours, 1),
            plain: round(plain, 1),
            ratio: round(ours / plain, 4),
            extra: round(ours - plain, 1),
            ours_allocs: round(ours_allocs, 2),
            plain_allocs: round(plain_allocs, 2),
            ours_bytes: round(ours_bytes, 1),
            plain_bytes: round(plain_bytes, 1),
        });
    }
    Ok(Instructions {
        requests: n,
        connections: options.connections,
        streams: options.streams,
        rows,
    })
}

fn round(x: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (x * scale).round() / scale
}

/// Where Debian's `libfaketime` package puts the library.
const FAKETIME_LIBS: [&str; 2] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
];

/// The libfaketime library that stops the counted child's wall clock.
fn faketime() -> anyhow::Result<PathBuf> {
    FAKETIME_LIBS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "bench instructions needs libfaketime (it stops the clocks of the counted \
                 child so elapsed time cannot change the count): install it with \
                 `apt-get update && apt-get install -y faketime` (scripts/test-all does)"
            )
        })
}

/// Fails with a clear message when valgrind is not installed.
fn check_valgrind() -> anyhow::Result<()> {
    let found = Command::new("valgrind")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    anyhow::ensure!(
        found,
        "bench instructions needs valgrind on PATH: install it with \
         `apt-get update && apt-get install -y valgrind` (scripts/test-all does)"
    );
    Ok(())
}

/// A temporary directory for callgrind's files, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> anyhow::Result<Self> {
        let dir =
            std::env::temp_dir().join(format!("deadline-lab-callgrind-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `runs` with at most `options.jobs` at a time; results in order.
fn run_all(
    runs: &[(Case, Variant, u64)],
    options: &Options,
    exe: &Path,
    faketime: &Path,
    dir: &Path,
) -> anyhow::Result<Vec<Counted>> {
    let next = AtomicU64::new(0);
    let results = std::sync::Mutex::new(vec![None; runs.len()]);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..options.jobs.clamp(1, runs.len().max(1)))
            .map(|_| {
                s.spawn(|| -> anyhow::Result<()> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                        let Some(&(case, variant, requests)) = runs.get(i) else {
                            return Ok(());
                        };
                        let out = dir.join(format!(
                            "callgrind.{}.{}.{requests}.out",
                            case.arg(),
                            variant.arg()
                        ));
                        let counted =
                            run_one(exe, faketime, &out, case, variant, requests, options)?;
                        if let Ok(mut results) = results.lock() {
                            results[i] = Some(counted);
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            worker
                .join()
                .map_err(|_| anyhow::anyhow!("a measuring thread panicked"))??;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let results = results
        .into_inner()
        .map_err(|_| anyhow::anyhow!("results poisoned"))?;
    results
        .into_iter()
        .zip(runs)
        .map(|(r, run)| r.ok_or_else(|| anyhow::anyhow!("run {run:?} produced nothing")))
        .collect()
}

/// The child command line.
fn child_args(cmd: &mut Command, case: Case, variant: Variant, requests: u64, options: &Options) {
    cmd.args([
        "bench-child",
        "--case",
        case.arg(),
        "--variant",
        variant.arg(),
    ])
    .arg("--requests")
    .arg(requests.to_string())
    .arg("--connections")
    .arg(options.connections.to_string())
    .arg("--streams")
    .arg(options.streams.to_string());
    if options.metrics {
        cmd.arg("--metrics");
    }
}

/// The functions that run a tonic server's work, each the root of a task:
/// a connection (reading frames, dispatching streams, writing) and one
/// stream (our layer, tonic's services, the handler, the response body),
/// plus the drop of a finished stream task, where the response body and the
/// request's scope are released.
///
/// Each name is given as valgrind demangles both of rustc's symbol
/// manglings: legacy (`{{closure}}`, `H2Stream<F,B,Ex>`; stable's default)
/// and v0 (`{closure#0}`, every generic function's type arguments,
/// `drop_in_place::<…>`; a nightly compiler's default, and a stable one's
/// under `RUSTC_BOOTSTRAP=1` or `-C symbol-mangling-version=v0`, where
/// the counts come out the same). A binary holds one of the two; should
/// neither match, the server cases count nothing and [`measure`] says so.
const SERVER_TASKS: [&str; 5] = [
    "tonic::transport::server::serve_connection::{{closure}}",
    "tonic::transport::server::serve_connection::<*>::{closure#0}",
    "<hyper::proto::h2::server::H2Stream<* as core::future::future::Future>::poll",
    // Not a wildcard before `<`: the drop of a task's stage that holds the
    // stream would match, and a toggle nested in a toggle turns it off.
    "core::ptr::drop_in_place<hyper::proto::h2::server::H2Stream<*",
    "core::ptr::drop_in_place::<hyper::proto::h2::server::H2Stream<*",
];

/// One variant with `requests` requests under callgrind.
fn run_one(
    exe: &Path,
    faketime: &Path,
    out: &Path,
    case: Case,
    variant: Variant,
    requests: u64,
    options: &Options,
) -> anyhow::Result<Counted> {
    let mut cmd = Command::new("valgrind");
    // An absolute FAKETIME stands still, for the monotonic clock too: no
    // deadline comes any closer and no timer fires.
    cmd.env("LD_PRELOAD", faketime)
        .env("FAKETIME", "2026-01-01 00:00:00")
        .env_remove("FAKETIME_DONT_FAKE_MONOTONIC")
        .args(["--tool=callgrind", "-q"])
        .arg(format!("--callgrind-out-file={}", out.display()));
    if matches!(
        case,
        Case::Server | Case::ServerHeader | Case::ServerGuard | Case::ServerGuardHeader
    ) {
        // Only the server's tasks: collection is switched on while one of
        // them is polled or dropped and off again when it returns.
        cmd.arg("--collect-atstart=no");
        for task in SERVER_TASKS {
            cmd.arg(format!("--toggle-collect={task}"));
        }
    }
    cmd.arg(exe);
    child_args(&mut cmd, case, variant, requests, options);
    let output = cmd.stdin(Stdio::null()).output()?;
    anyhow::ensure!(
        output.status.success(),
        "child {case:?} {variant:?} {requests} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let allocated: Allocated = serde_json::from_str(last)
        .map_err(|e| anyhow::anyhow!("child printed {last:?} instead of its allocations: {e}"))?;
    Ok(Counted {
        instructions: callgrind_total(out)?,
        allocated,
    })
}

/// The instructions of a callgrind output file (Ir, the default event),
/// less those executed inside libfaketime and the dynamic loader.
///
/// libfaketime's `clock_gettime` does more work than the vDSO call it
/// stands in for, and our layers read the clock more often than plain
/// tonic, so counting it would charge them for the stopped clock. That
/// work includes the loader's `__tls_get_addr`, five calls of about 11
/// instructions for every clock read: a library loaded with `LD_PRELOAD`
/// reaches its thread-locals through the loader, while the program's own,
/// linked into the executable, need no call (in the loader's profile every
/// call of `__tls_get_addr` comes from libfaketime). The loader's other
/// work (relocations, symbol lookups) happens at start-up, the same in
/// both runs of a variant. What is left is the program's own work, the
/// real `clock_gettime` included.
fn callgrind_total(path: &Path) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(path)?;
    let totals = text
        .lines()
        .find_map(|l| l.strip_prefix("totals:"))
        .or_else(|| text.lines().find_map(|l| l.strip_prefix("summary:")))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| anyhow::anyhow!("no totals in {}", path.display()))?;
    let stopped_clock = self_cost_in(&text, "libfaketime") + self_cost_in(&text, "ld-linux");
    Ok(totals.saturating_sub(stopped_clock))
}

/// The self cost (first event) of every function in an object whose name
/// contains `object`, from callgrind's output format: `ob=` names the object
/// of the functions that follow (`(id) name`, in `ob=` or `cob=`, defines a
/// compressed name, `(id)` refers to it), and the cost line after a `calls=` line is the
/// inclusive cost of that call, which is not self cost.
pub fn self_cost_in(text: &str, object: &str) -> u64 {
    let positions = text
        .lines()
        .find_map(|l| l.strip_prefix("positions:"))
        .map_or(1, |p| p.split_whitespace().count());
    let mut names = std::collections::HashMap::new();
    let mut inside = false;
    let mut after_call = false;
    let mut sum = 0u64;
    let mut name_of = |spec: &str| {
        let (id, name) = match spec.strip_prefix('(').and_then(|r| r.split_once(')')) {
            Some((id, rest)) => (Some(id.to_owned()), rest.trim()),
            None => (None, spec.trim()),
        };
        match (id, name.is_empty()) {
            (Some(id), true) => names.get(&id).cloned().unwrap_or_default(),
            (Some(id), false) => {
                names.insert(id, name.to_owned());
                name.to_owned()
            }
            (None, _) => name.to_owned(),
        }
    };
    for line in text.lines() {
        if let Some(spec) = line.strip_prefix("ob=") {
            inside = name_of(spec).contains(object);
        } else if let Some(spec) = line.strip_prefix("cob=") {
            // Defines a compressed name too; the current object is unchanged.
            name_of(spec);
        } else if line.starts_with("calls=") {
            after_call = true;
        } else if line.starts_with(|c: char| c.is_ascii_digit() || "+-*".contains(c)) {
            if std::mem::take(&mut after_call) {
                continue;
            }
            if inside {
                sum += line
                    .split_whitespace()
                    .nth(positions)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    sum
}

/// The hidden `bench-child` command: one side of one variant.
#[derive(Debug, Clone, clap::Args)]
pub struct ChildArgs {
    /// The case.
    #[arg(long, value_enum)]
    pub case: Case,
    /// Ours or plain tonic.
    #[arg(long, value_enum)]
    pub variant: Variant,
    /// Requests to make.
    #[arg(long)]
    pub requests: u64,
    /// Client connections.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Calls in flight per connection.
    #[arg(long, default_value_t = 16)]
    pub streams: usize,
    /// Our layers report to a metrics handle.
    #[arg(long)]
    pub metrics: bool,
}

/// Runs one child on a single-threaded runtime of its own. `allocated` reads
/// the binary's allocation counters; the last line printed is its value.
///
/// # Errors
///
/// A failed request or a port that cannot be bound.
pub fn child(args: ChildArgs, allocated: fn() -> Allocated) -> anyhow::Result<()> {
    // A service that logs nothing, for both variants. Without any tracing
    // subscriber, a dependency that turns on tracing's `log` feature (sqlx
    // does) makes every span of hyper, h2 and tonic try the `log` crate:
    // a tenth of plain tonic's instructions, which would dilute the ratio.
    let _ = tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let metrics =
        (args.metrics && args.variant == Variant::Ours).then(tonic_deadline::observe::Metrics::new);
    runtime.block_on(crate::metrics::maybe_with(metrics, async move {
        in_process(&args).await
    }))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(&allocated())?)?;
    out.flush()?;
    // Exit at once: dropping the runtime with its connections would only add
    // work that has nothing to do with requests.
    std::process::exit(0)
}

/// One caller: a client and the way it makes its requests.
enum Caller {
    /// `Health/Check`, optionally with a literal `grpc-timeout`.
    Health(HealthClient<Channel>, Option<&'static str>),
    /// `Health/Check` with `set_timeout(BUDGET)`.
    HealthTimeout(HealthClient<Channel>),
    /// `Health/Check` through our client layer, inside a `BUDGET` scope.
    HealthScoped(HealthClient<Layered>),
    /// `Probe/Call` on A with `set_timeout(BUDGET)`.
    ProbeTimeout(ProbeClient<Channel>),
    /// `Probe/Call` on A through our client layer, inside a `BUDGET` scope.
    ProbeScoped(ProbeClient<Layered>),
    /// `Probe/Watch` of [`STREAMED`] messages with `set_timeout(BUDGET)`,
    /// read to its end.
    WatchTimeout(ProbeClient<Channel>),
    /// The same through our client layer, inside a `BUDGET` scope.
    WatchScoped(ProbeClient<Layered>),
}

/// Reads a stream to its end.
async fn drain(stream: Result<Response<Streaming<CallReply>>, Status>) -> Result<(), Status> {
    let mut stream = stream?.into_inner();
    while stream.message().await?.is_some() {}
    Ok(())
}

fn watch_request() -> CallRequest {
    CallRequest {
        count: u32::try_from(STREAMED).unwrap_or(u32::MAX),
        ..CallRequest::default()
    }
}

impl Caller {
    async fn once(&mut self) -> Result<(), Status> {
        match self {
            Caller::Health(client, header) => {
                let mut request = Request::new(HealthCheckRequest::default());
                if let Some(header) = header {
                    request
                        .metadata_mut()
                        .insert("grpc-timeout", MetadataValue::from_static(header));
                }
                client.check(request).await.map(drop)
            }
            Caller::HealthTimeout(client) => {
                let mut request = Request::new(HealthCheckRequest::default());
                request.set_timeout(BUDGET);
                client.check(request).await.map(drop)
            }
            Caller::HealthScoped(client) => {
                let scope = Scope::root(Some(Instant::now() + BUDGET));
                scope
                    .enter(client.check(HealthCheckRequest::default()))
                    .await
                    .map(drop)
            }
            Caller::ProbeTimeout(client) => {
                let mut request = Request::new(CallRequest::default());
                request.set_timeout(BUDGET);
                client.call(request).await.map(drop)
            }
            Caller::ProbeScoped(client) => {
                let scope = Scope::root(Some(Instant::now() + BUDGET));
                scope
                    .enter(client.call(CallRequest::default()))
                    .await
                    .map(drop)
            }
            Caller::WatchTimeout(client) => {
                let mut request = Request::new(watch_request());
                request.set_timeout(BUDGET);
                drain(client.watch(request).await).await
            }
            Caller::WatchScoped(client) => {
                let scope = Scope::root(Some(Instant::now() + BUDGET));
                scope
                    .enter(async { drain(client.watch(watch_request()).await).await })
                    .await
            }
        }
    }
}

/// Makes exactly `requests` calls, `streams` at a time on each caller.
async fn drive<F, Fut>(
    connections: usize,
    streams: usize,
    requests: u64,
    mut caller: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Caller>>,
{
    let issued = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections.max(1) {
        let base = caller().await?;
        for _ in 0..streams.max(1) {
            let mut caller = base.clone_caller();
            let issued = issued.clone();
            #[allow(clippy::disallowed_methods)] // the load generator is no request's work
            tasks.spawn(async move {
                while issued.fetch_add(1, Ordering::Relaxed) < requests {
                    caller.once().await?;
                }
                Ok::<_, Status>(())
            });
        }
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

impl Caller {
    /// Another caller on the same connection.
    fn clone_caller(&self) -> Caller {
        match self {
            Caller::Health(c, h) => Caller::Health(c.clone(), *h),
            Caller::HealthTimeout(c) => Caller::HealthTimeout(c.clone()),
            Caller::HealthScoped(c) => Caller::HealthScoped(c.clone()),
            Caller::ProbeTimeout(c) => Caller::ProbeTimeout(c.clone()),
            Caller::ProbeScoped(c) => Caller::ProbeScoped(c.clone()),
            Caller::WatchTimeout(c) => Caller::WatchTimeout(c.clone()),
            Caller::WatchScoped(c) => Caller::WatchScoped(c.clone()),
        }
    }
}

/// Serves `routes` for a bench child: behind the layer alone for ours (the
/// reset guard is measured on its own), plain tonic otherwise.
async fn serve(routes: Routes, layer: Option<ServerDeadlineLayer>) -> anyhow::Result<SocketAddr> {
    net::serve_with("127.0.0.1:0", routes, layer, net::Guard::LayerOnly).await
}

async fn in_process(args: &ChildArgs) -> anyhow::Result<()> {
    let ours = args.variant == Variant::Ours;
    let layer = || ours.then(ServerDeadlineLayer::new);
    match args.case {
        Case::OneHop => {
            let (_reporter, health) = tonic_health::server::health_reporter();
            let addr = serve(Routes::new(health), layer()).await?;
            drive(
                args.connections,
                args.streams,
                args.requests,
                || async move {
                    Ok(if ours {
                        Caller::HealthScoped(HealthClient::new(net::connect_layered(addr).await?))
                    } else {
                        Caller::HealthTimeout(HealthClient::new(net::connect(addr).await?))
                    })
                },
            )
            .await
        }
        Case::Chain | Case::ChainByHand => {
            // Plain tonic passes the budget on by hand in the second case.
            let by_hand = args.case == Case::ChainByHand && !ours;
            let mut addr = serve(Relay::routes(None, by_hand), layer()).await?;
            for _hop in ["B", "A"] {
                let next = if ours {
                    Next::Layered(ProbeClient::new(net::connect_layered(addr).await?))
                } else {
                    Next::Plain(ProbeClient::new(net::connect(addr).await?))
                };
                addr = serve(Relay::routes(Some(next), by_hand), layer()).await?;
            }
            drive(
                args.connections,
                args.streams,
                args.requests,
                || async move {
                    Ok(if ours {
                        Caller::ProbeScoped(ProbeClient::new(net::connect_layered(addr).await?))
                    } else {
                        Caller::ProbeTimeout(ProbeClient::new(net::connect(addr).await?))
                    })
                },
            )
            .await
        }
        Case::Streaming => {
            let addr = serve(Relay::routes(None, false), layer()).await?;
            drive(1, 1, args.requests, || async move {
                Ok(if ours {
                    Caller::WatchScoped(ProbeClient::new(net::connect_layered(addr).await?))
                } else {
                    Caller::WatchTimeout(ProbeClient::new(net::connect(addr).await?))
                })
            })
            .await
        }
        Case::Server | Case::ServerHeader | Case::ServerGuard | Case::ServerGuardHeader => {
            let (_reporter, health) = tonic_health::server::health_reporter();
            let guard = match args.case {
                Case::ServerGuard | Case::ServerGuardHeader => net::Guard::Reset,
                _ => net::Guard::LayerOnly,
            };
            let addr = net::serve_with("127.0.0.1:0", Routes::new(health), layer(), guard).await?;
            let header =
                matches!(args.case, Case::ServerHeader | Case::ServerGuardHeader).then_some(HEADER);
            drive(
                args.connections,
                args.streams,
                args.requests,
                || async move {
                    Ok(Caller::Health(
                        HealthClient::new(net::connect(addr).await?),
                        header,
                    ))
                },
            )
            .await
        }
    }
}

/// A hop of the measured chain: calls the next hop at once (no work, no
/// timer of its own) and answers; the last hop answers at once. Its `Watch`
/// streams the replies asked for, as fast as they are read.
#[derive(Debug, Clone)]
struct Relay {
    next: Option<Next>,
    /// Pass the deadline on by hand, as plain tonic code must: read the
    /// incoming `grpc-timeout`, and set what is left of it on the call to
    /// the next hop.
    by_hand: bool,
}

impl Relay {
    fn routes(next: Option<Next>, by_hand: bool) -> Routes {
        Routes::new(ProbeServer::new(Relay { next, by_hand }))
    }
}

/// Reads a `grpc-timeout` value the way a tonic user would by hand: digits
/// and a unit.
fn grpc_timeout_by_hand(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

type Ticks = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<CallReply, Status>> + Send>>;

#[tonic::async_trait]
impl Probe for Relay {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        // By hand: the deadline from the moment the request is seen.
        let deadline = self
            .by_hand
            .then(|| {
                let value = request.metadata().get("grpc-timeout")?.to_str().ok()?;
                Some(Instant::now() + grpc_timeout_by_hand(value)?)
            })
            .flatten();
        match self.next.clone() {
            Some(Next::Plain(mut next)) if self.by_hand => {
                let mut outbound = Request::new(CallRequest::default());
                if let Some(deadline) = deadline {
                    outbound.set_timeout(deadline.saturating_duration_since(Instant::now()));
                }
                let reply = next.call(outbound).await?;
                Ok(Response::new(reply.into_inner()))
            }
            Some(next) => next.call(CallRequest::default()).await.map(Response::new),
            None => Ok(Response::new(CallReply::default())),
        }
    }

    type WatchStream = Ticks;

    async fn watch(&self, request: Request<CallRequest>) -> Result<Response<Ticks>, Status> {
        let count = request.into_inner().count;
        let replies = (0..count).map(|_| Ok(CallReply::default()));
        Ok(Response::new(Box::pin(tokio_stream::iter(replies))))
    }

    type ChatStream = Ticks;

    async fn chat(&self, _: Request<Streaming<CallRequest>>) -> Result<Response<Ticks>, Status> {
        Err(Status::unimplemented("not used by the bench"))
    }
}
