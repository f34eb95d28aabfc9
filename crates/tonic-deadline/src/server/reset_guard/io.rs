//! A guarded connection: the accepted stream, read and written through the
//! account of its client's streams.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

use super::book::{Book, Breach};
use super::{Shared, Turn};
use crate::wire::frames::{self, Frames, GOAWAY, Header, Sink};

/// HTTP/2's `ENHANCE_YOUR_CALM`, the code of the GOAWAY a breach sends.
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// How long a closing connection reads and drops what its client still
/// sends, at most: a socket closed with unread bytes is reset, and a reset
/// throws away what was still queued to be sent — the GOAWAY that says why.
const LINGER: Duration = Duration::from_secs(1);
/// How many bytes a closing connection drops, at most.
const LINGER_BYTES: usize = 256 * 1024;

/// An accepted connection under a [`ResetGuard`](super::ResetGuard): what
/// its client writes is followed frame by frame (the streams it opens, the
/// `grpc-timeout` each carries, the streams it resets), and the connection
/// is closed — `GOAWAY ENHANCE_YOUR_CALM`, then the socket — once the
/// client has reset more streams soon after opening them, long before their
/// deadlines, than the guard allows.
///
/// A new connection from an address the guard cut off lately is held
/// unread until its turn ([`ResetGuard::pace_after_cut`](super::ResetGuard::pace_after_cut)).
///
/// Made by [`ResetGuard::incoming`](super::ResetGuard::incoming) or
/// [`ResetGuard::wrap`](super::ResetGuard::wrap); tonic reads its
/// connection info as the wrapped stream's.
///
/// ```
/// use tonic_deadline::server::{Guarded, ResetGuard};
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
    /// Not HTTP/2 in the clear: nothing to follow.
    Off,
}

struct State {
    /// The peer's address, remembered if the connection is cut off.
    peer: Option<IpAddr>,
    /// Whether the connection may be read yet.
    gate: Gate,
    read: Scan,
    written: Frames,
    book: Book,
    /// The GOAWAY still to write, once the guard closed the connection.
    go_away: Option<Vec<u8>>,
    closed: bool,
    /// Once the GOAWAY is written: the write side shut, what the client
    /// still sends read and dropped until it closes too, or for [`LINGER`].
    linger: Option<Linger>,
}

/// A paced connection's turn ([`Turn`], as the guard gave it).
enum Gate {
    /// Read as it comes.
    Open,
    /// Not read until then.
    Until(Instant),
    /// The wait for it, made on the first read (in the runtime that serves
    /// the connection, wherever the connection was wrapped).
    Waiting(Pin<Box<Sleep>>),
    /// It had no turn: closed unread.
    Shut,
}

struct Linger {
    shut: bool,
    dropped: usize,
    until: Pin<Box<Sleep>>,
}

/// The server's frames, told to the account.
struct ServerFrames<'a>(&'a mut Book);

impl Sink for ServerFrames<'_> {
    fn header(&mut self, header: Header) {
        self.0.server_frame(header);
    }
}

impl<IO> Guarded<IO> {
    pub(super) fn new(io: IO, shared: Arc<Shared>, peer: Option<IpAddr>) -> Self {
        shared.wrapped();
        let now = Instant::now();
        let book = Book::new(shared.rules, now);
        let gate = match shared.turn(peer, now) {
            Turn::Now => Gate::Open,
            Turn::At(turn) => Gate::Until(turn),
            Turn::Refused => Gate::Shut,
        };
        Self {
            io,
            shared,
            state: Box::new(State {
                peer,
                gate,
                read: Scan::Start(Vec::new()),
                written: Frames::default(),
                book,
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
    /// Ready once the connection may be read: a held one at its turn.
    fn poll_gate(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            match &mut self.gate {
                Gate::Open | Gate::Shut => return Poll::Ready(()),
                Gate::Until(turn) => {
                    self.gate = Gate::Waiting(Box::pin(tokio::time::sleep_until(*turn)));
                }
                Gate::Waiting(sleep) => {
                    std::task::ready!(sleep.as_mut().poll(cx));
                    self.gate = Gate::Open;
                    // What waited in the socket arrived no earlier than
                    // this, as far as the account can tell the streams' ages.
                    self.book.restart(Instant::now());
                }
            }
        }
    }

    /// Follows `bytes` the client sent, read at `now`.
    fn read(&mut self, bytes: &[u8], now: Instant, shared: &Shared) {
        if let Scan::Start(start) = &mut self.read {
            start.extend_from_slice(bytes);
            match frames::is_preface(start) {
                None => return,
                Some(false) => {
                    shared.not_http2(start);
                    self.read = Scan::Off;
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
        self.book.reading_at(now);
        frames.walk(bytes, &mut self.book);
        if !self.closed
            && let Some(breach) = self.book.breach()
        {
            self.closed = true;
            shared.breached(&breach, self.peer, now);
            self.go_away = Some(go_away(&breach));
        }
    }
}

fn go_away(breach: &Breach) -> Vec<u8> {
    let mut payload = breach.last_stream.to_be_bytes().to_vec();
    payload.extend(ENHANCE_YOUR_CALM.to_be_bytes());
    payload.extend_from_slice(crate::wire::FLOOD_GO_AWAY.as_bytes());
    frames::frame(GOAWAY, 0, 0, &payload)
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
        if this.state.closed {
            return this.poll_closed(cx).map(Err);
        }
        match this.state.gate {
            Gate::Open => {}
            // The end of the stream: hyper closes the connection.
            Gate::Shut => return Poll::Ready(Ok(())),
            _ => std::task::ready!(this.state.poll_gate(cx)),
        }
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        let read = &buf.filled()[before..];
        if read.is_empty() || matches!(this.state.read, Scan::Off) {
            return Poll::Ready(Ok(()));
        }
        // One clock read for all the frames of a read.
        this.state.read(read, Instant::now(), &this.shared);
        if this.state.closed {
            // What this read brought is not handed on: the connection ends.
            buf.set_filled(before);
            return this.poll_closed(cx).map(Err);
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
        if matches!(state.read, Scan::Off) {
            return;
        }
        state
            .written
            .walk(bytes, &mut ServerFrames(&mut state.book));
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
