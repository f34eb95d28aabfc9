//! The ledger on the wire: a `google.rpc.DebugInfo` in the status's
//! `grpc-status-details-bin`, and a line in its `grpc-message`.

use base64::Engine as _;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD_NO_PAD};
use http::{HeaderMap, HeaderValue};
use percent_encoding::{AsciiSet, CONTROLS};
use prost::Message as _;

use super::{DETAIL, Ledger, MAX_HOPS, message_with};
use crate::Code;

const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: http::HeaderName = http::HeaderName::from_static("grpc-message");
const GRPC_STATUS_DETAILS: http::HeaderName =
    http::HeaderName::from_static("grpc-status-details-bin");

/// `google.rpc.Status` (google/rpc/status.proto): what
/// `grpc-status-details-bin` carries, as every gRPC implementation's rich
/// error model reads it.
#[derive(Clone, PartialEq, prost::Message)]
struct Status {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<Any>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
struct Any {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// `google.rpc.DebugInfo` (google/rpc/error_details.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct DebugInfo {
    #[prost(string, repeated, tag = "1")]
    stack_entries: Vec<String>,
    #[prost(string, tag = "2")]
    detail: String,
}

/// The code of the status in `headers` (`grpc-status`), if there is one
/// (a number gRPC does not define reads as `UNKNOWN`).
pub(super) fn status_code(headers: &HeaderMap) -> Option<Code> {
    let value = std::str::from_utf8(headers.get(GRPC_STATUS)?.as_bytes()).ok()?;
    Some(value.trim().parse().map_or(Code::Unknown, Code::from_i32))
}

/// The type URL of a `google.rpc.DebugInfo` in an `Any`.
const DEBUG_INFO: &str = "type.googleapis.com/google.rpc.DebugInfo";

/// Details larger than this are not read for a ledger: a ledger of
/// [`MAX_HOPS`] lines takes under 4 KB.
const MAX_DETAILS_BYTES: usize = 16 * 1024;

/// What gRPC asks to percent-encode in `grpc-message` (besides every byte
/// that is not ASCII): controls and `%`.
const MESSAGE: &AsciiSet = &CONTROLS.add(b'%');

/// Base64 with or without its padding, as gRPC peers send it.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The ledger's lines in `details` (a `google.rpc.Status`), and whether
/// some were dropped for the cap; `None` without a ledger.
pub(crate) fn entries_of_details(details: &[u8]) -> Option<(Vec<String>, bool)> {
    if details.is_empty() || details.len() > MAX_DETAILS_BYTES {
        return None;
    }
    let status = Status::decode(details).ok()?;
    status.details.iter().find_map(ledger_of)
}

/// The ledger's lines in a `google.rpc.Status` detail, if it is one.
fn ledger_of(any: &Any) -> Option<(Vec<String>, bool)> {
    if any.type_url != DEBUG_INFO {
        return None;
    }
    let info = DebugInfo::decode(&*any.value).ok()?;
    if info.detail != DETAIL {
        return None;
    }
    let mut entries = info.stack_entries;
    let capped = entries.len() > MAX_HOPS;
    entries.truncate(MAX_HOPS);
    Some((entries, capped))
}

/// The ledger's lines in the status of `headers` (a trailers-only answer,
/// or trailers), if they carry one.
pub(crate) fn entries_of_headers(headers: &HeaderMap) -> Option<(Vec<String>, bool)> {
    let details = headers.get(GRPC_STATUS_DETAILS)?;
    if details.len() > MAX_DETAILS_BYTES * 4 / 3 + 4 {
        return None;
    }
    let details = LENIENT.decode(details.as_bytes()).ok()?;
    entries_of_details(&details)
}

/// Puts the ledger `entries` on the status of `headers`: a `DebugInfo`
/// among its details (replacing the ledger of the hop below, keeping the
/// rest) and its line at the end of its message. Details that are not a
/// `google.rpc.Status` are left as they are: the ledger is then in the
/// message only.
pub(crate) fn attach(headers: &mut HeaderMap, entries: Vec<String>) {
    let Some(code) = status_code(headers) else {
        return;
    };
    let message = headers.get(GRPC_MESSAGE).map_or_else(String::new, |m| {
        percent_encoding::percent_decode(m.as_bytes())
            .decode_utf8_lossy()
            .into_owned()
    });
    let ledger = Ledger::from_entries(&entries, false);
    let message = message_with(&message, &ledger.summary());
    let details = match headers.get(GRPC_STATUS_DETAILS) {
        None => Some(Status::default()),
        Some(value) => LENIENT
            .decode(value.as_bytes())
            .ok()
            .and_then(|bytes| Status::decode(&*bytes).ok()),
    };
    if let Some(mut details) = details {
        details.details.retain(|any| ledger_of(any).is_none());
        details.details.push(Any {
            type_url: DEBUG_INFO.to_owned(),
            value: DebugInfo {
                stack_entries: entries,
                detail: DETAIL.to_owned(),
            }
            .encode_to_vec(),
        });
        details.code = code as i32;
        details.message.clone_from(&message);
        let encoded = STANDARD_NO_PAD.encode(details.encode_to_vec());
        if let Ok(value) = HeaderValue::try_from(encoded) {
            headers.insert(GRPC_STATUS_DETAILS, value);
        }
    }
    let encoded = percent_encoding::utf8_percent_encode(&message, MESSAGE).to_string();
    if let Ok(value) = HeaderValue::try_from(encoded) {
        headers.insert(GRPC_MESSAGE, value);
    }
}
