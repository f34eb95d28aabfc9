//! One connection's account: the streams its client opened, with the
//! deadline each asked for, and the resets it is allowed.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::wire::frames::{
    CONTINUATION, END_HEADERS, END_STREAM, HEADERS, Header, PADDED, PRIORITY, RST_STREAM, Sink,
};
use crate::wire::hpack::Shadow;

use super::Rules;

/// The most bytes of one header block the account assembles to read its
/// `grpc-timeout`. Beyond it the block is not read (h2 refuses header
/// lists far smaller, 16 KiB by default) and the account stops reading
/// deadlines on the connection: its streams count as having none.
const MAX_BLOCK: usize = 64 * 1024;

/// The most open streams the account follows; beyond it the oldest is let
/// go, as if it had ended.
const MAX_FOLLOWED: usize = 4096;

/// A stream the client opened, not yet ended.
#[derive(Debug, Clone, Copy)]
struct Open {
    id: u32,
    /// When its HEADERS were read.
    opened: Instant,
    /// When the read before that one was: the stream arrived after it, so
    /// it may be that much older than its read says (a server kept off the
    /// CPU reads a while of its client's frames at once).
    arrived_after: Instant,
    /// The `grpc-timeout` it carried (`None`: none, or none readable).
    timeout: Option<Duration>,
    /// The server has answered it (its response HEADERS went out): the work
    /// a flood is after was done, and the client saw it.
    answered: bool,
}

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
pub(crate) struct Book {
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
    /// What may still be spent on early resets; refilled by honest ends
    /// and by time.
    tokens: f64,
    refilled: Instant,
    /// When the read this account is following was read, and the one
    /// before it.
    now: Instant,
    previous: Instant,
    opened: u64,
    early_resets: u64,
    honest_ends: u64,
    breach: Option<Breach>,
}

impl std::fmt::Debug for Book {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Book")
            .field("open", &self.open.len())
            .field("tokens", &self.tokens)
            .field("early_resets", &self.early_resets)
            .finish_non_exhaustive()
    }
}

impl Book {
    pub(crate) fn new(rules: Rules, now: Instant) -> Self {
        Self {
            rules,
            open: VecDeque::new(),
            last_stream: 0,
            block: Vec::new(),
            block_stream: 0,
            frame: Vec::new(),
            hpack: Some(Shadow::default()),
            tokens: f64::from(rules.allowance),
            refilled: now,
            now,
            previous: now,
            opened: 0,
            early_resets: 0,
            honest_ends: 0,
            breach: None,
        }
    }

    /// Nothing was read before `now`: a connection held unread until its
    /// turn starts its account then, so that what its client sent while
    /// it waited is not taken for streams that lived that long.
    pub(crate) fn restart(&mut self, now: Instant) {
        self.now = now;
        self.previous = now;
        self.refilled = now;
    }

    /// The client's bytes about to be read were read at `now`.
    pub(crate) fn reading_at(&mut self, now: Instant) {
        self.previous = self.now;
        self.now = now;
    }

    /// The breach, once the client's resets exceeded what is allowed.
    pub(crate) fn breach(&self) -> Option<Breach> {
        self.breach
    }

    /// A stream the client opened with `timeout`.
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
            timeout,
            answered: false,
        });
    }

    /// Takes stream `id` off the open streams, if it is on them.
    fn close(&mut self, id: u32) -> Option<Open> {
        // Streams mostly end in the order they opened: look from the front.
        let at = self.open.iter().position(|o| o.id == id)?;
        self.open.remove(at)
    }

    fn earn(&mut self) {
        self.honest_ends += 1;
        self.tokens = (self.tokens + 1.0).min(f64::from(self.rules.allowance));
    }

    /// The client reset stream `id`.
    fn client_reset(&mut self, id: u32) {
        let Some(open) = self.close(id) else {
            // Already ended (the answer went out first), or never opened:
            // nothing for the guard.
            return;
        };
        let age = self.now.saturating_duration_since(open.opened);
        // Early: before any answer, soon after it opened, and long before
        // its deadline (or with none). A deadline the stream may have
        // reached explains the reset: its age is taken at the most the reads
        // allow, since a server kept off the CPU reads a while of frames at
        // once, and an honest storm's HEADERS and resets then come together.
        let oldest = self.now.saturating_duration_since(open.arrived_after);
        let early = !open.answered
            && age < self.rules.early
            && open
                .timeout
                .is_none_or(|timeout| timeout > oldest + self.rules.early);
        if !early {
            self.earn();
            return;
        }
        self.early_resets += 1;
        let elapsed = self.now.saturating_duration_since(self.refilled);
        self.refilled = self.now;
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.rules.refill_per_second)
            .min(f64::from(self.rules.allowance))
            - 1.0;
        if self.tokens < 0.0 && self.breach.is_none() {
            self.breach = Some(Breach {
                early_resets: self.early_resets,
                opened: self.opened,
                honest_ends: self.honest_ends,
                last_stream: self.last_stream,
            });
        }
    }

    /// A header block of stream `id` is whole.
    fn header_block(&mut self, id: u32) {
        let mut timeout = None;
        if let Some(hpack) = &mut self.hpack {
            // Every block is followed, to keep the table in step.
            match hpack.decode(&self.block) {
                Ok(read) => timeout = read,
                // h2 closes the connection for this itself; the account
                // reads no further deadlines.
                Err(_) => self.hpack = None,
            }
        }
        self.block.clear();
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

    /// The server wrote a frame with `header`.
    pub(crate) fn server_frame(&mut self, header: Header) {
        let ended = match header.kind {
            HEADERS if !header.has(END_STREAM) => {
                if let Some(open) = self.open.iter_mut().find(|o| o.id == header.stream) {
                    open.answered = true;
                }
                false
            }
            HEADERS | crate::wire::frames::DATA => header.has(END_STREAM),
            RST_STREAM => {
                // The server's own reset: neither honest nor early.
                self.close(header.stream);
                false
            }
            _ => false,
        };
        if ended && self.close(header.stream).is_some() {
            self.earn();
        }
    }
}

/// The client's frames.
impl Sink for Book {
    fn header(&mut self, header: Header) {
        match header.kind {
            RST_STREAM => self.client_reset(header.stream),
            HEADERS => {
                self.block.clear();
                self.frame.clear();
                self.block_stream = header.stream;
            }
            _ => {}
        }
    }

    fn payload(&mut self, header: Header, bytes: &[u8], last: bool) {
        match header.kind {
            HEADERS if header.has(PADDED) || header.has(PRIORITY) => {
                // The block lies between a pad length and a priority before
                // it and padding after it: take the frame whole first.
                if self.frame.len() + bytes.len() <= MAX_BLOCK {
                    self.frame.extend_from_slice(bytes);
                }
                if last {
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
                }
            }
            HEADERS | CONTINUATION if header.stream == self.block_stream => {
                self.append_block(bytes);
            }
            _ => return,
        }
        if last && header.has(END_HEADERS) {
            self.header_block(header.stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frames::{Frames, PREFACE, frame};

    const RULES: Rules = Rules {
        allowance: 10,
        early: Duration::from_millis(10),
        refill_per_second: 0.0,
        pace: None,
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
        book: Book,
        next: u32,
    }

    impl Client {
        fn new() -> Self {
            let mut client = Self {
                encoder: loona_hpack::Encoder::new(),
                frames: Frames::from_client(),
                book: Book::new(RULES, Instant::now()),
                next: 1,
            };
            client.send(PREFACE.to_vec());
            client
        }

        fn send(&mut self, bytes: Vec<u8>) {
            self.book.reading_at(Instant::now());
            self.frames.walk(&bytes, &mut self.book);
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
    }

    #[tokio::test(start_paused = true)]
    async fn streams_reset_at_once_without_deadlines_use_up_the_allowance() {
        let mut client = Client::new();
        for n in 1..=11 {
            let id = client.open(None);
            client.reset(id);
            assert_eq!(
                client.book.breach().is_some(),
                n > 10,
                "the 11th early reset is one too many"
            );
        }
        let breach = client.book.breach().expect("a breach");
        assert_eq!((breach.early_resets, breach.opened), (11, 11));
        assert_eq!(breach.last_stream, 21);
    }

    /// A flood written into a connection the guard held unread for its
    /// turn is read all at once when the turn comes: the account, started
    /// then, takes its streams for as young as that read says; started at
    /// the accept, it would take them for as old as the wait, and a flood
    /// whose streams carry a deadline shorter than the wait would pass for
    /// an honest storm.
    #[tokio::test(start_paused = true)]
    async fn a_connection_held_for_its_turn_starts_its_account_when_it_is_read() {
        let flood = |restarted: bool| {
            let mut client = Client::new();
            let mut bytes = Vec::new();
            for _ in 0..11 {
                let id = client.next;
                client.next += 2;
                let block = block(&mut client.encoder, Some("30m"));
                bytes.extend(frame(HEADERS, END_HEADERS, id, &block));
                bytes.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
            }
            (client, bytes, restarted)
        };
        let mut outcomes = Vec::new();
        for restarted in [false, true] {
            let (mut client, bytes, restarted) = flood(restarted);
            tokio::time::advance(Duration::from_millis(50)).await;
            if restarted {
                client.book.restart(Instant::now());
            }
            client.send(bytes);
            outcomes.push(client.book.breach().is_some());
        }
        assert_eq!(
            outcomes,
            [false, true],
            "only the restarted account sees the flood"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn resets_a_short_deadline_explains_never_count_even_read_at_once() {
        let mut client = Client::new();
        for _ in 0..100 {
            // A 5 ms deadline, the HEADERS and the reset in one read: a
            // busy server reads an honest storm so.
            let id = client.open(Some("5m"));
            client.reset(id);
        }
        assert_eq!(client.book.breach(), None);
        assert_eq!(client.book.early_resets, 0);
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
        assert_eq!(client.book.breach(), None, "as many honest as early");
        assert_eq!(client.book.early_resets, 50);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reset_after_the_answer_ended_is_nothing_to_the_guard() {
        let mut client = Client::new();
        for _ in 0..100 {
            let id = client.open(None);
            client.book.server_frame(Header {
                len: 0,
                kind: HEADERS,
                flags: END_STREAM | END_HEADERS,
                stream: id,
            });
            client.reset(id);
        }
        assert_eq!(client.book.breach(), None);
        assert_eq!(client.book.honest_ends, 100);
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
            client.book.breach(),
            None,
            "1 000 resets a deadline explains"
        );
        assert_eq!(client.book.early_resets, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_dropped_once_answered_is_no_early_reset() {
        let mut client = Client::new();
        for _ in 0..100 {
            let id = client.open(None);
            client.book.server_frame(Header {
                len: 0,
                kind: HEADERS,
                flags: END_HEADERS,
                stream: id,
            });
            client.reset(id);
        }
        assert_eq!(client.book.breach(), None);
        assert_eq!(client.book.early_resets, 0);
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
        let mut book = Book::new(RULES, Instant::now());
        Frames::from_client().walk(&bytes, &mut book);
        let open: Vec<_> = book.open.iter().map(|o| (o.id, o.timeout)).collect();
        assert_eq!(open, [(1, Some(Duration::from_secs(7)))]);
    }

    #[tokio::test(start_paused = true)]
    async fn time_refills_the_allowance() {
        let rules = Rules {
            refill_per_second: 100.0,
            ..RULES
        };
        let mut client = Client::new();
        client.book = Book::new(rules, Instant::now());
        for _ in 0..200 {
            let id = client.open(None);
            client.reset(id);
            // 100 a second refill one per 10 ms: a slow trickle never runs out.
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        assert_eq!(client.book.breach(), None);
    }
}
