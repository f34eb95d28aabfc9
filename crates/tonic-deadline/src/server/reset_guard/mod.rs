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
//! each carries (the header block decoded, as the server's HPACK decoder
//! does), and the streams it resets. A reset is *early* when the stream
//! was reset before the server answered it, less than 10 ms after its
//! HEADERS arrived, and its deadline was more than 10 ms further on (or it
//! had none). A reset that its deadline explains is never early: a server
//! kept off the CPU reads a while of its client's frames at once, HEADERS
//! and resets together, so a stream's age is taken at the most its reads
//! allow (since the read before its HEADERS). Early resets spend an
//! allowance of 32 per connection; every stream that ends by itself or at
//! its deadline, and time (100 a second), earn it back up to 32. A connection whose client spends more
//! is sent `GOAWAY ENHANCE_YOUR_CALM` and closed; the guard logs the rule
//! it broke (a `WARN`, at most one every 10 s) and counts it
//! ([`Metrics::reset_floods_cut`](crate::observe::Metrics::reset_floods_cut)).
//!
//! What an honest client cannot do is reset streams, long before their
//! deadlines, faster than its calls end: hedged calls whose losers are
//! reset, or callers that cancel, stay within the allowance as long as
//! their calls mostly end by themselves; a client that cancels most of its
//! calls right after making them is, on the wire, a flood.
//!
//! A flood that connects again as soon as it is cut off costs the server
//! a connection each time (its accept, its handshake, its allowance). So
//! the guard remembers the addresses it cut off: for 10 s after its last
//! cut, an address's new connections are read one at a time, 50 ms apart
//! ([`ResetGuard::pace_after_cut`]), and held unread until their turn; a
//! connection that would wait behind 20 others of its address is closed
//! unread. Connections already open are never held, nor other addresses'. Behind
//! a proxy that hides its clients' addresses, every client shares the
//! proxy's: a flood through it would hold everyone's new connections for
//! a while, and the guard says so when it holds or closes one (a `WARN`,
//! at most one every 10 s, and
//! [`Metrics::connections_held`](crate::observe::Metrics::connections_held),
//! [`Metrics::connections_refused`](crate::observe::Metrics::connections_refused)).
//!
//! hyper's own guard stays as a backstop, raised out of the way of honest
//! storms ([`PENDING_ACCEPT_RESETS`](super::PENDING_ACCEPT_RESETS)) by the
//! builder the guard gives ([`ResetGuard::builder`]); the connections must
//! be wrapped ([`ResetGuard::incoming`]). A guard whose builder serves
//! connections it never wrapped says so on the first request (a `WARN`,
//! and [`Metrics::unguarded_servers`](crate::observe::Metrics::unguarded_servers)):
//! hyper's raised bound would then stand alone.
//!
//! The guard reads HTTP/2 in the clear. A connection that is not (TLS set
//! on tonic's `Server`, which encrypts after the incoming stream) is passed
//! through unread, and said so; put the guard around the decrypted stream
//! instead.
//!
//! # Example
//!
//! ```no_run
//! use tonic::transport::server::TcpIncoming;
//! use tonic_deadline::ServerDeadlineLayer;
//! use tonic_deadline::server::ResetGuard;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let (_, health) = tonic_health::server::health_reporter();
//! let guard = ResetGuard::new();
//! guard
//!     .builder()
//!     .layer(ServerDeadlineLayer::new())
//!     .add_service(health)
//!     .serve_with_incoming(guard.incoming(TcpIncoming::bind("127.0.0.1:50051".parse()?)?))
//!     .await?;
//! # Ok(())
//! # }
//! ```

mod book;
mod io;
mod peers;

use std::fmt;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use http::Request;
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tonic::transport::Server;
use tonic::transport::server::Connected;
use tower_layer::{Identity, Layer, Stack};
use tower_service::Service;

use crate::warn_limit::WarnLimit;
use book::Breach;
pub use io::Guarded;
pub use peers::PeerAddress;
use peers::{Peers, Turn};

/// The early resets a connection may spend, and hold back, by default:
/// what each connection of a flood that reconnects costs the server
/// (`experiment rapid-reset`: at 128, the honest client's median under
/// fast floods was 1.5 to 2.4 × plain tonic's; at 32, within 1.3 ×).
const ALLOWANCE: u32 = 32;

/// How soon after its HEADERS, and how long before its deadline, a reset
/// counts as early.
const EARLY: Duration = Duration::from_millis(10);

/// How many early resets a second time gives back.
const REFILL_PER_SECOND: f64 = 100.0;

/// How far apart the new connections of an address cut off lately are
/// read: 20 a second (`experiment rapid-reset`: a flood that reconnects at
/// once had about 4 000 connections a second read without it).
const PACE: Duration = Duration::from_millis(50);

/// The rules of a guard: fixed when it is built.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    pub(crate) allowance: u32,
    pub(crate) early: Duration,
    pub(crate) refill_per_second: f64,
    /// How far apart an address cut off lately has its new connections
    /// read (`None`: not paced).
    pub(crate) pace: Option<Duration>,
}

/// Told when a guard closes a connection, or serves unguarded.
pub(crate) trait Observer: Send + Sync + fmt::Debug {
    /// A connection was closed for its early resets.
    fn reset_flood_cut(&self);

    /// A server built by a guard's builder served a request on a
    /// connection the guard never wrapped.
    fn unguarded(&self);

    /// A new connection was held unread for its turn: its address was cut
    /// off lately.
    fn connection_held(&self);

    /// A new connection was closed unread: its address was cut off lately,
    /// and as many of its connections as may wait were waiting.
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
    peers: Peers,
    /// Connections wrapped so far.
    wrapped: AtomicU64,
    /// A connection that was not HTTP/2 in the clear was seen.
    saw_opaque: AtomicBool,
    /// The builder's first request was checked.
    checked: AtomicBool,
}

impl Shared {
    fn wrapped(&self) {
        self.wrapped.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection that does not start with HTTP/2's preface: TLS (said,
    /// once per guard: the guard cannot read it), or HTTP/1 (nothing to
    /// guard).
    fn not_http2(&self, start: &[u8]) {
        // A TLS record of the handshake: content type 22, version 3.x.
        let tls = matches!(start, [0x16, 0x03, ..]);
        if tls && !self.saw_opaque.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "reset guard: a connection is TLS, which the guard cannot read; it is not \
                 guarded (hyper's bound alone applies). Terminate TLS in the incoming stream \
                 and wrap the decrypted stream, rather than setting TLS on tonic's Server"
            );
        }
    }

    #[cold]
    fn breached(&self, breach: &Breach, peer: Option<IpAddr>, now: Instant) {
        if let Some(observer) = &self.observer {
            observer.reset_flood_cut();
        }
        if let (Some(ip), Some(_)) = (peer, self.rules.pace) {
            self.peers.cut(ip, now);
        }
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

    /// When a connection from `peer`, accepted at `now`, may be read.
    fn turn(&self, peer: Option<IpAddr>, now: Instant) -> Turn {
        let (Some(ip), Some(pace)) = (peer, self.rules.pace) else {
            return Turn::Now;
        };
        let turn = self.peers.admit(ip, now, pace);
        match turn {
            Turn::Now => {}
            Turn::At(at) => self.paced(ip, Some(at - now)),
            Turn::Refused => self.paced(ip, None),
        }
        turn
    }

    /// A connection from `ip` waits `wait` for its turn, or (`None`) is
    /// refused.
    #[cold]
    fn paced(&self, ip: IpAddr, wait: Option<Duration>) {
        if let Some(observer) = &self.observer {
            match wait {
                Some(_) => observer.connection_held(),
                None => observer.connection_refused(),
            }
        }
        let Some(similar) = self.held_warnings.admit() else {
            return;
        };
        let pace = self.rules.pace.unwrap_or_default();
        let what = match wait {
            Some(wait) => format!("holding a new connection unread for {wait:?}, until its turn"),
            None => format!(
                "closing a new connection unread: {} of its address's connections wait for their \
                 turns already",
                peers::WAITING
            ),
        };
        tracing::warn!(
            peer = %ip,
            similar_since_last_warning = similar,
            "reset guard: {what}: its address was cut off for a reset flood within the last {} s, \
             and its new connections are read one every {pace:?}. Behind a proxy that hides its \
             clients' addresses every client shares this one: turn pacing off with \
             ResetGuard::pace_after_cut(None)",
            peers::FORGET.as_secs(),
        );
    }

    /// A request arrived at a server built by this guard's builder.
    fn served(&self) {
        if self.checked.load(Ordering::Relaxed) || self.checked.swap(true, Ordering::Relaxed) {
            return;
        }
        if self.wrapped.load(Ordering::Relaxed) == 0 {
            if let Some(observer) = &self.observer {
                observer.unguarded();
            }
            tracing::warn!(
                "reset guard: a server built by ResetGuard::builder serves connections the guard \
                 never wrapped: hyper's guard against reset floods is raised for the guard, and \
                 nothing else bounds them. Serve with \
                 .serve_with_incoming(guard.incoming(...))"
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
                refill_per_second: REFILL_PER_SECOND,
                pace: Some(PACE),
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
                peers: Peers::default(),
                wrapped: AtomicU64::new(0),
                saw_opaque: AtomicBool::new(false),
                checked: AtomicBool::new(false),
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

    /// How far apart the new connections of an address cut off lately
    /// are read, for 10 s after its last cut (50 ms by default: 20 a
    /// second; each is held unread until its turn). `None` turns pacing
    /// off: for a server behind a proxy that hides its clients' addresses,
    /// where a flood through the proxy would hold every client's new
    /// connections. Only connections from [`incoming`](Self::incoming) are
    /// paced, by their [`PeerAddress`].
    ///
    /// ```
    /// use std::time::Duration;
    /// let behind_a_proxy = tonic_deadline::server::ResetGuard::new().pace_after_cut(None);
    /// let stricter = tonic_deadline::server::ResetGuard::new()
    ///     .pace_after_cut(Some(Duration::from_millis(200)));
    /// # let _ = (behind_a_proxy, stricter);
    /// ```
    pub fn pace_after_cut(self, pace: Option<Duration>) -> Self {
        let rules = Rules {
            pace,
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

    /// Guards one accepted connection (not paced: the guard does not know
    /// its address; see [`wrap_from`](Self::wrap_from)).
    pub fn wrap<IO>(&self, io: IO) -> Guarded<IO> {
        Guarded::new(io, self.shared.clone(), None)
    }

    /// Guards one accepted connection from `peer`: if that address was
    /// cut off lately, the connection is read when its turn comes
    /// ([`pace_after_cut`](Self::pace_after_cut)).
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
    /// `TcpListenerStream`, a `UnixListenerStream`), each paced by its
    /// [`PeerAddress`] after a cut.
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
    /// builder leaves off. Serve with [`incoming`](Self::incoming).
    pub fn builder(&self) -> Server<Stack<CheckLayer, Identity>> {
        Server::builder()
            .http2_max_pending_accept_reset_streams(Some(super::PENDING_ACCEPT_RESETS))
            .http2_max_local_error_reset_streams(Some(super::LOCAL_ERROR_RESETS))
            .layer(CheckLayer {
                shared: self.shared.clone(),
            })
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

/// The layer of [`ResetGuard::builder`]: tells, once, that the server it
/// built serves connections the guard never wrapped.
#[derive(Debug, Clone)]
pub struct CheckLayer {
    shared: Arc<Shared>,
}

impl<S> Layer<S> for CheckLayer {
    type Service = Check<S>;

    fn layer(&self, inner: S) -> Check<S> {
        Check {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service of [`CheckLayer`]: passes every request on.
#[derive(Debug, Clone)]
pub struct Check<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S, B> Service<Request<B>> for Check<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> S::Future {
        self.shared.served();
        self.inner.call(request)
    }
}
