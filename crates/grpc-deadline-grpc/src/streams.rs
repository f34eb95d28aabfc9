//! The streams of a call under the interceptor: each wait on them races the
//! call's deadline and its scope.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use grpc::client::{RecvStream, ResponseStreamItem, SendOptions, SendStream};
use grpc::core::{RecvMessage, SendMessage, Trailers};
use grpc::{StatusCodeError, StatusError};
use grpc_deadline::{Cause, Code, Scope};
use tokio::time::{Instant, Sleep};

use crate::interceptor::Config;
use crate::ledger::Note;
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
pub struct DeadlineSendStream<S> {
    inner: Option<S>,
    watch: Watch,
    timer: Option<Pin<Box<Sleep>>>,
}

impl<S> DeadlineSendStream<S> {
    pub(crate) fn new(inner: Option<S>, watch: Watch) -> Self {
        Self {
            inner,
            watch,
            timer: None,
        }
    }
}

impl<S> fmt::Debug for DeadlineSendStream<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadlineSendStream")
            .field("open", &self.inner.is_some())
            .finish_non_exhaustive()
    }
}

impl<S: SendStream> SendStream for DeadlineSendStream<S> {
    async fn send(&mut self, msg: &dyn SendMessage, options: SendOptions) -> Result<(), ()> {
        if self.watch.ended_now().is_some() {
            self.inner = None;
        }
        let Some(inner) = self.inner.as_mut() else {
            return Err(());
        };
        let sent = {
            let send = inner.send(msg, options);
            tokio::select! {
                biased;
                _ = self.watch.ended(&mut self.timer) => None,
                sent = send => Some(sent),
            }
        };
        match sent {
            Some(sent) => sent,
            None => {
                // Ends the request stream; the receiving side reports why.
                self.inner = None;
                Err(())
            }
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
pub struct DeadlineRecvStream<R> {
    state: State<R>,
    watch: Watch,
    timer: Option<Pin<Box<Sleep>>>,
    /// The server's response headers arrived: from then on dropping the
    /// call's stream resets it.
    headers_seen: bool,
    config: Arc<Config>,
    /// The method, for what the interceptor reports.
    method: Arc<str>,
    /// The ledger's note of the call, until it ends.
    note: Option<Note>,
}

impl<R> DeadlineRecvStream<R> {
    pub(crate) fn open(
        inner: R,
        watch: Watch,
        config: Arc<Config>,
        method: Arc<str>,
        note: Option<Note>,
    ) -> Self {
        Self {
            state: State::Open(inner),
            watch,
            timer: None,
            headers_seen: false,
            config,
            method,
            note,
        }
    }

    /// Ends the ledger's note of the call with `code`.
    fn note_end(&mut self, code: Code, trailers: Option<&grpc::metadata::MetadataMap>) {
        if let (Some(note), Some(scope)) = (self.note.take(), &self.watch.scope) {
            note.ended(scope, code, trailers);
        }
    }

    pub(crate) fn failed(status: StatusError, config: Arc<Config>, method: Arc<str>) -> Self {
        Self {
            state: State::Failed(status),
            watch: Watch {
                scope: None,
                deadline: None,
            },
            timer: None,
            headers_seen: false,
            config,
            method,
            note: None,
        }
    }

    /// The call ended here with `cause`: its stream is dropped now.
    fn end(&mut self, cause: Cause) -> ResponseStreamItem {
        self.state = State::Closed;
        self.note_end(cause.code(), None);
        if cause != Cause::DeadlineExceeded && !self.headers_seen {
            // The server was told the deadline, not the cancel: until its
            // response headers arrive, the grpc crate keeps the stream on
            // a task of its own that nothing here can reach.
            self.config.cancel_not_reset(&self.method);
        }
        ResponseStreamItem::Trailers(Trailers::new(Err(status::ended(cause, true))))
    }

    /// The server's trailers, read by the spec's rules for a call with a
    /// deadline, and the chain budget's mark noted.
    fn trailers(&mut self, trailers: Trailers) -> ResponseStreamItem {
        self.state = State::Closed;
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

/// A call dropped open because its scope ended (a handler dropped when its
/// caller went away) is a cancel too: the same report when the server
/// cannot be told.
impl<R> Drop for DeadlineRecvStream<R> {
    fn drop(&mut self) {
        if !matches!(self.state, State::Open(_)) {
            return;
        }
        let Some(cause) = self.watch.scope.as_ref().and_then(Scope::cause) else {
            return;
        };
        if cause != Cause::DeadlineExceeded && !self.headers_seen {
            self.config.cancel_not_reset(&self.method);
        }
        self.note_end(cause.code(), None);
    }
}

impl<R> fmt::Debug for DeadlineRecvStream<R> {
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

impl<R: RecvStream> RecvStream for DeadlineRecvStream<R> {
    async fn recv(&mut self, msg: &mut dyn RecvMessage) -> ResponseStreamItem {
        match std::mem::replace(&mut self.state, State::Closed) {
            State::Open(inner) => self.state = State::Open(inner),
            State::Failed(status) => {
                return ResponseStreamItem::Trailers(Trailers::new(Err(status)));
            }
            State::Closed => return ResponseStreamItem::StreamClosed,
        }
        let State::Open(inner) = &mut self.state else {
            return ResponseStreamItem::StreamClosed;
        };
        let item = {
            let recv = inner.recv(msg);
            tokio::select! {
                biased;
                cause = self.watch.ended(&mut self.timer) => Err(cause),
                item = recv => Ok(item),
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
