//! One connection's account of its client's resets: the streams it
//! opened, with the deadline each asked for; which of its resets are early;
//! and the allowance early resets spend, until they breach it.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::frames::{
    CONTINUATION, DATA, END_HEADERS, END_STREAM, HEADERS, Header, PADDED, PRIORITY, RST_STREAM,
    Sink,
};
use crate::hpack::Shadow;
use crate::rules::Rules;

/// The most bytes of one header block the account assembles to read its
/// `grpc-timeout`. Beyond it the block is not read (h2 refuses header
/// lists far smaller, 16 KiB by default) and the account stops reading
/// deadlines on the connection: its streams count as having none.
const MAX_BLOCK: usize = 64 * 1024;

/// `duration` in nanoseconds, as far as 64 bits hold (584 years).
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// What a stream that ends by itself, or at its deadline, gives back to
/// the allowance: a hedged call's winner pays for its losers, reset as
/// soon as it is answered (gRPC's hedging sends at most 5 attempts).
const EARNED_PER_END: f64 = 4.0;

/// How many of the streams the server answered lately the account
/// remembers: more than a server answers on one connection in
/// [`EARLY`](crate::rules::EARLY).
const ANSWERED: usize = 64;

/// The most open streams the account follows; beyond it the oldest is let
/// go, as if it had ended.
const MAX_FOLLOWED: usize = 4096;

/// A stream the client opened, not yet ended. Times are nanoseconds since
/// the account opened, to keep the entry small: it is written for every
/// stream.
#[derive(Debug, Clone, Copy)]
struct Open {
    id: u32,
    /// When its HEADERS were read.
    opened: u64,
    /// When the read before that one was: the stream arrived after it, so
    /// it may be that much older than its read says (a server kept off the
    /// CPU reads a while of its client's frames at once).
    arrived_after: u64,
    /// The `grpc-timeout` it carried, in nanoseconds ([`NO_DEADLINE`]:
    /// none, or none readable).
    timeout: u64,
}

/// An [`Open`] stream's `timeout` when it has none.
const NO_DEADLINE: u64 = u64::MAX;

/// Why the account closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Breach {
    /// Streams the client reset soon after opening them, long before their
    /// deadline.
    pub(crate) early_resets: u64,
    /// Streams the client opened.
    pub(crate) opened: u64,
    /// Streams that ended by themselves, or at their deadline.
    pub(crate) honest_ends: u64,
    /// The highest stream the client opened.
    pub(crate) last_stream: u32,
}

/// What the client sent, and what the server sent, as far as the guard
/// needs it.
pub(crate) struct ResetAccount {
    rules: Rules,
    /// Streams opened and not ended, by increasing id.
    open: VecDeque<Open>,
    /// The highest stream id the client opened.
    last_stream: u32,
    /// The header block being assembled, and its stream.
    block: Vec<u8>,
    block_stream: u32,
    /// The HEADERS frame's payload, when it must be unpadded first.
    frame: Vec<u8>,
    /// The client's header table, followed to read each deadline; `None`
    /// once a block could not be followed.
    hpack: Option<Shadow>,
    /// The streams the server answered (its response HEADERS went out)
    /// most lately, newest at `answered_next - 1`: the work a flood is
    /// after was done for them, and the client saw it. Written on every
    /// answer, read only when the client resets a stream.
    answered: [u32; ANSWERED],
    answered_next: usize,
    /// What may still be spent on early resets; refilled by honest ends
    /// and by time, up to `allowance`.
    tokens: f64,
    allowance: f64,
    refilled: u64,
    /// On probation: time refills nothing until a stream ended honestly.
    probation: bool,
    /// When the account opened: what its times count from.
    start: Instant,
    /// When the read this account is following was read, and the one
    /// before it (nanoseconds since `start`).
    now: u64,
    previous: u64,
    opened: u64,
    early_resets: u64,
    honest_ends: u64,
    breach: Option<Breach>,
}

impl std::fmt::Debug for ResetAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResetAccount")
            .field("open", &self.open.len())
            .field("tokens", &self.tokens)
            .field("early_resets", &self.early_resets)
            .finish_non_exhaustive()
    }
}

impl ResetAccount {
    /// An account opened at `now`: with the whole allowance, or (on
    /// probation: its address was cut off lately) with nothing to spend
    /// until its streams earn it.
    pub(crate) fn new(rules: Rules, now: Instant, probation: bool) -> Self {
        Self {
            rules,
            open: VecDeque::new(),
            last_stream: 0,
            block: Vec::new(),
            block_stream: 0,
            frame: Vec::new(),
            hpack: Some(Shadow::default()),
            answered: [0; ANSWERED],
            answered_next: 0,
            tokens: if probation {
                0.0
            } else {
                f64::from(rules.allowance)
            },
            allowance: f64::from(rules.allowance),
            refilled: 0,
            probation,
            start: now,
            now: 0,
            previous: 0,
            opened: 0,
            early_resets: 0,
            honest_ends: 0,
            breach: None,
        }
    }

    /// The client's bytes about to be read were read at `now`.
    pub(crate) fn reading_at(&mut self, now: Instant) {
        self.previous = self.now;
        self.now = nanos(now.saturating_duration_since(self.start));
    }

    /// The breach, once the client's resets exceeded what is allowed.
    pub(crate) fn breach(&self) -> Option<Breach> {
        self.breach
    }

    /// A stream the client opened with `timeout`.
    #[inline(always)]
    fn opened(&mut self, id: u32, timeout: Option<Duration>) {
        if self.open.len() == MAX_FOLLOWED {
            self.open.pop_front();
        }
        self.opened += 1;
        self.last_stream = id;
        self.open.push_back(Open {
            id,
            opened: self.now,
            arrived_after: self.previous,
            timeout: timeout.map_or(NO_DEADLINE, nanos),
        });
    }

    /// Takes stream `id` off the open streams, if it is on them.
    #[inline]
    fn close(&mut self, id: u32) -> Option<Open> {
        if self.open.front().is_some_and(|oldest| oldest.id == id) {
            return self.open.pop_front();
        }
        self.close_later(id)
    }

    /// Whether stream `id` was open; it is no more.
    #[inline(always)]
    fn ended(&mut self, id: u32) -> bool {
        if self.open.front().is_some_and(|oldest| oldest.id == id) {
            self.open.pop_front();
            return true;
        }
        self.close_later(id).is_some()
    }

    /// [`close`](Self::close), of a stream that is not the oldest.
    #[inline(never)]
    fn close_later(&mut self, id: u32) -> Option<Open> {
        let at = self.open.binary_search_by_key(&id, |o| o.id).ok()?;
        self.open.remove(at)
    }

    /// Whether the server answered stream `id` lately.
    fn was_answered(&self, id: u32) -> bool {
        self.answered.contains(&id)
    }

    /// A stream ended by itself, or at its deadline.
    #[inline(always)]
    fn earn(&mut self) {
        self.honest_ends += 1;
        let tokens = self.tokens + EARNED_PER_END;
        self.tokens = if tokens < self.allowance {
            tokens
        } else {
            self.allowance
        };
    }

    /// The client reset stream `id`.
    #[inline(never)]
    fn client_reset(&mut self, id: u32) {
        let Some(open) = self.close(id) else {
            // Already ended (the answer went out first), or never opened:
            // nothing for the guard.
            return;
        };
        // Early: before any answer, soon after it opened (its HEADERS and
        // its reset read within `early` of each other), and long before its
        // deadline (or with none). A deadline the stream may have reached
        // explains the reset: its age is then taken at the most the reads
        // allow, since a server kept off the CPU reads a while of frames at
        // once, and an honest storm's HEADERS and resets then come together.
        let age = self.now.saturating_sub(open.opened);
        let oldest = self.now.saturating_sub(open.arrived_after);
        let early = age < nanos(self.rules.early)
            && !self.was_answered(id)
            && (open.timeout == NO_DEADLINE
                || open.timeout > oldest.saturating_add(nanos(self.rules.deadline_slack)));
        if !early {
            self.earn();
            return;
        }
        self.early_resets += 1;
        // On probation, time spent before the first honest end refills
        // nothing: a flood that waits after connecting (or a server that
        // reads it late) would otherwise start with an allowance again.
        let refill = if self.probation && self.honest_ends == 0 {
            0.0
        } else {
            self.now.saturating_sub(self.refilled) as f64 / 1e9 * self.rules.refill_per_second
        };
        self.refilled = self.now;
        self.tokens = (self.tokens + refill).min(self.allowance) - 1.0;
        if self.tokens < 0.0 && self.breach.is_none() {
            self.breach = Some(Breach {
                early_resets: self.early_resets,
                opened: self.opened,
                honest_ends: self.honest_ends,
                last_stream: self.last_stream,
            });
        }
    }

    /// A header block of stream `id` is whole: `block`, or (`None`) the
    /// one assembled.
    #[inline(always)]
    fn header_block(&mut self, id: u32, block: Option<&[u8]>) {
        let mut timeout = None;
        if let Some(hpack) = &mut self.hpack {
            // Every block is followed, to keep the table in step.
            match hpack.decode(block.unwrap_or(&self.block)) {
                Ok(read) => timeout = read,
                // h2 closes the connection for this itself; the account
                // reads no further deadlines.
                Err(_) => self.hpack = None,
            }
        }
        if block.is_none() {
            self.block.clear();
        }
        if id > self.last_stream {
            self.opened(id, timeout);
        }
    }

    fn append_block(&mut self, bytes: &[u8]) {
        if self.block.len() + bytes.len() > MAX_BLOCK {
            self.hpack = None;
        }
        if self.hpack.is_some() {
            self.block.extend_from_slice(bytes);
        }
    }

    /// A piece of a header block's frame that is not a whole HEADERS
    /// frame in one piece: padded or prioritised, split across reads, or
    /// continued.
    #[inline(never)]
    fn header_piece(&mut self, header: Header, bytes: &[u8], last: bool) {
        if header.kind == HEADERS && (header.has(PADDED) || header.has(PRIORITY)) {
            // The block lies between a pad length and a priority before
            // it and padding after it: take the frame whole first.
            if self.frame.len() + bytes.len() <= MAX_BLOCK {
                self.frame.extend_from_slice(bytes);
            }
            if !last {
                return;
            }
            let frame = std::mem::take(&mut self.frame);
            let mut block = &frame[..];
            let mut pad = 0;
            if header.has(PADDED) && !block.is_empty() {
                pad = usize::from(block[0]);
                block = &block[1..];
            }
            if header.has(PRIORITY) {
                block = block.get(5..).unwrap_or_default();
            }
            let block = &block[..block.len().saturating_sub(pad)];
            self.append_block(block);
            self.frame = frame;
            self.frame.clear();
        } else if header.stream == self.block_stream {
            self.append_block(bytes);
        } else {
            return;
        }
        if last && header.has(END_HEADERS) {
            self.header_block(header.stream, None);
        }
    }

    /// Whether a frame the server writes matters to the account: one that
    /// answers a stream, ends it, or resets it.
    #[inline(always)]
    pub(crate) fn wants_server_frame(kind: u8, flags: u8) -> bool {
        kind == HEADERS || kind == RST_STREAM || (kind == DATA && flags & END_STREAM != 0)
    }

    /// The server wrote a frame with `header`.
    #[inline(always)]
    pub(crate) fn server_frame(&mut self, header: Header) {
        let id = header.stream;
        if header.kind == RST_STREAM {
            // The server's own reset: neither honest nor early.
            self.ended(id);
        } else if header.has(END_STREAM) && (header.kind == HEADERS || header.kind == DATA) {
            if self.ended(id) {
                self.earn();
            }
        } else if header.kind == HEADERS {
            self.answered[self.answered_next % ANSWERED] = id;
            self.answered_next = self.answered_next.wrapping_add(1);
        }
    }
}

/// The client's frames.
impl Sink for ResetAccount {
    /// Streams opened (their header blocks) and reset.
    #[inline(always)]
    fn wants(&self, kind: u8, _flags: u8) -> bool {
        kind == HEADERS || kind == CONTINUATION || kind == RST_STREAM
    }

    #[inline(always)]
    fn header(&mut self, header: Header) {
        match header.kind {
            RST_STREAM => self.client_reset(header.stream),
            // The block a HEADERS frame begins: what an earlier one left
            // half assembled is a protocol error the connection's decoder
            // ends the connection for, so the pieces are not cleared here.
            HEADERS => self.block_stream = header.stream,
            _ => {}
        }
    }

    #[inline(always)]
    fn payload(&mut self, header: Header, bytes: &[u8], last: bool) {
        if header.kind != HEADERS && header.kind != CONTINUATION {
            return;
        }
        // The usual request: one HEADERS frame, read whole in one piece:
        // its block is read where it lies.
        if header.kind == HEADERS
            && header.flags & (PADDED | PRIORITY | END_HEADERS) == END_HEADERS
            && bytes.len() == header.len
            && bytes.len() <= MAX_BLOCK
        {
            self.header_block(header.stream, Some(bytes));
        } else {
            self.header_piece(header, bytes, last);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::{Frames, PREFACE, frame};

    const RULES: Rules = Rules {
        allowance: 10,
        early: crate::rules::EARLY,
        deadline_slack: crate::rules::DEADLINE_SLACK,
        refill_per_second: 0.0,
        hold: None,
    };

    /// [`RULES`] with the default refill by time: one early reset per 10 ms.
    const REFILLING: Rules = Rules {
        refill_per_second: 100.0,
        ..RULES
    };

    /// A request's header block, with `grpc-timeout` when given.
    fn block(encoder: &mut loona_hpack::Encoder<'_>, timeout: Option<&str>) -> Vec<u8> {
        let mut headers: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/probe.v1.Probe/Call"),
            (b":authority", b"server"),
            (b"content-type", b"application/grpc"),
        ];
        if let Some(timeout) = timeout {
            headers.push((b"grpc-timeout", timeout.as_bytes()));
        }
        encoder.encode(headers)
    }

    struct Client {
        encoder: loona_hpack::Encoder<'static>,
        frames: Frames,
        account: ResetAccount,
        next: u32,
    }

    impl Client {
        fn new() -> Self {
            let mut client = Self {
                encoder: loona_hpack::Encoder::new(),
                frames: Frames::from_client(),
                account: ResetAccount::new(RULES, Instant::now(), false),
                next: 1,
            };
            client.send(PREFACE.to_vec());
            client
        }

        fn send(&mut self, bytes: Vec<u8>) {
            self.account.reading_at(Instant::now());
            self.frames.walk(&bytes, &mut self.account);
        }

        fn open(&mut self, timeout: Option<&str>) -> u32 {
            let id = self.next;
            self.next += 2;
            let block = block(&mut self.encoder, timeout);
            self.send(frame(HEADERS, END_HEADERS, id, &block));
            id
        }

        fn reset(&mut self, id: u32) {
            self.send(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
        }

        /// The server answers stream `id` whole.
        fn answer(&mut self, id: u32) {
            self.account.server_frame(Header {
                len: 0,
                kind: HEADERS,
                flags: END_STREAM | END_HEADERS,
                stream: id,
            });
        }
    }

    #[tokio::test(start_paused = true)]
    async fn streams_reset_at_once_without_deadlines_use_up_the_allowance() {
        let mut client = Client::new();
        for n in 1..=11 {
            let id = client.open(None);
            client.reset(id);
            assert_eq!(
                client.account.breach().is_some(),
                n > 10,
                "the 11th early reset is one too many"
            );
        }
        let breach = client.account.breach().expect("a breach");
        assert_eq!((breach.early_resets, breach.opened), (11, 11));
        assert_eq!(breach.last_stream, 21);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_on_probation_may_spend_nothing_until_its_streams_earn_it() {
        let mut client = Client::new();
        client.account = ResetAccount::new(RULES, Instant::now(), true);
        let id = client.open(None);
        client.reset(id);
        assert!(client.account.breach().is_some(), "its first early reset");

        // A client that is answered earns what it spends.
        let mut client = Client::new();
        client.account = ResetAccount::new(RULES, Instant::now(), true);
        for _ in 0..20 {
            let answered = client.open(None);
            client.answer(answered);
            let early = client.open(None);
            client.reset(early);
        }
        assert_eq!(client.account.breach(), None);
    }

    /// Time refills an account, but not one on probation before its
    /// streams earned anything: a flood that waits after connecting (or
    /// that a busy server reads late) still starts with nothing.
    #[tokio::test(start_paused = true)]
    async fn on_probation_time_refills_nothing_until_a_stream_ends_honestly() {
        let mut client = Client::new();
        client.account = ResetAccount::new(REFILLING, Instant::now(), true);
        tokio::time::advance(Duration::from_secs(1)).await;
        let id = client.open(None);
        client.reset(id);
        assert!(
            client.account.breach().is_some(),
            "a second's wait earns nothing"
        );

        // Once a stream ended honestly, time refills as on any connection.
        let mut client = Client::new();
        client.account = ResetAccount::new(REFILLING, Instant::now(), true);
        let answered = client.open(None);
        client.answer(answered);
        for _ in 0..200 {
            let id = client.open(None);
            client.reset(id);
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        assert_eq!(client.account.breach(), None);
    }

    /// A hedged call with `hedgingDelay: "0s"` opens its attempts at once
    /// and resets the losers as soon as the winner is answered, often
    /// before the server answered them: the winner pays for them.
    #[tokio::test(start_paused = true)]
    async fn a_hedged_calls_winner_pays_for_its_four_losers() {
        let mut client = Client::new();
        for _ in 0..100 {
            let attempts: Vec<u32> = (0..5).map(|_| client.open(Some("1S"))).collect();
            client.answer(attempts[0]);
            for &loser in &attempts[1..] {
                client.reset(loser);
            }
        }
        assert_eq!(client.account.breach(), None);
        assert_eq!(client.account.early_resets, 400);
    }

    /// A client that gives up after 1 ms without telling the server (a
    /// `tokio::time::timeout` around the call, no `grpc-timeout`) resets
    /// each stream 1 ms after opening it: no flood, even when no call is
    /// ever answered.
    #[tokio::test(start_paused = true)]
    async fn a_client_that_gives_up_after_1_ms_without_a_header_is_no_flood() {
        let mut client = Client::new();
        for _ in 0..1000 {
            let id = client.open(None);
            tokio::time::advance(Duration::from_millis(1)).await;
            client.reset(id);
        }
        assert_eq!(client.account.breach(), None);
        assert_eq!(client.account.early_resets, 0);
    }

    /// A flood whose streams carry a deadline it does not wait for is a
    /// flood: read as it comes, the deadline is far from explaining it.
    #[tokio::test(start_paused = true)]
    async fn a_flood_carrying_deadlines_it_does_not_wait_for_is_still_cut() {
        let mut client = Client::new();
        for n in 1..=11 {
            let id = client.open(Some("30m"));
            client.reset(id);
            assert_eq!(client.account.breach().is_some(), n > 10);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn resets_a_short_deadline_explains_never_count_even_read_at_once() {
        let mut client = Client::new();
        for _ in 0..100 {
            // A 5 ms deadline, the HEADERS and the reset in one read: a
            // busy server reads an honest storm so, and a busy client
            // writes its HEADERS late, with the reset.
            let id = client.open(Some("5m"));
            client.reset(id);
        }
        assert_eq!(client.account.breach(), None);
        assert_eq!(client.account.early_resets, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn resets_at_the_deadline_earn_what_early_ones_spend() {
        let mut client = Client::new();
        for _ in 0..50 {
            let early = client.open(Some("1S"));
            client.reset(early);
            let late = client.open(Some("20m"));
            tokio::time::advance(Duration::from_millis(20)).await;
            client.reset(late);
        }
        assert_eq!(client.account.breach(), None, "as many honest as early");
        assert_eq!(client.account.early_resets, 50);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reset_after_the_answer_ended_is_nothing_to_the_guard() {
        let mut client = Client::new();
        for _ in 0..100 {
            let id = client.open(None);
            client.account.server_frame(Header {
                len: 0,
                kind: HEADERS,
                flags: END_STREAM | END_HEADERS,
                stream: id,
            });
            client.reset(id);
        }
        assert_eq!(client.account.breach(), None);
        assert_eq!(client.account.honest_ends, 100);
    }

    #[tokio::test(start_paused = true)]
    async fn a_starved_servers_read_of_an_honest_storm_is_no_flood() {
        let mut client = Client::new();
        // 50 ms off the CPU: then the HEADERS of streams with a 40 ms
        // deadline and their resets at the deadline are read at once.
        for _ in 0..20 {
            tokio::time::advance(Duration::from_millis(50)).await;
            let mut wave = Vec::new();
            let mut encoder = std::mem::replace(&mut client.encoder, loona_hpack::Encoder::new());
            for _ in 0..50 {
                let id = client.next;
                client.next += 2;
                wave.extend(frame(
                    HEADERS,
                    END_HEADERS,
                    id,
                    &block(&mut encoder, Some("40m")),
                ));
                wave.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
            }
            client.encoder = encoder;
            client.send(wave);
        }
        assert_eq!(
            client.account.breach(),
            None,
            "1 000 resets a deadline explains"
        );
        assert_eq!(client.account.early_resets, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_dropped_once_answered_is_no_early_reset() {
        let mut client = Client::new();
        for _ in 0..100 {
            let id = client.open(None);
            client.account.server_frame(Header {
                len: 0,
                kind: HEADERS,
                flags: END_HEADERS,
                stream: id,
            });
            client.reset(id);
        }
        assert_eq!(client.account.breach(), None);
        assert_eq!(client.account.early_resets, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_padded_prioritised_block_split_over_continuations_is_read() {
        let mut encoder = loona_hpack::Encoder::new();
        let block = block(&mut encoder, Some("7S"));
        let (first, rest) = block.split_at(block.len() / 2);
        let mut payload = vec![3]; // pad length
        payload.extend([0, 0, 0, 0, 16]); // priority
        payload.extend_from_slice(first);
        payload.extend([0, 0, 0]);
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(HEADERS, PADDED | PRIORITY, 1, &payload));
        bytes.extend(frame(CONTINUATION, END_HEADERS, 1, rest));
        let mut account = ResetAccount::new(RULES, Instant::now(), false);
        Frames::from_client().walk(&bytes, &mut account);
        let open: Vec<_> = account.open.iter().map(|o| (o.id, o.timeout)).collect();
        assert_eq!(open, [(1, nanos(Duration::from_secs(7)))]);
    }

    #[tokio::test(start_paused = true)]
    async fn time_refills_the_allowance() {
        let mut client = Client::new();
        client.account = ResetAccount::new(REFILLING, Instant::now(), false);
        for _ in 0..200 {
            let id = client.open(None);
            client.reset(id);
            // 100 a second refill one per 10 ms: a slow trickle never runs out.
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        assert_eq!(client.account.breach(), None);
    }
}
