//! The GOAWAY a guard closes a flooding connection with: the code
//! `ENHANCE_YOUR_CALM`, and a text by which a client names the cause.

#[cfg(feature = "server")]
use crate::frames::{GOAWAY, frame};

/// The debug data of the GOAWAY a guard sends when it closes a connection
/// for a reset flood: a client (tonic-deadline's client layer) names the
/// cause from it.
///
/// ```
/// assert!(tonic_deadline_guard::FLOOD_GO_AWAY.contains("reset"));
/// ```
pub const FLOOD_GO_AWAY: &str = "too many streams reset long before their deadlines";

/// HTTP/2's `ENHANCE_YOUR_CALM`, the code of the GOAWAY a cut sends.
#[cfg(feature = "server")]
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// The GOAWAY of a connection cut off whose client opened `last_stream`
/// last.
#[cfg(feature = "server")]
pub(crate) fn cut(last_stream: u32) -> Vec<u8> {
    let mut payload = last_stream.to_be_bytes().to_vec();
    payload.extend(ENHANCE_YOUR_CALM.to_be_bytes());
    payload.extend_from_slice(FLOOD_GO_AWAY.as_bytes());
    frame(GOAWAY, 0, 0, &payload)
}
