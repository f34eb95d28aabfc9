//! HTTP/2's framing (RFC 9113, 4.1), followed through a byte stream that
//! arrives in pieces of any size: each frame's 9-byte header once it is
//! whole, then its payload in the pieces it came in. The reset guard
//! follows each connection with it, and tonic-deadline's channel the
//! server's side of its own (the one HTTP/2 frame parser of both): public
//! for that, and for whoever reads HTTP/2 from a byte stream.
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
/// The frame type `RST_STREAM`.
pub const RST_STREAM: u8 = 0x3;
/// The frame type `GOAWAY`.
pub const GOAWAY: u8 = 0x7;
/// The frame type `CONTINUATION`.
pub const CONTINUATION: u8 = 0x9;

/// The flag `END_STREAM`.
pub const END_STREAM: u8 = 0x1;
/// The flag `END_HEADERS`.
pub const END_HEADERS: u8 = 0x4;
/// The flag `PADDED`.
pub const PADDED: u8 = 0x8;
/// The flag `PRIORITY`.
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

/// A frame, whole, for tests and for what a layer writes itself.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = Vec::with_capacity(FRAME_HEADER + len);
    out.extend([(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend((stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
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
