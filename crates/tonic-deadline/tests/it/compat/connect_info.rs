//! Connect info behind the server layer: `request.remote_addr()` and
//! `TcpConnectInfo` over TCP, `UdsConnectInfo` over a Unix socket, with
//! either client transport on the other end.

use testkit::probe_server::ProbeServer;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::{TcpConnectInfo, UdsConnectInfo};
use tonic::transport::{Endpoint, Server};
use tonic_deadline::client::ReadyChannel;
use tonic_deadline::{ClientDeadlineLayer, ServerDeadlineLayer};
use tower::ServiceBuilder;

use super::{
    Answer, Seer, Transport, assert_call_keeps_the_budget,
    assert_expired_call_answers_deadline_exceeded, boxed, endpoint, serve,
};

#[tokio::test]
async fn a_handler_behind_the_layer_sees_the_tcp_connect_info() {
    let (seer, mut sightings) = Seer::new(Answer::Echo);
    let addr = serve(seer).await;
    for transport in Transport::BOTH {
        let what = format!("TCP, {transport}");
        let mut client = transport.client(&endpoint(addr));
        assert_call_keeps_the_budget(&mut client, &mut sightings, &what).await;
        // Once more, for the connect info.
        within_budget_call(&mut client, &what).await;
        let seen = sightings.next().await;
        let info = seen
            .extensions
            .get::<TcpConnectInfo>()
            .unwrap_or_else(|| panic!("{what}: the handler must see TcpConnectInfo"));
        assert_eq!(
            info.local_addr(),
            Some(addr),
            "{what}: the connection's local end is the server's address"
        );
        let remote = info
            .remote_addr()
            .unwrap_or_else(|| panic!("{what}: TcpConnectInfo must name the peer"));
        assert!(
            remote.ip().is_loopback() && remote.port() != 0,
            "{what}: the peer is this process's client on loopback: {remote}"
        );
        assert_eq!(
            seen.remote_addr,
            Some(remote),
            "{what}: request.remote_addr() must read the same connect info"
        );
        assert_expired_call_answers_deadline_exceeded(&mut client, &what).await;
    }
}

async fn within_budget_call(client: &mut super::Client, what: &str) {
    super::within(super::BUDGET, client.call(testkit::CallRequest::default()))
        .await
        .unwrap_or_else(|status| panic!("{what}: the call must succeed, got {status:?}"));
}

#[tokio::test]
async fn a_handler_behind_the_layer_sees_the_unix_socket_connect_info() {
    let (seer, mut sightings) = Seer::new(Answer::Echo);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("probe.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("a Unix socket to listen on");
    tokio::spawn(
        Server::builder()
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(seer))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    // The endpoint tonic users write for a Unix socket: tonic's own
    // Channel dials it; a ReadyChannel is told the path.
    let unix = Endpoint::from_shared(format!("unix:{}", path.display())).expect("a unix: URI");
    for transport in Transport::BOTH {
        let what = format!("Unix socket, {transport}");
        let stack = match transport {
            Transport::Channel => boxed(
                ServiceBuilder::new()
                    .layer(ClientDeadlineLayer::new())
                    .service(unix.connect_lazy()),
            ),
            Transport::ReadyChannel => boxed(
                ServiceBuilder::new()
                    .layer(ClientDeadlineLayer::new())
                    .service(ReadyChannel::builder(&unix).unix_socket(&path).lazy()),
            ),
        };
        let mut client = testkit::probe_client::ProbeClient::new(stack);
        assert_call_keeps_the_budget(&mut client, &mut sightings, &what).await;
        within_budget_call(&mut client, &what).await;
        let seen = sightings.next().await;
        let info = seen
            .extensions
            .get::<UdsConnectInfo>()
            .unwrap_or_else(|| panic!("{what}: the handler must see UdsConnectInfo"));
        let credentials = info
            .peer_cred
            .unwrap_or_else(|| panic!("{what}: a Unix socket knows its peer's credentials"));
        assert_eq!(
            credentials.pid(),
            Some(std::process::id().try_into().expect("a pid fits")),
            "{what}: the peer is this very process"
        );
        assert_eq!(
            seen.remote_addr, None,
            "{what}: a Unix socket has no IP address to report"
        );
        assert!(
            seen.extensions.get::<TcpConnectInfo>().is_none(),
            "{what}: and no TCP connect info"
        );
        assert_expired_call_answers_deadline_exceeded(&mut client, &what).await;
    }
}
