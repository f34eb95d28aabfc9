//! The connection's stream: tells the channel when it is gone, reads the
//! server's stream limit, and meters the round trip.

use super::*;

/// The connection's stream: tells the channel when it is gone (hyper drops
/// it when the connection ends, by either side).
pub(super) struct LinkedIo<T> {
    pub(super) io: T,
    pub(super) on_close: Box<dyn Fn() + Send + Sync>,
    /// Set when the channel measures round trips: reads then go through a
    /// buffer of ours, to take our PING ACKs out.
    pub(super) meter: Option<Box<Metered>>,
    /// Reads the server's stream limit; `None` once the stream turned out
    /// not to be HTTP/2 in the clear.
    pub(super) scan: Option<Box<Scanned>>,
}

/// A [`SettingsScan`] of the bytes the server sends, where it reports, and
/// the streams the client reset (see [`Resets`]).
pub(super) struct Scanned {
    pub(super) scan: SettingsScan,
    pub(super) streams: Arc<Streams>,
    /// Reads land here first, to be scanned, when no [`Metered`] reads them.
    pub(super) scratch: Vec<u8>,
    pub(super) resets: Resets,
    /// The last read was held back for a reset due.
    pub(super) held_back: bool,
}

impl Scanned {
    /// Whether to hold this read back, once, because a call was dropped
    /// before its answer ended: h2 writes the reset it scheduled only once
    /// a read finds nothing, and an answer read before it would be charged
    /// (see [`Streams::take_reset_due`]). Never twice in a row, so reads
    /// go on under a storm of resets.
    pub(super) fn hold_back(&mut self, cx: &Context<'_>) -> bool {
        if std::mem::take(&mut self.held_back) || !self.streams.take_reset_due() {
            return false;
        }
        self.held_back = true;
        cx.waker().wake_by_ref();
        true
    }

    pub(super) fn scan(&mut self, bytes: &mut [u8]) {
        if let Limit::Set(limit) = self.scan.scan(bytes, &self.resets) {
            self.streams.set_limit(limit);
        }
    }

    /// Follows the first `n` bytes of `bufs`, written.
    pub(super) fn wrote(&mut self, bufs: &[io::IoSlice<'_>], mut n: usize) {
        for buf in bufs {
            if n == 0 {
                break;
            }
            let take = n.min(buf.len());
            self.resets.wrote(&buf[..take]);
            n -= take;
        }
    }
}

/// A [`Meter`] and the read bytes waiting for hyper.
pub(super) struct Metered {
    pub(super) meter: Meter,
    pub(super) ready: VecDeque<u8>,
    pub(super) scratch: Vec<u8>,
}

impl Metered {
    pub(super) fn new(round_trip: RoundTrip, every: Duration) -> Self {
        Self {
            meter: Meter::new(round_trip, every),
            ready: VecDeque::new(),
            scratch: vec![0; 16 * 1024],
        }
    }

    /// Moves what waits for hyper into `buf`; whether anything moved.
    pub(super) fn hand_over(&mut self, buf: &mut ReadBufCursor<'_>) -> bool {
        let n = self.ready.len().min(buf.remaining());
        if n == 0 {
            return false;
        }
        let (a, b) = self.ready.as_slices();
        let from_a = n.min(a.len());
        buf.put_slice(&a[..from_a]);
        buf.put_slice(&b[..n - from_a]);
        self.ready.drain(..n);
        true
    }
}

impl<T> Drop for LinkedIo<T> {
    fn drop(&mut self) {
        (self.on_close)();
    }
}

impl<T> fmt::Debug for LinkedIo<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinkedIo").finish_non_exhaustive()
    }
}

impl<T: Read + Unpin> Read for LinkedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.scan.as_ref().is_some_and(|s| s.scan.is_off()) {
            this.scan = None;
        }
        if this.scan.as_deref_mut().is_some_and(|s| s.hold_back(cx)) {
            return Poll::Pending;
        }
        let Some(metered) = this.meter.as_deref_mut() else {
            let Some(scanned) = this.scan.as_deref_mut() else {
                return Pin::new(&mut this.io).poll_read(cx, buf);
            };
            // Read into our buffer, no more than hyper has room for, scan,
            // and hand it all over.
            let room = buf.remaining().min(16 * 1024);
            if scanned.scratch.len() < room {
                scanned.scratch.resize(room, 0);
            }
            let mut read = hyper::rt::ReadBuf::new(&mut scanned.scratch[..room]);
            std::task::ready!(Pin::new(&mut this.io).poll_read(cx, read.unfilled()))?;
            let n = read.filled().len();
            let mut filled = std::mem::take(&mut scanned.scratch);
            scanned.scan(&mut filled[..n]);
            buf.put_slice(&filled[..n]);
            scanned.scratch = filled;
            return Poll::Ready(Ok(()));
        };
        loop {
            if metered.hand_over(&mut buf) {
                return Poll::Ready(Ok(()));
            }
            let mut read = hyper::rt::ReadBuf::new(&mut metered.scratch);
            std::task::ready!(Pin::new(&mut this.io).poll_read(cx, read.unfilled()))?;
            let filled = read.filled();
            if filled.is_empty() {
                // The peer closed: hand over what was held back, then EOF.
                metered.meter.read_end(&mut metered.ready);
                metered.hand_over(&mut buf);
                return Poll::Ready(Ok(()));
            }
            // Our ACKs alone leave nothing for hyper: read on rather than
            // hand it an empty read, which would mean the end.
            let now = tokio::time::Instant::now();
            let mut filled = filled.to_vec();
            if let Some(scanned) = this.scan.as_deref_mut() {
                scanned.scan(&mut filled);
            }
            metered.meter.read(&filled, now, &mut metered.ready);
        }
    }
}

impl<T: Write + Unpin> Write for LinkedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let Some(metered) = this.meter.as_deref_mut() else {
            let n = std::task::ready!(Pin::new(&mut this.io).poll_write(cx, buf))?;
            if let Some(scanned) = this.scan.as_deref_mut() {
                scanned.resets.wrote(&buf[..n]);
            }
            return Poll::Ready(Ok(n));
        };
        // Our PING, if one is due, goes first, whole.
        loop {
            let ours = metered.meter.pending_write(tokio::time::Instant::now());
            if ours.is_empty() {
                break;
            }
            let n = std::task::ready!(Pin::new(&mut this.io).poll_write(cx, ours))?;
            if n == 0 {
                return Poll::Ready(Ok(0));
            }
            metered.meter.wrote_ours(n);
        }
        let n = std::task::ready!(Pin::new(&mut this.io).poll_write(cx, buf))?;
        metered.meter.wrote(&buf[..n]);
        if let Some(scanned) = this.scan.as_deref_mut() {
            scanned.resets.wrote(&buf[..n]);
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        // A measured stream takes one buffer at a time, to find the frame
        // boundaries between which a PING may go.
        self.meter.is_none() && self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.meter.is_some() {
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &**b);
            return self.poll_write(cx, first);
        }
        let this = self.get_mut();
        let n = std::task::ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs))?;
        if let Some(scanned) = this.scan.as_deref_mut() {
            scanned.wrote(bufs, n);
        }
        Poll::Ready(Ok(n))
    }
}
