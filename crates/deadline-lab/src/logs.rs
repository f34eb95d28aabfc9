//! The lab's log output: `tracing` events to stderr (filtered by `RUST_LOG`,
//! warnings by default), and a count of the library's warnings that the
//! experiments read back to tell whether a break was reported.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
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
        let filter = stderr_filter(std::env::var("RUST_LOG").ok().as_deref());
        let _ = tracing_subscriber::registry()
            .with(extra)
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_filter(filter),
            )
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
