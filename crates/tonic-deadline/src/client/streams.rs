//! The peer's limit on concurrent streams, and the calls a channel has open
//! against it.
//!
//! A server may take only so many streams at once on a connection (its
//! SETTINGS_MAX_CONCURRENT_STREAMS; nginx says 128, a tonic server what
//! `Server::max_concurrent_streams` sets). h2 queues a request beyond it
//! *inside* the connection, after its headers — `grpc-timeout` among them —
//! were written, so the server would be told the queue time more than the
//! caller has. [`ReadyChannel`](super::ReadyChannel) keeps that queue
//! itself: its connection's stream reads the server's SETTINGS
//! ([`SettingsScan`]), the channel counts its open calls ([`Streams`]) and
//! is not ready while they fill the limit. The client layer above waits for
//! readiness — bounded by the caller's deadline — before it writes the
//! header, so the header counts the queue time.
//!
//! A call holds its stream from readiness until its response body ends or
//! is dropped (h2 lets the stream go at the same moment: on the frame that
//! ends it, or on the reset a dropped body sends).
//!
//! A call dropped before its answer ended makes h2 schedule a reset, which
//! it writes only once it has read all there is to read; an answer already
//! on its way is then read first, ignored and charged to the connection's
//! budget for small DATA frames ([`Resets`]). So such a drop also tells the
//! connection's stream ([`Streams::take_reset_due`]) to hold its next read
//! back once: h2 writes the reset, then reads the answer as the last frame
//! of a stream it reset, and charges nothing.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use tonic_deadline_guard::frames::{
    DATA, END_STREAM, FRAME_HEADER, Frames, Header, PREFACE, RST_STREAM,
};

const SETTINGS: u8 = 0x4;
const ACK: u8 = 0x1;
/// How many of the streams it reset a connection's scans keep in mind.
const RESETS_KEPT: usize = 4096;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const SETTING_LEN: usize = 6;

/// The open calls of a channel and the limit its peer set, shared by the
/// channel's clones and its connection's stream.
///
/// # Invariants
///
/// 1. `open` counts every [`Slot`] alive, granted ones included.
/// 2. A waiter is granted a slot only in queue order, and only while
///    `open < limit`: a call never overtakes one that waits.
/// 3. A granted ticket is in `granted` until its holder takes the slot or
///    gives it back (dropping the [`Ticket`]), so no grant is lost.
#[derive(Default)]
pub(crate) struct Streams {
    state: Mutex<State>,
    /// Set when a call is dropped before its answer ended: h2 has a reset
    /// to write.
    reset_due: AtomicBool,
}

#[derive(Default)]
struct State {
    open: usize,
    /// `None` until the peer sets one: HTTP/2 starts unlimited.
    limit: Option<usize>,
    queue: VecDeque<(u64, Waker)>,
    granted: Vec<u64>,
    tickets: u64,
}

impl State {
    fn has_room(&self) -> bool {
        self.limit.is_none_or(|limit| self.open < limit)
    }

    /// Grants slots to waiters, in order, while there is room; returns
    /// their wakers, to be woken once the lock is released.
    fn grant(&mut self) -> Vec<Waker> {
        let mut woken = Vec::new();
        while self.has_room()
            && let Some((ticket, waker)) = self.queue.pop_front()
        {
            self.open += 1;
            self.granted.push(ticket);
            woken.push(waker);
        }
        woken
    }
}

impl Streams {
    /// A slot for one call, or `Pending` until one is free (the caller's
    /// place in the queue is kept in `waiting`).
    pub(crate) fn poll_acquire(
        self: &Arc<Self>,
        cx: &mut Context<'_>,
        waiting: &mut Option<Ticket>,
    ) -> Poll<Slot> {
        let mut state = self.lock();
        if let Some(ticket) = waiting {
            if let Some(at) = state.granted.iter().position(|t| *t == ticket.id) {
                state.granted.swap_remove(at);
                ticket.id = 0; // taken: its drop gives nothing back
                drop(state);
                *waiting = None;
                return Poll::Ready(self.slot());
            }
            if let Some((_, waker)) = state.queue.iter_mut().find(|(t, _)| *t == ticket.id)
                && !waker.will_wake(cx.waker())
            {
                waker.clone_from(cx.waker());
            }
            return Poll::Pending;
        }
        if state.queue.is_empty() && state.has_room() {
            state.open += 1;
            drop(state);
            return Poll::Ready(self.slot());
        }
        state.tickets += 1;
        let id = state.tickets;
        state.queue.push_back((id, cx.waker().clone()));
        drop(state);
        *waiting = Some(Ticket {
            streams: self.clone(),
            id,
        });
        Poll::Pending
    }

    /// A slot for a call made without waiting for one (a caller that did
    /// not ask for readiness): counted, whatever the limit.
    pub(crate) fn admit(self: &Arc<Self>) -> Slot {
        self.lock().open += 1;
        self.slot()
    }

    /// The peer's SETTINGS_MAX_CONCURRENT_STREAMS (`None`: no limit).
    pub(crate) fn set_limit(&self, limit: Option<u32>) {
        let woken = {
            let mut state = self.lock();
            state.limit = limit.map(|l| usize::try_from(l).unwrap_or(usize::MAX));
            state.grant()
        };
        woken.into_iter().for_each(Waker::wake);
    }

    /// Whether a call was dropped before its answer ended since the last
    /// time this was asked: its reset should be written before the
    /// connection reads on.
    pub(crate) fn take_reset_due(&self) -> bool {
        // A load first: the common answer takes no exclusive access.
        self.reset_due.load(Ordering::Relaxed) && self.reset_due.swap(false, Ordering::Relaxed)
    }

    /// Calls open now.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.lock().open
    }

    fn slot(self: &Arc<Self>) -> Slot {
        Slot {
            streams: self.clone(),
            sent: false,
        }
    }

    fn release(&self) {
        let woken = {
            let mut state = self.lock();
            state.open = state.open.saturating_sub(1);
            if state.queue.is_empty() {
                return;
            }
            state.grant()
        };
        woken.into_iter().for_each(Waker::wake);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain counters and queues, left whole by a panic elsewhere.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for Streams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("Streams")
            .field("open", &state.open)
            .field("limit", &state.limit)
            .field("waiting", &state.queue.len())
            .finish()
    }
}

/// One call's stream: given back when dropped.
pub(crate) struct Slot {
    streams: Arc<Streams>,
    /// Its call went out and has not been answered to the end: dropping
    /// the slot now means h2 resets the stream.
    sent: bool,
}

impl Slot {
    /// Its call goes out now.
    pub(crate) fn sent(&mut self) {
        self.sent = true;
    }

    /// Its call's answer ended: the stream is free, with nothing to reset.
    pub(crate) fn ended(mut self) {
        self.sent = false;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.sent {
            self.streams.reset_due.store(true, Ordering::Relaxed);
        }
        self.streams.release();
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Slot")
    }
}

/// A place in the queue for a slot: leaves the queue when dropped, and
/// passes on a slot granted to it but not taken.
pub(crate) struct Ticket {
    streams: Arc<Streams>,
    /// 0 once the slot was taken.
    id: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.id == 0 {
            return;
        }
        let woken = {
            let mut state = self.streams.lock();
            if let Some(at) = state.queue.iter().position(|(t, _)| *t == self.id) {
                state.queue.remove(at);
                return;
            }
            let Some(at) = state.granted.iter().position(|t| *t == self.id) else {
                return;
            };
            state.granted.swap_remove(at);
            state.open = state.open.saturating_sub(1);
            state.grant()
        };
        woken.into_iter().for_each(Waker::wake);
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Ticket").field(&self.id).finish()
    }
}

/// Follows the frames a server sends on a connection and finds the
/// SETTINGS_MAX_CONCURRENT_STREAMS in its SETTINGS frames. Nothing is
/// changed; only frame headers and SETTINGS payloads are read.
///
/// A server's first frame must be SETTINGS (RFC 9113, 3.4): a stream that
/// does not start with one is not plaintext HTTP/2 (TLS set up after the
/// connector, say) and is not read further.
#[derive(Debug, Default)]
pub(crate) struct SettingsScan {
    header: [u8; FRAME_HEADER],
    header_len: usize,
    /// Payload bytes of the current frame still to come.
    payload: usize,
    /// The current frame is a SETTINGS frame (not an ACK).
    in_settings: bool,
    setting: [u8; SETTING_LEN],
    setting_len: usize,
    /// Whether the first frame was checked, and whether it was SETTINGS.
    started: bool,
    off: bool,
}

/// What a read's bytes said about the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    /// The limit is this (`None`: unlimited, the first SETTINGS set none).
    Set(Option<u32>),
    /// Nothing new.
    Same,
}

impl SettingsScan {
    /// Whether the stream turned out not to be HTTP/2 in the clear.
    pub(crate) fn is_off(&self) -> bool {
        self.off
    }

    /// Follows `bytes` through the framing. A DATA frame on a stream in
    /// `resets` is marked as its stream's last (see [`Resets`]), when its
    /// header lies whole in `bytes`.
    pub(crate) fn scan(&mut self, mut bytes: &mut [u8], resets: &Resets) -> Limit {
        let mut limit = Limit::Same;
        while !bytes.is_empty() && !self.off {
            if self.payload > 0 {
                let n = self.payload.min(bytes.len());
                if self.in_settings {
                    self.settings(&bytes[..n], &mut limit);
                }
                self.payload -= n;
                bytes = &mut std::mem::take(&mut bytes)[n..];
                continue;
            }
            let whole = self.header_len == 0 && bytes.len() >= FRAME_HEADER;
            let n = (FRAME_HEADER - self.header_len).min(bytes.len());
            self.header[self.header_len..self.header_len + n].copy_from_slice(&bytes[..n]);
            self.header_len += n;
            if whole {
                resets.end_late_data(&mut bytes[..FRAME_HEADER]);
            }
            bytes = &mut std::mem::take(&mut bytes)[n..];
            if self.header_len < FRAME_HEADER {
                continue;
            }
            self.header_len = 0;
            let h = &self.header;
            let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
            let on_connection = h[5] & 0x7f == 0 && h[6] == 0 && h[7] == 0 && h[8] == 0;
            self.in_settings = h[3] == SETTINGS && h[4] & ACK == 0 && on_connection;
            if !self.started {
                self.started = true;
                if !self.in_settings || len % SETTING_LEN != 0 {
                    self.off = true;
                    return Limit::Same;
                }
                // The connection's first SETTINGS: without the setting,
                // the connection is unlimited.
                limit = Limit::Set(None);
            }
            self.payload = len;
            self.setting_len = 0;
        }
        limit
    }

    fn settings(&mut self, mut bytes: &[u8], limit: &mut Limit) {
        while !bytes.is_empty() {
            let n = (SETTING_LEN - self.setting_len).min(bytes.len());
            self.setting[self.setting_len..self.setting_len + n].copy_from_slice(&bytes[..n]);
            self.setting_len += n;
            bytes = &bytes[n..];
            if self.setting_len == SETTING_LEN {
                self.setting_len = 0;
                let s = &self.setting;
                if u16::from_be_bytes([s[0], s[1]]) == SETTINGS_MAX_CONCURRENT_STREAMS {
                    *limit = Limit::Set(Some(u32::from_be_bytes([s[2], s[3], s[4], s[5]])));
                }
            }
        }
    }
}

/// The streams a connection's client reset, read from what it writes.
///
/// h2 (0.4.20) charges every small DATA frame that does not end its stream
/// to a budget of the connection, and gives the charge back only when the
/// application reads the frame; it closes the connection when the budget
/// runs out (`ENHANCE_YOUR_CALM`, "too_many_data_frames"). A DATA frame
/// that arrives on a stream the client has reset is never read — h2
/// ignores it, as HTTP/2 asks — yet is charged all the same, so under
/// deadline storms, where every call that gives up resets its stream and
/// answers keep arriving, the budget drains for good and the connection is
/// closed in the end. Such a frame is marked as the last of its stream
/// before h2 reads it: h2 ignores it just the same, and charges nothing
/// for a stream's last frame.
#[derive(Debug, Default)]
pub(crate) struct Resets {
    /// The last [`RESETS_KEPT`] streams reset, oldest first.
    ids: VecDeque<u32>,
    written: WriteScan,
}

impl Resets {
    /// Follows bytes the client wrote.
    pub(crate) fn wrote(&mut self, bytes: &[u8]) {
        if let Some(ids) = self.written.scan(bytes) {
            for id in ids {
                if self.ids.len() == RESETS_KEPT {
                    self.ids.pop_front();
                }
                self.ids.push_back(id);
            }
        }
    }

    /// Marks `header`, a frame header read whole, as its stream's last if
    /// it is a DATA frame on a stream the client reset.
    fn end_late_data(&self, header: &mut [u8]) {
        if header[3] != DATA || header[4] & END_STREAM != 0 || self.ids.is_empty() {
            return;
        }
        let id = u32::from_be_bytes([header[5] & 0x7f, header[6], header[7], header[8]]);
        if self.ids.contains(&id) {
            header[4] |= END_STREAM;
        }
    }
}

/// Follows the frames a client writes and finds its RST_STREAMs.
#[derive(Debug, Default)]
struct WriteScan {
    /// Preface bytes seen.
    preface: usize,
    frames: Frames,
    /// The stream did not open with the HTTP/2 preface (TLS below us).
    off: bool,
}

impl WriteScan {
    /// The streams reset in `bytes`, if any.
    fn scan(&mut self, mut bytes: &[u8]) -> Option<Vec<u32>> {
        if self.preface < PREFACE.len() && !self.off {
            let n = (PREFACE.len() - self.preface).min(bytes.len());
            if bytes[..n] != PREFACE[self.preface..self.preface + n] {
                self.off = true;
            }
            self.preface += n;
            bytes = &bytes[n..];
        }
        if self.off {
            return None;
        }
        let mut reset = None;
        self.frames.walk(bytes, &mut |h: Header| {
            if h.kind == RST_STREAM {
                reset.get_or_insert_with(Vec::new).push(h.stream);
            }
        });
        reset
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    /// An HTTP/2 frame on `stream`.
    pub(in crate::client) fn frame(kind: u8, flags: u8, stream: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            flags,
            0,
            0,
            0,
            stream,
        ];
        f.extend_from_slice(payload);
        f
    }

    fn setting(id: u16, value: u32) -> Vec<u8> {
        let mut s = id.to_be_bytes().to_vec();
        s.extend_from_slice(&value.to_be_bytes());
        s
    }

    #[test]
    fn the_limit_is_read_from_settings_split_anywhere() {
        let mut payload = setting(0x4, 65_535); // INITIAL_WINDOW_SIZE
        payload.extend(setting(SETTINGS_MAX_CONCURRENT_STREAMS, 1));
        let mut stream = frame(SETTINGS, 0, 0, &payload);
        stream.extend(frame(0x8, 0, 0, &[0, 0, 1, 0])); // WINDOW_UPDATE
        stream.extend(frame(SETTINGS, ACK, 0, &[]));
        stream.extend(frame(
            0x1,
            0x4,
            1,
            &setting(SETTINGS_MAX_CONCURRENT_STREAMS, 9),
        ));
        stream.extend(frame(
            SETTINGS,
            0,
            0,
            &setting(SETTINGS_MAX_CONCURRENT_STREAMS, 100),
        ));
        let mut scan = SettingsScan::default();
        let mut seen = Vec::new();
        // One byte at a time: every split of a frame must be handled.
        for byte in &stream {
            if let Limit::Set(limit) = scan.scan(&mut [*byte], &Resets::default()) {
                seen.push(limit);
            }
        }
        assert_eq!(
            seen,
            [None, Some(1), Some(100)],
            "the first SETTINGS resets to unlimited, then each value; a HEADERS payload is not read"
        );
        assert_eq!(
            SettingsScan::default().scan(&mut stream.clone(), &Resets::default()),
            Limit::Set(Some(100)),
            "in one read, the last value counts"
        );
    }

    #[test]
    fn a_stream_that_does_not_open_with_settings_is_not_read() {
        // A TLS ServerHello record, as seen below a TLS layer.
        let mut tls = [0x16, 0x03, 0x03, 0x00, 0x7a, 0x02, 0x00, 0x00, 0x76, 0x03];
        let mut scan = SettingsScan::default();
        assert_eq!(scan.scan(&mut tls, &Resets::default()), Limit::Same);
        assert!(scan.is_off());
        let mut settings = frame(SETTINGS, 0, 0, &setting(SETTINGS_MAX_CONCURRENT_STREAMS, 0));
        assert_eq!(
            scan.scan(&mut settings, &Resets::default()),
            Limit::Same,
            "never read again"
        );
        let mut resets = Resets::default();
        resets.wrote(&tls);
        resets.wrote(&frame(RST_STREAM, 0, 1, &[0, 0, 0, 8]));
        assert!(
            resets.ids.is_empty(),
            "a write stream without the preface is not read"
        );
    }

    #[test]
    fn a_late_data_frame_on_a_stream_the_client_reset_is_marked_as_its_last() {
        let mut resets = Resets::default();
        let mut written = PREFACE.to_vec();
        written.extend(frame(SETTINGS, 0, 0, &[]));
        written.extend(frame(0x1, 0x4, 1, b"headers"));
        written.extend(frame(0x1, 0x4, 3, b"headers"));
        written.extend(frame(RST_STREAM, 0, 3, &[0, 0, 0, 8]));
        // One byte at a time: a split header must still be found.
        for byte in &written {
            resets.wrote(std::slice::from_ref(byte));
        }
        assert_eq!(resets.ids, [3]);

        let mut read = frame(SETTINGS, 0, 0, &[]);
        let on_reset = read.len();
        read.extend(frame(DATA, 0, 3, b"late"));
        let on_open = read.len();
        read.extend(frame(DATA, 0, 1, b"answer"));
        let mut scan = SettingsScan::default();
        scan.scan(&mut read, &resets);
        assert_eq!(
            read[on_reset + 4],
            END_STREAM,
            "the reset stream's DATA ends it"
        );
        assert_eq!(
            read[on_open + 4],
            0,
            "an open stream's DATA is left as it is"
        );
        assert_eq!(
            read[on_reset + 9..on_reset + 13],
            *b"late",
            "nothing else changes"
        );
    }

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    #[test]
    fn calls_beyond_the_limit_wait_in_order_and_a_dropped_waiter_passes_its_turn_on() {
        let streams = Arc::new(Streams::default());
        let (_, w) = waker();
        let mut cx = Context::from_waker(&w);
        let unlimited: Vec<Slot> = (0..3)
            .map(|_| match streams.poll_acquire(&mut cx, &mut None) {
                Poll::Ready(slot) => slot,
                Poll::Pending => panic!("no limit yet: every call must get a stream"),
            })
            .collect();
        streams.set_limit(Some(2));
        let (first_woken, first_waker) = waker();
        let (second_woken, second_waker) = waker();
        let mut first = None;
        let mut second = None;
        assert!(
            streams
                .poll_acquire(&mut Context::from_waker(&first_waker), &mut first)
                .is_pending(),
            "3 open, limit 2: the call waits"
        );
        assert!(
            streams
                .poll_acquire(&mut Context::from_waker(&second_waker), &mut second)
                .is_pending()
        );
        let mut unlimited = unlimited.into_iter();
        drop(unlimited.next());
        assert_eq!(
            first_woken.0.load(Ordering::SeqCst),
            0,
            "2 open: still no room"
        );
        drop(unlimited.next());
        assert_eq!(
            first_woken.0.load(Ordering::SeqCst),
            1,
            "the first is woken"
        );
        assert_eq!(
            second_woken.0.load(Ordering::SeqCst),
            0,
            "the second is not"
        );
        drop(first); // woken, but its caller gave up
        assert_eq!(
            second_woken.0.load(Ordering::SeqCst),
            1,
            "the grant passes to the next in line"
        );
        let Poll::Ready(slot) =
            streams.poll_acquire(&mut Context::from_waker(&second_waker), &mut second)
        else {
            panic!("the second must take the granted slot");
        };
        assert!(second.is_none());
        assert_eq!(streams.open(), 2);
        drop(slot);
        drop(unlimited);
        assert_eq!(streams.open(), 0, "every slot was given back");
        let admitted = streams.admit();
        assert_eq!(
            streams.open(),
            1,
            "a call made without readiness counts too"
        );
        drop(admitted);
    }

    #[test]
    fn a_new_call_queues_behind_waiting_ones_and_a_raised_limit_lets_them_go() {
        let streams = Arc::new(Streams::default());
        streams.set_limit(Some(0));
        let (woken, w) = waker();
        let mut waiting = None;
        assert!(
            streams
                .poll_acquire(&mut Context::from_waker(&w), &mut waiting)
                .is_pending()
        );
        streams.set_limit(Some(1));
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        let mut late = None;
        let (_, other) = waker();
        assert!(
            streams
                .poll_acquire(&mut Context::from_waker(&other), &mut late)
                .is_pending(),
            "the room is the waiting call's"
        );
        assert!(
            streams
                .poll_acquire(&mut Context::from_waker(&w), &mut waiting)
                .is_ready()
        );
    }

    #[test]
    fn only_a_call_dropped_before_its_answer_ended_leaves_a_reset_due() {
        let streams = Arc::new(Streams::default());
        drop(streams.admit());
        assert!(
            !streams.take_reset_due(),
            "a slot never used opens no stream"
        );
        let mut answered = streams.admit();
        answered.sent();
        answered.ended();
        assert!(
            !streams.take_reset_due(),
            "an answer that ended leaves no reset"
        );
        let mut dropped = streams.admit();
        dropped.sent();
        drop(dropped);
        assert!(
            streams.take_reset_due(),
            "a call dropped mid-answer is reset"
        );
        assert!(!streams.take_reset_due(), "told once");
        assert_eq!(streams.open(), 0, "every slot was given back");
    }
}
