//! The ledger: where a `DEADLINE_EXCEEDED` spent its budget.
//!
//! When a call ends `DEADLINE_EXCEEDED` (or with another failure the
//! handler made after a call under it ran out of time: `CANCELLED`,
//! `INTERNAL`, …), the server layer of each hop adds its line on the
//! way back: the method, the budget it was given, how long it took, how
//! long it waited in an admission queue, and the calls it made that failed
//! or were cut off (what each was granted, how long it took, how it ended,
//! whether the hop below sent its own ledger back, and when it started: a
//! retry's backoff is the gap before it). The root caller gets the whole
//! chain, outermost hop first:
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
//! /im.Logic/Send budget=800.00 took=799.61 queued=0.20 call=/im.Route/Deliver,799.30,799.32,4,l,0.25
//! ```
//!
//! milliseconds throughout; `queued` (left out when none) is the time spent
//! waiting for an admission permit (tonic-deadline's `Admission`); each
//! `call=` is `method,granted (or -),took,code,reply,started`, where the
//! reply is `l` (its ledger came back), `n` (an answer without a ledger:
//! the chain was cut below here — a foreign hop, a proxy, a hop without the
//! layer) or `u` (no answer before this hop gave up), and `started` is when
//! it started after the hop's arrival. The time between a call and the
//! next hop's line is the transit ([`Hop::transit`]): the call's time less
//! the time the next hop took. A line is at most [`MAX_ENTRY_BYTES`]:
//! calls that do not fit are counted as `more=N`. A ledger keeps at most
//! [`MAX_HOPS`] lines; what a peer sends beyond the caps is dropped and the
//! ledger says so ([`Ledger::capped`]), and the status's code and message
//! stay as sent.
//!
//! Each stack reads it from the answer as it holds it: from the trailers
//! ([`Ledger::from_headers`]), the status's details bytes
//! ([`Ledger::from_details`]), or, with the `tonic` feature, a
//! `tonic::Status` (`Ledger::from_status`).
//!
//! ```
//! use grpc_deadline::ledger::Ledger;
//!
//! # fn on_failure(trailers: &http::HeaderMap) {
//! if let Some(ledger) = Ledger::from_headers(trailers) {
//!     for hop in ledger.hops() {
//!         println!("{} had {:?}, spent {:?} itself", hop.method, hop.budget, hop.own());
//!     }
//!     if let Some(stalled) = ledger.stalled() {
//!         println!("the time went in {}", stalled.method);
//!     }
//! }
//! # }
//! ```
//!
//! # For layers
//!
//! A stack's layers keep the ledger with four calls: the client layer
//! makes a [`CallNote`] when a call goes out under a scope and says how it
//! [ended](CallNote::ended); an admission queue tells the time a request
//! waited ([`note_queued`]); the server layer asks whether the handler's
//! status is [`due`] a ledger and writes it with [`answer`].

mod book;
mod wire;

use std::fmt::{self, Write as _};
use std::time::Duration;

use crate::Code;

pub use book::{CallNote, answer, due, note_queued};

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
    /// Time it waited in an admission queue.
    pub queued: Duration,
    /// The call above that brought this line took this much longer than
    /// this hop: the network both ways and the layers' work (`None` for the
    /// root, and where it cannot be told). Read, not sent.
    pub transit: Option<Duration>,
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
    pub code: Code,
    /// What came back.
    pub reply: Reply,
    /// From the hop's arrival to this call's start (`None` when the line
    /// does not say).
    pub started: Option<Duration>,
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
    /// The time it spent itself: [`took`](Hop::took) less its queue and
    /// its calls' time (calls that overlapped count once at most as the
    /// hop's whole time).
    pub fn own(&self) -> Duration {
        let calls: Duration = self.calls.iter().map(|c| c.took).sum();
        self.took.saturating_sub(self.queued).saturating_sub(calls)
    }

    /// What the budget lost here: its own time and its queue.
    fn spent(&self) -> Duration {
        self.own() + self.queued.min(self.took)
    }

    /// The waits between its calls: for each call after the first, the gap
    /// since the end of the one before it that ended last (a retry's
    /// backoff), where the line says when they started.
    ///
    /// ```
    /// use std::time::Duration;
    /// use grpc_deadline::ledger::Ledger;
    /// let line = "/a.A/Run budget=900.00 took=900.00 call=/b.B/Do,300.00,300.00,4,n,0.00 call=/b.B/Do,580.00,580.00,4,n,320.00";
    /// let ledger = Ledger::from_lines(&[line.to_owned()]);
    /// // The second attempt started 20 ms after the first ended.
    /// assert_eq!(ledger.hops()[0].gaps(), [Duration::from_millis(20)]);
    /// ```
    pub fn gaps(&self) -> Vec<Duration> {
        let mut ended: Option<Duration> = None;
        let mut gaps = Vec::new();
        for call in &self.calls {
            let Some(started) = call.started else {
                return Vec::new();
            };
            if let Some(ended) = ended {
                gaps.push(started.saturating_sub(ended));
            }
            ended = Some(ended.map_or(started + call.took, |e| e.max(started + call.took)));
        }
        gaps
    }

    /// Its line, at most [`MAX_ENTRY_BYTES`].
    pub(crate) fn to_line(&self) -> String {
        let mut line = String::with_capacity(MAX_ENTRY_BYTES);
        line.push_str(truncated(&self.method, 80));
        if let Some(budget) = self.budget {
            let _ = write!(line, " budget={}", Ms(budget));
        }
        let _ = write!(line, " took={}", Ms(self.took));
        if !self.queued.is_zero() {
            let _ = write!(line, " queued={}", Ms(self.queued));
        }
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
            if let Some(started) = call.started {
                let _ = write!(one, ",{}", Ms(started));
            }
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
            queued: Duration::ZERO,
            transit: None,
            calls: Vec::new(),
            more_calls: 0,
        };
        for word in words {
            let (key, value) = word.split_once('=')?;
            match key {
                "budget" => hop.budget = Some(ms(value)?),
                "took" => hop.took = ms(value)?,
                "queued" => hop.queued = ms(value)?,
                "more" => hop.more_calls = value.parse().ok()?,
                "call" => {
                    let mut fields = value.split(',');
                    let method = fields.next()?.to_owned();
                    let granted = match fields.next()? {
                        "-" => None,
                        granted => Some(ms(granted)?),
                    };
                    let took = ms(fields.next()?)?;
                    let code = Code::from_i32(fields.next()?.parse().ok()?);
                    let reply = match fields.next()? {
                        "l" => Reply::Ledger,
                        "n" => Reply::NoLedger,
                        "u" => Reply::Unanswered,
                        _ => return None,
                    };
                    // The sixth field, when there, is when it started;
                    // fields a later version adds after it are skipped.
                    let started = match fields.next() {
                        Some(started) => Some(ms(started)?),
                        None => None,
                    };
                    hop.calls.push(Call {
                        method,
                        granted,
                        took,
                        code,
                        reply,
                        started,
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
    /// The ledger a `tonic::Status` carries, if any: from its details (a
    /// `google.rpc.Status` holding a `google.rpc.DebugInfo` whose `detail`
    /// is [`DETAIL`]).
    ///
    /// ```
    /// use grpc_deadline::ledger::Ledger;
    /// let plain = tonic::Status::deadline_exceeded("deadline exceeded");
    /// assert!(Ledger::from_status(&plain).is_none());
    /// ```
    #[cfg(feature = "tonic")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
    pub fn from_status(status: &tonic::Status) -> Option<Ledger> {
        Ledger::from_details(status.details())
    }

    /// The ledger in a status's details (the bytes of
    /// `grpc-status-details-bin`, decoded: a `google.rpc.Status`), if any.
    ///
    /// ```
    /// use grpc_deadline::ledger::Ledger;
    /// assert!(Ledger::from_details(b"").is_none());
    /// ```
    pub fn from_details(details: &[u8]) -> Option<Ledger> {
        let (entries, capped) = wire::entries_of_details(details)?;
        Some(Ledger::from_entries(&entries, capped))
    }

    /// The ledger in the status of `headers` (trailers, or a trailers-only
    /// answer), if any.
    ///
    /// ```
    /// use grpc_deadline::ledger::Ledger;
    /// assert!(Ledger::from_headers(&http::HeaderMap::new()).is_none());
    /// ```
    pub fn from_headers(headers: &http::HeaderMap) -> Option<Ledger> {
        let (entries, capped) = wire::entries_of_headers(headers)?;
        Some(Ledger::from_entries(&entries, capped))
    }

    /// The ledger of these lines, the root's first, as
    /// [`lines`](Ledger::lines) gives them; a line that does not read is
    /// dropped and the ledger says so ([`capped`](Ledger::capped)).
    ///
    /// ```
    /// use grpc_deadline::ledger::Ledger;
    /// let ledger = Ledger::from_lines(&["/a.A/Run budget=100.00 took=100.00".to_owned()]);
    /// assert_eq!(ledger.hops()[0].method, "/a.A/Run");
    /// assert!(!ledger.capped());
    /// ```
    pub fn from_lines(lines: &[String]) -> Ledger {
        Ledger::from_entries(lines, false)
    }

    pub(crate) fn from_entries(entries: &[String], capped: bool) -> Ledger {
        let mut hops = Vec::new();
        let mut capped = capped || entries.len() > MAX_HOPS;
        for entry in entries.iter().take(MAX_HOPS) {
            match Hop::from_line(entry) {
                Some(mut hop) => {
                    hop.transit = hops
                        .last()
                        .and_then(followed)
                        .map(|call| call.took.saturating_sub(hop.took));
                    hops.push(hop);
                }
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

    /// The hop that spent the most time itself (its own work and its
    /// queue): where the budget went, unless it went in transit or below
    /// where the chain was cut ([`cut`](Ledger::cut)), which
    /// [`summary`](Ledger::summary) says.
    pub fn stalled(&self) -> Option<&Hop> {
        (0..self.hops.len())
            .max_by_key(|&i| self.hops[i].spent())
            .map(|i| &self.hops[i])
    }

    /// The call the chain was cut at, if it was: the last hop's last call
    /// that brought no ledger back (a foreign hop, a proxy, a hop without
    /// the layer, or one that did not answer in time).
    ///
    /// ```
    /// use grpc_deadline::ledger::{Ledger, Reply};
    /// let line = "/a.A/Run budget=100.00 took=100.00 call=/b.B/Do,99.00,99.50,4,u";
    /// let ledger = Ledger::from_lines(&[line.to_owned()]);
    /// assert_eq!(ledger.cut().map(|c| c.reply), Some(Reply::Unanswered));
    /// ```
    pub fn cut(&self) -> Option<&Call> {
        let last = self.hops.last()?;
        last.calls.iter().rev().find(|c| c.reply != Reply::Ledger)
    }

    /// The pieces of the root's time, in chain order, and which is the
    /// largest.
    fn pieces(&self) -> (Vec<Piece<'_>>, Option<usize>) {
        let mut pieces = Vec::with_capacity(self.hops.len() * 2 + 1);
        for hop in &self.hops {
            if let Some(transit) = hop.transit.filter(|t| *t >= SHOWN_TRANSIT) {
                pieces.push(Piece::Transit(transit));
            }
            pieces.push(Piece::Hop(hop));
        }
        if let Some(cut) = self.cut() {
            pieces.push(Piece::Cut(cut));
        }
        let largest = (0..pieces.len()).max_by_key(|&i| pieces[i].time());
        (pieces, largest)
    }

    /// The lines of the ledger a `tonic::Status` carries, as the wire
    /// carries them (the root's first; empty without a ledger): what
    /// [`from_status`](Ledger::from_status) reads.
    ///
    /// ```
    /// use grpc_deadline::ledger::Ledger;
    /// assert!(Ledger::lines(&tonic::Status::deadline_exceeded("late")).is_empty());
    /// ```
    #[cfg(feature = "tonic")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
    pub fn lines(status: &tonic::Status) -> Vec<String> {
        Ledger::lines_of_details(status.details())
    }

    /// The lines of the ledger in a status's details, as the wire carries
    /// them (empty without a ledger).
    ///
    /// ```
    /// use grpc_deadline::ledger::Ledger;
    /// assert!(Ledger::lines_of_details(b"").is_empty());
    /// ```
    pub fn lines_of_details(details: &[u8]) -> Vec<String> {
        wire::entries_of_details(details).map_or_else(Vec::new, |(lines, _)| lines)
    }

    /// The readable line: the first hop's budget, then each hop and the
    /// time it spent itself (and queued; of its own time, what passed
    /// between its calls, such as a retry's backoff), the transit between
    /// hops, both where they are a millisecond or more, and where the chain
    /// was cut; the largest of these is marked `(stalled here)`.
    pub fn summary(&self) -> String {
        let mut line = String::new();
        if let Some(budget) = self.hops.first().and_then(|h| h.budget) {
            let _ = write!(line, "{} ms budget: ", Ms(budget));
        }
        let (pieces, largest) = self.pieces();
        for (i, piece) in pieces.iter().enumerate() {
            if i > 0 {
                line.push_str(" → ");
            }
            match piece {
                Piece::Hop(hop) => {
                    let _ = write!(line, "{} {} ms", short(&hop.method), Ms(hop.own()));
                    if !hop.queued.is_zero() {
                        let _ = write!(line, " + {} ms queued", Ms(hop.queued));
                    }
                    let between: Duration = hop.gaps().iter().sum();
                    if between >= SHOWN_TRANSIT {
                        let _ = write!(line, " ({} ms between calls)", Ms(between));
                    }
                }
                Piece::Transit(transit) => {
                    let _ = write!(line, "{} ms in transit", Ms(*transit));
                }
                Piece::Cut(cut) => {
                    let _ = write!(
                        line,
                        "{} {} ms, {}",
                        short(&cut.method),
                        Ms(cut.took),
                        match cut.reply {
                            Reply::NoLedger => "answered without a ledger",
                            _ => "no answer in time",
                        }
                    );
                }
            }
            if largest == Some(i) {
                line.push_str(" (stalled here)");
            }
        }
        if self.capped {
            line.push_str(" (capped)");
        }
        line
    }
}

/// Transit shorter than this is left out of the summary.
const SHOWN_TRANSIT: Duration = Duration::from_millis(1);

/// A piece of the root's time, as the summary tells it.
enum Piece<'a> {
    Hop(&'a Hop),
    Transit(Duration),
    Cut(&'a Call),
}

impl Piece<'_> {
    fn time(&self) -> Duration {
        match self {
            Piece::Hop(hop) => hop.spent(),
            Piece::Transit(transit) => *transit,
            Piece::Cut(cut) => cut.took,
        }
    }
}

/// The call of `hop` whose ledger the next line is: the longest of those
/// that brought one back (as the server layer's book chooses it).
fn followed(hop: &Hop) -> Option<&Call> {
    hop.calls
        .iter()
        .filter(|c| c.reply == Reply::Ledger)
        .fold(None, |longest: Option<&Call>, c| {
            if longest.is_none_or(|l| c.took > l.took) {
                Some(c)
            } else {
                longest
            }
        })
}

impl fmt::Display for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary())
    }
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
