//! Message and frame sizes: tonic's message limits on client and server
//! (`max_decoding_message_size`, `max_encoding_message_size`) answer
//! through both layers exactly as they do in plain tonic; messages many
//! HTTP/2 frames long, under small flow-control windows and non-default
//! frame sizes, pass whole and keep the budget.

use std::net::SocketAddr;

use bytes::Bytes;
use testkit::CallRequest;
use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Status;
use tonic::body::Body;
use tonic::transport::Server;
use tonic_deadline::{BoxError, ServerDeadlineLayer};

use super::{
    Answer, BUDGET, PATIENCE, Seer, Transport, assert_expired_call_answers_deadline_exceeded,
    endpoint, loopback, plain_client, within,
};

/// The limit every case sets, and the size of the message that breaks it.
const LIMIT: usize = 1024;
const TOO_BIG: usize = 4 * LIMIT;

/// One of tonic's four message limits, set low.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    /// The client refuses a reply that large.
    ClientDecoding,
    /// The client refuses to send a request that large.
    ClientEncoding,
    /// The server refuses a request that large.
    ServerDecoding,
    /// The server refuses to send a reply that large.
    ServerEncoding,
}

impl Limit {
    const ALL: [Self; 4] = [
        Self::ClientDecoding,
        Self::ClientEncoding,
        Self::ServerDecoding,
        Self::ServerEncoding,
    ];

    fn server(self, server: ProbeServer<Seer>) -> ProbeServer<Seer> {
        match self {
            Self::ServerDecoding => server.max_decoding_message_size(LIMIT),
            Self::ServerEncoding => server.max_encoding_message_size(LIMIT),
            Self::ClientDecoding | Self::ClientEncoding => server,
        }
    }

    fn client<T>(self, client: ProbeClient<T>) -> ProbeClient<T>
    where
        T: tonic::client::GrpcService<Body>,
        T::Error: Into<BoxError>,
        T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
        <T::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
    {
        match self {
            Self::ClientDecoding => client.max_decoding_message_size(LIMIT),
            Self::ClientEncoding => client.max_encoding_message_size(LIMIT),
            Self::ServerDecoding | Self::ServerEncoding => client,
        }
    }

    /// A request whose message, or whose reply, breaks the limit.
    fn request(self) -> CallRequest {
        match self {
            Self::ClientEncoding | Self::ServerDecoding => CallRequest {
                payload: "x".repeat(TOO_BIG),
                ..CallRequest::default()
            },
            Self::ClientDecoding | Self::ServerEncoding => CallRequest {
                count: TOO_BIG as u32,
                ..CallRequest::default()
            },
        }
    }

    /// Whether the call reaches the handler before the limit stops it.
    fn reaches_the_handler(self) -> bool {
        matches!(self, Self::ClientDecoding | Self::ServerEncoding)
    }
}

/// Serves a probe with `limit` set, behind the server layer or without it.
async fn serve_limited(seer: Seer, limit: Limit, layered: bool) -> SocketAddr {
    let (listener, addr) = loopback().await;
    let incoming = TcpListenerStream::new(listener);
    let service = limit.server(ProbeServer::new(seer));
    if layered {
        tokio::spawn(
            Server::builder()
                .layer(ServerDeadlineLayer::new())
                .add_service(service)
                .serve_with_incoming(incoming),
        );
    } else {
        tokio::spawn(
            Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming),
        );
    }
    addr
}

#[tokio::test]
async fn message_size_limits_answer_through_both_layers_as_plain_tonic_does() {
    for limit in Limit::ALL {
        // Plain tonic, no layer on either side: the answer to match.
        let (seer, _) = Seer::new(Answer::Echo);
        let plain = endpoint(serve_limited(seer, limit, false).await);
        let mut client = limit.client(plain_client(&plain));
        let expected = tokio::time::timeout(PATIENCE, client.call(limit.request()))
            .await
            .expect("plain tonic answers")
            .expect_err("the message breaks the limit");

        let (seer, mut sightings) = Seer::new(Answer::Echo);
        let layered = endpoint(serve_limited(seer, limit, true).await);
        for transport in Transport::BOTH {
            let what = format!("{limit:?} limit, both layers, {transport}");
            let mut client = limit.client(transport.client(&layered));
            let status: Status =
                tokio::time::timeout(PATIENCE, within(BUDGET, client.call(limit.request())))
                    .await
                    .expect("the limit answers at once")
                    .expect_err("the message breaks the limit");
            assert_eq!(
                (status.code(), status.message()),
                (expected.code(), expected.message()),
                "{what}: the limit's status must pass through unchanged: {status:?}"
            );
            if limit.reaches_the_handler() {
                sightings.next().await.assert_budget(BUDGET, &what);
            }
            // The same client still calls within the limit, and still obeys
            // its deadline.
            within(BUDGET, client.call(CallRequest::default()))
                .await
                .unwrap_or_else(|status| panic!("{what}: a small call must succeed: {status:?}"));
            sightings.next().await.assert_budget(BUDGET, &what);
            assert_expired_call_answers_deadline_exceeded(&mut client, &what).await;
        }
    }
}

#[tokio::test]
async fn messages_many_frames_long_pass_whole_under_small_windows_and_keep_the_budget() {
    let (seer, mut sightings) = Seer::new(Answer::Echo);
    let (listener, addr) = loopback().await;
    // Frames up to 64 KiB toward the server, small windows both ways: a
    // message of 1 MiB crosses as dozens of frames and window updates.
    tokio::spawn(
        Server::builder()
            .max_frame_size(64 * 1024)
            .initial_stream_window_size(64 * 1024)
            .initial_connection_window_size(128 * 1024)
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(seer))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let endpoint = endpoint(addr)
        .max_frame_size(32 * 1024)
        .initial_stream_window_size(64 * 1024)
        .initial_connection_window_size(128 * 1024);
    let payload: String = (0..1024 * 1024)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    for transport in Transport::BOTH {
        let what = format!("1 MiB messages, {transport}");
        let mut client = transport.client(&endpoint);
        let reply = within(
            BUDGET,
            client.call(CallRequest {
                payload: payload.clone(),
                ..CallRequest::default()
            }),
        )
        .await
        .unwrap_or_else(|status| panic!("{what}: the call must succeed, got {status:?}"));
        assert!(
            reply.into_inner().payload == payload,
            "{what}: the reply must arrive whole"
        );
        sightings.next().await.assert_budget(BUDGET, &what);

        let outbound = tokio_stream::iter(vec![
            CallRequest {
                payload: payload.clone(),
                ..CallRequest::default()
            };
            3
        ]);
        let echoes: Vec<usize> = within(BUDGET, async {
            let replies = client.chat(outbound).await?.into_inner();
            replies
                .map(|r| r.map(|r| usize::from(r.payload == payload)))
                .collect::<Result<Vec<_>, _>>()
                .await
        })
        .await
        .unwrap_or_else(|status: Status| panic!("{what}: the stream must succeed, got {status:?}"));
        assert_eq!(
            echoes,
            [1, 1, 1],
            "{what}: every message must come back whole"
        );
        sightings.next().await.assert_budget(BUDGET, &what);
        assert_expired_call_answers_deadline_exceeded(&mut client, &what).await;
    }
}
