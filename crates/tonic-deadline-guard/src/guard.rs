//! The guard itself, as a user holds it: its settings, and what it makes
//! (guarded connections, a guarded incoming stream, tonic's `Server`
//! builder set for it).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use tonic::transport::Server;

use crate::builder::GuardedServer;
use crate::connection::{Guarded, Incoming};
use crate::hyper_limits::{LOCAL_ERROR_RESETS, PENDING_ACCEPT_RESETS};
use crate::observer::Observer;
use crate::rules::Rules;
use crate::shared::Shared;
#[cfg(feature = "tls")]
use crate::tls::{ServerTls, TlsError, TlsIncoming};

/// A guard against HTTP/2 reset floods that lets honest deadline storms
/// through. See the [crate docs](crate).
///
/// Configure it, then use it: its builder and every connection it wraps
/// share one frozen configuration, its warnings and what it reports to.
#[derive(Debug, Clone)]
pub struct ResetGuard {
    shared: Arc<Shared>,
}

impl Default for ResetGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl ResetGuard {
    /// A guard with the rules of the [crate docs](crate).
    pub fn new() -> Self {
        Self::with(Rules::default(), None)
    }

    fn with(rules: Rules, observer: Option<Arc<dyn Observer>>) -> Self {
        Self {
            shared: Arc::new(Shared::new(rules, observer)),
        }
    }

    /// How many early resets a connection may spend before it is closed
    /// (32 by default; it is also the most it can hold back). An honest
    /// deadline storm needs none of it (a deadline within reach explains a
    /// reset); it is for calls cancelled right after they were made, and it
    /// is what every connection of a reconnecting flood gets for free.
    ///
    /// ```
    /// let guard = tonic_deadline_guard::ResetGuard::new().allowance(256);
    /// # let _ = guard;
    /// ```
    pub fn allowance(self, resets: u32) -> Self {
        let rules = Rules {
            allowance: resets,
            ..self.shared.rules
        };
        Self::with(rules, self.shared.observer.clone())
    }

    /// How long a connection is held unread, when it floods again from an
    /// address cut off within the last 10 s, before it is cut off (1 s by
    /// default; at most 20 of an address at once, the rest cut off at once).
    /// Such connections are on *probation*: they may reset no stream early
    /// until their streams have earned it. `None` turns probation off: every
    /// connection gets the whole allowance, and a flood that reconnects costs
    /// the server a connection each time.
    ///
    /// Only the connections that flood again are held: a client sharing the
    /// flood's address (behind a NAT, or a proxy that hides its clients'
    /// addresses) is served as any other. Only connections from
    /// [`incoming`](Self::incoming) are on probation, by their
    /// [`PeerAddress`](crate::PeerAddress).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tonic_deadline_guard::ResetGuard;
    /// let longer = ResetGuard::new().hold_after_cut(Some(Duration::from_secs(5)));
    /// let without = ResetGuard::new().hold_after_cut(None);
    /// # let _ = (longer, without);
    /// ```
    pub fn hold_after_cut(self, hold: Option<Duration>) -> Self {
        let rules = Rules {
            hold,
            ..self.shared.rules
        };
        Self::with(rules, self.shared.observer.clone())
    }

    /// Reports to `observer` the connections the guard closes for reset
    /// floods, the new connections it holds for their turn or closes
    /// unread, and a server of its builder serving connections it never
    /// wrapped. With tonic-deadline: `.observed_by(metrics.clone())`.
    pub fn observed_by(self, observer: impl Observer + 'static) -> Self {
        Self::with(self.shared.rules, Some(Arc::new(observer)))
    }

    /// Guards one accepted connection (never on probation: the guard does
    /// not know its address; see [`wrap_from`](Self::wrap_from)).
    pub fn wrap<IO>(&self, io: IO) -> Guarded<IO> {
        Guarded::new(io, self.shared.clone(), None)
    }

    /// Guards one accepted connection from `peer`: if that address was
    /// cut off lately, the connection is on probation
    /// ([`hold_after_cut`](Self::hold_after_cut)).
    ///
    /// ```
    /// use tonic_deadline_guard::ResetGuard;
    /// # async fn run(tcp: tokio::net::TcpStream) -> std::io::Result<()> {
    /// let peer = tcp.peer_addr()?.ip();
    /// let guarded = ResetGuard::new().wrap_from(tcp, Some(peer));
    /// # let _ = guarded;
    /// # Ok(())
    /// # }
    /// ```
    pub fn wrap_from<IO>(&self, io: IO, peer: Option<IpAddr>) -> Guarded<IO> {
        Guarded::new(io, self.shared.clone(), peer)
    }

    /// Guards every connection of `incoming` (what tonic's
    /// `serve_with_incoming` takes: a `TcpIncoming`, a
    /// `TcpListenerStream`, a `UnixListenerStream`), each on probation
    /// after a cut of its [`PeerAddress`](crate::PeerAddress).
    pub fn incoming<I, IO, E>(&self, incoming: I) -> Incoming<I>
    where
        I: Stream<Item = Result<IO, E>>,
    {
        Incoming::new(incoming, self.shared.clone())
    }

    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    /// Guards every connection of `incoming` (what tonic's
    /// `serve_with_incoming` takes) as [`incoming`](Self::incoming) does,
    /// after a TLS handshake made with `tls`: the guard reads the
    /// decrypted HTTP/2. Use it instead of tonic's `Server::tls_config`,
    /// whose TLS the guard could not read (it refuses such connections).
    ///
    /// Handlers see the client's certificates and address as under
    /// tonic's TLS (`Request::peer_certs`, `Request::remote_addr`). A
    /// handshake that fails or takes longer than its timeout drops the
    /// connection, as tonic does.
    ///
    /// # Errors
    ///
    /// When the certificate, the key or the client CA cannot be read, or
    /// rustls refuses them.
    ///
    /// ```no_run
    /// use tonic::transport::server::TcpIncoming;
    /// use tonic_deadline_guard::{ResetGuard, ServerTls};
    ///
    /// # async fn run(cert: Vec<u8>, key: Vec<u8>) -> Result<(), Box<dyn std::error::Error>> {
    /// let (_, health) = tonic_health::server::health_reporter();
    /// let guard = ResetGuard::new();
    /// let incoming = TcpIncoming::bind("127.0.0.1:50051".parse()?)?;
    /// guard
    ///     .builder()
    ///     .add_service(health)
    ///     .serve_with_incoming(guard.incoming_tls(incoming, ServerTls::new(cert, key))?)
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn incoming_tls<I, IO, E>(
        &self,
        incoming: I,
        tls: ServerTls,
    ) -> Result<TlsIncoming<I, IO>, TlsError>
    where
        I: Stream<Item = Result<IO, E>>,
    {
        TlsIncoming::new(incoming, &tls, self.shared.clone())
    }

    /// tonic's `Server::builder()` with hyper's guards set for this one:
    /// its bound on streams reset before they are accepted raised to
    /// [`PENDING_ACCEPT_RESETS`](crate::PENDING_ACCEPT_RESETS) (a backstop
    /// far beyond what this guard allows), and its bound on streams the
    /// server resets for a client's protocol errors at
    /// [`LOCAL_ERROR_RESETS`](crate::LOCAL_ERROR_RESETS), which tonic's
    /// builder leaves off. Its router serves only connections this guard
    /// wraps (see [`GuardedServer`]).
    pub fn builder(&self) -> GuardedServer {
        GuardedServer::new(
            Server::builder()
                .http2_max_pending_accept_reset_streams(Some(PENDING_ACCEPT_RESETS))
                .http2_max_local_error_reset_streams(Some(LOCAL_ERROR_RESETS)),
            self.shared.clone(),
        )
    }
}
