//! A guard against reset floods that knows deadlines.
//!
//! Every call that ends before its answer resets its stream: at its
//! deadline, or when its caller cancels. With deadlines propagated, short
//! ones under load make many resets, often before the server has accepted
//! the stream (its connection task had no CPU for a moment). HTTP/2 Rapid
//! Reset (CVE-2023-44487) is made of the same frames: a client opens
//! streams and resets them at once, so that the server does work no stream
//! limit bounds. hyper's guard counts resets of streams not yet accepted
//! and closes a connection with more than 20 at once: it takes a deadline
//! storm on a busy server for a flood, and misses a flood slower than the
//! server's accept loop, whose streams are accepted before they are reset.
//!
//! [`ResetGuard`] tells the two apart by what an honest reset looks like.
//! It follows each connection's frames (an I/O wrapper on the accepted
//! stream, [`Guarded`]): the streams the client opens, the `grpc-timeout`
//! each carries (read from the header block with a shadow of the server's
//! HPACK table, which decodes no other header), the streams the server
//! answers, and the streams the client resets. A reset is *early* when it
//! comes before the server answered the stream, less than 0.5 ms after its
//! HEADERS (a client that gives up after its own timeout, 1 ms or more,
//! without telling the server, is never early), and more than 10 ms before
//! its deadline, if it has one. A reset that its deadline explains is never
//! early: a server kept off the CPU reads a while of its client's frames at
//! once, HEADERS and resets together, so a stream's age is taken at the
//! most its reads allow (since the read before its HEADERS). Early resets
//! spend an allowance of 32 per connection; every stream that ends by
//! itself or at its deadline earns 4 back (a hedged call's winner pays for
//! its losers, reset as soon as it is answered), and time 100 a second, up
//! to 32. A connection whose client spends more is sent
//! `GOAWAY ENHANCE_YOUR_CALM` and closed; the guard logs the rule it broke
//! (a `WARN`, at most one every 10 s) and counts it
//! ([`Metrics::reset_floods_cut`](crate::observe::Metrics::reset_floods_cut)).
//!
//! What an honest client cannot do is reset streams within half a
//! millisecond of opening them, long before their deadlines, faster than
//! its calls end: a client that cancels most of its calls the moment it
//! makes them is, on the wire, a flood.
//!
//! A flood that connects again as soon as it is cut off costs the server
//! a connection each time (its accept, its handshake, its allowance). So
//! the guard remembers the addresses it cut off: for 10 s after its last
//! cut, an address's new connections are on *probation*. They are read as
//! any other, but start with no allowance: one that resets a stream early
//! is held unread for a second before it is cut off
//! ([`ResetGuard::hold_after_cut`]), so that a flood's thread has one
//! connection a second read; beyond 20 held at once from one address, the
//! rest are cut off at once. What is held is only what floods again: a
//! client sharing the address (behind a NAT, or a proxy that hides its
//! clients' addresses) is served as any other. The guard says so when it
//! holds or cuts one (a `WARN` naming the address, at most one every 10 s,
//! and [`Metrics::connections_held`](crate::observe::Metrics::connections_held),
//! [`Metrics::connections_refused`](crate::observe::Metrics::connections_refused)).
//!
//! hyper's own guard stays as a backstop, raised out of the way of honest
//! storms ([`PENDING_ACCEPT_RESETS`](super::PENDING_ACCEPT_RESETS)) by the
//! builder the guard gives ([`ResetGuard::builder`]). A server of that
//! builder must therefore never serve what the guard cannot read, and it
//! does not: its router serves only connections the guard wraps
//! ([`GuardedRouter`]: an address it binds, [`ResetGuard::incoming`], or
//! `incoming_tls`), and a server serving anything else does not compile.
//! TLS set on tonic's `Server` (through [`GuardedServer::configure`]; it
//! encrypts after the incoming stream, so that the guard would read
//! ciphertext) has every TLS connection refused, said at once as an
//! `ERROR` naming the fix, and counted
//! ([`Metrics::unguarded_servers`](crate::observe::Metrics::unguarded_servers)).
//! For TLS, the guard terminates it itself ([`GuardedRouter::serve_tls`],
//! `ResetGuard::incoming_tls`, the `tls` feature): rustls as tonic's
//! `tls-ring` builds it, and the handlers see the client's certificates and
//! address as under tonic's own TLS.
//!
//! # Example
//!
//! ```no_run
//! use tonic_deadline::ServerDeadlineLayer;
//! use tonic_deadline::server::ResetGuard;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let (_, health) = tonic_health::server::health_reporter();
//! ResetGuard::new()
//!     .builder()
//!     .layer(ServerDeadlineLayer::new())
//!     .add_service(health)
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(())
//! # }
//! ```

mod book;
mod builder;
mod io;
mod peers;
#[cfg(feature = "tls")]
mod tls;

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

use crate::warn_limit::WarnLimit;
use book::Breach;
pub use builder::{GuardedIncoming, GuardedRouter, GuardedServer, ServeError};
pub use io::Guarded;
pub use peers::PeerAddress;
use peers::{Held, Peers};
#[cfg(feature = "tls")]
pub use tls::{ServerTls, TlsError, TlsIncoming};

/// The early resets a connection may spend, and hold back, by default:
/// what each connection of a flood that reconnects costs the server
/// (`experiment rapid-reset`: at 128, the honest client's median under
/// fast floods was 1.5 to 2.4 × plain tonic's; at 32, within 1.3 ×).
const ALLOWANCE: u32 = 32;

/// How soon after its HEADERS a reset counts as early: half tokio's timer
/// tick, the shortest timeout a Rust client gives up at without telling the
/// server (`tokio::time::timeout` of 1 ms fires no sooner than 1 ms after
/// the call).
const EARLY: Duration = Duration::from_micros(500);

/// How far before its deadline a reset may come and still be explained by
/// it: a client's HEADERS can wait in its own connection's queue while its
/// deadline runs, and reach the server together with the reset.
const DEADLINE_SLACK: Duration = Duration::from_millis(10);

/// How many early resets a second time gives back.
const REFILL_PER_SECOND: f64 = 100.0;

/// How long a connection that floods again, from an address cut off
/// lately, is held unread before it is cut off: a flood that reconnects
/// at once has one connection a second read per thread.
const HOLD: Duration = Duration::from_secs(1);

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

/// Told when a guard closes a connection, or refuses one it cannot read.
pub(crate) trait Observer: Send + Sync + fmt::Debug {
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
    rules: Rules,
    observer: Option<Arc<dyn Observer>>,
    warnings: WarnLimit,
    held_warnings: WarnLimit,
    /// The addresses cut off lately.
    peers: Arc<Peers>,
    /// A connection that is TLS, which the guard cannot read, was refused.
    saw_tls: AtomicBool,
}

impl Shared {
    /// Whether a connection from `peer`, accepted at `now`, is on
    /// probation: its address was cut off lately.
    fn probation(&self, peer: Option<IpAddr>, now: Instant) -> bool {
        match (peer, self.rules.hold) {
            (Some(ip), Some(_)) => self.peers.on_probation(ip, now),
            _ => false,
        }
    }

    /// A connection that does not start with HTTP/2's preface: TLS (which
    /// the guard cannot read: refused, and said plainly, at once), or
    /// HTTP/1 (nothing to guard). Whether it is refused.
    fn not_http2(&self, start: &[u8]) -> bool {
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
                 guard.incoming_tls(incoming, ServerTls::from_pem(..)?) and no tls_config"
            );
        }
        tls
    }

    /// A connection breached its allowance at `now`: a hold to keep it
    /// unread for, if it was on probation and may be held; cut off at once
    /// otherwise.
    #[cold]
    fn breached(
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
                    peers::HELD
                ),
            };
            tracing::warn!(
                peer = %ip,
                early_resets = breach.early_resets,
                similar_since_last_warning = similar,
                "reset guard: a connection from an address cut off for a reset flood within the \
                 last {} s reset streams early again: {what}. Its address's other connections \
                 are served as any other",
                peers::FORGET.as_secs(),
            );
        }
        held.map(|held| (held, hold))
    }

    fn warn_cut(&self, breach: &Breach) {
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
/// through. See the [module docs](self).
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
    /// A guard with the rules of the [module docs](self).
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

    fn with(rules: Rules, observer: Option<Arc<dyn Observer>>) -> Self {
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
    /// let guard = tonic_deadline::server::ResetGuard::new().allowance(256);
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
    /// use tonic_deadline::server::ResetGuard;
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

    #[cfg_attr(
        not(feature = "metrics"),
        allow(dead_code, reason = "observe's Metrics calls it")
    )]
    pub(crate) fn observed_by(self, observer: Arc<dyn Observer>) -> Self {
        Self::with(self.shared.rules, Some(observer))
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
    /// use tonic_deadline::server::ResetGuard;
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
    /// [`PENDING_ACCEPT_RESETS`](super::PENDING_ACCEPT_RESETS) (a backstop
    /// far beyond what this guard allows), and its bound on streams the
    /// server resets for a client's protocol errors at
    /// [`LOCAL_ERROR_RESETS`](super::LOCAL_ERROR_RESETS), which tonic's
    /// builder leaves off. Its router serves only connections this guard
    /// wraps (see [`GuardedServer`]).
    pub fn builder(&self) -> GuardedServer {
        GuardedServer::new(
            Server::builder()
                .http2_max_pending_accept_reset_streams(Some(super::PENDING_ACCEPT_RESETS))
                .http2_max_local_error_reset_streams(Some(super::LOCAL_ERROR_RESETS)),
            self.shared.clone(),
        )
    }
}

pin_project! {
    /// The connections of an incoming stream, each [`Guarded`]. See
    /// [`ResetGuard::incoming`].
    pub struct Incoming<I> {
        #[pin]
        inner: I,
        shared: Arc<Shared>,
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
