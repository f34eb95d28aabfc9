//! Certificates made for one run: a certificate authority, a server
//! certificate for `localhost` and 127.0.0.1 signed by it, and a client
//! certificate signed by it (for mutual TLS); and the rustls client
//! configuration a raw flood speaks TLS with.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, IpAddr as PkiIp, ServerName};
use rustls::{ClientConfig, RootCertStore};

/// The name the server certificate is made for, and the clients ask for.
pub const SERVER_NAME: &str = "localhost";

/// A certificate authority and what it signed, all in PEM.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The authority's certificate: what clients trust, and what a server
    /// checks its clients' certificates against.
    pub ca_pem: String,
    /// The server's certificate, for `localhost` and 127.0.0.1.
    pub server_cert_pem: String,
    /// The server's private key.
    pub server_key_pem: String,
    /// A client's certificate.
    pub client_cert_pem: String,
    /// The client's private key.
    pub client_key_pem: String,
}

impl Pki {
    /// Makes a new authority and its certificates.
    ///
    /// # Panics
    ///
    /// When rcgen cannot make a key or a certificate (it can always, with
    /// its ring backend).
    pub fn new() -> Self {
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("a CA key"))
            .expect("a CA certificate");
        let server_key = KeyPair::generate().expect("a server key");
        let server = CertificateParams::new(vec![SERVER_NAME.to_owned(), "127.0.0.1".to_owned()])
            .expect("server parameters")
            .signed_by(&server_key, &ca)
            .expect("a server certificate");
        let client_key = KeyPair::generate().expect("a client key");
        let client = CertificateParams::new(vec!["client".to_owned()])
            .expect("client parameters")
            .signed_by(&client_key, &ca)
            .expect("a client certificate");
        Self {
            ca_pem: ca.pem(),
            server_cert_pem: server.pem(),
            server_key_pem: server_key.serialize_pem(),
            client_cert_pem: client.pem(),
            client_key_pem: client_key.serialize_pem(),
        }
    }

    /// A rustls client configuration that trusts this authority and asks
    /// for HTTP/2, without a client certificate.
    ///
    /// # Panics
    ///
    /// When the authority's certificate does not parse (it always does).
    pub fn client_config(&self) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            roots.add(cert.expect("the CA's PEM")).expect("the CA");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        Arc::new(config)
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}

/// The name a client asks the server for.
pub fn server_name() -> ServerName<'static> {
    ServerName::try_from(SERVER_NAME).unwrap_or(ServerName::IpAddress(PkiIp::from(
        std::net::IpAddr::from([127, 0, 0, 1]),
    )))
}
