//! The one trait every experiment and benchmark implements, [`Experiment`],
//! and [`Entry`], an experiment as the lists hold it (the lists and the
//! lookups over them: [`crate::catalog`]).
//!
//! An experiment says its name, its flags, how it runs, the table it prints
//! and what it draws in the report. The command line builds `experiment
//! NAME` (and `bench NAME`) from it, the demo runs it and the report draws
//! it, and `docs/lab.md`'s table of commands shows its flags and what it
//! [prints](Experiment::PRINTS); so adding an experiment is its file, with
//! its `impl Experiment`, and its line in the [`entries!`] of
//! `experiments/mod.rs`.

use std::fmt;
use std::pin::Pin;

use clap::{ArgMatches, FromArgMatches};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::html::{Part, Section};
use crate::otlp::Receiver;
use crate::report::Outcome;

/// One run of an entry, to its printed result.
pub type Run = Pin<Box<dyn Future<Output = anyhow::Result<Outcome>>>>;

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

/// Where the spans of a traced run come from (only the waterfall and the
/// ledger trace their calls).
#[derive(Debug, Clone, Default)]
pub enum Spans {
    /// From a child `deadline-lab experiment NAME --json`, so that the spans
    /// (and their cost) stay out of this process: what the demo does.
    #[default]
    ChildProcess,
    /// From this process's own receiver (`None`: none runs): what `deadline-lab
    /// experiment NAME` does for an experiment that
    /// [collects its spans](Experiment::COLLECTS_SPANS).
    Collected(Option<Receiver>),
}

/// The flags of an experiment that takes none.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct NoArgs {}

/// One experiment or benchmark of the lab. The type is its result: what it
/// measured, printed as JSON with `--json` and read back by the report.
///
/// The command line offers it as `experiment NAME` (or `bench NAME`) with
/// its [`Args`](Experiment::Args), the demo runs it with
/// [`demo_args`](Experiment::demo_args), both print its
/// [`outcome`](Experiment::outcome), and the demo's report draws its
/// [`report`](Experiment::report) from the result and that same table.
pub trait Experiment: Serialize + DeserializeOwned + 'static {
    /// Its name on the command line (`db-cancel`, `overload`).
    const NAME: &'static str;
    /// One line on what it measures: its `--help`, and the line above its
    /// table in the report.
    const ABOUT: &'static str;
    /// What its command prints, in a few words of markdown: its line in
    /// `docs/lab.md`'s table of commands, beside its
    /// [usage](Entry::usage).
    const PRINTS: &'static str;
    /// Experiment or benchmark.
    const KIND: Kind = Kind::Experiment;
    /// Optional tools it needs; without one, the demo skips it.
    const NEEDS: &'static [Needs] = &[];
    /// Whether the demo runs it.
    const IN_DEMO: bool = true;
    /// Whether it barely uses the machine: it waits on deadlines, stalls
    /// and timers, not on work, and its figures hold beside other such
    /// steps. The demo runs such steps side by side, each in a process of
    /// its own ([`crate::demo::step`]); a step that times the machine's work
    /// (a benchmark, a flood, a load) runs alone.
    const LIGHT: bool = false;
    /// Whether its command collects the spans it traces with a receiver in
    /// this process ([`Spans::Collected`]); the demo runs it as a child
    /// process instead.
    const COLLECTS_SPANS: bool = false;
    /// The report's section it draws in, and where the report says it
    /// failed or was skipped; `None`: only its table, with every other.
    const SECTION: Option<Section> = None;
    /// CSS its charts need, added to the report's.
    const STYLE: &'static str = "";

    /// Its flags ([`NoArgs`] for none).
    type Args: clap::Args;

    /// The flags the demo runs it with: unless it says otherwise, their
    /// defaults on the command line.
    fn demo_args() -> Self::Args {
        defaults::<Self::Args>(Self::NAME)
    }

    /// Runs it with `args`, taking spans (if it traces any) from `spans`.
    fn run(args: Self::Args, spans: Spans) -> impl Future<Output = anyhow::Result<Self>>;

    /// The table it prints: its title, columns, rows and notes, and this
    /// result as the JSON `--json` prints.
    fn outcome(&self) -> Outcome;

    /// What it draws in the report: charts from this result, and the rows
    /// of `table` (its own [`outcome`](Experiment::outcome), as the demo
    /// printed it) rather than a copy made again. Nothing by default.
    fn report(&self, table: &Outcome) -> Vec<Part> {
        let _ = table;
        Vec::new()
    }
}

/// The values `A`'s flags take when none is given.
///
/// # Panics
///
/// When one of them has no default (a mistake in the lab, found by the
/// registry's tests).
fn defaults<A: clap::Args>(name: &'static str) -> A {
    let command = <A as clap::Args>::augment_args(clap::Command::new(name).no_binary_name(true));
    let matches = command
        .try_get_matches_from(std::iter::empty::<String>())
        .expect("an experiment's flags must all have defaults");
    A::from_arg_matches(&matches).expect("defaults must read back as the flags")
}

/// An [`Experiment`] as the lists hold it.
#[derive(Debug)]
pub struct Entry {
    /// [`Experiment::NAME`].
    pub name: &'static str,
    /// [`Experiment::KIND`].
    pub kind: Kind,
    /// [`Experiment::ABOUT`].
    pub about: &'static str,
    /// [`Experiment::PRINTS`].
    pub prints: &'static str,
    /// [`Experiment::NEEDS`].
    pub needs: &'static [Needs],
    /// [`Experiment::IN_DEMO`].
    pub in_demo: bool,
    /// [`Experiment::LIGHT`].
    pub light: bool,
    /// [`Experiment::COLLECTS_SPANS`].
    pub collects_spans: bool,
    /// [`Experiment::SECTION`].
    pub section: Option<Section>,
    /// [`Experiment::STYLE`].
    pub style: &'static str,
    command: fn() -> clap::Command,
    run: fn(&ArgMatches, Spans) -> Run,
    demo: fn() -> Run,
    outcome: fn(serde_json::Value) -> anyhow::Result<Outcome>,
    report: fn(&Outcome) -> Vec<Part>,
}

impl Entry {
    /// The entry of experiment `E`.
    pub const fn of<E: Experiment>() -> Self {
        Self {
            name: E::NAME,
            kind: E::KIND,
            about: E::ABOUT,
            prints: E::PRINTS,
            needs: E::NEEDS,
            in_demo: E::IN_DEMO,
            light: E::LIGHT,
            collects_spans: E::COLLECTS_SPANS,
            section: E::SECTION,
            style: E::STYLE,
            command: command::<E>,
            run: run::<E>,
            demo: demo::<E>,
            outcome: outcome::<E>,
            report: report::<E>,
        }
    }

    /// The demo's name for the step: `chain`, `bench overload`.
    pub fn step(&self) -> String {
        match self.kind {
            Kind::Experiment => self.name.to_owned(),
            Kind::Bench => format!("bench {}", self.name),
        }
    }

    /// Its command line with every flag, as `docs/lab.md` lists it:
    /// `experiment ledger [--json] [--runs RUNS]`.
    pub fn usage(&self) -> String {
        let mut usage = match self.kind {
            Kind::Experiment => format!("experiment {} [--json]", self.name),
            Kind::Bench => format!("bench {} [--json]", self.name),
        };
        if self.collects_spans {
            usage.push_str(" [--otlp-endpoint URL]");
        }
        for arg in self.command().get_arguments() {
            let Some(long) = arg.get_long().filter(|long| *long != "help") else {
                continue;
            };
            if !arg.get_action().takes_values() {
                usage.push_str(&format!(" [--{long}]"));
                continue;
            }
            let value = arg
                .get_value_names()
                .and_then(|names| names.first())
                .map_or_else(|| arg.get_id().as_str().to_uppercase(), ToString::to_string);
            let many = matches!(arg.get_action(), clap::ArgAction::Append);
            usage.push_str(&format!(
                " [--{long} {value}{}]",
                if many { " …" } else { "" }
            ));
        }
        usage
    }

    /// Its row of `docs/lab.md`'s table of commands: its
    /// [usage](Entry::usage) and what it [prints](Experiment::PRINTS).
    pub fn doc_row(&self) -> String {
        format!("| `{}` | {} |", self.usage(), self.prints)
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

    /// Its subcommand: its name, its line of help and its flags.
    pub fn command(&self) -> clap::Command {
        (self.command)()
    }

    /// Runs it with the flags of its subcommand's `matches`.
    pub fn run(&self, matches: &ArgMatches, spans: Spans) -> Run {
        (self.run)(matches, spans)
    }

    /// Runs it as the demo does: with [`Experiment::demo_args`], its spans
    /// (if it traces any) collected by a child process.
    pub fn run_in_demo(&self) -> Run {
        (self.demo)()
    }

    /// Its table, from the result `json` a run printed (with `--json`, or
    /// as a demo step in a child process).
    ///
    /// # Errors
    ///
    /// When `json` does not read back as its result.
    pub fn outcome(&self, json: serde_json::Value) -> anyhow::Result<Outcome> {
        (self.outcome)(json)
    }

    /// What it draws in the report from its printed `table`: nothing when
    /// the table's JSON does not read back as its result.
    pub fn report(&self, table: &Outcome) -> Vec<Part> {
        (self.report)(table)
    }
}

fn command<E: Experiment>() -> clap::Command {
    // After the flags: their derive sets the help from their doc comment.
    <E::Args as clap::Args>::augment_args(clap::Command::new(E::NAME))
        .about(E::ABOUT)
        .long_about(None)
}

fn run<E: Experiment>(matches: &ArgMatches, spans: Spans) -> Run {
    let args = E::Args::from_arg_matches(matches);
    Box::pin(async move { Ok(E::run(args?, spans).await?.outcome()) })
}

fn outcome<E: Experiment>(json: serde_json::Value) -> anyhow::Result<Outcome> {
    Ok(serde_json::from_value::<E>(json)?.outcome())
}

fn report<E: Experiment>(table: &Outcome) -> Vec<Part> {
    // The result read back from the JSON it printed, as `--json` readers
    // read it.
    serde_json::from_value::<E>(table.json.clone())
        .map_or_else(|_| Vec::new(), |result| result.report(table))
}

fn demo<E: Experiment>() -> Run {
    Box::pin(async { Ok(E::run(E::demo_args(), Spans::ChildProcess).await?.outcome()) })
}

/// Runs `run` with the warnings it provokes counted in its table's notes
/// rather than printed ([`crate::logs::Quiet`]): how the demo and `experiment
/// NAME` run every entry. (`bench NAME` prints its warnings as they come: a
/// benchmark provokes none on purpose.)
///
/// # Errors
///
/// As `run`.
pub async fn quietly(run: Run) -> anyhow::Result<Outcome> {
    let quiet = crate::logs::Quiet::start();
    let mut outcome = run.await?;
    outcome.notes.extend(quiet.summary());
    Ok(outcome)
}

/// Declares the modules of a list of experiments and the list itself, one
/// line each (`module::Result`, in the order the demo runs them): the
/// module in `module.rs` beside the list's, the entry that of `Result`,
/// its [`Experiment`].
///
/// ```ignore
/// entries! {
///     /// Every experiment, in the order the demo runs them.
///     ALL: wire::Wire, chain::Chain,
/// }
/// ```
macro_rules! entries {
    ($(#[$doc:meta])* $list:ident: $($module:ident::$result:ident),+ $(,)?) => {
        $(pub mod $module;)+
        $(#[$doc])*
        pub static $list: &[$crate::registry::Entry] =
            &[$($crate::registry::Entry::of::<$module::$result>()),+];
    };
}
pub(crate) use entries;
