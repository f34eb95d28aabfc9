//! Rich statuses and binary metadata through both layers: a status's
//! details and metadata (`Status::with_details`,
//! `with_details_and_metadata`), and `-bin` entries both ways, in headers
//! and in trailers, unary and streaming.

use bytes::Bytes;
use testkit::CallRequest;
use tokio_stream::StreamExt;
use tonic::metadata::{BinaryMetadataValue, MetadataMap};
use tonic::{Code, Status};

use super::{
    Answer, BUDGET, ECHO_BIN, EXPIRING, PATIENCE, SLOW_MS, Seer, TOKEN_BIN, Transport, endpoint,
    serve, within,
};

/// Details as a server would pack a `google.rpc.Status`: any bytes.
const DETAILS: &[u8] = b"\x08\x09\x12\x0dno quota left\x00\xff";
/// Binary metadata, with bytes no ASCII header value may hold.
const TRACE: &[u8] = &[0x00, 0x01, 0x7f, 0x80, 0xfe, 0xff];
const TOKEN: &[u8] = &[0xde, 0xad, 0x00, 0xbe, 0xef];

fn with_details_and_metadata() -> Status {
    let mut metadata = MetadataMap::new();
    metadata.insert_bin("x-trace-bin", BinaryMetadataValue::from_bytes(TRACE));
    metadata.insert("x-reason", "quota".parse().expect("an ASCII value"));
    Status::with_details_and_metadata(
        Code::FailedPrecondition,
        "no quota left",
        Bytes::from_static(DETAILS),
        metadata,
    )
}

fn with_details() -> Status {
    Status::with_details(
        Code::FailedPrecondition,
        "no quota left",
        Bytes::from_static(DETAILS),
    )
}

/// `request` carrying the binary token the [`Seer`] echoes.
fn with_token<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert_bin(TOKEN_BIN, BinaryMetadataValue::from_bytes(TOKEN));
    request
}

fn assert_detailed(status: &Status, with_metadata: bool, what: &str) {
    assert_eq!(
        (status.code(), status.message()),
        (Code::FailedPrecondition, "no quota left"),
        "{what}: the handler's status must arrive unchanged: {status:?}"
    );
    assert_eq!(
        status.details(),
        DETAILS,
        "{what}: the status's details must arrive byte for byte"
    );
    if with_metadata {
        let trace = status
            .metadata()
            .get_bin("x-trace-bin")
            .unwrap_or_else(|| panic!("{what}: the status's binary metadata must arrive"));
        assert_eq!(
            trace.to_bytes().expect("valid base64"),
            TRACE,
            "{what}: binary metadata must arrive byte for byte"
        );
        assert_eq!(
            status
                .metadata()
                .get("x-reason")
                .and_then(|v| v.to_str().ok()),
            Some("quota"),
            "{what}: and so must the ASCII metadata beside it"
        );
    }
}

fn assert_token_arrived(seen: &super::Seen, what: &str) {
    let token = seen
        .metadata
        .get_bin(TOKEN_BIN)
        .unwrap_or_else(|| panic!("{what}: the caller's binary metadata must reach the handler"));
    assert_eq!(
        token.to_bytes().expect("valid base64"),
        TOKEN,
        "{what}: byte for byte"
    );
}

fn assert_token_echoed(metadata: &MetadataMap, what: &str) {
    let echo = metadata
        .get_bin(ECHO_BIN)
        .unwrap_or_else(|| panic!("{what}: the handler's binary metadata must reach the caller"));
    assert_eq!(
        echo.to_bytes().expect("valid base64"),
        TOKEN,
        "{what}: byte for byte"
    );
}

#[tokio::test]
async fn a_failed_calls_details_and_metadata_pass_through_both_layers() {
    for (status, with_metadata) in [
        (with_details_and_metadata as fn() -> Status, true),
        (with_details, false),
    ] {
        let (seer, mut sightings) = Seer::new(Answer::Fail(status));
        let addr = serve(seer).await;
        for transport in Transport::BOTH {
            let what = format!("unary, with metadata: {with_metadata}, {transport}");
            let mut client = transport.client(&endpoint(addr));
            let failed = within(BUDGET, client.call(with_token(CallRequest::default())))
                .await
                .expect_err("the handler fails the call");
            assert_detailed(&failed, with_metadata, &what);
            let seen = sightings.next().await;
            assert_token_arrived(&seen, &what);
            seen.assert_budget(BUDGET, &what);
        }
    }
}

#[tokio::test]
async fn binary_metadata_crosses_both_layers_both_ways_unary_and_streaming() {
    let (seer, mut sightings) = Seer::new(Answer::Echo);
    let addr = serve(seer).await;
    for transport in Transport::BOTH {
        let mut client = transport.client(&endpoint(addr));

        let what = format!("unary, {transport}");
        let reply = within(BUDGET, client.call(with_token(CallRequest::default())))
            .await
            .unwrap_or_else(|status| panic!("{what}: the call must succeed, got {status:?}"));
        assert_token_echoed(reply.metadata(), &what);
        let seen = sightings.next().await;
        assert_token_arrived(&seen, &what);
        seen.assert_budget(BUDGET, &what);

        let what = format!("server streaming, {transport}");
        let watch = CallRequest {
            count: 2,
            interval_ms: 1,
            ..CallRequest::default()
        };
        let replies = within(BUDGET, async {
            let response = client.watch(with_token(watch)).await?;
            assert_token_echoed(response.metadata(), &what);
            let replies: Vec<_> = response.into_inner().collect().await;
            Ok::<_, Status>(replies)
        })
        .await
        .unwrap_or_else(|status| panic!("{what}: the stream must open, got {status:?}"));
        assert_eq!(replies.len(), 2, "{what}: {replies:?}");
        assert!(replies.iter().all(Result::is_ok), "{what}: {replies:?}");
        let seen = sightings.next().await;
        assert_token_arrived(&seen, &what);
        seen.assert_budget(BUDGET, &what);

        let what = format!("bidirectional streaming, {transport}");
        let outbound = tokio_stream::iter([CallRequest::default()]);
        let echoes = within(BUDGET, async {
            let response = client.chat(with_token(outbound)).await?;
            assert_token_echoed(response.metadata(), &what);
            let echoes: Vec<_> = response.into_inner().collect().await;
            Ok::<_, Status>(echoes)
        })
        .await
        .unwrap_or_else(|status| panic!("{what}: the stream must open, got {status:?}"));
        assert_eq!(echoes.len(), 1, "{what}: {echoes:?}");
        let seen = sightings.next().await;
        assert_token_arrived(&seen, &what);
        seen.assert_budget(BUDGET, &what);
    }
}

#[tokio::test]
async fn a_stream_ending_in_a_detailed_status_delivers_it_in_the_trailers() {
    let (seer, mut sightings) = Seer::new(Answer::Fail(with_details_and_metadata));
    let addr = serve(seer).await;
    for transport in Transport::BOTH {
        let what = format!("server streaming, {transport}");
        let mut client = transport.client(&endpoint(addr));
        let watch = CallRequest {
            count: 2,
            interval_ms: 1,
            ..CallRequest::default()
        };
        let (headers, replies) = within(BUDGET, async {
            let response = client.watch(with_token(watch)).await?;
            let headers = response.metadata().clone();
            let replies: Vec<_> = response.into_inner().collect().await;
            Ok::<_, Status>((headers, replies))
        })
        .await
        .unwrap_or_else(|status| panic!("{what}: the stream must open, got {status:?}"));
        assert_token_echoed(&headers, &format!("{what}, headers"));
        let [Ok(_), Ok(_), Err(status)] = &replies[..] else {
            panic!("{what}: two replies, then the status from the trailers: {replies:?}");
        };
        assert_detailed(status, true, &format!("{what}, trailers"));
        sightings.next().await.assert_budget(BUDGET, &what);

        // A stream that outlives its deadline ends with DEADLINE_EXCEEDED.
        let endless = CallRequest {
            count: 1_000,
            interval_ms: 10,
            work_ms: SLOW_MS, // (marks it as meant to expire)
            ..CallRequest::default()
        };
        let ended = tokio::time::timeout(
            PATIENCE,
            within(EXPIRING, async {
                let mut replies = client.watch(endless).await?.into_inner();
                while replies.message().await?.is_some() {}
                Ok::<_, Status>(())
            }),
        )
        .await
        .expect("the stream must end at its deadline")
        .expect_err("a thousand replies 10 ms apart outlive the budget");
        assert_eq!(ended.code(), Code::DeadlineExceeded, "{what}: {ended:?}");
    }
}
