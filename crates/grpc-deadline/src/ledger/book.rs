//! What a request's layers note for its ledger, kept on its root scope
//! until the server layer writes its line.

use std::sync::Mutex;
use std::time::Duration;

use super::wire::{attach, entries_of_headers, status_code};
use super::{Call, Hop, MAX_HOPS, Reply};
use crate::{Code, Scope};

/// The calls under a request that failed or were cut off, and the time it
/// waited in admission queues, kept on its root scope for its ledger.
#[derive(Debug, Default)]
pub(crate) struct Book {
    pages: Mutex<Pages>,
}

#[derive(Debug, Default)]
struct Pages {
    calls: Vec<Noted>,
    queued: Duration,
}

/// A call as the client layer saw it end, with the ledger its answer
/// carried.
#[derive(Debug)]
pub(crate) struct Noted {
    pub(crate) call: Call,
    pub(crate) started: tokio::time::Instant,
    pub(crate) below: Vec<String>,
}

/// At most this many calls are noted per request.
const MAX_NOTED: usize = 32;

impl Book {
    fn pages(&self) -> std::sync::MutexGuard<'_, Pages> {
        self.pages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn note(&self, noted: Noted) {
        let mut pages = self.pages();
        if pages.calls.len() < MAX_NOTED {
            pages.calls.push(noted);
        }
    }

    /// Whether a call noted ran out of time: it ended
    /// `DEADLINE_EXCEEDED`, or took all it was granted.
    fn ran_out(&self) -> bool {
        self.pages().calls.iter().any(|n| {
            n.call.code == Code::DeadlineExceeded
                || n.call.granted.is_some_and(|g| n.call.took >= g)
        })
    }

    /// The request waited `waited` for an admission permit.
    pub(crate) fn queued(&self, waited: Duration) {
        let mut pages = self.pages();
        pages.queued = pages.queued.saturating_add(waited);
    }

    /// This hop's line and the lines below it: those of the call that took
    /// longest among those whose ledger came back, or `below` (the
    /// handler's own answer carried them).
    pub(crate) fn entries(
        &self,
        method: &str,
        budget: Option<Duration>,
        arrived: tokio::time::Instant,
        below: Vec<String>,
    ) -> Vec<String> {
        let mut pages = self.pages();
        let mut hop = Hop {
            method: method.to_owned(),
            budget,
            took: arrived.elapsed(),
            queued: pages.queued,
            transit: None,
            calls: Vec::with_capacity(pages.calls.len()),
            more_calls: 0,
        };
        let mut longest: Option<(Duration, Vec<String>)> = None;
        for mut noted in pages.calls.drain(..) {
            if !noted.below.is_empty() && longest.as_ref().is_none_or(|(t, _)| noted.call.took > *t)
            {
                longest = Some((noted.call.took, noted.below));
            }
            noted.call.started = Some(noted.started.saturating_duration_since(arrived));
            hop.calls.push(noted.call);
        }
        let below = longest.map_or(below, |(_, below)| below);
        let mut entries = Vec::with_capacity(1 + below.len());
        entries.push(hop.to_line());
        entries.extend(below.into_iter().take(MAX_HOPS - 1));
        entries
    }
}

/// A call in flight under a scope with a deadline, as a client layer keeps
/// it until it ends: see [For layers](super#for-layers).
///
/// ```
/// use std::time::Duration;
/// use grpc_deadline::{Code, Scope, ledger::CallNote};
/// use tokio::time::Instant;
///
/// # async fn call() {
/// let scope = Scope::current();
/// let path = http::uri::PathAndQuery::from_static("/im.Route/Deliver");
/// let granted = Duration::from_millis(300);
/// let told = Instant::now() + granted;
/// let note = CallNote::new(&path, granted);
/// // … the call runs, and its answer's trailers arrive …
/// let trailers = http::HeaderMap::new();
/// note.ended(&scope, Code::DeadlineExceeded, Some(&trailers), told);
/// # }
/// ```
#[derive(Debug)]
pub struct CallNote {
    path: http::uri::PathAndQuery,
    granted: Duration,
}

impl CallNote {
    /// A call to `path`, granted `granted` on the wire.
    pub fn new(path: &http::uri::PathAndQuery, granted: Duration) -> Self {
        Self {
            path: path.clone(),
            granted,
        }
    }

    /// The call ended with `code`, answered in `headers` (a trailers-only
    /// answer or trailers) or decided here (`None`: the race was lost, the
    /// connection failed, the call was dropped); `told` is when the budget
    /// it was granted runs out. A failure is noted on the root of `scope`,
    /// with the ledger its answer carried.
    pub fn ended(
        self,
        scope: &Scope,
        code: Code,
        headers: Option<&http::HeaderMap>,
        told: tokio::time::Instant,
    ) {
        if code == Code::Ok {
            return;
        }
        let Some(book) = scope.root_notes::<Book>() else {
            return;
        };
        let (reply, below) = match headers.map(entries_of_headers) {
            None => (Reply::Unanswered, Vec::new()),
            Some(None) => (Reply::NoLedger, Vec::new()),
            Some(Some((entries, _))) => (Reply::Ledger, entries),
        };
        let started = told - self.granted;
        book.note(Noted {
            call: Call {
                method: self.path.path().to_owned(),
                granted: Some(self.granted),
                took: started.elapsed(),
                code,
                reply,
                started: None,
            },
            started,
            below,
        });
    }
}

/// This hop's answer `headers` (`DEADLINE_EXCEEDED`, made by the layer or
/// the handler) get the ledger: this hop's line — `method`, arrived at
/// `arrived` with `budget`, the failed calls noted on `scope` — and the
/// lines of the hop below (those its slowest answered call brought, or
/// those the handler's answer carries).
///
/// For a stack's server layer: see [For layers](super#for-layers).
pub fn answer(
    headers: &mut http::HeaderMap,
    scope: &Scope,
    method: &str,
    arrived: tokio::time::Instant,
    budget: Option<Duration>,
) {
    let below = entries_of_headers(headers)
        .map(|(entries, _)| entries)
        .unwrap_or_default();
    let entries = match scope.notes::<Book>() {
        Some(book) => book.entries(method, budget, arrived, below),
        // No call under it failed: its line alone, and those below.
        None => Book::default().entries(method, budget, arrived, below),
    };
    attach(headers, entries);
}

/// Whether the handler's status in `headers` gets the ledger, once
/// something was noted under the request (a failed call, a queue): a
/// `DEADLINE_EXCEEDED`, or any other failure after a call under it ran out
/// of time (a handler that answers `CANCELLED`, `INTERNAL`, … of its own).
///
/// For a stack's server layer: see [For layers](super#for-layers).
pub fn due(scope: &Scope, headers: &http::HeaderMap) -> bool {
    let Some(book) = scope.notes::<Book>() else {
        return false;
    };
    match status_code(headers) {
        None | Some(Code::Ok) => false,
        Some(Code::DeadlineExceeded) => true,
        Some(_) => book.ran_out(),
    }
}

/// The request under `scope` waited `waited` for an admission permit: its
/// ledger line says so (`queued=`).
///
/// For a stack's admission queue: see [For layers](super#for-layers).
pub fn note_queued(scope: &Scope, waited: Duration) {
    if let Some(book) = scope.root_notes::<Book>() {
        book.queued(waited);
    }
}
