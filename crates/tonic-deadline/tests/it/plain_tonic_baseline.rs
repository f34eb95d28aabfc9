//! What plain tonic does without our layer — the gaps the README's table
//! names. If a tonic release closes one, this fails and the table must change.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{Events, Node, loopback, raw_call, raw_client};
use testkit::CallRequest;
use testkit::probe_server::ProbeServer;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;

async fn serve_plain(node: Node) -> SocketAddr {
    let (listener, addr) = loopback().await;
    tokio::spawn(async move {
        Server::builder()
            .add_service(ProbeServer::new(node))
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .expect("the test server must keep serving");
    });
    addr
}

#[tokio::test]
async fn plain_tonic_ignores_a_malformed_grpc_timeout_and_runs_the_handler() {
    let (_events, tx) = Events::new();
    let addr = serve_plain(Node::new("S", &tx)).await;
    let mut connection = raw_client(addr).await;
    let answer = raw_call(&mut connection, addr, Some(b"1a"), &CallRequest::default()).await;
    assert_eq!(
        answer.status.code(),
        tonic::Code::Ok,
        "plain tonic answers a malformed grpc-timeout as if it were absent: {:?}",
        answer.status
    );
}

#[tokio::test]
async fn plain_tonic_reports_its_own_timeout_as_cancelled() {
    let (_events, tx) = Events::new();
    let addr = serve_plain(Node::new("S", &tx).working(Duration::from_secs(2))).await;
    let mut connection = raw_client(addr).await;
    let answer = raw_call(
        &mut connection,
        addr,
        Some(b"100m"),
        &CallRequest::default(),
    )
    .await;
    assert_eq!(
        answer.status.code(),
        tonic::Code::Cancelled,
        "plain tonic's server timer answers CANCELLED, not DEADLINE_EXCEEDED: {:?}",
        answer.status
    );
}
