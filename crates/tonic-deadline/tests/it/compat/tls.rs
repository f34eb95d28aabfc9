//! TLS through both layers: tonic's `Server::tls_config` behind the server
//! layer, `Endpoint::tls_config` under either client transport. A
//! `ReadyChannel` dials TCP and tonic performs the handshake after its
//! connector returns, as it does for its own `Channel`.

use probe::probe_server::ProbeServer;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};
use tonic_deadline::ServerDeadlineLayer;

use super::{
    Answer, Seer, Transport, assert_call_keeps_the_budget,
    assert_expired_call_answers_deadline_exceeded, loopback,
};

/// A certificate for `localhost` and its key, in PEM, made for this run.
fn certificate() -> (String, String) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
        .expect("rcgen must make a certificate");
    (made.cert.pem(), made.signing_key.serialize_pem())
}

#[tokio::test]
async fn tls_carries_calls_and_their_budget_through_both_layers_over_either_transport() {
    let (cert, key) = certificate();
    let (seer, mut sightings) = Seer::new(Answer::Echo);
    let (listener, addr) = loopback().await;
    let server = Server::builder()
        .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(&cert, &key)))
        .expect("the server must take the certificate");
    tokio::spawn(
        server
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(seer))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let endpoint = Endpoint::from_shared(format!("https://{addr}"))
        .expect("a loopback URI")
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&cert))
                .domain_name("localhost"),
        )
        .expect("the client must take the certificate");
    for transport in Transport::BOTH {
        let what = format!("TLS, {transport}");
        let mut client = transport.client(&endpoint);
        assert_call_keeps_the_budget(&mut client, &mut sightings, &what).await;
        super::within(super::BUDGET, client.call(probe::CallRequest::default()))
            .await
            .unwrap_or_else(|status| panic!("{what}: the call must succeed, got {status:?}"));
        let seen = sightings.next().await;
        let info = seen
            .extensions
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .unwrap_or_else(|| panic!("{what}: the call must have come over TLS"));
        assert_eq!(info.get_ref().local_addr(), Some(addr), "{what}");
        assert_eq!(
            seen.remote_addr,
            info.get_ref().remote_addr(),
            "{what}: request.remote_addr() must read through the TLS connect info"
        );
        assert_expired_call_answers_deadline_exceeded(&mut client, &what).await;
    }
}
