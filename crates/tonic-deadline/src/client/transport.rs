//! A connection that breaks under a call, as the gRPC status it means.
//!
//! tonic reports a connection that closes under an open call as `UNKNOWN`
//! ("transport error", "h2 protocol error: error reading a body from
//! connection"). gRPC calls a lost connection `UNAVAILABLE` — the one code a
//! client may treat as "try elsewhere" — and a response message left
//! incomplete is `INTERNAL` (as tonic already says when a stream *ends*
//! mid-message). So the client layer tracks where the response body is in
//! its gRPC framing and classifies a transport failure by it.

use std::error::Error;
use std::io::IoSlice;

use bytes::Buf;

use crate::status::chain;

/// The status for `err` if it is a lost connection, given whether the
/// response body stopped in the middle of a message; `None` for any other
/// error (a stream reset with a reason, a status, a protocol error), which
/// keeps tonic's own classification.
pub(crate) fn lost_connection_status(
    err: &(dyn Error + 'static),
    mid_message: bool,
) -> Option<tonic::Status> {
    // tonic's channel turns body errors into statuses itself: a lost
    // connection arrives as `UNKNOWN` with the I/O error as its source. Any
    // other status (ours, the server's, a reset's) is kept.
    if let Some(status) = err.downcast_ref::<tonic::Status>()
        && status.code() != tonic::Code::Unknown
    {
        return None;
    }
    if !is_connection_lost(err) {
        return None;
    }
    Some(if mid_message {
        tonic::Status::internal("connection lost in the middle of a response message")
    } else {
        tonic::Status::unavailable("connection lost")
    })
}

/// The status for `err` if the connection closed before the call was
/// handed to it: hyper fails the calls it still holds with `Canceled`
/// ("connection closed", "connection was not ready"), which tonic reports
/// as `CANCELLED`, as if the caller had given up. Nothing reached the
/// server: gRPC calls that `UNAVAILABLE`, the code a client may retry.
/// (hyper is known with the `channel` feature; without it, `None`.)
#[cfg(feature = "channel")]
pub(crate) fn unsent_status(err: &(dyn Error + 'static)) -> Option<tonic::Status> {
    let unsent = chain(err)
        .filter_map(|err| err.downcast_ref::<hyper::Error>())
        .any(hyper::Error::is_canceled);
    unsent.then(|| {
        tonic::Status::unavailable(
            "the connection closed before this call was sent (hyper: request canceled, \
             connection closed): nothing reached the server; the call may be tried again",
        )
    })
}

#[cfg(not(feature = "channel"))]
pub(crate) fn unsent_status(_: &(dyn Error + 'static)) -> Option<tonic::Status> {
    None
}

/// The status for `err` if it is an HTTP/2 guard against reset streams
/// closing the connection (`GOAWAY ENHANCE_YOUR_CALM`): it names which side's
/// guard tripped and the setting that moves it. `None` for anything else.
///
/// tonic alone says `RESOURCE_EXHAUSTED: h2 protocol error: …`, which names
/// neither. Deadlines make such closes likely: every call that ends before
/// its answer resets its stream.
pub(crate) fn reset_guard_status(err: &(dyn Error + 'static)) -> Option<tonic::Status> {
    let h2 = chain(err).find_map(|err| err.downcast_ref::<h2::Error>())?;
    if !h2.is_go_away() || h2.reason() != Some(h2::Reason::ENHANCE_YOUR_CALM) {
        return None;
    }
    // h2 says which of its guards closed the connection only in the
    // GOAWAY's debug data, which it shows in its `Debug` form alone.
    let said = format!("{h2:?}");
    let small_data = said.contains("too_many_data_frames");
    Some(
        if h2.is_remote() && said.contains(tonic_deadline_guard::FLOOD_GO_AWAY) {
            tonic::Status::resource_exhausted(
                "the server's reset guard closed the connection (HTTP/2 GOAWAY ENHANCE_YOUR_CALM): \
             this client reset more streams soon after opening them, long before their \
             deadlines, than the server allows — on the wire, a reset flood",
            )
        } else if h2.is_remote() {
            tonic::Status::resource_exhausted(
                "the server closed the connection for too many reset streams (HTTP/2 GOAWAY \
             ENHANCE_YOUR_CALM): calls that end before their answer reset their streams; \
             give the server a guard that tells deadlines from floods: \
             tonic_deadline::server::ResetGuard",
            )
        } else if small_data {
            tonic::Status::unavailable(
                "this client closed its connection: h2's budget for small DATA frames ran out \
             (HTTP/2 ENHANCE_YOUR_CALM, too_many_data_frames); h2 charges it, for good, with \
             the small DATA frames it ignores on streams this client reset: remember none \
             (Endpoint::http2_max_concurrent_reset_streams(0)); ReadyChannel does, and has \
             such frames read after the reset and marked so that h2 does not charge them; \
             the channel connects again",
            )
        } else {
            tonic::Status::unavailable(
                "this client closed its connection for too many frames on streams it had reset \
             and forgotten (HTTP/2 ENHANCE_YOUR_CALM): lift the bound \
             (Endpoint::http2_max_local_error_reset_streams(None)), as ReadyChannel does",
            )
        },
    )
}

/// Whether `err` (or what caused it) is the connection going away: an I/O
/// failure of the socket, seen directly or through h2.
fn is_connection_lost(err: &(dyn Error + 'static)) -> bool {
    use std::io::ErrorKind::*;
    chain(err).any(|err| {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return h2.is_io();
        }
        err.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                BrokenPipe | ConnectionReset | ConnectionAborted | UnexpectedEof | NotConnected
            )
        })
    })
}

/// Where a response body is in gRPC's length-prefixed framing: each
/// message is a 1-byte flag, a 4-byte big-endian length, then that many
/// bytes.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct MessageCursor {
    /// Prefix bytes seen of the current message (0..=5).
    prefix_seen: u8,
    /// The length bytes of the prefix so far.
    length: [u8; 4],
    /// Payload bytes still to come.
    payload_left: u64,
    /// A data chunk could not be read whole: the position is unknown.
    lost_track: bool,
}

impl MessageCursor {
    /// Moves past the bytes of `data` (without consuming it).
    pub(crate) fn feed(&mut self, data: &impl Buf) {
        let chunk = data.chunk();
        if chunk.len() == data.remaining() {
            // One contiguous chunk, as hyper hands out `Bytes`.
            self.feed_bytes(chunk);
            return;
        }
        let mut slices = [IoSlice::new(&[]); 64];
        let n = data.chunks_vectored(&mut slices);
        let seen: usize = slices[..n].iter().map(|s| s.len()).sum();
        if seen < data.remaining() {
            self.lost_track = true;
        }
        for slice in &slices[..n] {
            self.feed_bytes(slice);
        }
    }

    fn feed_bytes(&mut self, mut bytes: &[u8]) {
        // The usual chunk: whole messages from a boundary (a server writes
        // each message in a DATA frame of its own). Skipped prefix by
        // prefix, without the byte-wise state.
        if self.prefix_seen == 0 && self.payload_left == 0 {
            while let [_, a, b, c, d, rest @ ..] = bytes {
                let len = u32::from_be_bytes([*a, *b, *c, *d]) as usize;
                match rest.get(len..) {
                    Some(after) => bytes = after,
                    None => {
                        self.payload_left = (len - rest.len()) as u64;
                        return;
                    }
                }
            }
        }
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let take = usize::try_from(self.payload_left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                self.payload_left -= take as u64;
                bytes = &bytes[take..];
                continue;
            }
            if let (0, [_, a, b, c, d, rest @ ..]) = (self.prefix_seen, bytes) {
                // A whole prefix at once, the usual case at a boundary.
                self.payload_left = u64::from(u32::from_be_bytes([*a, *b, *c, *d]));
                bytes = rest;
                continue;
            }
            let byte = bytes[0];
            bytes = &bytes[1..];
            if self.prefix_seen > 0 {
                self.length[usize::from(self.prefix_seen - 1)] = byte;
            }
            self.prefix_seen += 1;
            if self.prefix_seen == 5 {
                self.prefix_seen = 0;
                self.payload_left = u64::from(u32::from_be_bytes(self.length));
            }
        }
    }

    /// Part of a message has arrived and the rest has not (false when the
    /// position is unknown: then a break counts as a lost connection).
    pub(crate) fn is_mid_message(&self) -> bool {
        !self.lost_track && (self.prefix_seen > 0 || self.payload_left > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn message(len: u32) -> Vec<u8> {
        let mut out = vec![0];
        out.extend(len.to_be_bytes());
        out.extend(std::iter::repeat_n(0x2a, len as usize));
        out
    }

    #[test]
    fn cursor_knows_a_message_boundary_whatever_the_chunking() {
        let mut wire = message(3);
        wire.extend(message(0));
        wire.extend(message(300));
        for chunk in 1..wire.len() {
            let mut cursor = MessageCursor::default();
            let mut fed = 0;
            for piece in wire.chunks(chunk) {
                cursor.feed(&Bytes::copy_from_slice(piece));
                fed += piece.len();
                let at_boundary = [0, 8, 13, wire.len()].contains(&fed);
                assert_eq!(
                    cursor.is_mid_message(),
                    !at_boundary,
                    "chunk {chunk}, after {fed} bytes"
                );
            }
        }
    }

    #[test]
    fn cursor_reads_a_chunk_made_of_several_pieces() {
        let mut wire = message(3);
        wire.extend(message(300));
        for split in 1..wire.len() {
            let (head, tail) = wire.split_at(split);
            let pieces = Bytes::copy_from_slice(head).chain(Bytes::copy_from_slice(tail));
            let mut cursor = MessageCursor::default();
            cursor.feed(&pieces);
            assert!(!cursor.is_mid_message(), "split at {split}");
            let (head, tail) = wire[..wire.len() - 1].split_at(split.min(wire.len() - 2));
            let mut cut = MessageCursor::default();
            cut.feed(&Bytes::copy_from_slice(head).chain(Bytes::copy_from_slice(tail)));
            assert!(cut.is_mid_message(), "one byte short, split at {split}");
        }
    }

    #[tokio::test]
    async fn a_reset_guard_closing_the_connection_is_named_with_its_side_and_fix() {
        let theirs = h2::Error::from(h2::Reason::ENHANCE_YOUR_CALM);
        assert!(
            reset_guard_status(&theirs).is_none(),
            "a stream reset with that reason is not a connection closed"
        );
        for (side, expect) in [
            (
                Guard::Server,
                (tonic::Code::ResourceExhausted, "ResetGuard"),
            ),
            (
                Guard::Resets,
                (
                    tonic::Code::Unavailable,
                    "http2_max_local_error_reset_streams(None)",
                ),
            ),
            (
                Guard::SmallData,
                (
                    tonic::Code::Unavailable,
                    "http2_max_concurrent_reset_streams(0)",
                ),
            ),
        ] {
            let err = go_away(side).await;
            let status = reset_guard_status(&err).unwrap_or_else(|| {
                panic!("{side:?}: a GOAWAY ENHANCE_YOUR_CALM is named: {err:?}")
            });
            assert_eq!(status.code(), expect.0);
            assert!(
                status.message().contains(expect.1),
                "{side:?}: the message must name the fix: {}",
                status.message()
            );
            let wrapped = tonic::Status::from_error(Box::new(go_away(side).await));
            assert!(
                reset_guard_status(&wrapped).is_some(),
                "found through tonic's status too"
            );
        }
        let calm = h2::Error::from(h2::Reason::NO_ERROR);
        assert!(reset_guard_status(&calm).is_none());
    }

    /// Which guard closes the connection.
    #[derive(Debug, Clone, Copy)]
    enum Guard {
        /// The server's: it sends GOAWAY ENHANCE_YOUR_CALM.
        Server,
        /// The client's bound on resets answering frames on forgotten
        /// streams.
        Resets,
        /// The client's budget for small DATA frames.
        SmallData,
    }

    /// A GOAWAY ENHANCE_YOUR_CALM from `guard`, as h2 reports it to a call
    /// on the connection: an h2 client talks to a peer that writes raw
    /// frames.
    async fn go_away(guard: Guard) -> h2::Error {
        use tokio::io::AsyncWriteExt;
        let (ours, mut theirs) = tokio::io::duplex(1 << 20);
        let mut builder = h2::client::Builder::new();
        if let Guard::SmallData = guard {
            // Stream 1's reset is remembered: frames on it are ignored.
            builder.max_concurrent_reset_streams(1);
        } else {
            // A reset stream is forgotten at once, and there is no room
            // for a single error of the peer's making: the first frame on a
            // reset stream trips the guard on this side.
            builder.max_concurrent_reset_streams(0);
            builder.max_local_error_reset_streams(Some(0));
        }
        let (mut client, connection) = builder
            .handshake::<_, bytes::Bytes>(ours)
            .await
            .expect("handshake");
        #[allow(clippy::disallowed_methods)] // the connection is no request's work
        let connection = tokio::spawn(connection);
        let request = || {
            http::Request::post("http://peer/")
                .body(())
                .expect("request")
        };
        // Stream 1, given up: RST_STREAM.
        let (given_up, body) = client.send_request(request(), false).expect("sent");
        tokio::task::yield_now().await;
        drop((given_up, body));
        tokio::task::yield_now().await;
        let (response, _body) = client.send_request(request(), false).expect("sent");
        let mut frames = vec![0, 0, 0, 0x4, 0, 0, 0, 0, 0]; // SETTINGS
        match guard {
            // GOAWAY, last stream 0, ENHANCE_YOUR_CALM
            Guard::Server => {
                frames.extend([0, 0, 8, 0x7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 11]);
            }
            // DATA on stream 1, which was reset and forgotten
            Guard::Resets => frames.extend([0, 0, 1, 0x0, 0, 0, 0, 0, 1, 0]),
            // Small DATA frames on stream 1, reset and remembered: ignored,
            // and charged to the budget (half the 64 KiB window) for good.
            Guard::SmallData => {
                for _ in 0..200 {
                    frames.extend([0, 0, 1, 0x0, 0, 0, 0, 0, 1, 0]);
                }
            }
        }
        theirs.write_all(&frames).await.expect("written");
        let err = response
            .await
            .expect_err("the connection is closed under the call");
        drop(theirs);
        let _ = connection.await;
        err
    }

    #[test]
    fn a_broken_pipe_is_a_lost_connection_and_a_reset_is_not() {
        let pipe = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "gone");
        let status =
            lost_connection_status(&pipe, false).expect("a broken pipe is a lost connection");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        let status = lost_connection_status(&pipe, true).expect("and mid-message too");
        assert_eq!(status.code(), tonic::Code::Internal);
        let reset = h2::Error::from(h2::Reason::REFUSED_STREAM);
        assert!(
            lost_connection_status(&reset, false).is_none(),
            "a stream reset keeps tonic's own mapping"
        );
        let status = tonic::Status::cancelled("ours");
        assert!(lost_connection_status(&status, false).is_none());
        let unknown = tonic::Status::unknown("the server's own");
        assert!(
            lost_connection_status(&unknown, false).is_none(),
            "an UNKNOWN without a lost connection behind it stays UNKNOWN"
        );
        let wrapped = tonic::Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "gone",
        )));
        assert_eq!(
            lost_connection_status(&wrapped, false).map(|s| s.code()),
            Some(tonic::Code::Unavailable),
            "tonic's UNKNOWN for a broken pipe is a lost connection"
        );
    }
}
