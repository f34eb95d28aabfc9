//! The round trip of a connection, measured with HTTP/2 PINGs.
//!
//! `grpc-timeout` is relative: the server starts counting when the headers
//! arrive, so it believes it has the one-way transit more than the caller
//! has. Half the round trip is an estimate of that transit that needs no
//! clock sync. HTTP/2 has its own echo for it: a PING frame, which every
//! peer must answer at once with a PING ACK carrying the same eight bytes.
//!
//! hyper owns the HTTP/2 connection and offers no PINGs of its own, so the
//! connection's stream does it: it writes a PING of ours between two of
//! hyper's frames, and takes the ACK out of what hyper reads (hyper would
//! warn about an ACK for a PING it never sent). Nothing else in the byte
//! streams is changed; both directions are only scanned for frame
//! boundaries.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use tonic_deadline_guard::frames::{FRAME_HEADER, Frames, Header};

const PING: u8 = 0x6;
const ACK: u8 = 0x1;
/// The first four bytes of our PINGs' payload; the other four count.
const MAGIC: [u8; 4] = *b"tdrt";
/// How many samples the estimate is the minimum of.
const WINDOW: usize = 8;

/// The measured round trip of a [`ReadyChannel`](super::ReadyChannel)'s
/// connection: a handle, cheap to clone, updated as PINGs come back.
///
/// The estimate is the smallest of the last eight samples: the path's own
/// delay, without the queueing that a busy moment adds to some of them.
///
/// ```
/// let round_trip = tonic_deadline::client::RoundTrip::new();
/// assert_eq!(round_trip.estimate(), None, "nothing measured yet");
/// ```
#[derive(Clone, Default)]
pub struct RoundTrip {
    inner: Arc<Samples>,
}

#[derive(Default)]
struct Samples {
    /// The current estimate in nanoseconds; 0 while nothing is measured.
    estimate_ns: AtomicU64,
    count: AtomicU64,
    window: Mutex<VecDeque<Duration>>,
}

impl RoundTrip {
    /// A handle with nothing measured.
    pub fn new() -> Self {
        Self::default()
    }

    /// The round trip, once one PING has come back.
    pub fn estimate(&self) -> Option<Duration> {
        match self.inner.estimate_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// Half the round trip: the one-way transit on a symmetric path.
    pub fn one_way(&self) -> Option<Duration> {
        self.estimate().map(|rtt| rtt / 2)
    }

    /// How many PINGs have come back.
    pub fn samples(&self) -> u64 {
        self.inner.count.load(Ordering::Relaxed)
    }

    pub(crate) fn record(&self, sample: Duration) {
        let mut window = self
            .inner
            .window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if window.len() == WINDOW {
            window.pop_front();
        }
        window.push_back(sample);
        let min = window.iter().min().copied().unwrap_or(sample);
        let ns = u64::try_from(min.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.inner.estimate_ns.store(ns, Ordering::Relaxed);
        self.inner.count.fetch_add(1, Ordering::Relaxed);
    }
}

impl fmt::Debug for RoundTrip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoundTrip")
            .field("estimate", &self.estimate())
            .field("samples", &self.samples())
            .finish()
    }
}

/// One connection's PING state: what to write, what to take out of reads.
#[derive(Debug)]
pub(crate) struct Meter {
    round_trip: RoundTrip,
    every: Duration,
    written: Frames,
    /// Our PING still to be written, from `inject_at`.
    inject: Vec<u8>,
    inject_at: usize,
    /// The PING in flight: its counter and when it left.
    in_flight: Option<(u32, Instant)>,
    last_sent: Option<Instant>,
    sent: u32,
    read: ReadScan,
}

impl Meter {
    pub(crate) fn new(round_trip: RoundTrip, every: Duration) -> Self {
        Self {
            round_trip,
            every,
            written: Frames::from_client(),
            inject: Vec::new(),
            inject_at: 0,
            in_flight: None,
            last_sent: None,
            sent: 0,
            read: ReadScan::default(),
        }
    }

    /// Bytes of ours that must be written before hyper's next ones; starts
    /// a PING when one is due and the stream is between two frames (and
    /// past the preface and hyper's first SETTINGS).
    pub(crate) fn pending_write(&mut self, now: Instant) -> &[u8] {
        if self.inject_at == self.inject.len() {
            let due = self.in_flight.is_none()
                && self
                    .last_sent
                    .is_none_or(|at| now.duration_since(at) >= self.every);
            if due && self.written.at_boundary() && self.written.frames() > 0 {
                self.sent = self.sent.wrapping_add(1);
                self.inject.clear();
                self.inject
                    .extend_from_slice(&[0, 0, 8, PING, 0, 0, 0, 0, 0]);
                self.inject.extend_from_slice(&MAGIC);
                self.inject.extend_from_slice(&self.sent.to_be_bytes());
                self.inject_at = 0;
                self.in_flight = Some((self.sent, now));
                self.last_sent = Some(now);
            }
        }
        &self.inject[self.inject_at..]
    }

    /// `n` of our bytes were written.
    pub(crate) fn wrote_ours(&mut self, n: usize) {
        self.inject_at += n;
    }

    /// hyper's `bytes` were written.
    pub(crate) fn wrote(&mut self, bytes: &[u8]) {
        self.written.walk(bytes, &mut |_| {});
    }

    /// Scans `bytes` read from the peer; what hyper should read is appended
    /// to `out`.
    pub(crate) fn read(&mut self, bytes: &[u8], now: Instant, out: &mut VecDeque<u8>) {
        let mut acked = None;
        self.read.scan(bytes, out, &mut acked);
        if let Some(counter) = acked
            && let Some((sent, at)) = self.in_flight
            && sent == counter
        {
            self.in_flight = None;
            self.round_trip.record(now.duration_since(at));
        }
    }

    /// The peer closed: whatever was held back goes to hyper.
    pub(crate) fn read_end(&mut self, out: &mut VecDeque<u8>) {
        out.extend(self.read.held.drain(..));
    }
}

/// Finds our PING ACKs in the bytes read and keeps them from hyper.
#[derive(Debug, Default)]
struct ReadScan {
    /// A frame header (and, for a PING ACK, its payload) not yet decided.
    held: Vec<u8>,
    /// Bytes of a frame being passed through.
    passing: usize,
}

impl ReadScan {
    fn scan(&mut self, mut bytes: &[u8], out: &mut VecDeque<u8>, acked: &mut Option<u32>) {
        while !bytes.is_empty() {
            if self.passing > 0 {
                let n = self.passing.min(bytes.len());
                out.extend(&bytes[..n]);
                self.passing -= n;
                bytes = &bytes[n..];
                continue;
            }
            // Collect a frame header, and a PING ACK's payload, before
            // deciding what to do with it.
            let want = if self.held.len() >= FRAME_HEADER && is_ping_ack(&self.held) {
                FRAME_HEADER + 8
            } else {
                FRAME_HEADER
            };
            let n = (want - self.held.len()).min(bytes.len());
            self.held.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.held.len() < want {
                continue;
            }
            if want == FRAME_HEADER && is_ping_ack(&self.held) {
                continue; // collect its payload
            }
            if want == FRAME_HEADER + 8 && self.held[FRAME_HEADER..FRAME_HEADER + 4] == MAGIC {
                let counter = u32::from_be_bytes([
                    self.held[13],
                    self.held[14],
                    self.held[15],
                    self.held[16],
                ]);
                *acked = Some(counter);
                self.held.clear();
                continue;
            }
            let header: [u8; FRAME_HEADER] = self.held[..FRAME_HEADER]
                .try_into()
                .unwrap_or([0; FRAME_HEADER]);
            self.passing = Header::parse(&header).len - (self.held.len() - FRAME_HEADER);
            out.extend(self.held.drain(..));
        }
    }
}

/// A PING ACK's header (with its eight-byte payload length).
fn is_ping_ack(header: &[u8]) -> bool {
    header[..3] == [0, 0, 8] && header[3] == PING && header[4] & ACK != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        crate::client::streams::tests::frame(kind, flags, 1, payload)
    }

    #[tokio::test(start_paused = true)]
    async fn a_ping_goes_between_frames_after_the_preface_and_first_settings() {
        let mut meter = Meter::new(RoundTrip::new(), Duration::from_secs(1));
        assert!(
            meter.pending_write(Instant::now()).is_empty(),
            "nothing before the preface"
        );
        meter.wrote(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        assert!(
            meter.pending_write(Instant::now()).is_empty(),
            "nothing before SETTINGS"
        );
        let settings = frame(0x4, 0, &[0; 6]);
        meter.wrote(&settings[..5]);
        assert!(
            meter.pending_write(Instant::now()).is_empty(),
            "never inside a frame"
        );
        meter.wrote(&settings[5..]);
        let ping = meter.pending_write(Instant::now()).to_vec();
        assert_eq!(ping.len(), 17);
        assert_eq!(&ping[..5], &[0, 0, 8, PING, 0], "a PING, not an ACK");
        assert_eq!(&ping[9..13], &MAGIC);
        meter.wrote_ours(17);
        assert!(
            meter.pending_write(Instant::now()).is_empty(),
            "one PING in flight at a time"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn our_ack_is_taken_out_and_timed_everything_else_passes() {
        let round_trip = RoundTrip::new();
        let mut meter = Meter::new(round_trip.clone(), Duration::from_secs(1));
        meter.wrote(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        meter.wrote(&frame(0x4, 0, &[]));
        let ping = meter.pending_write(Instant::now()).to_vec();
        meter.wrote_ours(ping.len());
        tokio::time::advance(Duration::from_millis(40)).await;

        let data = frame(0x0, 0, b"hello");
        let theirs = frame(PING, ACK, b"abcdefgh"); // hyper's own PING's ACK
        let ours = frame(PING, ACK, &ping[9..]);
        let mut stream = Vec::new();
        stream.extend_from_slice(&data);
        stream.extend_from_slice(&ours);
        stream.extend_from_slice(&theirs);
        let mut out = VecDeque::new();
        // One byte at a time: every split of a frame must be handled.
        for byte in &stream {
            meter.read(std::slice::from_ref(byte), Instant::now(), &mut out);
        }
        let mut expected = data.clone();
        expected.extend_from_slice(&theirs);
        assert_eq!(Vec::from(out), expected, "only our ACK is taken out");
        assert_eq!(round_trip.estimate(), Some(Duration::from_millis(40)));
        assert_eq!(round_trip.one_way(), Some(Duration::from_millis(20)));
    }

    #[test]
    fn the_estimate_is_the_smallest_recent_sample() {
        let round_trip = RoundTrip::new();
        for ms in [30, 10, 50] {
            round_trip.record(Duration::from_millis(ms));
        }
        assert_eq!(round_trip.estimate(), Some(Duration::from_millis(10)));
        for _ in 0..WINDOW {
            round_trip.record(Duration::from_millis(25));
        }
        assert_eq!(
            round_trip.estimate(),
            Some(Duration::from_millis(25)),
            "old samples leave the window"
        );
        assert_eq!(round_trip.samples(), 3 + WINDOW as u64);
    }
}
