//! Compression: gzip and zstd on a generated client and server
//! (`send_compressed`/`accept_compressed`), both ways, unary and streaming.
//! The layers wrap the HTTP bodies, under tonic's codec: what is compressed
//! passes through them as bytes.

use testkit::CallRequest;
use testkit::probe_server::ProbeServer;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::codec::CompressionEncoding;
use tonic::transport::Server;
use tonic_deadline::ServerDeadlineLayer;

use super::{
    Answer, BUDGET, Seer, Transport, assert_expired_call_answers_deadline_exceeded, endpoint,
    loopback, within,
};

const ENCODINGS: [(CompressionEncoding, &str); 2] = [
    (CompressionEncoding::Gzip, "gzip"),
    (CompressionEncoding::Zstd, "zstd"),
];

#[tokio::test]
async fn compressed_calls_pass_through_both_layers_both_ways_and_keep_the_budget() {
    for (encoding, name) in ENCODINGS {
        let (seer, mut sightings) = Seer::new(Answer::Echo);
        let (listener, addr) = loopback().await;
        tokio::spawn(
            Server::builder()
                .layer(ServerDeadlineLayer::new())
                .add_service(
                    ProbeServer::new(seer)
                        .send_compressed(encoding)
                        .accept_compressed(encoding),
                )
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        for transport in Transport::BOTH {
            let what = format!("{name} over a {transport}");
            let mut client = transport
                .client(&endpoint(addr))
                .send_compressed(encoding)
                .accept_compressed(encoding);
            // Compressible, and larger than one HTTP/2 frame before it is.
            let payload = "a compressible sentence, again and again. ".repeat(2_000);

            let reply = within(
                BUDGET,
                client.call(CallRequest {
                    payload: payload.clone(),
                    ..CallRequest::default()
                }),
            )
            .await
            .unwrap_or_else(|status| panic!("{what}: the call must succeed, got {status:?}"));
            assert_eq!(
                reply
                    .metadata()
                    .get("grpc-encoding")
                    .and_then(|v| v.to_str().ok()),
                Some(name),
                "{what}: the reply must come compressed"
            );
            assert!(
                reply.into_inner().payload == payload,
                "{what}: the reply must decompress to what was sent"
            );
            let seen = sightings.next().await;
            assert_eq!(
                seen.metadata
                    .get("grpc-encoding")
                    .and_then(|v| v.to_str().ok()),
                Some(name),
                "{what}: the request must arrive compressed"
            );
            seen.assert_budget(BUDGET, &what);

            // A stream both ways, each message compressed.
            let outbound: Vec<_> = (0..3)
                .map(|i| CallRequest {
                    payload: format!("{i}: {payload}"),
                    ..CallRequest::default()
                })
                .collect();
            let outbound = tokio_stream::iter(outbound);
            let (encoding_back, echoes) = within(BUDGET, async {
                let response = client.chat(outbound).await?;
                let encoding_back = response.metadata().get("grpc-encoding").cloned();
                let echoes = response
                    .into_inner()
                    .map(|r| r.map(|r| r.payload))
                    .collect::<Result<Vec<_>, _>>()
                    .await?;
                Ok::<_, tonic::Status>((encoding_back, echoes))
            })
            .await
            .unwrap_or_else(|status| panic!("{what}: the stream must succeed, got {status:?}"));
            assert_eq!(
                encoding_back.as_ref().and_then(|v| v.to_str().ok()),
                Some(name),
                "{what}: the stream's replies must come compressed"
            );
            assert_eq!(echoes.len(), 3, "{what}: every message must come back");
            assert!(
                echoes
                    .iter()
                    .enumerate()
                    .all(|(i, echo)| *echo == format!("{i}: {payload}")),
                "{what}: every message must decompress to what was sent"
            );
            let seen = sightings.next().await;
            assert_eq!(
                seen.metadata
                    .get("grpc-encoding")
                    .and_then(|v| v.to_str().ok()),
                Some(name),
                "{what}: the stream's messages must arrive compressed"
            );
            seen.assert_budget(BUDGET, &what);

            assert_expired_call_answers_deadline_exceeded(&mut client, &what).await;
        }
    }
}
