//! TLS through both layers: tonic's `Server::tls_config` behind the server
//! layer, `Endpoint::tls_config` under either client transport. A
//! `ReadyChannel` dials TCP and tonic performs the handshake after its
//! connector returns, as it does for its own `Channel`.

use testkit::probe_server::ProbeServer;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};
use tonic_deadline::ServerDeadlineLayer;
use tonic_deadline::observe::Metrics;
use tonic_deadline::server::{ResetGuard, ServerTls};

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
        super::within(super::BUDGET, client.call(testkit::CallRequest::default()))
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

/// The README's server with TLS: the reset guard terminates TLS itself
/// (`ResetGuard::incoming_tls`, mutual TLS here) and reads the decrypted
/// HTTP/2. Calls carry their budget over either client transport, and the
/// handler sees what tonic's own TLS shows it: the client's certificate
/// and its address.
#[tokio::test]
async fn the_reset_guard_terminates_tls_and_handlers_see_the_clients_certificate_and_address() {
    let pki = testkit::tls::Pki::new();
    let (seer, mut sightings) = Seer::new(Answer::Echo);
    let (listener, addr) = loopback().await;
    let guard = ResetGuard::new();
    let tls = ServerTls::new(&pki.server_cert_pem, &pki.server_key_pem).client_ca_root(&pki.ca_pem);
    let incoming = guard
        .incoming_tls(TcpListenerStream::new(listener), tls)
        .expect("the guard must take the certificates");
    tokio::spawn(
        guard
            .builder()
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(seer))
            .serve_with_incoming(incoming),
    );
    let endpoint = Endpoint::from_shared(format!("https://{addr}"))
        .expect("a loopback URI")
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&pki.ca_pem))
                .identity(Identity::from_pem(
                    &pki.client_cert_pem,
                    &pki.client_key_pem,
                ))
                .domain_name(testkit::tls::SERVER_NAME),
        )
        .expect("the client must take the certificates");
    for transport in Transport::BOTH {
        let what = format!("TLS through the reset guard, {transport}");
        let mut client = transport.client(&endpoint);
        assert_call_keeps_the_budget(&mut client, &mut sightings, &what).await;
        super::within(super::BUDGET, client.call(testkit::CallRequest::default()))
            .await
            .unwrap_or_else(|status| panic!("{what}: the call must succeed, got {status:?}"));
        let seen = sightings.next().await;
        let info = seen
            .extensions
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .unwrap_or_else(|| panic!("{what}: the call must have come over TLS"));
        let certs = info
            .peer_certs()
            .unwrap_or_else(|| panic!("{what}: the handler must see the client's certificate"));
        assert_eq!(certs.len(), 1, "{what}: the client's one certificate");
        assert_eq!(info.get_ref().local_addr(), Some(addr), "{what}");
        assert!(seen.remote_addr.is_some(), "{what}: the client's address");
        assert_eq!(
            seen.remote_addr,
            info.get_ref().remote_addr(),
            "{what}: request.remote_addr() must read through the TLS connect info"
        );
        assert_expired_call_answers_deadline_exceeded(&mut client, &what).await;
    }

    // The client CA is enforced: without a certificate, no call.
    let anonymous = Endpoint::from_shared(format!("https://{addr}"))
        .expect("a loopback URI")
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&pki.ca_pem))
                .domain_name(testkit::tls::SERVER_NAME),
        )
        .expect("the client must take the certificate");
    let refused = Transport::Channel
        .client(&anonymous)
        .call(testkit::CallRequest::default())
        .await
        .expect_err("a client without a certificate must not be served");
    // TLS 1.3: the client learns it from the server's alert after its side
    // of the handshake, which tonic's client reports as it comes.
    assert!(
        format!("{refused:?}").contains("CertificateRequired"),
        "the server asks for the certificate: {refused:?}"
    );
}

/// TLS set the way tonic documents it (`tls_config` on the server, through
/// the guard's builder's `configure`), with the reset guard around the
/// incoming connections: the guard would read ciphertext, and hyper's bound
/// on reset floods is raised for the guard, so nothing would bound them.
/// The guard refuses every such connection, says why at once (an ERROR
/// naming the fix) and counts it; it is never served unguarded.
#[tokio::test]
async fn tls_set_on_tonics_server_around_the_guard_is_refused_and_said_plainly() {
    testkit::logs::capture();
    let errors_before = testkit::logs::errors_about("incoming_tls").len();
    let pki = testkit::tls::Pki::new();
    let (seer, _sightings) = Seer::new(Answer::Echo);
    let (listener, addr) = loopback().await;
    let metrics = Metrics::new();
    let guard = ResetGuard::new().observed_by(metrics.clone());
    let identity = Identity::from_pem(&pki.server_cert_pem, &pki.server_key_pem);
    let server = guard.builder().configure(|server| {
        server
            .tls_config(ServerTlsConfig::new().identity(identity))
            .expect("tonic takes the certificate")
    });
    tokio::spawn(
        server
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(seer))
            .serve_with_incoming(guard.incoming(TcpListenerStream::new(listener))),
    );
    let endpoint = Endpoint::from_shared(format!("https://{addr}"))
        .expect("a loopback URI")
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&pki.ca_pem))
                .domain_name(testkit::tls::SERVER_NAME),
        )
        .expect("the client must take the certificate");
    for _ in 0..3 {
        let refused = Transport::Channel
            .client(&endpoint)
            .call(testkit::CallRequest::default())
            .await
            .expect_err("a connection the guard cannot read must not be served");
        assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    }
    assert_eq!(metrics.unguarded_servers(), 1, "counted, once");
    let errors = testkit::logs::errors_about("incoming_tls");
    assert_eq!(errors.len(), errors_before + 1, "said once, at the first");
}

/// The guard's router binds an address and terminates TLS itself:
/// `serve_tls`, as short to write as tonic's `tls_config`.
#[tokio::test]
async fn a_guarded_router_serves_tls_on_an_address_it_binds() {
    let pki = testkit::tls::Pki::new();
    let (seer, mut sightings) = Seer::new(Answer::Echo);
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = free.local_addr().expect("its address");
    drop(free);
    tokio::spawn(
        ResetGuard::new()
            .builder()
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(seer))
            .serve_tls(
                addr,
                ServerTls::new(&pki.server_cert_pem, &pki.server_key_pem),
            ),
    );
    let endpoint = Endpoint::from_shared(format!("https://{addr}"))
        .expect("a loopback URI")
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&pki.ca_pem))
                .domain_name(testkit::tls::SERVER_NAME),
        )
        .expect("the client must take the certificate");
    let mut client = Transport::ReadyChannel.client(&endpoint);
    assert_call_keeps_the_budget(&mut client, &mut sightings, &"serve_tls").await;
}
