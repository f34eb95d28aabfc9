//! A TCP proxy that decodes the HTTP/2 frames going through it, in both
//! directions, and can delay what the client sends.
//!
//! Bytes are forwarded untouched. On the way, every frame is parsed: its
//! type, flags and stream id, the header block of HEADERS (+ CONTINUATION)
//! decoded with HPACK (so `grpc-timeout`, `:path` and `grpc-status` can be
//! read), and the error code of RST_STREAM and GOAWAY. Each direction keeps
//! its own HPACK table, as the peers do.
//!
//! With a delay, each chunk read from the client is forwarded that long after
//! it was read, in order and overlapping: a one-way link latency (and, with a
//! reply delay, the same for what the server sends back). (The seed's
//! proxy slept before each chunk one after the other, so a request behind
//! another chunk arrived two delays late; see `experiments::drift`.)
//!
//! ```no_run
//! # async fn run(upstream: std::net::SocketAddr) -> std::io::Result<()> {
//! use deadline_lab::capture::{Capture, Options};
//! let capture = Capture::start_with(upstream, Options::default()).await?;
//! // … point a client at capture.addr() …
//! for record in capture.records() {
//!     println!("{}", record.line());
//! }
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tonic_deadline_guard::frames::{
    CONTINUATION, DATA, END_HEADERS, Frame, HEADERS, PADDED, PRIORITY, WholeFrames,
};
pub use tonic_deadline_guard::frames::{Header, error_code_name};

/// Which way a frame went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client to the server.
    ClientToServer,
    /// From the server to the client.
    ServerToClient,
}

impl Direction {
    /// `c→s` or `s→c`.
    pub fn arrow(self) -> &'static str {
        match self {
            Direction::ClientToServer => "c→s",
            Direction::ServerToClient => "s→c",
        }
    }
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Time since the proxy started (client → server: when forwarded, after
    /// any delay).
    pub at: Duration,
    /// Which connection through the proxy (0, 1, …).
    pub connection: u32,
    /// Which way it went.
    pub direction: Direction,
    /// Which read of this direction carried the frame's end (0, 1, …): frames
    /// with the same number were forwarded in one chunk.
    pub chunk: u32,
    /// The frame header.
    pub frame: Header,
    /// The payload length.
    pub len: u32,
    /// The decoded header list, on the frame that ends a header block.
    pub headers: Vec<(String, String)>,
    /// The error code of RST_STREAM and GOAWAY.
    pub error_code: Option<u32>,
    /// What could not be decoded, if anything.
    pub problem: Option<String>,
}

impl Record {
    /// The value of header `name` in this frame's header block.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// One human line: time, direction, type, stream, flags, details.
    pub fn line(&self) -> String {
        let mut line = format!(
            "{:>10.3} ms  #{} {}  {:<13} stream={:<3} len={:<5}",
            self.at.as_secs_f64() * 1000.0,
            self.connection,
            self.direction.arrow(),
            self.frame.kind_name(),
            self.frame.stream,
            self.len,
        );
        let flags = self.frame.flag_names();
        if !flags.is_empty() {
            line += &format!(" [{}]", flags.join("|"));
        }
        if let Some(code) = self.error_code {
            line += &format!(" {}", error_code_name(code));
        }
        // The deadline-related headers first, so they are seen at a glance.
        let rank = |name: &str| match name {
            "grpc-timeout" | "grpc-status" => 0,
            ":path" | "grpc-message" => 1,
            _ => 2,
        };
        let mut headers: Vec<&(String, String)> = self.headers.iter().collect();
        headers.sort_by_key(|(name, _)| rank(name));
        for (name, value) in headers {
            line += &format!(" {name}={value}");
        }
        if let Some(problem) = &self.problem {
            line += &format!(" ({problem})");
        }
        line
    }

    /// The record as one line of `capture --json`.
    pub fn json(&self) -> RecordLine {
        RecordLine {
            at_ms: (self.at.as_secs_f64() * 1_000_000.0).round() / 1000.0,
            connection: self.connection,
            direction: self.direction.arrow().to_owned(),
            chunk: self.chunk,
            kind: self.frame.kind_name().to_owned(),
            stream: self.frame.stream,
            flags: self
                .frame
                .flag_names()
                .into_iter()
                .map(str::to_owned)
                .collect(),
            len: self.len,
            headers: self.headers.iter().cloned().collect(),
            error_code: self.error_code.map(|c| error_code_name(c).to_owned()),
            problem: self.problem.clone(),
        }
    }
}

/// One decoded frame as `capture --json` prints it, one object a line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordLine {
    /// Time since the proxy started, in ms.
    pub at_ms: f64,
    /// Which connection through the proxy.
    pub connection: u32,
    /// `c→s` or `s→c`.
    pub direction: String,
    /// Which read of this direction carried the frame's end.
    pub chunk: u32,
    /// The frame type's name (`HEADERS`, `RST_STREAM`, …).
    #[serde(rename = "type")]
    pub kind: String,
    /// The stream id.
    pub stream: u32,
    /// The names of the flags set.
    pub flags: Vec<String>,
    /// The payload length.
    pub len: u32,
    /// The decoded header list, on the frame that ends a header block (a
    /// repeated name keeps its last value).
    pub headers: BTreeMap<String, String>,
    /// The error code's name, for RST_STREAM and GOAWAY.
    pub error_code: Option<String>,
    /// What could not be decoded, if anything.
    pub problem: Option<String>,
}

impl RecordLine {
    /// Whether this is a HEADERS frame going `direction`.
    pub fn is_headers(&self, direction: Direction) -> bool {
        self.kind == "HEADERS" && self.direction == direction.arrow()
    }
}

/// The first line of `capture --json`: where the proxy listens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listening {
    /// The address clients connect to.
    pub listen: String,
    /// Where it forwards.
    pub upstream: String,
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line())
    }
}

/// Called with every record as it is made (the CLI prints them live).
pub type Observer = Arc<dyn Fn(&Record) + Send + Sync>;

/// How the proxy runs.
#[derive(Clone, Default)]
pub struct Options {
    /// Where to listen; a free loopback port when `None`.
    pub listen: Option<String>,
    /// How long each chunk from the client waits before it is forwarded.
    pub delay: Duration,
    /// How long each chunk from the server waits before it is forwarded (a
    /// symmetric link has `reply_delay == delay`).
    pub reply_delay: Duration,
    /// Called with every record as it is made.
    pub observer: Option<Observer>,
    /// Do not keep records in memory (a long-running CLI proxy).
    pub forget: bool,
    /// Cut the connection once this many bytes of server → client DATA
    /// payload have passed, in the middle of the DATA frame that carries
    /// them: forward up to there, then close both sides (a link that breaks
    /// mid-message). `None`: never.
    pub cut_reply_after: Option<u64>,
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("listen", &self.listen)
            .field("delay", &self.delay)
            .field("reply_delay", &self.reply_delay)
            .field("observer", &self.observer.is_some())
            .field("forget", &self.forget)
            .field("cut_reply_after", &self.cut_reply_after)
            .finish()
    }
}

#[derive(Clone)]
struct Sink {
    started: Instant,
    records: Arc<Mutex<Vec<Record>>>,
    observer: Option<Observer>,
    forget: bool,
}

impl Sink {
    /// Nobody reads the records: frames need not be decoded at all.
    fn is_discarded(&self) -> bool {
        self.forget && self.observer.is_none()
    }

    fn push(&self, record: Record) {
        if let Some(observer) = &self.observer {
            observer(&record);
        }
        if !self.forget
            && let Ok(mut records) = self.records.lock()
        {
            records.push(record);
        }
    }
}

/// A running capture proxy.
#[derive(Debug, Clone)]
pub struct Capture {
    addr: SocketAddr,
    records: Arc<Mutex<Vec<Record>>>,
    cut_at: Arc<Mutex<Option<Instant>>>,
}

impl Capture {
    /// Listens on a free loopback port and forwards each connection to
    /// `upstream`, without delay.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Capture> {
        Self::start_with(upstream, Options::default()).await
    }

    /// Listens as `options` say and forwards each connection to `upstream`.
    pub async fn start_with(upstream: SocketAddr, options: Options) -> std::io::Result<Capture> {
        let listen = options.listen.as_deref().unwrap_or("127.0.0.1:0");
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let records = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink {
            started: Instant::now(),
            records: records.clone(),
            observer: options.observer,
            forget: options.forget,
        };
        let delays = (options.delay, options.reply_delay);
        let cut_at = Arc::new(Mutex::new(None));
        let cut = options.cut_reply_after.map(|after| (after, cut_at.clone()));
        tonic_deadline::detach(async move {
            let mut connection = 0;
            while let Ok((client, _)) = listener.accept().await {
                let sink = sink.clone();
                let cut = cut.clone();
                tonic_deadline::detach(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        let _ = relay(client, server, sink, connection, delays, cut).await;
                    }
                });
                connection += 1;
            }
        });
        Ok(Capture {
            addr,
            records,
            cut_at,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every client → server frame seen so far.
    pub fn frames(&self) -> Vec<Header> {
        self.records()
            .into_iter()
            .filter(|r| r.direction == Direction::ClientToServer)
            .map(|r| r.frame)
            .collect()
    }

    /// Every frame seen so far, both directions, in the order recorded.
    pub fn records(&self) -> Vec<Record> {
        self.records.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// When the proxy cut a connection mid-message
    /// ([`Options::cut_reply_after`]), if it did.
    pub fn cut_at(&self) -> Option<Instant> {
        self.cut_at.lock().ok().and_then(|c| *c)
    }

    /// Forgets what was recorded so far.
    pub fn clear(&self) {
        if let Ok(mut records) = self.records.lock() {
            records.clear();
        }
    }
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    sink: Sink,
    connection: u32,
    (delay, reply_delay): (Duration, Duration),
    cut: Option<(u64, Arc<Mutex<Option<Instant>>>)>,
) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pump(
        client_read,
        server_write,
        Decoder::new(Direction::ClientToServer, connection, sink.clone()),
        delay,
        None,
    );
    let down = pump(
        server_read,
        client_write,
        Decoder::new(Direction::ServerToClient, connection, sink),
        reply_delay,
        cut.map(|(after, at)| Cutter::new(after, at)),
    );
    // A cut ends one direction with an error; both sockets close with it.
    tokio::try_join!(up, down).map(|_| ())
}

/// Finds where to cut a server → client byte stream: inside the DATA frame
/// that carries payload byte number `after`.
#[derive(Debug)]
pub struct Cutter {
    parser: WholeFrames,
    after: u64,
    /// Bytes of the stream before the current chunk.
    seen: u64,
    /// DATA payload bytes in the frames parsed so far.
    payload: u64,
    cut_at: Arc<Mutex<Option<Instant>>>,
}

impl Cutter {
    /// A cutter for payload byte `after`; the proxy records the time of
    /// the cut in `cut_at`.
    pub fn new(after: u64, cut_at: Arc<Mutex<Option<Instant>>>) -> Self {
        Self {
            parser: WholeFrames::from_server(),
            after,
            seen: 0,
            payload: 0,
            cut_at,
        }
    }

    /// How many bytes of `chunk` to forward before cutting, if the cut
    /// falls in it. A frame split across chunks is cut at the start of the
    /// chunk that completes it if its cut point already went through.
    pub fn cut_point(&mut self, chunk: &[u8]) -> Option<usize> {
        let start = self.seen;
        self.seen += chunk.len() as u64;
        for parsed in self.parser.feed(chunk) {
            if parsed.header.kind != DATA {
                continue;
            }
            let len = parsed.payload.len() as u64;
            if self.payload + len > self.after {
                let inside = (self.after - self.payload)
                    .max(1)
                    .min(len.saturating_sub(1));
                let cut = parsed.start + 9 + inside;
                return Some(usize::try_from(cut.saturating_sub(start)).unwrap_or(0));
            }
            self.payload += len;
        }
        None
    }

    fn mark(&self) {
        if let Ok(mut at) = self.cut_at.lock() {
            at.get_or_insert_with(Instant::now);
        }
    }
}

/// Forwards `chunk`, or, if the cut falls in it, its first part only and
/// then fails with the cut.
async fn forward(
    to: &mut OwnedWriteHalf,
    chunk: &[u8],
    cutter: &mut Option<Cutter>,
) -> std::io::Result<()> {
    if let Some(c) = cutter
        && let Some(keep) = c.cut_point(chunk)
    {
        to.write_all(&chunk[..keep.min(chunk.len())]).await?;
        to.flush().await?;
        c.mark();
        return Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "cut mid-message on purpose",
        ));
    }
    to.write_all(chunk).await
}

/// Copies one direction, decoding on the way. With a delay, each chunk is
/// forwarded `delay` after it was read, in order: a one-way link latency
/// (chunks in flight overlap; a request written in two chunks arrives once
/// late, not twice).
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut decoder: Decoder,
    delay: Duration,
    mut cutter: Option<Cutter>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    if delay.is_zero() {
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0 {
                return to.shutdown().await;
            }
            decoder.feed(&buf[..n]);
            forward(&mut to, &buf[..n], &mut cutter).await?;
        }
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(Instant, Vec<u8>)>(1024);
    let reader = async move {
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0
                || tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .await
                    .is_err()
            {
                return std::io::Result::Ok(());
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            wait_until(due).await;
            decoder.feed(&chunk);
            forward(&mut to, &chunk, &mut cutter).await?;
        }
        to.shutdown().await
    };
    let (read, write) = tokio::join!(reader, writer);
    read.and(write)
}

/// Waits until `due`, closer than the timer's millisecond resolution: the
/// timer brings it within a millisecond, then the task yields until `due`
/// (a bounded number of times; a paused clock falls back to the timer). A
/// link latency that ran up to a millisecond late would show as transit
/// that is not there.
async fn wait_until(due: Instant) {
    const SPINS: u32 = 200_000;
    if let Some(early) = due.checked_sub(Duration::from_millis(1)) {
        tokio::time::sleep_until(early).await;
    }
    for _ in 0..SPINS {
        if Instant::now() >= due {
            return;
        }
        tokio::task::yield_now().await;
    }
    tokio::time::sleep_until(due).await;
}

/// Decodes one direction's bytes as the proxy does: a record per frame, a
/// header block decoded across its CONTINUATION frames.
pub fn decode(direction: Direction, bytes: &[u8]) -> Vec<Record> {
    let sink = Sink {
        started: Instant::now(),
        records: Arc::default(),
        observer: None,
        forget: false,
    };
    Decoder::new(direction, 0, sink.clone()).feed(bytes);
    sink.records.lock().map(|r| r.clone()).unwrap_or_default()
}

/// One direction's frame parser, HPACK table and pending header block.
struct Decoder {
    direction: Direction,
    connection: u32,
    sink: Sink,
    parser: WholeFrames,
    hpack: loona_hpack::Decoder<'static>,
    /// The header block being assembled (HEADERS then CONTINUATIONs).
    block: Vec<u8>,
    /// HPACK failed once: the table is unknown from here on.
    broken: bool,
    /// Chunks read so far.
    chunks: u32,
}

impl Decoder {
    fn new(direction: Direction, connection: u32, sink: Sink) -> Self {
        let parser = match direction {
            Direction::ClientToServer => WholeFrames::from_client(),
            Direction::ServerToClient => WholeFrames::from_server(),
        };
        Self {
            direction,
            connection,
            sink,
            parser,
            hpack: loona_hpack::Decoder::new(),
            block: Vec::new(),
            broken: false,
            chunks: 0,
        }
    }

    fn feed(&mut self, bytes: &[u8]) {
        if self.sink.is_discarded() {
            return;
        }
        for parsed in self.parser.feed(bytes) {
            let record = self.decode(&parsed);
            self.sink.push(record);
        }
        self.chunks += 1;
    }

    fn decode(&mut self, parsed: &Frame) -> Record {
        let (frame, payload) = (parsed.header, parsed.payload.as_slice());
        let mut record = Record {
            at: self.sink.started.elapsed(),
            connection: self.connection,
            direction: self.direction,
            chunk: self.chunks,
            frame,
            len: u32::try_from(payload.len()).unwrap_or(u32::MAX),
            headers: Vec::new(),
            error_code: parsed.error_code(),
            problem: None,
        };
        if let HEADERS | CONTINUATION = frame.kind {
            let fragment = if frame.kind == HEADERS {
                self.block.clear();
                header_fragment(frame.flags, payload)
            } else {
                Some(payload)
            };
            match fragment {
                Some(fragment) => self.block.extend_from_slice(fragment),
                None => record.problem = Some("malformed padding".into()),
            }
            if frame.flags & END_HEADERS != 0 {
                let block = std::mem::take(&mut self.block);
                match self.decode_block(&block) {
                    Ok(headers) => record.headers = headers,
                    Err(problem) => record.problem = Some(problem),
                }
            }
        }
        record
    }

    fn decode_block(&mut self, block: &[u8]) -> Result<Vec<(String, String)>, String> {
        if self.broken {
            return Err("HPACK state lost".into());
        }
        match self.hpack.decode(block) {
            Ok(list) => Ok(list
                .into_iter()
                .map(|(n, v)| {
                    (
                        String::from_utf8_lossy(&n).into_owned(),
                        String::from_utf8_lossy(&v).into_owned(),
                    )
                })
                .collect()),
            Err(e) => {
                self.broken = true;
                Err(format!("HPACK: {e:?}"))
            }
        }
    }
}

/// The header block fragment of a HEADERS payload, without padding and
/// priority fields; `None` when the padding is longer than the payload.
pub fn header_fragment(flags: u8, payload: &[u8]) -> Option<&[u8]> {
    let mut start = 0;
    let mut end = payload.len();
    if flags & PADDED != 0 {
        let pad = usize::from(*payload.first()?);
        start = 1;
        end = end.checked_sub(pad)?;
    }
    if flags & PRIORITY != 0 {
        start += 5;
    }
    payload.get(start..end)
}
