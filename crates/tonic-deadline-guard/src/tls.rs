//! TLS terminated by the guard, so that it reads the decrypted HTTP/2.
//!
//! tonic's `Server::tls_config` encrypts after the incoming stream: a guard
//! around the incoming stream would see ciphertext, and refuses it. Here
//! the guard's incoming stream does the handshake (tokio-rustls, the same
//! rustls tonic uses, each handshake on a task of its own as tonic does)
//! and guards the decrypted stream. Handlers see what they see under
//! tonic's TLS: `Request::peer_certs()` and `Request::remote_addr()` read
//! the same `TlsConnectInfo`.

use std::fmt;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tonic::transport::server::{Connected, TlsConnectInfo};

use crate::connection::Guarded;
use crate::probation::PeerAddress;
use crate::shared::Shared;

/// How long a client may take over its handshake by default (tonic sets
/// none: a client that never finishes holds its connection forever).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The protocol gRPC asks for in the handshake.
const ALPN_H2: &[u8] = b"h2";

/// TLS for a server whose reset guard reads its connections: what tonic's
/// `ServerTlsConfig` sets (the server's certificate and key, the
/// certificate authority that signs its clients' certificates), made into
/// the same rustls configuration. See
/// [`ResetGuard::incoming_tls`](crate::ResetGuard::incoming_tls).
///
/// ```
/// use tonic_deadline_guard::ServerTls;
/// # fn run(cert_pem: &[u8], key_pem: &[u8], ca_pem: &[u8]) {
/// let tls = ServerTls::new(cert_pem, key_pem);
/// let mutual = ServerTls::new(cert_pem, key_pem).client_ca_root(ca_pem);
/// # let _ = (tls, mutual);
/// # }
/// ```
#[derive(Clone)]
pub struct ServerTls {
    source: Source,
    handshake_timeout: Duration,
}

#[derive(Clone)]
enum Source {
    Pem {
        cert: Vec<u8>,
        key: Vec<u8>,
        client_ca: Option<Vec<u8>>,
        client_auth_optional: bool,
    },
    Rustls(Arc<ServerConfig>),
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

/// Why a [`ServerTls`] could not be made into a server's TLS.
#[derive(Debug)]
pub struct TlsError {
    what: String,
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reset guard TLS: {}", self.what)
    }
}

impl std::error::Error for TlsError {}

fn error(what: impl fmt::Display) -> TlsError {
    TlsError {
        what: what.to_string(),
    }
}

impl ServerTls {
    /// The server's certificate chain and private key, in PEM (what
    /// tonic's `Identity::from_pem` takes).
    pub fn new(cert_pem: impl AsRef<[u8]>, key_pem: impl AsRef<[u8]>) -> Self {
        Self {
            source: Source::Pem {
                cert: cert_pem.as_ref().to_vec(),
                key: key_pem.as_ref().to_vec(),
                client_ca: None,
                client_auth_optional: false,
            },
            handshake_timeout: HANDSHAKE_TIMEOUT,
        }
    }

    /// A rustls configuration of your own (its crypto provider, its
    /// verifier); `h2` is added to its ALPN protocols if missing.
    ///
    /// ```
    /// # fn run(config: tokio_rustls::rustls::ServerConfig) {
    /// let tls = tonic_deadline_guard::ServerTls::from_rustls(config);
    /// # let _ = tls;
    /// # }
    /// ```
    pub fn from_rustls(mut config: ServerConfig) -> Self {
        if !config.alpn_protocols.iter().any(|p| p == ALPN_H2) {
            config.alpn_protocols.push(ALPN_H2.to_vec());
        }
        Self {
            source: Source::Rustls(Arc::new(config)),
            handshake_timeout: HANDSHAKE_TIMEOUT,
        }
    }

    /// Clients must show a certificate signed by this authority (PEM), as
    /// tonic's `ServerTlsConfig::client_ca_root`.
    pub fn client_ca_root(mut self, ca_pem: impl AsRef<[u8]>) -> Self {
        if let Source::Pem { client_ca, .. } = &mut self.source {
            *client_ca = Some(ca_pem.as_ref().to_vec());
        }
        self
    }

    /// With a [`client_ca_root`](Self::client_ca_root), clients without a
    /// certificate are let in too (false by default).
    pub fn client_auth_optional(mut self, optional: bool) -> Self {
        if let Source::Pem {
            client_auth_optional,
            ..
        } = &mut self.source
        {
            *client_auth_optional = optional;
        }
        self
    }

    /// How long a client may take over its handshake before its
    /// connection is dropped (10 s by default).
    pub fn handshake_timeout(self, timeout: Duration) -> Self {
        Self {
            handshake_timeout: timeout,
            ..self
        }
    }

    fn config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let (cert, key, client_ca, optional) = match &self.source {
            Source::Rustls(config) => return Ok(config.clone()),
            Source::Pem {
                cert,
                key,
                client_ca,
                client_auth_optional,
            } => (cert, key, client_ca, *client_auth_optional),
        };
        // The process's provider if it has one, else ring (tonic's
        // `tls-ring`, which this feature builds).
        let provider = CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(tokio_rustls::rustls::crypto::ring::default_provider()));
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(error)?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                let certs = certificates(ca, "the client CA")?;
                roots.add_parsable_certificates(certs);
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                let verifier = if optional {
                    verifier.allow_unauthenticated()
                } else {
                    verifier
                };
                builder.with_client_cert_verifier(verifier.build().map_err(error)?)
            }
        };
        let chain = certificates(cert, "the certificate")?;
        let key = PrivateKeyDer::from_pem_slice(key)
            .map_err(|e| error(format!("the private key is not PEM: {e}")))?;
        let mut config = builder.with_single_cert(chain, key).map_err(error)?;
        config.alpn_protocols.push(ALPN_H2.to_vec());
        Ok(Arc::new(config))
    }
}

fn certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error(format!("{what} is not PEM: {e}")))?;
    if certs.is_empty() {
        return Err(error(format!("{what} holds no certificate")));
    }
    Ok(certs)
}

pin_project! {
    /// The connections of an incoming stream, each through its TLS
    /// handshake and then [`Guarded`]. See
    /// [`ResetGuard::incoming_tls`](crate::ResetGuard::incoming_tls).
    pub struct TlsIncoming<I, IO> {
        #[pin]
        inner: I,
        acceptor: TlsAcceptor,
        timeout: Duration,
        handshakes: JoinSet<Option<(TlsStream<IO>, Option<IpAddr>)>>,
        shared: Arc<Shared>,
        inner_done: bool,
    }
}

impl<I, IO> TlsIncoming<I, IO> {
    /// The connections of `incoming`, each through a handshake with `tls`
    /// and then guarded with `shared`.
    pub(crate) fn new(incoming: I, tls: &ServerTls, shared: Arc<Shared>) -> Result<Self, TlsError> {
        Ok(Self {
            inner: incoming,
            acceptor: TlsAcceptor::from(tls.config()?),
            timeout: tls.handshake_timeout,
            handshakes: JoinSet::new(),
            shared,
            inner_done: false,
        })
    }
}

impl<I, IO, E> Stream for TlsIncoming<I, IO>
where
    I: Stream<Item = Result<IO, E>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IO::ConnectInfo: PeerAddress,
{
    type Item = Result<Guarded<TlsStream<IO>>, E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        loop {
            // New connections first: each handshake goes on its own task.
            while !*this.inner_done {
                match this.inner.as_mut().poll_next(cx) {
                    Poll::Ready(Some(Ok(io))) => {
                        let peer = io.connect_info().peer_address();
                        let accept = this.acceptor.accept(io);
                        let timeout = *this.timeout;
                        // A handshake belongs to no request: it has no
                        // scope to lose.
                        #[allow(clippy::disallowed_methods)]
                        this.handshakes.spawn(async move {
                            match tokio::time::timeout(timeout, accept).await {
                                Ok(Ok(tls)) => Some((tls, peer)),
                                Ok(Err(e)) => {
                                    tracing::debug!(error = %e, "reset guard: a TLS handshake failed");
                                    None
                                }
                                Err(_) => {
                                    tracing::debug!("reset guard: a TLS handshake timed out");
                                    None
                                }
                            }
                        });
                    }
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                    Poll::Ready(None) => *this.inner_done = true,
                    Poll::Pending => break,
                }
            }
            match this.handshakes.poll_join_next(cx) {
                Poll::Ready(Some(Ok(Some((tls, peer))))) => {
                    return Poll::Ready(Some(Ok(Guarded::new(tls, this.shared.clone(), peer))));
                }
                // A handshake that failed (said at debug, as tonic does),
                // or whose task panicked: the next.
                Poll::Ready(Some(_)) => continue,
                Poll::Ready(None) if *this.inner_done => return Poll::Ready(None),
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<I, IO> fmt::Debug for TlsIncoming<I, IO> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsIncoming")
            .field("handshakes", &self.handshakes.len())
            .finish_non_exhaustive()
    }
}

impl<T: PeerAddress> PeerAddress for TlsConnectInfo<T> {
    fn peer_address(&self) -> Option<IpAddr> {
        self.get_ref().peer_address()
    }
}
