//! The streams of a call under the interceptor: each wait on them races the
//! call's deadline and its scope.

use std::any::Any;
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use grpc::client::{RecvStream, ResponseStreamItem, SendOptions, SendStream};
use grpc::core::{RecvMessage, SendMessage, Trailers};
use grpc::{StatusCodeError, StatusError};
use grpc_deadline::{Cause, Code, Scope};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

use crate::ledger::Note;
use crate::stats::Stats;
use crate::status;

/// gRPC's retry pushback: `-1` (any negative value) tells the caller not to
/// retry. A hop whose retries were spent answers with it (the chain budget).
pub(crate) const PUSHBACK: &str = "grpc-retry-pushback-ms";

/// What a call's streams watch: its deadline and its scope.
#[derive(Clone)]
pub(crate) struct Watch {
    pub(crate) scope: Option<Scope>,
    pub(crate) deadline: Option<Instant>,
}

impl Watch {
    /// Waits until the deadline passes or the scope ends, and says which.
    ///
    /// # Cancellation safety
    ///
    /// Safe: dropping it only stops the wait.
    pub(crate) async fn ended(&self, timer: &mut Option<Pin<Box<Sleep>>>) -> Cause {
        let deadline = async {
            match (self.deadline, timer.as_mut()) {
                (Some(_), Some(timer)) => timer.as_mut().await,
                (Some(at), None) => timer.insert(Box::pin(tokio::time::sleep_until(at))).await,
                (None, _) => std::future::pending().await,
            }
        };
        let cancelled = async {
            match &self.scope {
                Some(scope) => {
                    scope.cancelled().await;
                    scope.cause().unwrap_or(Cause::Cancelled)
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            cause = cancelled => cause,
            () = deadline => Cause::DeadlineExceeded,
        }
    }

    /// Why the call is over already, if it is: read without waiting.
    fn ended_now(&self) -> Option<Cause> {
        if let Some(cause) = self.scope.as_ref().and_then(Scope::cause) {
            return Some(cause);
        }
        self.deadline
            .filter(|d| *d <= Instant::now())
            .map(|_| Cause::DeadlineExceeded)
    }
}

/// How long past its deadline an abandoned call's streams are held: the
/// server ends the call at the deadline it was sent, a transit later.
const HOLD_PAST_DEADLINE: Duration = Duration::from_secs(1);

/// How long an abandoned call without a deadline is held before its
/// streams are let go (and its request stream ends normally).
const HOLD_WITHOUT_DEADLINE: Duration = Duration::from_secs(10);

/// What the two halves of one call share: the request side's stream while
/// the caller has let go of it but not of the call, and how the call
/// stands.
///
/// The `grpc` crate's own transport ends a call's request stream normally
/// (HTTP/2 END_STREAM, "the client finished sending") when its send half
/// is dropped, and when its receive half is: a call abandoned mid-upload
/// would read to the server as a complete input. So a send half dropped
/// before its last message waits here until the caller reads the answer
/// (then the drop was its end of input), and the halves of an abandoned
/// call are held until the server has ended the call itself, at the
/// deadline it was sent.
pub(crate) struct Call {
    /// The send half's stream, dropped before its last message, not yet
    /// let go.
    parked: Mutex<Parked>,
    /// Woken when a send half is parked, so that a receive already under
    /// way lets it go.
    parked_now: Notify,
    /// The request stream is closed: its last message was sent, or the
    /// caller's end of input was let go.
    request_closed: AtomicBool,
    deadline: Option<Instant>,
    stats: Arc<Stats>,
}

enum Parked {
    /// The call runs; the send half, if parked, waits for the caller's
    /// next read.
    Live(Option<Box<dyn Any + Send>>),
    /// The answer was read: a send half dropped now ends its stream.
    Done,
    /// The caller went away: a send half dropped now is held.
    Abandoned,
}

impl Call {
    pub(crate) fn new(deadline: Option<Instant>, stats: Arc<Stats>) -> Arc<Self> {
        Arc::new(Self {
            parked: Mutex::new(Parked::Live(None)),
            parked_now: Notify::new(),
            request_closed: AtomicBool::new(false),
            deadline,
            stats,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Parked> {
        // Nothing panics while holding it; a poisoned lock is still sound.
        self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_abandoned(&self) -> bool {
        matches!(*self.lock(), Parked::Abandoned)
    }

    /// The send half was dropped before its last message.
    fn send_half_dropped(&self, stream: Box<dyn Any + Send>) {
        let mut parked = self.lock();
        match &mut *parked {
            Parked::Live(slot) => {
                *slot = Some(stream);
                drop(parked);
                self.parked_now.notify_one();
            }
            Parked::Done => {
                drop(parked);
                drop(stream);
            }
            Parked::Abandoned => {
                drop(parked);
                self.hold(vec![stream]);
            }
        }
    }

    /// The caller reads the answer: a send half it dropped was its end of
    /// input, and goes now.
    fn let_parked_go(&self) {
        let stream = match &mut *self.lock() {
            Parked::Live(slot) => slot.take(),
            Parked::Done | Parked::Abandoned => None,
        };
        if stream.is_some() {
            self.request_closed.store(true, Ordering::Relaxed);
        }
        drop(stream);
    }

    /// The answer was read to its end.
    fn done(&self) {
        let stream = match std::mem::replace(&mut *self.lock(), Parked::Done) {
            Parked::Live(stream) => stream,
            Parked::Done | Parked::Abandoned => None,
        };
        drop(stream);
    }

    /// The caller went away before the answer's end: returns what must be
    /// held with the receive half (a parked send half), and whether the
    /// request stream was still open.
    fn abandon(&self) -> (Option<Box<dyn Any + Send>>, bool) {
        let stream = match std::mem::replace(&mut *self.lock(), Parked::Abandoned) {
            Parked::Live(stream) => stream,
            Parked::Done | Parked::Abandoned => None,
        };
        let open = !self.request_closed.load(Ordering::Relaxed);
        (stream, open)
    }

    /// Holds `streams` until the server has ended the call: a little past
    /// its deadline, or [`HOLD_WITHOUT_DEADLINE`] for a call without one
    /// (reported: its request stream then ends normally).
    fn hold(&self, streams: Vec<Box<dyn Any + Send>>) {
        let deadline = self.deadline;
        let stats = self.stats.clone();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to hold them on: they end now, and say so.
            stats.note_held_then_ended(Duration::ZERO);
            return;
        };
        // The held streams belong to no request: their scope is over.
        #[allow(
            clippy::disallowed_methods,
            reason = "holds an abandoned call's streams; no request's work"
        )]
        runtime.spawn(async move {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline + HOLD_PAST_DEADLINE).await,
                None => {
                    tokio::time::sleep(HOLD_WITHOUT_DEADLINE).await;
                    stats.note_held_then_ended(HOLD_WITHOUT_DEADLINE);
                }
            }
            drop(streams);
        });
    }
}

/// The sending side of a call made through
/// [`DeadlineInterceptor`](crate::DeadlineInterceptor): a send stops at the
/// deadline or when the scope ends, and reports the stream closed (the
/// receiving side then says why).
///
/// ```
/// fn sends<S: grpc::client::SendStream>(_: &S) {}
/// # fn check<S: grpc::client::SendStream>(s: grpc_deadline_grpc::DeadlineSendStream<S>) {
/// sends(&s);
/// # }
/// ```
pub struct DeadlineSendStream<S: Send + 'static> {
    inner: Option<S>,
    watch: Watch,
    timer: Option<Pin<Box<Sleep>>>,
    /// What it shares with the receiving side (none for a call that
    /// failed before it left, or when the transport resets what it drops).
    call: Option<Arc<Call>>,
    /// Closed here: its scope ended or its deadline passed. The stream is
    /// kept, not ended.
    closed: bool,
    /// Its last message was sent: the request stream ended normally.
    finished: bool,
}

impl<S: Send + 'static> DeadlineSendStream<S> {
    pub(crate) fn new(inner: Option<S>, watch: Watch, call: Option<Arc<Call>>) -> Self {
        Self {
            inner,
            watch,
            timer: None,
            call,
            closed: false,
            finished: false,
        }
    }
}

impl<S: Send + 'static> fmt::Debug for DeadlineSendStream<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadlineSendStream")
            .field("open", &(self.inner.is_some() && !self.closed))
            .finish_non_exhaustive()
    }
}

impl<S: SendStream + Send + 'static> SendStream for DeadlineSendStream<S> {
    async fn send(&mut self, msg: &dyn SendMessage, options: SendOptions) -> Result<(), ()> {
        if self.closed
            || self.watch.ended_now().is_some()
            || self.call.as_ref().is_some_and(|c| c.is_abandoned())
        {
            // Closed, but not ended: the stream is kept (see `Drop`).
            self.closed = true;
            return Err(());
        }
        let Some(inner) = self.inner.as_mut() else {
            return Err(());
        };
        let final_msg = options.final_msg;
        let sent = {
            let send = inner.send(msg, options);
            tokio::select! {
                biased;
                _ = self.watch.ended(&mut self.timer) => None,
                sent = send => Some(sent),
            }
        };
        match sent {
            Some(sent) => {
                if final_msg && sent.is_ok() {
                    self.finished = true;
                    if let Some(call) = &self.call {
                        call.request_closed.store(true, Ordering::Relaxed);
                    }
                }
                sent
            }
            None => {
                // The receiving side reports why; the request stream is
                // not ended (see `Drop`).
                self.closed = true;
                Err(())
            }
        }
    }
}

/// A send half dropped before its last message does not end the request
/// stream at once: the `grpc` crate's transport would end it normally,
/// and a call its caller abandoned would read to the server as a complete
/// input. It waits for the caller's next read of the answer (then the drop
/// was its end of input), or, if the caller went away, is held until the
/// server ends the call.
impl<S: Send + 'static> Drop for DeadlineSendStream<S> {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        match &self.call {
            Some(call) if !self.finished => call.send_half_dropped(Box::new(inner)),
            _ => drop(inner),
        }
    }
}

/// Where a call's receiving side stands.
enum State<R> {
    /// Sent, waiting on the server.
    Open(R),
    /// Ended here with this status, not yet read by the caller.
    Failed(StatusError),
    /// Over: trailers were read.
    Closed,
}

/// The receiving side of a call made through
/// [`DeadlineInterceptor`](crate::DeadlineInterceptor).
///
/// At the deadline it answers `DEADLINE_EXCEEDED`, when the scope ends
/// `CANCELLED`, and drops the call's own stream either way (the `grpc`
/// crate resets it once the server's response headers have arrived). A
/// `CANCELLED` from the server that arrives after the deadline is read as
/// `DEADLINE_EXCEEDED`, as the gRPC spec asks; a failure whose trailers
/// say its retries were spent below is noted on the scope (the chain
/// budget).
///
/// ```
/// fn receives<R: grpc::client::RecvStream>(_: &R) {}
/// # fn check<R: grpc::client::RecvStream>(r: grpc_deadline_grpc::DeadlineRecvStream<R>) {
/// receives(&r);
/// # }
/// ```
pub struct DeadlineRecvStream<R: Send + 'static> {
    state: State<R>,
    watch: Watch,
    timer: Option<Pin<Box<Sleep>>>,
    /// The server's response headers arrived: from then on dropping the
    /// call's stream resets it.
    headers_seen: bool,
    stats: Arc<Stats>,
    /// The method, for what the interceptor reports.
    method: Arc<str>,
    /// The ledger's note of the call, until it ends.
    note: Option<Note>,
    /// What it shares with the sending side (none for a call that failed
    /// before it left, or when the transport resets what it drops).
    call: Option<Arc<Call>>,
}

impl<R: Send + 'static> DeadlineRecvStream<R> {
    pub(crate) fn open(
        inner: R,
        watch: Watch,
        stats: Arc<Stats>,
        method: Arc<str>,
        note: Option<Note>,
        call: Option<Arc<Call>>,
    ) -> Self {
        Self {
            state: State::Open(inner),
            watch,
            timer: None,
            headers_seen: false,
            stats,
            method,
            note,
            call,
        }
    }

    /// Ends the ledger's note of the call with `code`.
    fn note_end(&mut self, code: Code, trailers: Option<&grpc::metadata::MetadataMap>) {
        if let (Some(note), Some(scope)) = (self.note.take(), &self.watch.scope) {
            note.ended(scope, code, trailers);
        }
    }

    pub(crate) fn failed(status: StatusError, stats: Arc<Stats>, method: Arc<str>) -> Self {
        Self {
            state: State::Failed(status),
            watch: Watch {
                scope: None,
                deadline: None,
            },
            timer: None,
            headers_seen: false,
            stats,
            method,
            note: None,
            call: None,
        }
    }

    /// The call ended here with `cause`: its stream is let go of.
    fn end(&mut self, cause: Cause) -> ResponseStreamItem {
        self.note_end(cause.code(), None);
        if let State::Open(inner) = std::mem::replace(&mut self.state, State::Closed) {
            self.abandon(inner, Some(cause));
        }
        ResponseStreamItem::Trailers(Trailers::new(Err(status::ended(cause, true))))
    }

    /// The caller went away (`cause`: why, if its scope or deadline says;
    /// none for a call it dropped) before the answer's end.
    ///
    /// A transport that resets what it drops lets the call go now. The
    /// `grpc` crate's own cannot: before the server's response headers it
    /// keeps the stream on a task of its own, and a dropped request stream
    /// it ends normally. So a call whose request stream is still open is
    /// held, both halves, until the server has ended it at the deadline
    /// it was sent; and a call the server was not told of at once (a
    /// cause other than the deadline it has) is counted and warned about.
    fn abandon(&mut self, inner: R, cause: Option<Cause>) {
        let Some(call) = self.call.take() else {
            drop(inner);
            return;
        };
        let (parked, open) = call.abandon();
        if cause != Some(Cause::DeadlineExceeded) && (open || !self.headers_seen) {
            self.stats.note_cancel_not_reset(&self.method);
        }
        if open {
            let mut held: Vec<Box<dyn Any + Send>> = vec![Box::new(inner)];
            held.extend(parked);
            call.hold(held);
        }
    }

    /// The server's trailers, read by the spec's rules for a call with a
    /// deadline, and the chain budget's mark noted.
    fn trailers(&mut self, trailers: Trailers) -> ResponseStreamItem {
        self.state = State::Closed;
        if let Some(call) = self.call.take() {
            call.done();
        }
        let Err(error) = trailers.status() else {
            self.note_end(Code::Ok, None);
            return ResponseStreamItem::Trailers(trailers);
        };
        if let Some(scope) = &self.watch.scope
            && trailers
                .metadata()
                .get(PUSHBACK)
                .is_some_and(|v| v.to_str().starts_with('-'))
        {
            scope.note_retries_spent();
        }
        let late_cancel = error.code() == StatusCodeError::Cancelled
            && self.watch.deadline.is_some_and(|d| d <= Instant::now());
        if !late_cancel {
            let code = Code::from_i32(error.code() as i32);
            self.note_end(code, Some(trailers.metadata()));
            return ResponseStreamItem::Trailers(trailers);
        }
        self.note_end(Code::DeadlineExceeded, Some(trailers.metadata()));
        let status = StatusError::new(
            StatusCodeError::DeadlineExceeded,
            format!(
                "deadline exceeded (the server answered CANCELLED: {})",
                error.message()
            ),
        );
        let metadata = trailers.metadata().clone();
        ResponseStreamItem::Trailers(Trailers::new(Err(status)).with_metadata(metadata))
    }
}

/// A call dropped open — because its scope ended (a handler dropped when
/// its caller went away), or by the caller itself (a `select!`, a
/// `timeout` around it) — is abandoned too: held or let go as
/// `DeadlineRecvStream::abandon` says, and reported when the
/// server cannot be told.
impl<R: Send + 'static> Drop for DeadlineRecvStream<R> {
    fn drop(&mut self) {
        let State::Open(inner) = std::mem::replace(&mut self.state, State::Closed) else {
            return;
        };
        let cause = self.watch.ended_now();
        if let Some(cause) = cause {
            self.note_end(cause.code(), None);
        }
        self.abandon(inner, cause);
    }
}

impl<R: Send + 'static> fmt::Debug for DeadlineRecvStream<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Open(_) => "open",
            State::Failed(_) => "failed",
            State::Closed => "closed",
        };
        f.debug_struct("DeadlineRecvStream")
            .field("state", &state)
            .field("deadline", &self.watch.deadline)
            .finish_non_exhaustive()
    }
}

impl<R: RecvStream + Send + 'static> RecvStream for DeadlineRecvStream<R> {
    async fn recv(&mut self, msg: &mut dyn RecvMessage) -> ResponseStreamItem {
        match std::mem::replace(&mut self.state, State::Closed) {
            State::Open(inner) => self.state = State::Open(inner),
            State::Failed(status) => {
                return ResponseStreamItem::Trailers(Trailers::new(Err(status)));
            }
            State::Closed => return ResponseStreamItem::StreamClosed,
        }
        if let Some(cause) = self.watch.ended_now() {
            return self.end(cause);
        }
        // The caller reads the answer: a send half it dropped was its end
        // of input.
        if let Some(call) = &self.call {
            call.let_parked_go();
        }
        let State::Open(inner) = &mut self.state else {
            return ResponseStreamItem::StreamClosed;
        };
        let call = self.call.as_deref();
        let item = {
            let recv = inner.recv(msg);
            tokio::pin!(recv);
            loop {
                let parked_now = async {
                    match call {
                        Some(call) => call.parked_now.notified().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    biased;
                    cause = self.watch.ended(&mut self.timer) => break Err(cause),
                    () = parked_now => {
                        // A send half dropped while this read waits.
                        if let Some(call) = call && self.watch.ended_now().is_none() {
                            call.let_parked_go();
                        }
                    }
                    item = &mut recv => break Ok(item),
                }
            }
        };
        match item {
            Err(cause) => self.end(cause),
            Ok(ResponseStreamItem::Headers(headers)) => {
                self.headers_seen = true;
                ResponseStreamItem::Headers(headers)
            }
            Ok(ResponseStreamItem::Trailers(trailers)) => self.trailers(trailers),
            Ok(ResponseStreamItem::StreamClosed) => {
                self.state = State::Closed;
                if let Some(call) = self.call.take() {
                    call.done();
                }
                ResponseStreamItem::StreamClosed
            }
            Ok(item) => item,
        }
    }
}

/// How long after it was written a call's `grpc-timeout` left.
pub(crate) fn late(written: Instant) -> Duration {
    Instant::now().saturating_duration_since(written)
}
