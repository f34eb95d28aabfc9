//! The ledger: where a `DEADLINE_EXCEEDED` spent its budget.
//!
//! When a call ends `DEADLINE_EXCEEDED`, the server layer of each hop adds
//! its line on the way back: the method, the budget it was given, how long
//! it took, and the calls it made that failed or were cut off (what each
//! was granted, how long it took, how it ended, and whether the hop below
//! sent its own ledger back). The root caller gets the whole chain,
//! outermost hop first:
//!
//! - in `grpc-status-details-bin`, as a `google.rpc.DebugInfo` in a
//!   well-formed `google.rpc.Status` beside any details the handler set
//!   (`detail` is `tonic-deadline ledger/1`, one `stack_entries` line per
//!   hop), so grpcurl, grpc-go and grpc-java callers read it too;
//! - as one readable line at the end of the status message, after
//!   ` [ledger] `;
//! - through [`Ledger::from_status`].
//!
//! A hop's line:
//!
//! ```text
//! /im.Logic/Send budget=800.00 took=799.61 call=/im.Route/Deliver,799.30,799.42,4,l
//! ```
//!
//! milliseconds throughout; each `call=` is `method,granted (or -),took,
//! code,reply`, where the reply is `l` (its ledger came back), `n` (an
//! answer without a ledger: the chain was cut below here — a foreign hop, a
//! proxy, a hop without the layer) or `u` (no answer before this hop gave
//! up). A line is at most [`MAX_ENTRY_BYTES`]: calls that do not fit are
//! counted as `more=N`. A ledger keeps at most [`MAX_HOPS`] lines; what a
//! peer sends beyond the caps is dropped and the ledger says so
//! ([`Ledger::capped`]), and the status's code and message stay as sent.
//!
//! ```
//! use std::time::Duration;
//! use tonic_deadline::ledger::Ledger;
//!
//! # fn on_failure(status: &tonic::Status) {
//! if let Some(ledger) = Ledger::from_status(status) {
//!     for hop in ledger.hops() {
//!         println!("{} had {:?}, spent {:?} itself", hop.method, hop.budget, hop.own());
//!     }
//!     if let Some(stalled) = ledger.stalled() {
//!         println!("the time went in {}", stalled.method);
//!     }
//! }
//! # }
//! ```

mod wire;

use std::fmt::{self, Write as _};
use std::sync::Mutex;
use std::time::Duration;

pub(crate) use wire::{attach, entries_of_headers};

/// The most bytes one hop's line takes.
pub const MAX_ENTRY_BYTES: usize = 200;

/// The most hops a ledger keeps.
pub const MAX_HOPS: usize = 16;

/// The `detail` of the `google.rpc.DebugInfo` that carries a ledger.
pub const DETAIL: &str = "tonic-deadline ledger/1";

/// Marks where the ledger's line begins in a status message.
const SUMMARY_MARK: &str = " [ledger] ";

/// Where a `DEADLINE_EXCEEDED` spent its budget, hop by hop: see the
/// [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    hops: Vec<Hop>,
    capped: bool,
}

/// One hop's line of a [`Ledger`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// The method it served, as its path (`/package.Service/Method`).
    pub method: String,
    /// The budget it was given on arrival (`None`: no deadline).
    pub budget: Option<Duration>,
    /// From its arrival to its answer.
    pub took: Duration,
    /// The calls it made that failed or were cut off, in the order they
    /// started.
    pub calls: Vec<Call>,
    /// Calls that did not fit in the line.
    pub more_calls: u32,
}

/// A call a [`Hop`] made that failed or was cut off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// Its method's path.
    pub method: String,
    /// The budget it was given on the wire (`grpc-timeout`).
    pub granted: Option<Duration>,
    /// From its start to its end.
    pub took: Duration,
    /// How it ended.
    pub code: tonic::Code,
    /// What came back.
    pub reply: Reply,
}

/// What came back from a [`Call`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// An answer with its own ledger: the next hop's line follows.
    Ledger,
    /// An answer without a ledger: the chain was cut below this call (a
    /// foreign hop, a proxy, a hop without the server layer, or a failure
    /// other than a deadline).
    NoLedger,
    /// No answer before the hop gave up (its own deadline, or its caller
    /// went away).
    Unanswered,
}

impl Hop {
    /// The time it spent itself: [`took`](Hop::took) less its calls' time
    /// (calls that overlapped count once at most as the hop's whole time).
    pub fn own(&self) -> Duration {
        let calls: Duration = self.calls.iter().map(|c| c.took).sum();
        self.took.saturating_sub(calls)
    }

    /// Its line, at most [`MAX_ENTRY_BYTES`].
    pub(crate) fn to_line(&self) -> String {
        let mut line = String::with_capacity(MAX_ENTRY_BYTES);
        line.push_str(truncated(&self.method, 80));
        if let Some(budget) = self.budget {
            let _ = write!(line, " budget={}", Ms(budget));
        }
        let _ = write!(line, " took={}", Ms(self.took));
        let mut more = self.more_calls;
        for call in &self.calls {
            let mut one = String::new();
            let _ = write!(
                one,
                " call={},{},{},{},{}",
                truncated(&call.method, 60),
                call.granted
                    .map_or_else(|| "-".to_owned(), |g| Ms(g).to_string()),
                Ms(call.took),
                call.code as i32,
                match call.reply {
                    Reply::Ledger => 'l',
                    Reply::NoLedger => 'n',
                    Reply::Unanswered => 'u',
                }
            );
            // Room kept for " more=NN".
            if line.len() + one.len() + 9 > MAX_ENTRY_BYTES {
                more += 1;
            } else {
                line.push_str(&one);
            }
        }
        if more > 0 {
            let _ = write!(line, " more={more}");
        }
        line
    }

    /// Reads a line; `None` when it is not one.
    fn from_line(line: &str) -> Option<Hop> {
        if line.len() > MAX_ENTRY_BYTES {
            return None;
        }
        let mut words = line.split(' ');
        let method = words.next().filter(|m| m.starts_with('/'))?.to_owned();
        let mut hop = Hop {
            method,
            budget: None,
            took: Duration::ZERO,
            calls: Vec::new(),
            more_calls: 0,
        };
        for word in words {
            let (key, value) = word.split_once('=')?;
            match key {
                "budget" => hop.budget = Some(ms(value)?),
                "took" => hop.took = ms(value)?,
                "more" => hop.more_calls = value.parse().ok()?,
                "call" => {
                    let mut fields = value.split(',');
                    let method = fields.next()?.to_owned();
                    let granted = match fields.next()? {
                        "-" => None,
                        granted => Some(ms(granted)?),
                    };
                    let took = ms(fields.next()?)?;
                    let code = tonic::Code::from_i32(fields.next()?.parse().ok()?);
                    let reply = match fields.next()? {
                        "l" => Reply::Ledger,
                        "n" => Reply::NoLedger,
                        "u" => Reply::Unanswered,
                        _ => return None,
                    };
                    hop.calls.push(Call {
                        method,
                        granted,
                        took,
                        code,
                        reply,
                    });
                }
                // Keys a later version adds are skipped.
                _ => {}
            }
        }
        Some(hop)
    }
}

impl Ledger {
    /// The ledger a status carries, if any: from its details (a
    /// `google.rpc.Status` holding a `google.rpc.DebugInfo` whose `detail`
    /// is [`DETAIL`]).
    ///
    /// ```
    /// use tonic_deadline::ledger::Ledger;
    /// let plain = tonic::Status::deadline_exceeded("deadline exceeded");
    /// assert!(Ledger::from_status(&plain).is_none());
    /// ```
    pub fn from_status(status: &tonic::Status) -> Option<Ledger> {
        let (entries, capped) = wire::entries_of_details(status.details())?;
        Some(Ledger::from_entries(&entries, capped))
    }

    pub(crate) fn from_entries(entries: &[String], capped: bool) -> Ledger {
        let mut hops = Vec::new();
        let mut capped = capped || entries.len() > MAX_HOPS;
        for entry in entries.iter().take(MAX_HOPS) {
            match Hop::from_line(entry) {
                Some(hop) => hops.push(hop),
                None => capped = true,
            }
        }
        Ledger { hops, capped }
    }

    /// Its hops, the root's first.
    pub fn hops(&self) -> &[Hop] {
        &self.hops
    }

    /// Whether a line was dropped on the way: too many hops, a line too
    /// long or unreadable.
    pub fn capped(&self) -> bool {
        self.capped
    }

    /// The hop that spent the most time itself: where the budget went.
    pub fn stalled(&self) -> Option<&Hop> {
        self.stalled_at().map(|i| &self.hops[i])
    }

    /// Where [`stalled`](Ledger::stalled) is in the chain.
    fn stalled_at(&self) -> Option<usize> {
        (0..self.hops.len()).max_by_key(|&i| self.hops[i].own())
    }

    /// The lines of the ledger `status` carries, as the wire carries them
    /// (the root's first; empty without a ledger): what
    /// [`from_status`](Ledger::from_status) reads.
    ///
    /// ```
    /// use tonic_deadline::ledger::Ledger;
    /// assert!(Ledger::lines(&tonic::Status::deadline_exceeded("late")).is_empty());
    /// ```
    pub fn lines(status: &tonic::Status) -> Vec<String> {
        wire::entries_of_details(status.details()).map_or_else(Vec::new, |(lines, _)| lines)
    }

    /// The readable line: the first hop's budget, then each hop and the
    /// time it spent itself, the one that spent the most named; where the
    /// chain was cut, said.
    pub fn summary(&self) -> String {
        let mut line = String::new();
        if let Some(budget) = self.hops.first().and_then(|h| h.budget) {
            let _ = write!(line, "{} ms budget: ", Ms(budget));
        }
        let stalled = self.stalled_at();
        for (i, hop) in self.hops.iter().enumerate() {
            if i > 0 {
                line.push_str(" → ");
            }
            let _ = write!(line, "{} {} ms", short(&hop.method), Ms(hop.own()));
            if stalled == Some(i) {
                line.push_str(" (stalled here)");
            }
            let last = i + 1 == self.hops.len();
            if last && let Some(cut) = hop.calls.iter().rev().find(|c| c.reply != Reply::Ledger) {
                let _ = write!(
                    line,
                    " → {} {} ms, {}",
                    short(&cut.method),
                    Ms(cut.took),
                    match cut.reply {
                        Reply::NoLedger => "answered without a ledger",
                        _ => "no answer in time",
                    }
                );
            }
        }
        if self.capped {
            line.push_str(" (capped)");
        }
        line
    }
}

impl fmt::Display for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary())
    }
}

/// The calls under a request that failed or were cut off, kept on its
/// root scope for its ledger.
#[derive(Debug, Default)]
pub(crate) struct Book {
    calls: Mutex<Vec<Noted>>,
}

/// A call as the client layer saw it end, with the ledger its answer
/// carried.
#[derive(Debug)]
pub(crate) struct Noted {
    pub(crate) call: Call,
    pub(crate) below: Vec<String>,
}

/// At most this many calls are noted per request.
const MAX_NOTED: usize = 32;

impl Book {
    pub(crate) fn note(&self, noted: Noted) {
        let mut calls = self
            .calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if calls.len() < MAX_NOTED {
            calls.push(noted);
        }
    }

    /// This hop's line and the lines below it: those of the call that took
    /// longest among those whose ledger came back, or `below` (the
    /// handler's own answer carried them).
    pub(crate) fn entries(
        &self,
        method: &str,
        budget: Option<Duration>,
        took: Duration,
        below: Vec<String>,
    ) -> Vec<String> {
        let mut calls = self
            .calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut hop = Hop {
            method: method.to_owned(),
            budget,
            took,
            calls: Vec::with_capacity(calls.len()),
            more_calls: 0,
        };
        let mut longest: Option<(Duration, Vec<String>)> = None;
        for noted in calls.drain(..) {
            if !noted.below.is_empty() && longest.as_ref().is_none_or(|(t, _)| noted.call.took > *t)
            {
                longest = Some((noted.call.took, noted.below));
            }
            hop.calls.push(noted.call);
        }
        let below = longest.map_or(below, |(_, below)| below);
        let mut entries = Vec::with_capacity(1 + below.len());
        entries.push(hop.to_line());
        entries.extend(below.into_iter().take(MAX_HOPS - 1));
        entries
    }
}

/// A call in flight under a scope with a deadline, as the client layer
/// keeps it until it ends.
#[derive(Debug)]
pub(crate) struct CallNote {
    path: http::uri::PathAndQuery,
    granted: Duration,
}

impl CallNote {
    pub(crate) fn new(path: &http::uri::PathAndQuery, granted: Duration) -> Self {
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
    pub(crate) fn ended(
        self,
        scope: &crate::Scope,
        code: tonic::Code,
        headers: Option<&http::HeaderMap>,
        told: tokio::time::Instant,
    ) {
        if code == tonic::Code::Ok {
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
        book.note(Noted {
            call: Call {
                method: self.path.path().to_owned(),
                granted: Some(self.granted),
                took: (told - self.granted).elapsed(),
                code,
                reply,
            },
            below,
        });
    }
}

/// This hop's answer `headers` (`DEADLINE_EXCEEDED`, made by the layer or
/// the handler) get the ledger: this hop's line — `method`, arrived at
/// `arrived` with `budget`, the failed calls noted on `scope` — and the
/// lines of the hop below (those its slowest answered call brought, or
/// those the handler's answer carries).
pub(crate) fn answer(
    headers: &mut http::HeaderMap,
    scope: &crate::Scope,
    method: &str,
    arrived: tokio::time::Instant,
    budget: Option<Duration>,
) {
    let below = entries_of_headers(headers)
        .map(|(entries, _)| entries)
        .unwrap_or_default();
    let took = arrived.elapsed();
    let entries = match scope.notes::<Book>() {
        Some(book) => book.entries(method, budget, took, below),
        // No call under it failed: its line alone, and those below.
        None => Book::default().entries(method, budget, took, below),
    };
    attach(headers, entries);
}

/// A duration in milliseconds, two decimals.
struct Ms(Duration);

impl fmt::Display for Ms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.2}", self.0.as_secs_f64() * 1e3)
    }
}

/// Reads milliseconds; `None` unless a finite, non-negative number below a
/// day.
fn ms(value: &str) -> Option<Duration> {
    let ms: f64 = value.parse().ok()?;
    (ms.is_finite() && (0.0..86_400_000.0).contains(&ms)).then(|| Duration::from_secs_f64(ms / 1e3))
}

/// `/package.Service/Method` as `Service/Method`.
fn short(method: &str) -> &str {
    let path = method.trim_start_matches('/');
    match path.split_once('/') {
        Some((service, _)) => {
            let package = service.rfind('.').map_or(0, |dot| dot + 1);
            &path[package..]
        }
        None => path,
    }
}

/// At most `max` bytes of `s`, cut at a character's boundary.
fn truncated(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `message` with its ledger line (if any) replaced by `summary`.
pub(crate) fn message_with(message: &str, summary: &str) -> String {
    let own = message
        .split_once(SUMMARY_MARK)
        .map_or(message, |(own, _)| own);
    format!("{own}{SUMMARY_MARK}{summary}")
}

#[cfg(test)]
mod tests;
