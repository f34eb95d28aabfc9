//! What the lab prints and counts of the library's logs.

use tracing::Level;
use tracing::level_filters::LevelFilter;

use deadline_lab::logs::{library_warnings_filter, stderr_filter};

#[test]
fn stderr_shows_warnings_but_not_sqlx_unless_rust_log_asks() {
    let default = stderr_filter(None);
    assert!(default.would_enable("tonic_deadline::client", &Level::WARN));
    assert!(!default.would_enable("tonic_deadline::client", &Level::INFO));
    assert!(!default.would_enable("sqlx::query", &Level::WARN));
    assert!(default.would_enable("sqlx::query", &Level::ERROR));

    let asked = stderr_filter(Some("info,h2=debug"));
    assert!(asked.would_enable("sqlx::query", &Level::INFO));
    assert!(asked.would_enable("h2::codec", &Level::DEBUG));
    assert!(!asked.would_enable("hyper", &Level::DEBUG));

    let garbled = stderr_filter(Some("h2=loud"));
    assert!(
        garbled.would_enable("tonic_deadline", &Level::WARN)
            && !garbled.would_enable("sqlx", &Level::WARN),
        "a RUST_LOG that does not parse falls back to the default"
    );
}

#[test]
fn the_warning_counter_sees_only_the_library_at_warn_and_above() {
    let filter = library_warnings_filter();
    assert!(
        filter.would_enable("tonic_deadline::client::unscoped", &Level::WARN),
        "the library's warnings must reach the counter"
    );
    assert!(filter.would_enable("tonic_deadline", &Level::ERROR));
    assert!(
        !filter.would_enable("tonic_deadline::server", &Level::INFO),
        "the library's quieter events must stay disabled"
    );
    for target in ["h2::proto::streams", "hyper::proto", "tonic::transport"] {
        assert!(
            !filter.would_enable(target, &Level::TRACE)
                && !filter.would_enable(target, &Level::WARN),
            "{target} must stay disabled for the counter"
        );
    }
}

#[test]
fn the_warning_counter_hints_warn_so_trace_callsites_stay_off() {
    use tracing_subscriber::Registry;
    use tracing_subscriber::layer::Filter;
    assert_eq!(
        Filter::<Registry>::max_level_hint(&library_warnings_filter()),
        Some(LevelFilter::WARN),
        "no callsite below WARN may be enabled for the counter"
    );
}
