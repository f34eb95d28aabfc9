//! The ledger's note of a call (feature `ledger`): a call under a scope
//! with a deadline that fails is noted on the request's root, with the
//! ledger its answer carried, for the server layer of the request to write
//! its hop's line, as the tonic client layer notes its calls.

use std::time::Duration;

use grpc::metadata::MetadataMap;
use grpc_deadline::{Code, Scope};
use tokio::time::Instant;

/// A call in flight, noted when it fails.
#[cfg(feature = "ledger")]
#[derive(Debug)]
pub(crate) struct Note {
    note: grpc_deadline::ledger::CallNote,
    told: Instant,
}

/// Without the feature nothing is kept.
#[cfg(not(feature = "ledger"))]
#[derive(Debug)]
pub(crate) enum Note {}

impl Note {
    /// The note of a call to `method` under `scope`, granted `granted` at
    /// `now`.
    #[cfg(feature = "ledger")]
    pub(crate) fn new(
        scope: Option<&Scope>,
        method: &str,
        granted: Option<Duration>,
        now: Instant,
    ) -> Option<Note> {
        scope?;
        let granted = granted?;
        let path = http::uri::PathAndQuery::try_from(method).ok()?;
        Some(Note {
            note: grpc_deadline::ledger::CallNote::new(&path, granted),
            told: now.checked_add(granted)?,
        })
    }

    #[cfg(not(feature = "ledger"))]
    pub(crate) fn new(_: Option<&Scope>, _: &str, _: Option<Duration>, _: Instant) -> Option<Note> {
        None
    }

    /// The call ended with `code`, answered with `trailers` (`None`: ended
    /// here, unanswered).
    #[cfg(feature = "ledger")]
    pub(crate) fn ended(self, scope: &Scope, code: Code, trailers: Option<&MetadataMap>) {
        use base64::Engine as _;
        let headers = trailers.map(|trailers| {
            let mut headers = http::HeaderMap::new();
            // The crate keeps binary metadata decoded; the ledger reads it
            // as it travels.
            if let Some(details) = trailers.get_bin("grpc-status-details-bin") {
                let raw = bytes::Bytes::from(details.clone());
                let encoded = base64::engine::general_purpose::STANDARD_NO_PAD.encode(raw);
                if let Ok(value) = http::HeaderValue::from_str(&encoded) {
                    headers.insert("grpc-status-details-bin", value);
                }
            }
            headers
        });
        self.note.ended(scope, code, headers.as_ref(), self.told);
    }

    #[cfg(not(feature = "ledger"))]
    pub(crate) fn ended(self, _: &Scope, _: Code, _: Option<&MetadataMap>) {
        match self {}
    }
}
