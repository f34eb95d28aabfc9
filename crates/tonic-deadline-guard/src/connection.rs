//! A guarded connection: the accepted stream, read and written through the
//! account of its client's resets; and an incoming stream of them.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

use crate::frames::{self, Frames, Header, Sink};
use crate::go_away;
use crate::probation::{Held, PeerAddress};
use crate::reset_account::ResetAccount;
use crate::shared::Shared;

/// How long a closing connection reads and drops what its client still
/// sends, at most: a socket closed with unread bytes is reset, and a reset
/// throws away what was still queued to be sent — the GOAWAY that says why.
const LINGER: Duration = Duration::from_secs(1);
/// How many bytes a closing connection drops, at most.
const LINGER_BYTES: usize = 256 * 1024;

/// An accepted connection under a [`ResetGuard`](crate::ResetGuard): what
/// its client writes is followed frame by frame (the streams it opens, the
/// `grpc-timeout` each carries, the streams it resets), and the connection
/// is closed — `GOAWAY ENHANCE_YOUR_CALM`, then the socket — once the
/// client has reset more streams soon after opening them, long before their
/// deadlines, than the guard allows.
///
/// A connection from an address the guard cut off lately is on probation:
/// one that floods again is held unread for a while before it is cut off
/// ([`ResetGuard::hold_after_cut`](crate::ResetGuard::hold_after_cut)).
/// A connection that starts with a TLS handshake, which the guard cannot
/// read, is refused (TLS belongs inside the guard:
/// [`ResetGuard::incoming_tls`](crate::ResetGuard::incoming_tls)).
///
/// Made by [`ResetGuard::incoming`](crate::ResetGuard::incoming) or
/// [`ResetGuard::wrap`](crate::ResetGuard::wrap); tonic reads its
/// connection info as the wrapped stream's.
///
/// ```
/// use tonic_deadline_guard::{Guarded, ResetGuard};
/// # async fn run(tcp: tokio::net::TcpStream) {
/// let guarded: Guarded<tokio::net::TcpStream> = ResetGuard::new().wrap(tcp);
/// # let _ = guarded;
/// # }
/// ```
pub struct Guarded<IO> {
    io: IO,
    shared: Arc<Shared>,
    state: Box<State>,
}

#[derive(Debug)]
enum Scan {
    /// The first bytes, until they show the HTTP/2 preface or not.
    Start(Vec<u8>),
    Http2(Frames),
    /// HTTP/1: nothing to follow.
    Off,
    /// TLS, which the guard cannot read: refused.
    Refused,
}

struct State {
    /// The peer's address, remembered if the connection is cut off.
    peer: Option<IpAddr>,
    /// Its address was cut off lately.
    probation: bool,
    read: Scan,
    written: Frames,
    account: ResetAccount,
    /// Held unread until the sleep ends, then cut off: a connection that
    /// flooded again on probation.
    hold: Option<(Pin<Box<Sleep>>, Held)>,
    /// The GOAWAY still to write, once the guard cut the connection off.
    go_away: Option<Vec<u8>>,
    closed: bool,
    /// Once the GOAWAY is written: the write side shut, what the client
    /// still sends read and dropped until it closes too, or for [`LINGER`].
    linger: Option<Linger>,
}

struct Linger {
    shut: bool,
    dropped: usize,
    until: Pin<Box<Sleep>>,
}

/// The server's frames, told to the account.
struct ServerFrames<'a>(&'a mut ResetAccount);

impl Sink for ServerFrames<'_> {
    #[inline(always)]
    fn wants(&self, kind: u8, flags: u8) -> bool {
        ResetAccount::wants_server_frame(kind, flags)
    }

    #[inline(always)]
    fn header(&mut self, header: Header) {
        self.0.server_frame(header);
    }
}

impl<IO> Guarded<IO> {
    pub(crate) fn new(io: IO, shared: Arc<Shared>, peer: Option<IpAddr>) -> Self {
        let now = Instant::now();
        let probation = shared.probation(peer, now);
        let account = ResetAccount::new(shared.rules, now, probation);
        Self {
            io,
            shared,
            state: Box::new(State {
                peer,
                probation,
                read: Scan::Start(Vec::new()),
                written: Frames::default(),
                account,
                hold: None,
                go_away: None,
                closed: false,
                linger: None,
            }),
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// The wrapped stream, mutably.
    pub fn get_mut(&mut self) -> &mut IO {
        &mut self.io
    }
}

impl State {
    /// Follows `bytes` the client sent, read at `now`.
    fn read(&mut self, bytes: &[u8], now: Instant, shared: &Shared) {
        if let Scan::Start(start) = &mut self.read {
            start.extend_from_slice(bytes);
            match frames::is_preface(start) {
                None => return,
                Some(false) => {
                    self.read = if shared.not_http2(start) {
                        Scan::Refused
                    } else {
                        Scan::Off
                    };
                    return;
                }
                Some(true) => {
                    let start = std::mem::take(start);
                    self.read = Scan::Http2(Frames::from_client());
                    // Walk what was held back, this read included.
                    return self.read(&start, now, shared);
                }
            }
        }
        let Scan::Http2(frames) = &mut self.read else {
            return;
        };
        self.account.reading_at(now);
        frames.walk(bytes, &mut self.account);
        if !self.cut()
            && let Some(breach) = self.account.breach()
        {
            self.go_away = Some(go_away::cut(breach.last_stream));
            match shared.breached(&breach, self.peer, self.probation, now) {
                Some((held, hold)) => {
                    self.hold = Some((Box::pin(tokio::time::sleep(hold)), held));
                }
                None => self.closed = true,
            }
        }
    }

    /// The connection was cut off, or is held before it is.
    fn cut(&self) -> bool {
        self.closed || self.hold.is_some()
    }
}

fn refused_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionRefused,
        "refused by the reset guard: TLS it cannot read (terminate TLS in the guard: \
         ResetGuard::incoming_tls)",
    )
}

fn closed_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "closed by the reset guard: too many streams reset long before their deadlines",
    )
}

impl<IO: AsyncWrite + Unpin> Guarded<IO> {
    /// Writes the GOAWAY of a breach, if the server is between frames; the
    /// connection closes after it either way.
    fn poll_go_away(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let state = &mut *self.state;
        let Some(go_away) = state.go_away.as_mut() else {
            return Poll::Ready(());
        };
        if !state.written.at_boundary() {
            // A frame of the server's is half written: a GOAWAY now would
            // break it. The close alone says enough.
            state.go_away = None;
            return Poll::Ready(());
        }
        while !go_away.is_empty() {
            match Pin::new(&mut self.io).poll_write(cx, go_away) {
                Poll::Ready(Ok(n)) if n > 0 => {
                    go_away.drain(..n);
                }
                Poll::Pending => return Poll::Pending,
                _ => break,
            }
        }
        state.go_away = None;
        Poll::Ready(())
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Guarded<IO> {
    /// A connection cut off: held unread until its hold ends, if it has
    /// one, then closed. Ready with the error that ends the connection.
    #[cold]
    fn poll_cut(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if let Some((until, _)) = &mut self.state.hold {
            std::task::ready!(until.as_mut().poll(cx));
            // The hold given back: its address may have another held.
            self.state.hold = None;
            self.state.closed = true;
        }
        self.poll_closed(cx)
    }

    /// Closes a breached connection: the GOAWAY, the write side shut after
    /// it, then what the client still sends read and dropped (at most
    /// [`LINGER_BYTES`], for at most [`LINGER`]) so that the socket ends
    /// without a reset that could lose the GOAWAY. Ready with the error
    /// that ends the connection.
    fn poll_closed(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        std::task::ready!(self.poll_go_away(cx));
        let linger = self.state.linger.get_or_insert_with(|| Linger {
            shut: false,
            dropped: 0,
            until: Box::pin(tokio::time::sleep(LINGER)),
        });
        if !linger.shut {
            std::task::ready!(Pin::new(&mut self.io).poll_shutdown(cx)).ok();
            linger.shut = true;
        }
        let mut scratch = [0u8; 4096];
        loop {
            if linger.dropped >= LINGER_BYTES || linger.until.as_mut().poll(cx).is_ready() {
                return Poll::Ready(closed_error());
            }
            let mut buf = ReadBuf::new(&mut scratch);
            match std::task::ready!(Pin::new(&mut self.io).poll_read(cx, &mut buf)) {
                Ok(()) if !buf.filled().is_empty() => linger.dropped += buf.filled().len(),
                // The client closed too, or the socket failed: done.
                _ => return Poll::Ready(closed_error()),
            }
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.state.cut() {
            return this.poll_cut(cx).map(Err);
        }
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        this.follow_read(cx, buf, before)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Guarded<IO> {
    /// Follows what a read brought into `buf` after `before`; what the read
    /// answers. Out of line: most reads of a busy connection find nothing.
    #[inline(never)]
    fn follow_read(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        before: usize,
    ) -> Poll<io::Result<()>> {
        let read = &buf.filled()[before..];
        match self.state.read {
            Scan::Off => return Poll::Ready(Ok(())),
            Scan::Refused => return Poll::Ready(Err(refused_error())),
            _ if read.is_empty() => return Poll::Ready(Ok(())),
            _ => {}
        }
        // One clock read for all the frames of a read.
        self.state.read(read, Instant::now(), &self.shared);
        if matches!(self.state.read, Scan::Refused) {
            buf.set_filled(before);
            return Poll::Ready(Err(refused_error()));
        }
        if self.state.cut() {
            // What this read brought is not handed on: the connection ends.
            buf.set_filled(before);
            return self.poll_cut(cx).map(Err);
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.state.closed {
            return this.poll_closed(cx).map(Err);
        }
        let n = std::task::ready!(Pin::new(&mut this.io).poll_write(cx, buf))?;
        this.wrote(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.state.closed {
            return this.poll_closed(cx).map(Err);
        }
        let mut n = std::task::ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs))?;
        let written = n;
        for buf in bufs {
            if n == 0 {
                break;
            }
            let take = n.min(buf.len());
            this.wrote(&buf[..take]);
            n -= take;
        }
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<IO> Guarded<IO> {
    /// Follows bytes the server wrote.
    fn wrote(&mut self, bytes: &[u8]) {
        let state = &mut *self.state;
        if matches!(state.read, Scan::Off | Scan::Refused) {
            return;
        }
        state
            .written
            .walk(bytes, &mut ServerFrames(&mut state.account));
    }
}

impl<IO: Connected> Connected for Guarded<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<IO> fmt::Debug for Guarded<IO> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guarded")
            .field("closed", &self.state.closed)
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// The connections of an incoming stream, each [`Guarded`]. See
    /// [`ResetGuard::incoming`](crate::ResetGuard::incoming).
    pub struct Incoming<I> {
        #[pin]
        inner: I,
        shared: Arc<Shared>,
    }
}

impl<I> Incoming<I> {
    /// The connections of `incoming`, each guarded with `shared`.
    pub(crate) fn new(incoming: I, shared: Arc<Shared>) -> Self {
        Self {
            inner: incoming,
            shared,
        }
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
