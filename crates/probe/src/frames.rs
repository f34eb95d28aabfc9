//! HTTP/2 frames (RFC 9113 §4.1) split off a byte stream, whatever its
//! chunking: the one frame decoder of the workspace, used by the lab's
//! capture proxy and by the library's wire tests alike.
//!
//! It reads frame headers and keeps payloads; it does not check the
//! protocol (the peers do that) and does not decode header blocks (HPACK
//! needs a table per direction: the capture proxy keeps its own).
//!
//! ```
//! use probe::frames::{FrameParser, HEADERS, PREFACE};
//!
//! let mut wire = PREFACE.to_vec();
//! // HEADERS, 3 bytes of header block, END_HEADERS, stream 1.
//! wire.extend([0, 0, 3, HEADERS, 0x4, 0, 0, 0, 1, 0xaa, 0xbb, 0xcc]);
//! let mut parser = FrameParser::client_to_server();
//! let (first, rest) = wire.split_at(30);
//! assert!(parser.feed(first).is_empty(), "half a frame is not a frame");
//! let frames = parser.feed(rest);
//! assert_eq!(frames[0].frame.kind_name(), "HEADERS");
//! assert_eq!(frames[0].frame.stream, 1);
//! assert_eq!(frames[0].payload, [0xaa, 0xbb, 0xcc]);
//! ```

/// The connection preface a client sends before its first frame.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The length of a frame header.
pub const FRAME_HEADER_LEN: usize = 9;

/// Frame type DATA.
pub const DATA: u8 = 0x0;
/// Frame type HEADERS.
pub const HEADERS: u8 = 0x1;
/// Frame type PRIORITY.
pub const PRIORITY_FRAME: u8 = 0x2;
/// Frame type RST_STREAM.
pub const RST_STREAM: u8 = 0x3;
/// Frame type SETTINGS.
pub const SETTINGS: u8 = 0x4;
/// Frame type PUSH_PROMISE.
pub const PUSH_PROMISE: u8 = 0x5;
/// Frame type PING.
pub const PING: u8 = 0x6;
/// Frame type GOAWAY.
pub const GOAWAY: u8 = 0x7;
/// Frame type WINDOW_UPDATE.
pub const WINDOW_UPDATE: u8 = 0x8;
/// Frame type CONTINUATION.
pub const CONTINUATION: u8 = 0x9;

/// Flag END_STREAM (DATA, HEADERS).
pub const END_STREAM: u8 = 0x1;
/// Flag ACK (SETTINGS, PING).
pub const ACK: u8 = 0x1;
/// Flag END_HEADERS (HEADERS, PUSH_PROMISE, CONTINUATION).
pub const END_HEADERS: u8 = 0x4;
/// Flag PADDED (DATA, HEADERS).
pub const PADDED: u8 = 0x8;
/// Flag PRIORITY (HEADERS).
pub const PRIORITY: u8 = 0x20;

/// One frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// The frame type ([`DATA`], [`HEADERS`], [`RST_STREAM`], …).
    pub kind: u8,
    /// The frame flags.
    pub flags: u8,
    /// The stream id; 0 for connection frames.
    pub stream: u32,
}

impl Frame {
    /// The frame type's name (`DATA`, `HEADERS`, …; `UNKNOWN` for an
    /// extension type).
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

    /// The names of the flags set, as this frame type defines them.
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

/// The name of an HTTP/2 error code (RST_STREAM, GOAWAY).
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

/// One frame split off a byte stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// Its header.
    pub frame: Frame,
    /// Its payload, padding and all.
    pub payload: Vec<u8>,
    /// Where its header starts, in bytes of the stream after the preface.
    pub start: u64,
}

impl Parsed {
    /// The error code of a RST_STREAM or GOAWAY (`None` for other frames,
    /// or a payload too short to hold one).
    pub fn error_code(&self) -> Option<u32> {
        let at = match self.frame.kind {
            RST_STREAM => 0,
            GOAWAY => 4,
            _ => return None,
        };
        self.payload
            .get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Splits a byte stream into frames, whatever the chunking: bytes that do
/// not complete a frame wait for the next [`feed`](FrameParser::feed).
#[derive(Debug)]
pub struct FrameParser {
    preface_left: usize,
    pending: Vec<u8>,
    /// Bytes after the preface that were split off before `pending`.
    consumed: u64,
}

impl FrameParser {
    /// A parser for what a client sends: the connection preface first.
    pub fn client_to_server() -> Self {
        Self::skipping(PREFACE.len())
    }

    /// A parser for what a server sends: frames from the first byte.
    pub fn server_to_client() -> Self {
        Self::skipping(0)
    }

    fn skipping(preface: usize) -> Self {
        Self {
            preface_left: preface,
            pending: Vec::new(),
            consumed: 0,
        }
    }

    /// Takes the next bytes of the stream; returns the frames they complete.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Vec<Parsed> {
        let take = self.preface_left.min(bytes.len());
        self.preface_left -= take;
        bytes = &bytes[take..];
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(h) = self.pending.get(at..at + FRAME_HEADER_LEN) {
            let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
            let body = at + FRAME_HEADER_LEN;
            let Some(payload) = self.pending.get(body..body + len) else {
                break;
            };
            out.push(Parsed {
                frame: Frame {
                    kind: h[3],
                    flags: h[4],
                    stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
                },
                payload: payload.to_vec(),
                start: self.consumed + at as u64,
            });
            at = body + len;
        }
        self.pending.drain(..at);
        self.consumed += at as u64;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parser_finds_frames_across_any_chunking() {
        let mut wire = PREFACE.to_vec();
        wire.extend([0, 0, 0, SETTINGS, 0, 0, 0, 0, 0]);
        wire.extend([0, 0, 3, HEADERS, END_HEADERS, 0, 0, 0, 1, 0xaa, 0xbb, 0xcc]);
        wire.extend([0, 0, 4, RST_STREAM, 0, 0, 0, 0, 1, 0, 0, 0, 8]);
        for chunk in 1..wire.len() {
            let mut parser = FrameParser::client_to_server();
            let frames: Vec<Parsed> = wire.chunks(chunk).flat_map(|c| parser.feed(c)).collect();
            let seen: Vec<_> = frames
                .iter()
                .map(|p| (p.frame.kind_name(), p.frame.stream, p.error_code()))
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
                frames[1].payload,
                [0xaa, 0xbb, 0xcc],
                "the payload must be kept"
            );
            assert_eq!(
                frames[2].start,
                9 + 12,
                "offsets must count from after the preface"
            );
        }
    }

    #[test]
    fn a_short_reset_has_no_error_code_rather_than_a_panic() {
        let mut parser = FrameParser::server_to_client();
        let frames = parser.feed(&[0, 0, 2, RST_STREAM, 0, 0, 0, 0, 1, 0, 8]);
        assert_eq!(frames.len(), 1, "the frame itself is complete");
        assert_eq!(frames[0].error_code(), None, "two bytes cannot hold a code");
    }

    #[test]
    fn flags_are_named_per_frame_type() {
        let headers = Frame {
            kind: HEADERS,
            flags: END_STREAM | END_HEADERS,
            stream: 1,
        };
        assert_eq!(headers.flag_names(), ["END_STREAM", "END_HEADERS"]);
        let ping = Frame {
            kind: PING,
            flags: ACK,
            stream: 0,
        };
        assert_eq!(ping.flag_names(), ["ACK"], "0x1 on PING is ACK");
        assert_eq!(error_code_name(8), "CANCEL");
    }
}
