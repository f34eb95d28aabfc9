//! What a test binary's code logged at WARN and above, captured
//! process-wide: [`capture`] installs the binary's one subscriber (before
//! the calls whose warnings a test reads), and [`warnings_about`] and
//! [`errors_about`] read what it caught.
//!
//! ```
//! testkit::logs::capture();
//! tracing::warn!("a connection reset streams early again");
//! assert_eq!(testkit::logs::warnings_about("reset streams early").len(), 1);
//! assert!(testkit::logs::errors_about("reset streams early").is_empty());
//! ```

use std::sync::{Mutex, OnceLock};

use tracing_subscriber::filter::LevelFilter;

fn log_lines() -> &'static Mutex<Vec<u8>> {
    static LOG: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    let log = LOG.get_or_init(|| Mutex::new(Vec::new()));
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(LevelFilter::WARN)
            .with_writer(|| LogWriter)
            .finish();
        tracing_subscriber::util::SubscriberInitExt::try_init(subscriber)
            .expect("the test binary installs one subscriber");
    });
    log
}

struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        log_lines()
            .lock()
            .expect("not poisoned")
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Starts capturing what the process logs (before the test's calls).
///
/// # Panics
///
/// When the binary has installed a subscriber of its own.
pub fn capture() {
    let _ = log_lines();
}

/// The lines logged at `level` (`WARN`, `ERROR`) so far that mention
/// `needle`.
fn logged(level: &str, needle: &str) -> Vec<String> {
    let log = log_lines().lock().expect("not poisoned");
    String::from_utf8_lossy(&log)
        .lines()
        .filter(|l| l.contains(level) && l.contains(needle))
        .map(str::to_owned)
        .collect()
}

/// The warnings logged so far that mention `needle`.
pub fn warnings_about(needle: &str) -> Vec<String> {
    logged("WARN", needle)
}

/// The errors logged so far that mention `needle`.
pub fn errors_about(needle: &str) -> Vec<String> {
    logged("ERROR", needle)
}
