//! gRPC-Web over HTTP/1.1: tonic-web's `GrpcWebLayer` on a server that
//! accepts HTTP/1.1, beside the server layer; a hyper HTTP/1.1 client
//! through tonic-web's `GrpcWebClientLayer`, under the client layer.
//! (`ReadyChannel` speaks HTTP/2 only: a gRPC-Web client is a plain HTTP
//! client with the client layer on it.)

use std::net::SocketAddr;
use std::time::Duration;

use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use testkit::CallRequest;
use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;
use tonic::{Code, Status};
use tonic_deadline::{ClientDeadlineLayer, ServerDeadlineLayer};
use tonic_web::{GrpcWebClientLayer, GrpcWebLayer};
use tower::ServiceBuilder;

use super::{
    Answer, BUDGET, Client, EXPIRING, PATIENCE, SLOW_MS, Seer, assert_call_keeps_the_budget,
    assert_expired_call_answers_deadline_exceeded, boxed, loopback, within,
};

/// Where `GrpcWebLayer` stands beside `ServerDeadlineLayer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Translation {
    /// `.layer(GrpcWebLayer::new()).layer(ServerDeadlineLayer::new())`: the
    /// deadline layer sees gRPC, and its answers are translated.
    Outside,
    /// `.layer(ServerDeadlineLayer::new()).layer(GrpcWebLayer::new())`.
    Inside,
}

async fn serve_web(seer: Seer, translation: Translation) -> SocketAddr {
    let (listener, addr) = loopback().await;
    let incoming = TcpListenerStream::new(listener);
    let builder = Server::builder().accept_http1(true);
    match translation {
        Translation::Outside => tokio::spawn(
            builder
                .layer(GrpcWebLayer::new())
                .layer(ServerDeadlineLayer::new())
                .add_service(ProbeServer::new(seer))
                .serve_with_incoming(incoming),
        ),
        Translation::Inside => tokio::spawn(
            builder
                .layer(ServerDeadlineLayer::new())
                .layer(GrpcWebLayer::new())
                .add_service(ProbeServer::new(seer))
                .serve_with_incoming(incoming),
        ),
    };
    addr
}

/// A gRPC-Web client over hyper's HTTP/1.1 client, with the client layer
/// on it or without.
fn web_client(addr: SocketAddr, client_layer: bool) -> Client {
    let http1 = HttpClient::builder(TokioExecutor::new()).build_http();
    let stack = if client_layer {
        boxed(
            ServiceBuilder::new()
                .layer(ClientDeadlineLayer::new())
                .layer(GrpcWebClientLayer::new())
                .service(http1),
        )
    } else {
        boxed(
            ServiceBuilder::new()
                .layer(GrpcWebClientLayer::new())
                .service(http1),
        )
    };
    let origin = format!("http://{addr}").parse().expect("a loopback URI");
    ProbeClient::with_origin(stack, origin)
}

#[tokio::test]
async fn grpc_web_over_http1_carries_calls_and_their_budget_through_both_layers() {
    for translation in [Translation::Outside, Translation::Inside] {
        let what = format!("gRPC-Web, GrpcWebLayer {translation:?} the server layer");
        let (seer, mut sightings) = Seer::new(Answer::Echo);
        let mut client = web_client(serve_web(seer, translation).await, true);
        assert_call_keeps_the_budget(&mut client, &mut sightings, &what).await;

        let watch = CallRequest {
            count: 3,
            interval_ms: 1,
            payload: "tick".to_owned(),
            ..CallRequest::default()
        };
        let replies = within(BUDGET, async {
            let replies = client.watch(watch).await?.into_inner();
            replies
                .map(|r| r.map(|r| r.payload))
                .collect::<Result<Vec<_>, _>>()
                .await
        })
        .await
        .unwrap_or_else(|status| panic!("{what}: the stream must succeed, got {status:?}"));
        assert_eq!(replies, ["tick"; 3], "{what}");
        sightings.next().await.assert_budget(BUDGET, &what);

        assert_expired_call_answers_deadline_exceeded(&mut client, &what).await;
        if translation == Translation::Inside {
            // A stream cut at its deadline loses its trailers behind the
            // translation (see the last test): whichever of the client's
            // timer and the server layer's cut comes first decides what
            // the caller is told.
            continue;
        }
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

/// A `Watch` of a thousand replies 10 ms apart whose caller leaves its
/// 100 ms deadline to the server (no client layer: nothing times it on
/// the client).
async fn stream_left_to_the_server(client: &mut Client) -> Status {
    let mut endless = tonic::Request::new(CallRequest {
        count: 1_000,
        interval_ms: 10,
        ..CallRequest::default()
    });
    endless.set_timeout(Duration::from_millis(100));
    tokio::time::timeout(PATIENCE, async {
        let mut replies = client.watch(endless).await?.into_inner();
        while replies.message().await?.is_some() {}
        Ok::<_, Status>(())
    })
    .await
    .expect("the server must end the stream at the deadline")
    .expect_err("a thousand replies 10 ms apart outlive the deadline")
}

#[tokio::test]
async fn a_grpc_web_caller_that_leaves_its_deadline_to_the_server_gets_deadline_exceeded() {
    for translation in [Translation::Outside, Translation::Inside] {
        let what = format!("gRPC-Web without the client layer, GrpcWebLayer {translation:?}");
        let (seer, _sightings) = Seer::new(Answer::Echo);
        let mut client = web_client(serve_web(seer, translation).await, false);
        let mut slow = tonic::Request::new(CallRequest {
            work_ms: SLOW_MS,
            ..CallRequest::default()
        });
        slow.set_timeout(Duration::from_millis(100));
        let status = tokio::time::timeout(PATIENCE, client.call(slow))
            .await
            .expect("the server must answer at the deadline")
            .expect_err("the handler works far beyond the deadline");
        assert_eq!(
            status.code(),
            Code::DeadlineExceeded,
            "{what}: the server layer's answer (trailers-only, in the head) reaches a \
             gRPC-Web caller in either order: {status:?}"
        );
    }

    // A stream already under way ends in trailers, which gRPC-Web carries
    // in the body: outside the server layer, the translation carries the
    // layer's.
    let (seer, _sightings) = Seer::new(Answer::Echo);
    let mut client = web_client(serve_web(seer, Translation::Outside).await, false);
    let ended = stream_left_to_the_server(&mut client).await;
    assert_eq!(
        ended.code(),
        Code::DeadlineExceeded,
        "a stream the server layer cuts ends with DEADLINE_EXCEEDED in its gRPC-Web trailers: {ended:?}"
    );
}

#[tokio::test]
async fn behind_the_grpc_web_translation_a_streams_deadline_reaches_the_caller() {
    // The server layer outside GrpcWebLayer sees the translated answer: a
    // stream it cuts must end with the trailer frame gRPC-Web carries in
    // the body, since HTTP/1.1 drops HTTP trailers on the way to a
    // gRPC-Web client (which would be told the stream broke off, UNKNOWN
    // "missing grpc-status trailer", not why).
    let (seer, _sightings) = Seer::new(Answer::Echo);
    let mut client = web_client(serve_web(seer, Translation::Inside).await, false);
    let ended = stream_left_to_the_server(&mut client).await;
    assert_eq!(
        ended.code(),
        Code::DeadlineExceeded,
        "behind the translation, the layer's trailers reach a gRPC-Web caller: {ended:?}"
    );
}
