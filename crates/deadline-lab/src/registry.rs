//! Every experiment and benchmark of the demo, in one list: the demo runs
//! them in this order, `deadline-lab experiment NAME` finds its runner here,
//! and the report names each step as the list does.
//!
//! Adding an experiment is one [`Entry`] here (and its subcommand in
//! `main.rs`, for its flags; a test there checks that the two agree).

use std::fmt;
use std::pin::Pin;
use std::time::Duration;

use crate::otlp::Receiver;
use crate::report::Outcome;
use crate::{bench, experiments};

/// One run of an entry, to its printed result.
pub type Run = Pin<Box<dyn Future<Output = anyhow::Result<Outcome>>>>;

/// The demo's soak: long enough to see a flat memory line, short enough to
/// keep the demo brief (`bench soak` runs 10^6).
const DEMO_SOAK_CALLS: u64 = 30_000;

/// An optional tool an entry needs, beyond what the lab itself brings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Debian's nginx (found as [`crate::nginx::binary`] finds it).
    Nginx,
    /// Root, and iproute2's `ip` with working network namespaces (checked
    /// as [`crate::netns::check_support`] checks it).
    NetNamespaces,
}

impl Needs {
    /// What is needed, in a few words.
    pub fn tool(self) -> &'static str {
        match self {
            Needs::Nginx => "nginx",
            Needs::NetNamespaces => "root and network namespaces",
        }
    }

    /// How to provide it.
    pub fn hint(self) -> &'static str {
        match self {
            Needs::Nginx => "apt-get install nginx",
            Needs::NetNamespaces => "run as root, with iproute2 (apt-get install iproute2)",
        }
    }

    /// Why the tool cannot be used here; `None` when it can.
    pub async fn missing(self) -> Option<String> {
        let found = match self {
            Needs::Nginx => crate::nginx::binary().map(drop),
            Needs::NetNamespaces => crate::netns::check_support().await.map(drop),
        };
        found.err().map(|e| format!("{e:#}"))
    }
}

/// A tool an entry needs that this machine lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// The tool.
    pub needs: Needs,
    /// What the check found.
    pub why: String,
}

/// `needs nginx: apt-get install nginx`.
impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "needs {}: {}", self.needs.tool(), self.needs.hint())
    }
}

/// Whether an entry is an experiment (`experiment NAME`) or a benchmark
/// (`bench NAME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Measures one claim.
    Experiment,
    /// Measures a cost or a capacity; the demo runs it with a short load.
    Bench,
}

/// Where the waterfall gets its spans.
#[derive(Debug, Clone, Default)]
pub enum Spans {
    /// From a child `deadline-lab experiment waterfall`, so that the spans
    /// (and their cost) stay out of this process: what the demo does.
    #[default]
    ChildProcess,
    /// From this process's own receiver (`None`: none runs).
    Collected(Option<Receiver>),
}

/// What the flags of `experiment NAME` can change; the defaults are the
/// demo's.
#[derive(Debug, Clone)]
pub struct Params {
    /// `experiment chain --hop-ms`: each hop's work.
    pub hop: Duration,
    /// `experiment hosts --one-way-ms`: one-way latency of every link.
    pub one_way_ms: Vec<u64>,
    /// Where the waterfall's spans come from.
    pub spans: Spans,
    /// `experiment rapid-reset --flood-ms`: how long each row floods.
    pub flood: Duration,
    /// `experiment honest-resets --window-ms`: how long each pattern runs
    /// against each server.
    pub window: Duration,
    /// `experiment amplification --fan-in-ms`: how long C is down in the
    /// fan-in case.
    pub fan_in: Duration,
    /// `experiment metastable --before-ms --trigger-ms --after-ms`.
    pub timeline: [Duration; 3],
    /// `experiment ledger --runs`: runs of each stall case.
    pub runs: usize,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            hop: Duration::from_millis(experiments::chain::DEFAULT_HOP_MS),
            one_way_ms: experiments::hosts::ONE_WAY_MS.to_vec(),
            spans: Spans::ChildProcess,
            flood: experiments::rapid_reset::DEMO_FLOOD,
            window: experiments::honest_resets::DEMO_WINDOW,
            fan_in: experiments::amplification::DEMO_FAN_IN,
            timeline: experiments::metastable::DEMO_TIMELINE_MS.map(Duration::from_millis),
            runs: experiments::ledger::RUNS,
        }
    }
}

/// One experiment or benchmark.
#[derive(Debug)]
pub struct Entry {
    /// Its name on the command line (`db-cancel`, `overload`).
    pub name: &'static str,
    /// Experiment or benchmark.
    pub kind: Kind,
    /// One line on what it measures (its `--help`).
    pub about: &'static str,
    /// Optional tools it needs; without one, the demo skips it.
    pub needs: &'static [Needs],
    run: fn(Params) -> Run,
}

impl Entry {
    /// The demo's name for the step: `chain`, `bench overload`.
    pub fn step(&self) -> String {
        match self.kind {
            Kind::Experiment => self.name.to_owned(),
            Kind::Bench => format!("bench {}", self.name),
        }
    }

    /// The first tool it needs that this machine lacks.
    pub async fn missing_tool(&self) -> Option<Missing> {
        for &needs in self.needs {
            if let Some(why) = needs.missing().await {
                return Some(Missing { needs, why });
            }
        }
        None
    }

    /// Runs it with `params`. Benchmarks ignore them and run the demo's
    /// short load (`bench NAME` takes its own flags). The warnings it
    /// provokes are counted in its table's notes, not printed
    /// ([`crate::logs::Quiet`]).
    pub fn run(&self, params: Params) -> Run {
        let run = (self.run)(params);
        Box::pin(async move {
            let quiet = crate::logs::Quiet::start();
            let mut outcome = run.await?;
            outcome.notes.extend(quiet.summary());
            Ok(outcome)
        })
    }
}

/// Every step of the demo, in the order it runs them.
pub static ENTRIES: &[Entry] = &[
    Entry {
        name: "wire",
        kind: Kind::Experiment,
        about: "grpc-timeout on the wire for budgets from 50 ms to 100 h",
        needs: &[],
        run: |_| Box::pin(experiments::wire::run()),
    },
    Entry {
        name: "chain",
        kind: Kind::Experiment,
        about: "Remaining budget on entry at A, B and C",
        needs: &[],
        run: |p| Box::pin(experiments::chain::run(p.hop)),
    },
    Entry {
        name: "propagation",
        kind: Kind::Experiment,
        about: "Completions downstream after the client gives up: propagate vs detach",
        needs: &[],
        run: |_| Box::pin(experiments::propagation::run()),
    },
    Entry {
        name: "expired",
        kind: Kind::Experiment,
        about: "An already-expired call: status, time, frames on the wire",
        needs: &[],
        run: |_| Box::pin(experiments::expired::run()),
    },
    Entry {
        name: "handler",
        kind: Kind::Experiment,
        about: "A handler that watches its scope vs one that ignores it",
        needs: &[],
        run: |_| Box::pin(experiments::handler::run()),
    },
    Entry {
        name: "drift",
        kind: Kind::Experiment,
        about: "Relative timeouts under injected client → server delay",
        needs: &[],
        run: |_| Box::pin(experiments::drift::run()),
    },
    Entry {
        name: "im",
        kind: Kind::Experiment,
        about: "The IM chain's per-hop budgets, normal and with route stalling",
        needs: &[],
        run: |_| Box::pin(experiments::im::run()),
    },
    Entry {
        name: "ledger",
        kind: Kind::Experiment,
        about: "Where the budget of a DEADLINE_EXCEEDED went: the ledger the root caller receives for the IM chain with route stalled, the shop with pricing late and a retried call, over many runs",
        needs: &[],
        run: |p| match p.spans {
            Spans::ChildProcess => Box::pin(experiments::ledger::run_child(p.runs)),
            Spans::Collected(receiver) => {
                Box::pin(async move { experiments::ledger::run(p.runs, receiver.as_ref()).await })
            }
        },
    },
    Entry {
        name: "waterfall",
        kind: Kind::Experiment,
        about: "One request through the IM chain, traced: every hop's span, budget and outcome, normal and with route stalling",
        needs: &[],
        run: |p| match p.spans {
            Spans::ChildProcess => Box::pin(experiments::waterfall::run_child()),
            Spans::Collected(receiver) => {
                Box::pin(async move { experiments::waterfall::run(receiver.as_ref()).await })
            }
        },
    },
    Entry {
        name: "shop",
        kind: Kind::Experiment,
        about: "The API's 900 ms shared by inventory and pricing, the cache cap, fan-out",
        needs: &[],
        run: |_| Box::pin(experiments::shop::run()),
    },
    Entry {
        name: "orders",
        kind: Kind::Experiment,
        about: "CreateOrder with a payment that stalls past the deadline",
        needs: &[],
        run: |_| Box::pin(experiments::orders::run()),
    },
    Entry {
        name: "db-cancel",
        kind: Kind::Experiment,
        about: "A 5 s query under a 200 ms deadline, on SQLite and PostgreSQL",
        needs: &[],
        run: |_| Box::pin(experiments::db_cancel::run()),
    },
    Entry {
        name: "seams",
        kind: Kind::Experiment,
        about: "Every way code moves work or makes a call: budget kept, or the break reported",
        needs: &[],
        run: |_| Box::pin(experiments::seams::run()),
    },
    Entry {
        name: "edge",
        kind: Kind::Experiment,
        about: "An axum edge → tonic → sqlx query (and → reqwest → REST) under one 900 ms budget, the client giving up at 300 ms (needs PostgreSQL)",
        needs: &[],
        run: |_| Box::pin(experiments::edge::run()),
    },
    Entry {
        name: "hosts",
        kind: Kind::Experiment,
        about: "Every service in its own network namespace with one-way latency: what each hop's deadline gains over its parent's (needs root)",
        needs: &[Needs::NetNamespaces],
        run: |p| {
            Box::pin(async move {
                let hosts = experiments::hosts::measure(&p.one_way_ms).await?;
                anyhow::Ok(experiments::hosts::outcome(&hosts))
            })
        },
    },
    Entry {
        name: "proxy",
        kind: Kind::Experiment,
        about: "Debian's nginx (grpc_pass) between two hops: the header it forwards, the transit, and whether a client's cancel reaches the hop behind it",
        needs: &[Needs::Nginx],
        run: |_| Box::pin(experiments::proxy::run()),
    },
    Entry {
        name: "faults",
        kind: Kind::Experiment,
        about: "A downstream process killed, a connection cut mid-message, a downstream hung: the upstream hop's answer and what it released",
        needs: &[],
        run: |_| Box::pin(experiments::faults::run()),
    },
    Entry {
        name: "rapid-reset",
        kind: Kind::Experiment,
        about: "HTTP/2 Rapid Reset floods, fast and slow, on one connection and four, in the clear and over TLS: how plain tonic, the layer alone and ours cut them off, and an honest client's latency beside them",
        needs: &[],
        run: |p| Box::pin(experiments::rapid_reset::run(p.flood)),
    },
    Entry {
        name: "honest-resets",
        kind: Kind::Experiment,
        about: "Honest clients that end streams early (deadline storms, hedges, their own short timeouts, cancels, a flood's neighbours behind one address) against plain tonic, the layer alone and ours",
        needs: &[],
        run: |p| Box::pin(experiments::honest_resets::run(p.window)),
    },
    Entry {
        name: "amplification",
        kind: Kind::Experiment,
        about: "Retries on every hop of client → A → B → C with C down, failing 5 % of calls, and under fan-in: attempts reaching C per root call, one budget for the chain beside per-hop retries",
        needs: &[],
        run: |p| Box::pin(experiments::amplification::run(p.fan_in)),
    },
    Entry {
        name: "metastable",
        kind: Kind::Experiment,
        about: "A service at 0.9 of capacity under retrying clients, hit by a capacity cut or a load spike that then ends: goodput per second and the time it takes to come back, plain tonic beside ours",
        needs: &[],
        run: |p| Box::pin(experiments::metastable::run(p.timeline)),
    },
    Entry {
        name: "retry",
        kind: Kind::Experiment,
        about: "Retries inside one deadline: succeeding on the 3rd attempt, the deadline ending the backoff, pushback, outcome-unknown codes",
        needs: &[],
        run: |_| Box::pin(experiments::retry::run()),
    },
    Entry {
        name: "hedge",
        kind: Kind::Experiment,
        about: "Hedging against a 5 % slow tail: none, ours, tower::hedge",
        needs: &[],
        run: |_| Box::pin(experiments::hedge::run()),
    },
    Entry {
        name: "jobs",
        kind: Kind::Experiment,
        about: "Jobs on PostgreSQL, two worker processes, one killed mid-job",
        needs: &[],
        run: |_| Box::pin(async { experiments::jobs::run().await?.outcome() }),
    },
    Entry {
        name: "overhead",
        kind: Kind::Bench,
        about: "Unary throughput and latency, plain tonic vs both layers",
        needs: &[],
        run: |_| {
            Box::pin(bench::overhead::run(bench::overhead::Load {
                rounds: 4,
                ..Default::default()
            }))
        },
    },
    Entry {
        name: "cancel",
        kind: Kind::Bench,
        about: "Cancel propagation latency across three hops",
        needs: &[],
        run: |_| Box::pin(bench::cancel::run_on_own_runtime(1000, 1)),
    },
    Entry {
        name: "overload",
        kind: Kind::Bench,
        about: "Goodput at 1x, 2x and 4x capacity: a pooled ~10 ms query, 100 ms deadlines",
        needs: &[],
        // 1 s windows: a dozen windows are the demo's longest step, and at
        // 1x capacity a window still holds ~350 calls (`bench overload`
        // alone keeps 3 s).
        run: |_| {
            Box::pin(bench::overload::run(bench::overload::Load {
                window: Duration::from_secs(1),
                ..Default::default()
            }))
        },
    },
    Entry {
        name: "soak",
        kind: Kind::Bench,
        about: "Many calls through A -> B -> C with random deadlines and client cancels; then memory, tasks, permits and connections left over",
        needs: &[],
        run: |_| {
            Box::pin(async {
                let load = bench::soak::Load {
                    calls: DEMO_SOAK_CALLS,
                    max: Duration::from_secs(60),
                    ..Default::default()
                };
                bench::soak::run_on_own_runtime(load).await?.outcome()
            })
        },
    },
    Entry {
        name: "retry-storm",
        kind: Kind::Bench,
        about: "The overload setup at 2x capacity with a downstream failing 10 % of calls: no retries, naive retries, ours",
        needs: &[],
        run: |_| {
            Box::pin(bench::retry_storm::run(bench::overload::Load {
                window: Duration::from_secs(2),
                ..Default::default()
            }))
        },
    },
];

/// The experiment called `name` on the command line.
pub fn experiment(name: &str) -> Option<&'static Entry> {
    ENTRIES
        .iter()
        .find(|e| e.kind == Kind::Experiment && e.name == name)
}

/// The entry whose demo step is called `step` (`chain`, `bench soak`).
pub fn by_step(step: &str) -> Option<&'static Entry> {
    ENTRIES.iter().find(|e| e.step() == step)
}
