//! HTTP/2's framing (RFC 9113, 4.1), followed through a byte stream that
//! arrives in pieces of any size: each frame's 9-byte header once it is
//! whole, then its payload in the pieces it came in.
//!
//! Two ways to read: [`Frames`] walks the bytes in place and tells a
//! [`Sink`] what it sees, keeping nothing (the reset guard follows every
//! connection with it, and tonic-deadline's channel the server's side of
//! its own); [`WholeFrames`] keeps each frame whole, payload and all, for
//! whoever looks at frames after the fact (a capture, a test, a tool).
//! Both are the same walk. Neither checks the protocol (the peers do that)
//! nor decodes header blocks (HPACK needs a table per direction).
//!
//! ```
//! use tonic_deadline_guard::frames::{Frames, Header, PREFACE, RST_STREAM, Sink, frame};
//!
//! #[derive(Default)]
//! struct Resets(Vec<u32>);
//! impl Sink for Resets {
//!     fn header(&mut self, header: Header) {
//!         if header.kind == RST_STREAM {
//!             self.0.push(header.stream);
//!         }
//!     }
//! }
//!
//! let mut bytes = PREFACE.to_vec();
//! bytes.extend(frame(RST_STREAM, 0, 3, &8u32.to_be_bytes()));
//! let mut walk = Frames::from_client();
//! let mut resets = Resets::default();
//! for piece in bytes.chunks(5) {
//!     walk.walk(piece, &mut resets); // any split of the bytes reads the same
//! }
//! assert_eq!(resets.0, [3]);
//! assert!(walk.at_boundary());
//! ```

/// The length of a frame header.
pub const FRAME_HEADER: usize = 9;

/// The frame type `DATA`.
pub const DATA: u8 = 0x0;
/// The frame type `HEADERS`.
pub const HEADERS: u8 = 0x1;
/// The frame type `PRIORITY` (the flag of the same name is [`PRIORITY`]).
pub const PRIORITY_FRAME: u8 = 0x2;
/// The frame type `RST_STREAM`.
pub const RST_STREAM: u8 = 0x3;
/// The frame type `SETTINGS`.
pub const SETTINGS: u8 = 0x4;
/// The frame type `PUSH_PROMISE`.
pub const PUSH_PROMISE: u8 = 0x5;
/// The frame type `PING`.
pub const PING: u8 = 0x6;
/// The frame type `GOAWAY`.
pub const GOAWAY: u8 = 0x7;
/// The frame type `WINDOW_UPDATE`.
pub const WINDOW_UPDATE: u8 = 0x8;
/// The frame type `CONTINUATION`.
pub const CONTINUATION: u8 = 0x9;

/// The flag `END_STREAM` (`DATA`, `HEADERS`).
pub const END_STREAM: u8 = 0x1;
/// The flag `ACK` (`SETTINGS`, `PING`).
pub const ACK: u8 = 0x1;
/// The flag `END_HEADERS` (`HEADERS`, `PUSH_PROMISE`, `CONTINUATION`).
pub const END_HEADERS: u8 = 0x4;
/// The flag `PADDED` (`DATA`, `HEADERS`).
pub const PADDED: u8 = 0x8;
/// The flag `PRIORITY` (`HEADERS`).
pub const PRIORITY: u8 = 0x20;

/// The client connection preface, which precedes a client's frames.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A frame's header, read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The payload's length.
    pub len: usize,
    /// The frame's type.
    pub kind: u8,
    /// The frame's flags.
    pub flags: u8,
    /// The stream it belongs to (0: the connection).
    pub stream: u32,
}

impl Header {
    /// Reads a frame header.
    pub fn parse(h: &[u8; FRAME_HEADER]) -> Self {
        let (len, kind) = len_and_kind(h);
        Self {
            len,
            kind,
            flags: h[4],
            stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
        }
    }

    /// Whether `flag` is set.
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// The frame type's name (`DATA`, `HEADERS`, …; `UNKNOWN` for an
    /// extension's).
    ///
    /// ```
    /// use tonic_deadline_guard::frames::{Header, PING};
    /// let ping = Header { len: 8, kind: PING, flags: 0, stream: 0 };
    /// assert_eq!(ping.kind_name(), "PING");
    /// ```
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            DATA => "DATA",
            HEADERS => "HEADERS",
            PRIORITY_FRAME => "PRIORITY",
            RST_STREAM => "RST_STREAM",
            SETTINGS => "SETTINGS",
            PUSH_PROMISE => "PUSH_PROMISE",
            PING => "PING",
            GOAWAY => "GOAWAY",
            WINDOW_UPDATE => "WINDOW_UPDATE",
            CONTINUATION => "CONTINUATION",
            _ => "UNKNOWN",
        }
    }

    /// The names of the flags set, as the frame's type defines them (`0x1`
    /// is `END_STREAM` on `DATA`, `ACK` on `PING`).
    ///
    /// ```
    /// use tonic_deadline_guard::frames::{END_HEADERS, END_STREAM, HEADERS, Header};
    /// let headers = Header { len: 3, kind: HEADERS, flags: END_STREAM | END_HEADERS, stream: 1 };
    /// assert_eq!(headers.flag_names(), ["END_STREAM", "END_HEADERS"]);
    /// ```
    pub fn flag_names(&self) -> Vec<&'static str> {
        let known: &[(u8, &str)] = match self.kind {
            DATA => &[(END_STREAM, "END_STREAM"), (PADDED, "PADDED")],
            HEADERS => &[
                (END_STREAM, "END_STREAM"),
                (END_HEADERS, "END_HEADERS"),
                (PADDED, "PADDED"),
                (PRIORITY, "PRIORITY"),
            ],
            SETTINGS | PING => &[(ACK, "ACK")],
            PUSH_PROMISE | CONTINUATION => &[(END_HEADERS, "END_HEADERS")],
            _ => &[],
        };
        known
            .iter()
            .filter(|(bit, _)| self.flags & bit != 0)
            .map(|(_, name)| *name)
            .collect()
    }
}

/// The name of an HTTP/2 error code, as `RST_STREAM` and `GOAWAY` carry it
/// (`UNKNOWN_ERROR` for one RFC 9113 does not define).
///
/// ```
/// assert_eq!(tonic_deadline_guard::frames::error_code_name(8), "CANCEL");
/// ```
pub fn error_code_name(code: u32) -> &'static str {
    match code {
        0 => "NO_ERROR",
        1 => "PROTOCOL_ERROR",
        2 => "INTERNAL_ERROR",
        3 => "FLOW_CONTROL_ERROR",
        4 => "SETTINGS_TIMEOUT",
        5 => "STREAM_CLOSED",
        6 => "FRAME_SIZE_ERROR",
        7 => "REFUSED_STREAM",
        8 => "CANCEL",
        9 => "COMPRESSION_ERROR",
        10 => "CONNECT_ERROR",
        11 => "ENHANCE_YOUR_CALM",
        12 => "INADEQUATE_SECURITY",
        13 => "HTTP_1_1_REQUIRED",
        _ => "UNKNOWN_ERROR",
    }
}

/// A frame header's payload length and type, read as one word.
#[inline(always)]
fn len_and_kind(h: &[u8; FRAME_HEADER]) -> (usize, u8) {
    let word = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    ((word >> 8) as usize, word as u8)
}

/// What a [`Frames`] walk shows, in order.
pub trait Sink {
    /// Whether frames of `kind` with `flags` are told: a frame that is not
    /// is passed over, its header unread beyond its length.
    fn wants(&self, _kind: u8, _flags: u8) -> bool {
        true
    }

    /// A frame's header, once whole.
    fn header(&mut self, header: Header);

    /// Bytes of the current frame's payload, in the pieces they came in;
    /// `last` on the piece that ends it.
    fn payload(&mut self, _header: Header, _bytes: &[u8], _last: bool) {}
}

/// Headers alone, to a closure.
impl<F: FnMut(Header)> Sink for F {
    fn header(&mut self, header: Header) {
        self(header);
    }
}

/// Where a byte stream is in HTTP/2's framing.
#[derive(Debug, Default)]
pub struct Frames {
    /// Preface bytes still to come.
    preface: usize,
    header: [u8; FRAME_HEADER],
    header_len: usize,
    /// The frame whose payload is being read.
    current: Option<Header>,
    /// Its payload bytes still to come.
    payload: usize,
    /// Whole frames seen.
    frames: u64,
}

impl Frames {
    /// Follows a client's writes: the preface first.
    pub fn from_client() -> Self {
        Self {
            preface: PREFACE.len(),
            ..Self::default()
        }
    }

    /// Follows a server's writes: frames from the first byte (as
    /// `Frames::default()`).
    ///
    /// ```
    /// use tonic_deadline_guard::frames::{ACK, Frames, Header, SETTINGS, frame};
    /// let mut acks = 0;
    /// let mut count = |header: Header| acks += usize::from(header.has(ACK));
    /// Frames::from_server().walk(&frame(SETTINGS, ACK, 0, &[]), &mut count);
    /// assert_eq!(acks, 1);
    /// ```
    pub fn from_server() -> Self {
        Self::default()
    }

    /// Whether the stream is between two frames.
    pub fn at_boundary(&self) -> bool {
        self.preface == 0 && self.header_len == 0 && self.payload == 0
    }

    /// Whole frames seen so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Follows `bytes` through the framing, telling `sink` what it sees.
    pub fn walk(&mut self, mut bytes: &[u8], sink: &mut impl Sink) {
        loop {
            if self.at_boundary() {
                // Whole frame headers, read in place: most pieces hold
                // nothing else.
                while let Some((head, rest)) = bytes.split_first_chunk::<FRAME_HEADER>() {
                    let (len, kind) = len_and_kind(head);
                    if len <= rest.len() && !sink.wants(kind, head[4]) {
                        // A whole frame the sink does not want.
                        self.frames += 1;
                        bytes = &rest[len..];
                        continue;
                    }
                    bytes = self.begin(Header::parse(head), rest, sink);
                }
            }
            if bytes.is_empty() {
                return;
            }
            // The preface, the rest of a payload, or part of a header.
            if self.preface > 0 {
                let n = self.preface.min(bytes.len());
                self.preface -= n;
                bytes = &bytes[n..];
            } else if let Some(current) = self.current.filter(|_| self.payload > 0) {
                let n = self.payload.min(bytes.len());
                self.payload -= n;
                sink.payload(current, &bytes[..n], self.payload == 0);
                bytes = &bytes[n..];
                if self.payload == 0 {
                    self.frames += 1;
                }
            } else {
                let n = (FRAME_HEADER - self.header_len).min(bytes.len());
                self.header[self.header_len..self.header_len + n].copy_from_slice(&bytes[..n]);
                self.header_len += n;
                bytes = &bytes[n..];
                if self.header_len == FRAME_HEADER {
                    self.header_len = 0;
                    bytes = self.begin(Header::parse(&self.header), bytes, sink);
                }
            }
        }
    }

    /// A frame with `header` begins; `bytes` follow it. Tells `sink`, and
    /// hands it what of the payload `bytes` hold; what is left after that.
    #[inline(always)]
    fn begin<'a>(&mut self, header: Header, bytes: &'a [u8], sink: &mut impl Sink) -> &'a [u8] {
        sink.header(header);
        let n = header.len.min(bytes.len());
        let rest = header.len - n;
        if n > 0 || header.len == 0 {
            sink.payload(header, &bytes[..n], rest == 0);
        }
        if rest == 0 {
            self.frames += 1;
        } else {
            self.current = Some(header);
            self.payload = rest;
        }
        &bytes[n..]
    }
}

/// The preface bytes of a client seen so far match HTTP/2's: `Some(true)`
/// once all are seen, `Some(false)` as soon as one differs, `None` while
/// they match but more are to come.
pub fn is_preface(start: &[u8]) -> Option<bool> {
    let n = start.len().min(PREFACE.len());
    if start[..n] != PREFACE[..n] {
        return Some(false);
    }
    (n == PREFACE.len()).then_some(true)
}

/// A frame read whole by [`WholeFrames`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Its header.
    pub header: Header,
    /// Its payload, padding and all.
    pub payload: Vec<u8>,
    /// Where its header starts, in bytes of the stream after the preface.
    pub start: u64,
}

impl Frame {
    /// The error code of a `RST_STREAM` or `GOAWAY` (`None` for other
    /// frames, or a payload too short to hold one).
    ///
    /// ```
    /// use tonic_deadline_guard::frames::{RST_STREAM, WholeFrames, frame};
    /// let mut frames = WholeFrames::from_server();
    /// let reset = frames.feed(&frame(RST_STREAM, 0, 1, &8u32.to_be_bytes()));
    /// assert_eq!(reset[0].error_code(), Some(8));
    /// ```
    pub fn error_code(&self) -> Option<u32> {
        let at = match self.header.kind {
            RST_STREAM => 0,
            GOAWAY => 4,
            _ => return None,
        };
        self.payload
            .get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Whole frames from a byte stream in pieces of any size: a [`Frames`]
/// walk that keeps each payload, and hands each frame over once its last
/// byte has come. For reading frames after the fact; what follows a
/// connection as it runs walks it in place with a [`Sink`], and keeps
/// nothing.
///
/// ```
/// use tonic_deadline_guard::frames::{END_HEADERS, HEADERS, PREFACE, WholeFrames, frame};
///
/// let mut wire = PREFACE.to_vec();
/// wire.extend(frame(HEADERS, END_HEADERS, 1, &[0xaa, 0xbb, 0xcc]));
/// let mut frames = WholeFrames::from_client();
/// let (first, rest) = wire.split_at(30);
/// assert!(frames.feed(first).is_empty(), "half a frame is not a frame");
/// let whole = frames.feed(rest);
/// assert_eq!(whole[0].header.kind_name(), "HEADERS");
/// assert_eq!(whole[0].header.stream, 1);
/// assert_eq!(whole[0].payload, [0xaa, 0xbb, 0xcc]);
/// ```
#[derive(Debug)]
pub struct WholeFrames {
    walk: Frames,
    kept: Keep,
}

/// What a [`WholeFrames`] keeps between pieces.
#[derive(Debug, Default)]
struct Keep {
    /// The frame whose payload is still coming.
    current: Option<Frame>,
    /// Where the next frame starts, after the preface.
    next_start: u64,
    /// Frames whole since they were last handed over.
    whole: Vec<Frame>,
}

/// The most payload a [`Keep`] reserves ahead of its bytes: a frame header
/// may announce 16 MiB that never come.
const RESERVE: usize = 16 * 1024;

impl Sink for Keep {
    fn header(&mut self, header: Header) {
        let start = self.next_start;
        self.next_start += (FRAME_HEADER + header.len) as u64;
        self.current = Some(Frame {
            header,
            payload: Vec::with_capacity(header.len.min(RESERVE)),
            start,
        });
    }

    fn payload(&mut self, _header: Header, bytes: &[u8], last: bool) {
        if let Some(current) = &mut self.current {
            current.payload.extend_from_slice(bytes);
        }
        if last {
            self.whole.extend(self.current.take());
        }
    }
}

impl WholeFrames {
    /// Reads what a client sends: the connection preface first.
    pub fn from_client() -> Self {
        Self {
            walk: Frames::from_client(),
            kept: Keep::default(),
        }
    }

    /// Reads what a server sends: frames from the first byte.
    pub fn from_server() -> Self {
        Self {
            walk: Frames::from_server(),
            kept: Keep::default(),
        }
    }

    /// Takes the next bytes of the stream; the frames they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Frame> {
        self.walk.walk(bytes, &mut self.kept);
        std::mem::take(&mut self.kept.whole)
    }
}

/// A frame, whole, for tests and for what a layer writes itself.
///
/// ```
/// use tonic_deadline_guard::frames::{PING, frame};
/// assert_eq!(frame(PING, 0, 0, &[0; 8]).len(), 9 + 8);
/// ```
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_HEADER + payload.len());
    append_frame(&mut out, kind, flags, stream, payload);
    out
}

/// Appends a frame to `out`: what writes many frames into one buffer (a
/// batch of requests, a flood) without a buffer for each.
///
/// ```
/// use tonic_deadline_guard::frames::{END_HEADERS, HEADERS, RST_STREAM, append_frame};
/// let mut batch = Vec::new();
/// append_frame(&mut batch, HEADERS, END_HEADERS, 1, &[0x83]);
/// append_frame(&mut batch, RST_STREAM, 0, 1, &8u32.to_be_bytes());
/// assert_eq!(batch.len(), 9 + 1 + 9 + 4);
/// ```
pub fn append_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len();
    out.extend([(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend((stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Seen {
        headers: Vec<Header>,
        payloads: Vec<(u32, Vec<u8>)>,
    }

    impl Sink for Seen {
        fn header(&mut self, header: Header) {
            self.headers.push(header);
            self.payloads.push((header.stream, Vec::new()));
        }

        fn payload(&mut self, header: Header, bytes: &[u8], _last: bool) {
            let last = self.payloads.last_mut().expect("a header came first");
            assert_eq!(last.0, header.stream);
            last.1.extend_from_slice(bytes);
        }
    }

    #[test]
    fn frames_split_anywhere_are_read_whole() {
        let mut stream = PREFACE.to_vec();
        stream.extend(frame(HEADERS, END_HEADERS, 1, b"abc"));
        stream.extend(frame(RST_STREAM, 0, 1, &8u32.to_be_bytes()));
        stream.extend(frame(DATA, END_STREAM, 3, b""));
        for split in 1..stream.len() {
            let mut frames = Frames::from_client();
            let mut seen = Seen::default();
            for piece in stream.chunks(split) {
                frames.walk(piece, &mut seen);
            }
            assert!(frames.at_boundary());
            let kinds: Vec<_> = seen.headers.iter().map(|h| (h.kind, h.stream)).collect();
            assert_eq!(
                kinds,
                [(HEADERS, 1), (RST_STREAM, 1), (DATA, 3)],
                "split {split}"
            );
            assert_eq!(seen.payloads[0].1, b"abc");
            assert_eq!(seen.payloads[1].1, 8u32.to_be_bytes());
        }
    }

    #[test]
    fn whole_frames_are_found_once_in_order_across_any_chunking() {
        let mut wire = PREFACE.to_vec();
        wire.extend(frame(SETTINGS, 0, 0, b""));
        wire.extend(frame(HEADERS, END_HEADERS, 1, &[0xaa, 0xbb, 0xcc]));
        wire.extend(frame(RST_STREAM, 0, 1, &8u32.to_be_bytes()));
        for chunk in 1..wire.len() {
            let mut frames = WholeFrames::from_client();
            let whole: Vec<Frame> = wire.chunks(chunk).flat_map(|c| frames.feed(c)).collect();
            let seen: Vec<_> = whole
                .iter()
                .map(|f| (f.header.kind_name(), f.header.stream, f.error_code()))
                .collect();
            assert_eq!(
                seen,
                [
                    ("SETTINGS", 0, None),
                    ("HEADERS", 1, None),
                    ("RST_STREAM", 1, Some(8))
                ],
                "chunk size {chunk}: every frame must be found once, in order"
            );
            assert_eq!(
                whole[1].payload,
                [0xaa, 0xbb, 0xcc],
                "the payload must be kept"
            );
            assert_eq!(
                whole[2].start,
                9 + 12,
                "offsets must count from after the preface"
            );
        }
    }

    #[test]
    fn a_short_reset_has_no_error_code_rather_than_a_panic() {
        let mut frames = WholeFrames::from_server();
        let whole = frames.feed(&frame(RST_STREAM, 0, 1, &[0, 8]));
        assert_eq!(whole.len(), 1, "the frame itself is complete");
        assert_eq!(whole[0].error_code(), None, "two bytes cannot hold a code");
    }

    #[test]
    fn flags_are_named_per_frame_type() {
        let ping = Header {
            len: 8,
            kind: PING,
            flags: ACK,
            stream: 0,
        };
        assert_eq!(ping.flag_names(), ["ACK"], "0x1 on PING is ACK");
        let data = Header { kind: DATA, ..ping };
        assert_eq!(
            data.flag_names(),
            ["END_STREAM"],
            "0x1 on DATA is END_STREAM"
        );
        assert_eq!(error_code_name(11), "ENHANCE_YOUR_CALM");
    }

    #[test]
    fn a_stream_that_is_not_http2_is_told_apart_from_its_first_byte() {
        assert_eq!(is_preface(b"PRI * HT"), None);
        assert_eq!(is_preface(PREFACE), Some(true));
        assert_eq!(
            is_preface(b"\x16\x03\x01"),
            Some(false),
            "a TLS ClientHello"
        );
        assert_eq!(is_preface(b"POST / HTTP/1.1"), Some(false));
    }
}
