//! The lab's log output: `tracing` events to stderr (filtered by `RUST_LOG`,
//! warnings by default), and a count of the library's warnings that the
//! experiments read back to tell whether a break was reported.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

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
        let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
        let _ = tracing_subscriber::registry()
            .with(extra)
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_filter(filter),
            )
            .with(LibraryWarnings)
            .try_init();
    });
}

/// How many warnings the library (`tonic_deadline`) logged, and their
/// messages, since the process started.
pub fn library_warnings() -> (u64, Vec<String>) {
    let seen = seen();
    let lines = seen.lines.lock().map(|l| l.clone()).unwrap_or_default();
    (seen.count.load(Ordering::Relaxed), lines)
}

struct LibraryWarnings;

impl<S: tracing::Subscriber> Layer<S> for LibraryWarnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() != tracing::Level::WARN || !meta.target().starts_with("tonic_deadline") {
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
