//! tonic-deadline's tests against a live PostgreSQL server live in
//! `tests/it`; this crate ships nothing. See its `live` feature.
