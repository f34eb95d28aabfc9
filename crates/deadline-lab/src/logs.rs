//! The lab's log output: `tracing` events to stderr (filtered by `RUST_LOG`,
//! warnings by default, with colours only on a terminal), a count of the
//! library's warnings that the experiments read back to tell whether a break
//! was reported, and [`Quiet`]: while an experiment runs, the warnings it
//! provokes on purpose (h2's, the reset guard's) are counted for its table
//! instead of printed line by line.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::writer::MakeWriterExt;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// The target prefix of the library's own events.
const LIBRARY: &str = "tonic_deadline";

/// The library's warnings seen so far, as `target: message` lines.
#[derive(Debug, Default)]
struct Seen {
    count: AtomicU64,
    lines: Mutex<Vec<String>>,
}

fn seen() -> &'static Seen {
    static SEEN: OnceLock<Seen> = OnceLock::new();
    SEEN.get_or_init(Seen::default)
}

/// Installs the lab's subscriber once per process (later calls do nothing;
/// a subscriber installed by someone else is left in place, and then
/// [`library_warnings`] counts nothing).
pub fn install() {
    install_with(None);
}

/// A layer added under the lab's own, such as the span exporter.
pub type Extra = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>;

/// [`install`], with `extra` as well (the first call decides).
pub fn install_with(extra: Option<Extra>) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let rust_log = std::env::var("RUST_LOG").ok();
        // Asked for by name, events are printed even while quiet. Decided
        // per event printed, in the writer: a filter of the layer's own
        // would leave every callsite (h2's and hyper's TRACE spans
        // included) to be asked at run time, at a cost on every request.
        let asked = rust_log.is_some();
        let filter = stderr_filter(rust_log.as_deref());
        let stderr = std::io::stderr.with_filter(move |meta: &tracing::Metadata<'_>| {
            asked || *meta.level() == tracing::Level::ERROR || !QUIET.load(Ordering::Relaxed)
        });
        let _ = tracing_subscriber::registry()
            .with(extra)
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(stderr)
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_filter(filter),
            )
            .with(Provoked.with_filter(Targets::new().with_default(tracing::Level::WARN)))
            // Filtered to what it counts: without a filter of its own the
            // layer would enable every callsite (h2's and hyper's TRACE
            // events included) for the whole subscriber, and each request
            // would pay for building and dispatching events nobody prints.
            .with(LibraryWarnings.with_filter(library_warnings_filter()))
            .try_init();
    });
}

/// What is printed to stderr: `RUST_LOG` (`target=level` directives and a
/// default level, comma-separated) or, without it, warnings.
///
/// sqlx warns of every statement slower than a second and of each server
/// notice; the experiments make statements slow and cancel them on
/// purpose, so by default its lines would read as failures. `RUST_LOG`
/// still shows them. A `RUST_LOG` that does not parse is said on stderr,
/// not ignored in silence.
pub fn stderr_filter(rust_log: Option<&str>) -> Targets {
    const DEFAULT: &str = "warn,sqlx=error";
    let directives = rust_log.unwrap_or(DEFAULT);
    directives.parse().unwrap_or_else(|error| {
        eprintln!("RUST_LOG={directives:?} does not parse ({error}): using {DEFAULT:?}");
        DEFAULT.parse().expect("the default filter parses")
    })
}

/// How many warnings the library (`tonic_deadline`) logged, and their
/// messages, since the process started.
pub fn library_warnings() -> (u64, Vec<String>) {
    let seen = seen();
    let lines = seen.lines.lock().map(|l| l.clone()).unwrap_or_default();
    (seen.count.load(Ordering::Relaxed), lines)
}

/// What [`LibraryWarnings`] is shown: the library's events at `WARN` and
/// above; its level hint keeps every callsite below `WARN` disabled unless
/// another layer (`RUST_LOG`, the span exporter) asks for it.
pub fn library_warnings_filter() -> Targets {
    Targets::new().with_target(LIBRARY, tracing::Level::WARN)
}

struct LibraryWarnings;

impl<S: tracing::Subscriber> Layer<S> for LibraryWarnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() != tracing::Level::WARN || !meta.target().starts_with(LIBRARY) {
            return;
        }
        let mut text = Text(String::new());
        event.record(&mut text);
        let seen = seen();
        seen.count.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut lines) = seen.lines.lock() {
            lines.push(format!("{}: {}", meta.target(), text.0));
        }
    }
}

struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if !self.0.is_empty() {
            self.0.push(' ');
        }
        if field.name() == "message" {
            self.0.push_str(&format!("{value:?}"));
        } else {
            self.0.push_str(&format!("{}={value:?}", field.name()));
        }
    }
}

/// While set, warnings and errors go to [`Quiet`]'s count, not to stderr.
static QUIET: AtomicBool = AtomicBool::new(false);

/// What was logged while quiet: (target, message) → how many.
fn provoked() -> &'static Mutex<BTreeMap<(String, String), u64>> {
    static PROVOKED: OnceLock<Mutex<BTreeMap<(String, String), u64>>> = OnceLock::new();
    PROVOKED.get_or_init(Mutex::default)
}

/// Counts the warnings and errors logged while quiet.
struct Provoked;

impl<S: tracing::Subscriber> Layer<S> for Provoked {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if !QUIET.load(Ordering::Relaxed) {
            return;
        }
        let mut text = Message(String::new());
        event.record(&mut text);
        let key = (event.metadata().target().to_owned(), text.0);
        if let Ok(mut provoked) = provoked().lock() {
            *provoked.entry(key).or_insert(0) += 1;
        }
    }
}

/// An event's message alone, without its fields.
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

/// While held, the warnings and errors an experiment provokes are counted,
/// not printed (unless `RUST_LOG` asks for them): a reset flood makes h2
/// warn of every connection it cuts, thousands of lines that say one thing.
/// [`summary`](Self::summary) is the line the experiment's table notes.
#[derive(Debug)]
pub struct Quiet(());

impl Quiet {
    /// Starts counting.
    pub fn start() -> Self {
        if let Ok(mut provoked) = provoked().lock() {
            provoked.clear();
        }
        QUIET.store(true, Ordering::Relaxed);
        Self(())
    }

    /// What was logged since the start, most frequent first, each message
    /// cut to a line: `None` when nothing was.
    pub fn summary(&self) -> Option<String> {
        let provoked = provoked().lock().ok()?;
        if provoked.is_empty() {
            return None;
        }
        let total: u64 = provoked.values().sum();
        let mut each: Vec<_> = provoked.iter().collect();
        each.sort_by(|a, b| b.1.cmp(a.1));
        let listed: Vec<String> = each
            .iter()
            .take(4)
            .map(|((target, message), n)| {
                let mut message = message.clone();
                if message.chars().count() > 90 {
                    message = message.chars().take(89).collect::<String>() + "…";
                }
                format!("{n} × {target}: {message}")
            })
            .collect();
        let more = each.len().saturating_sub(listed.len());
        Some(format!(
            "warnings logged while it ran, counted rather than printed ({total}; RUST_LOG=warn prints them): {}{}",
            listed.join("; "),
            if more > 0 {
                format!("; and {more} other kinds")
            } else {
                String::new()
            }
        ))
    }
}

impl Drop for Quiet {
    fn drop(&mut self) {
        QUIET.store(false, Ordering::Relaxed);
    }
}
