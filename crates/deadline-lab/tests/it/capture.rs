//! The capture proxy's frame decoding and where it cuts a reply.

use std::sync::Arc;

use deadline_lab::capture::{Cutter, Direction, decode, error_code_name, header_fragment};
use tonic_deadline_guard::frames::{
    CONTINUATION, DATA, END_HEADERS, END_STREAM, HEADERS, PADDED, PREFACE, PRIORITY, RST_STREAM,
};

#[test]
fn decoder_reads_grpc_timeout_and_reset_codes() {
    let mut encoder = loona_hpack::Encoder::new();
    let block = encoder.encode([
        (&b":method"[..], &b"POST"[..]),
        (b":path", b"/probe.v1.Probe/Call"),
        (b"grpc-timeout", b"999978u"),
    ]);
    let mut wire = PREFACE.to_vec();
    // HEADERS split in two: HEADERS without END_HEADERS, then CONTINUATION.
    let (first, rest) = block.split_at(block.len() / 2);
    wire.extend(frame_bytes(HEADERS, 0, 1, first));
    wire.extend(frame_bytes(CONTINUATION, END_HEADERS, 1, rest));
    wire.extend(frame_bytes(RST_STREAM, 0, 1, &8u32.to_be_bytes()));
    let records = decode(Direction::ClientToServer, &wire);
    assert_eq!(records.len(), 2 + 1);
    assert_eq!(
        records[1].header("grpc-timeout"),
        Some("999978u"),
        "the header block must be decoded across CONTINUATION"
    );
    assert_eq!(records[2].error_code.map(error_code_name), Some("CANCEL"));
    assert!(records[2].line().contains("RST_STREAM"));
    assert!(records[1].line().contains("grpc-timeout=999978u"));
}

fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

#[test]
fn the_cut_falls_inside_the_data_frame_that_carries_the_byte_whatever_the_chunking() {
    let mut wire = frame_bytes(HEADERS, END_HEADERS, 1, &[0xaa; 7]);
    wire.extend(frame_bytes(DATA, 0, 1, &[0x2a; 40]));
    let second = wire.len();
    wire.extend(frame_bytes(DATA, 0, 1, &[0x2b; 40]));
    let end = wire.len();
    wire.extend(frame_bytes(
        HEADERS,
        END_STREAM | END_HEADERS,
        1,
        &[0xbb; 3],
    ));
    for chunk in 1..wire.len() {
        let mut cutter = Cutter::new(60, Arc::default());
        let mut forwarded = 0;
        for piece in wire.chunks(chunk) {
            match cutter.cut_point(piece) {
                Some(keep) => {
                    forwarded += keep.min(piece.len());
                    break;
                }
                None => forwarded += piece.len(),
            }
        }
        assert!(
            forwarded > second + 9 && forwarded < end,
            "chunk size {chunk}: the cut must fall inside the second DATA payload, at {forwarded}"
        );
    }
}

#[test]
fn padding_and_priority_are_stripped() {
    let payload = [2, 0, 0, 0, 0, 0, 0xaa, 0xbb, 0, 0];
    assert_eq!(
        header_fragment(PADDED | PRIORITY, &payload),
        Some(&[0xaa, 0xbb][..])
    );
    assert_eq!(header_fragment(PADDED, &[9, 1]), None, "padding too long");
}
