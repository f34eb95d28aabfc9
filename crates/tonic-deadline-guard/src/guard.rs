//! The guard: its rules, what its connections share, and the builder of a
//! server that serves only what it wraps.

use std::fmt;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tonic::transport::Server;
use tonic::transport::server::Connected;

use grpc_deadline::warn_limit::WarnLimit;

use crate::book::Breach;
pub use crate::builder::{GuardedIncoming, GuardedRouter, GuardedServer, ServeError};
pub use crate::io::Guarded;
pub use crate::peers::PeerAddress;
use crate::peers::{Held, Peers};
#[cfg(feature = "tls")]
pub use crate::tls::{ServerTls, TlsError, TlsIncoming};

/// The early resets a connection may spend, and hold back, by default:
/// what each connection of a flood that reconnects costs the server
/// (`experiment rapid-reset`: at 128, the honest client's median under
/// fast floods was 1.5 to 2.4 × plain tonic's; at 32, within 1.3 ×).
pub(crate) const ALLOWANCE: u32 = 32;

/// How soon after its HEADERS a reset counts as early: half tokio's timer
/// tick, the shortest timeout a Rust client gives up at without telling the
/// server (`tokio::time::timeout` of 1 ms fires no sooner than 1 ms after
/// the call).
pub(crate) const EARLY: Duration = Duration::from_micros(500);

/// How far before its deadline a reset may come and still be explained by
/// it: a client's HEADERS can wait in its own connection's queue while its
/// deadline runs, and reach the server together with the reset.
pub(crate) const DEADLINE_SLACK: Duration = Duration::from_millis(10);

/// How many early resets a second time gives back.
pub(crate) const REFILL_PER_SECOND: f64 = 100.0;

/// How long a connection that floods again, from an address cut off
/// lately, is held unread before it is cut off: a flood that reconnects
/// at once has one connection a second read per thread.
pub(crate) const HOLD: Duration = Duration::from_secs(1);

/// The rules of a guard: fixed when it is built.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    pub(crate) allowance: u32,
    pub(crate) early: Duration,
    pub(crate) deadline_slack: Duration,
    pub(crate) refill_per_second: f64,
    /// How long a connection that floods on probation is held before it
    /// is cut off (`None`: no probation, every connection alike).
    pub(crate) hold: Option<Duration>,
}

/// Told when a guard closes a connection, or refuses one it cannot read:
/// how a guard reports, without a registry of its own (tonic-deadline's
/// `observe::Metrics` implements it). Give it with
/// [`ResetGuard::observed_by`].
///
/// ```
/// #[derive(Debug, Default)]
/// struct Floods(std::sync::atomic::AtomicU64);
/// impl tonic_deadline_guard::Observer for Floods {
///     fn reset_flood_cut(&self) {
///         self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///     }
///     fn unguarded(&self) {}
///     fn connection_held(&self) {}
///     fn connection_refused(&self) {}
/// }
/// let guard = tonic_deadline_guard::ResetGuard::new().observed_by(Floods::default());
/// # let _ = guard;
/// ```
pub trait Observer: Send + Sync + fmt::Debug {
    /// A connection was closed for its early resets.
    fn reset_flood_cut(&self);

    /// A connection the guard cannot read (TLS set on tonic's `Server`) was
    /// refused.
    fn unguarded(&self);

    /// A connection from an address cut off lately flooded again, and was
    /// held unread before being cut off.
    fn connection_held(&self);

    /// A connection from an address cut off lately flooded again, and was
    /// cut off at once: as many of its address's connections as may be
    /// held were held.
    fn connection_refused(&self);
}

/// What a guard and its connections share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) rules: Rules,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    pub(crate) warnings: WarnLimit,
    pub(crate) held_warnings: WarnLimit,
    /// The addresses cut off lately.
    pub(crate) peers: Arc<Peers>,
    /// A connection that is TLS, which the guard cannot read, was refused.
    pub(crate) saw_tls: AtomicBool,
}

impl Shared {
    /// Whether a connection from `peer`, accepted at `now`, is on
    /// probation: its address was cut off lately.
    pub(crate) fn probation(&self, peer: Option<IpAddr>, now: Instant) -> bool {
        match (peer, self.rules.hold) {
            (Some(ip), Some(_)) => self.peers.on_probation(ip, now),
            _ => false,
        }
    }

    /// A connection that does not start with HTTP/2's preface: TLS (which
    /// the guard cannot read: refused, and said plainly, at once), or
    /// HTTP/1 (nothing to guard). Whether it is refused.
    pub(crate) fn not_http2(&self, start: &[u8]) -> bool {
        // A TLS record of the handshake: content type 22, version 3.x.
        let tls = matches!(start, [0x16, 0x03, ..]);
        if tls && !self.saw_tls.swap(true, Ordering::Relaxed) {
            if let Some(observer) = &self.observer {
                observer.unguarded();
            }
            tracing::error!(
                "reset guard: refused a TLS connection, which the guard cannot read: TLS is set \
                 on tonic's Server, around the guard, so nothing would bound reset floods on it \
                 (the guard's builder raised hyper's own bound for the guard). Every TLS \
                 connection is refused until the guard terminates TLS itself: serve with \
                 guard.builder()...serve_tls(addr, ServerTls::new(cert_pem, key_pem)), or \
                 guard.incoming_tls(incoming, ServerTls::new(cert_pem, key_pem))?, and no \
                 tls_config (feature tls)"
            );
        }
        tls
    }

    /// A connection breached its allowance at `now`: a hold to keep it
    /// unread for, if it was on probation and may be held; cut off at once
    /// otherwise.
    #[cold]
    pub(crate) fn breached(
        &self,
        breach: &Breach,
        peer: Option<IpAddr>,
        probation: bool,
        now: Instant,
    ) -> Option<(Held, Duration)> {
        if let Some(observer) = &self.observer {
            observer.reset_flood_cut();
        }
        let (Some(ip), Some(hold)) = (peer, self.rules.hold) else {
            self.warn_cut(breach);
            return None;
        };
        self.peers.cut(ip, now);
        if !probation {
            self.warn_cut(breach);
            return None;
        }
        let held = self.peers.hold(ip);
        if let Some(observer) = &self.observer {
            match held {
                Some(_) => observer.connection_held(),
                None => observer.connection_refused(),
            }
        }
        if let Some(similar) = self.held_warnings.admit() {
            let what = match held {
                Some(_) => format!("holding it unread for {hold:?}, then cutting it off"),
                None => format!(
                    "cutting it off at once: {} of its address's connections are held already",
                    crate::peers::HELD
                ),
            };
            tracing::warn!(
                peer = %ip,
                early_resets = breach.early_resets,
                similar_since_last_warning = similar,
                "reset guard: a connection from an address cut off for a reset flood within the \
                 last {} s reset streams early again: {what}. Its address's other connections \
                 are served as any other",
                crate::peers::FORGET.as_secs(),
            );
        }
        held.map(|held| (held, hold))
    }

    pub(crate) fn warn_cut(&self, breach: &Breach) {
        if let Some(similar) = self.warnings.admit() {
            tracing::warn!(
                early_resets = breach.early_resets,
                opened = breach.opened,
                ended_honestly = breach.honest_ends,
                last_stream = breach.last_stream,
                similar_since_last_warning = similar,
                "reset guard: closed a connection (GOAWAY ENHANCE_YOUR_CALM) whose client reset \
                 more streams soon after opening them, long before their deadlines, than the \
                 allowance of {} earned back by streams that end by themselves: an HTTP/2 \
                 reset flood (Rapid Reset, CVE-2023-44487)",
                self.rules.allowance,
            );
        }
    }
}

/// A guard against HTTP/2 reset floods that lets honest deadline storms
/// through. See the [crate docs](crate).
///
/// Configure it, then use it: its builder and every connection it wraps
/// share one frozen configuration, its warnings and what it reports to.
#[derive(Debug, Clone)]
pub struct ResetGuard {
    pub(crate) shared: Arc<Shared>,
}

impl Default for ResetGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl ResetGuard {
    /// A guard with the rules of the [crate docs](crate).
    pub fn new() -> Self {
        Self::with(
            Rules {
                allowance: ALLOWANCE,
                early: EARLY,
                deadline_slack: DEADLINE_SLACK,
                refill_per_second: REFILL_PER_SECOND,
                hold: Some(HOLD),
            },
            None,
        )
    }

    pub(crate) fn with(rules: Rules, observer: Option<Arc<dyn Observer>>) -> Self {
        Self {
            shared: Arc::new(Shared {
                rules,
                observer,
                warnings: WarnLimit::new(),
                held_warnings: WarnLimit::new(),
                peers: Arc::default(),
                saw_tls: AtomicBool::new(false),
            }),
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
    /// [`PeerAddress`].
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
    /// after a cut of its [`PeerAddress`].
    pub fn incoming<I, IO, E>(&self, incoming: I) -> Incoming<I>
    where
        I: Stream<Item = Result<IO, E>>,
    {
        Incoming {
            inner: incoming,
            shared: self.shared.clone(),
        }
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
                .http2_max_pending_accept_reset_streams(Some(crate::PENDING_ACCEPT_RESETS))
                .http2_max_local_error_reset_streams(Some(crate::LOCAL_ERROR_RESETS)),
            self.shared.clone(),
        )
    }
}

pin_project! {
    /// The connections of an incoming stream, each [`Guarded`]. See
    /// [`ResetGuard::incoming`].
    pub struct Incoming<I> {
        #[pin]
        pub(crate) inner: I,
        pub(crate) shared: Arc<Shared>,
    }
}

impl<I, IO, E> Stream for Incoming<I>
where
    I: Stream<Item = Result<IO, E>>,
    IO: Connected,
    IO::ConnectInfo: PeerAddress,
{
    type Item = Result<Guarded<IO>, E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        let next = std::task::ready!(this.inner.poll_next(cx));
        Poll::Ready(next.map(|accepted| {
            accepted.map(|io| {
                let peer = io.connect_info().peer_address();
                Guarded::new(io, this.shared.clone(), peer)
            })
        }))
    }
}

impl<I> fmt::Debug for Incoming<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Incoming").finish_non_exhaustive()
    }
}
