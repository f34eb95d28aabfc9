//! The two sides of a call made through [`TonicInvoke`](super::TonicInvoke).

use std::fmt;
use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use grpc::client::{RecvStream, ResponseStreamItem, SendOptions, SendStream};
use grpc::core::{RecvMessage, ResponseHeaders, SendMessage, Trailers};
use grpc::{StatusCodeError, StatusError};
use tokio::sync::mpsc;
use tonic::CancellationHandle;
use tonic::Streaming;

use super::call::{Dispatch, Side};
use super::codec::Outgoing;

/// The call's streams, its request handed to the connection.
pub(super) fn open(
    queue: mpsc::Sender<Outgoing>,
    finished: Arc<AtomicBool>,
    cancel: CancellationHandle,
    dispatch: Arc<Dispatch>,
) -> (TonicSendStream, TonicRecvStream) {
    let request = Arc::new(Request {
        finished,
        parked: Mutex::new(None),
        reading: AtomicBool::new(false),
    });
    (
        TonicSendStream {
            queue: Some(queue),
            request: request.clone(),
            cancel: Some(cancel.clone()),
            dispatch: Some(dispatch.clone()),
        },
        TonicRecvStream {
            state: State::Awaiting(dispatch),
            cancel: Some(cancel),
            request,
        },
    )
}

/// What the two sides share of the request: whether it is finished, and
/// the queue of a sending side dropped before its last message.
///
/// The `grpc` crate's generated client-streaming calls finish an upload by
/// dropping the sending side and then reading the answer; a call dropped
/// whole (a `select!`, a `timeout`) drops the sending side too, then the
/// receiving side unread. So a sending side dropped unfinished while
/// nothing reads ends the request only when the caller next reads (then
/// cleanly, `END_STREAM`), and the call is reset if the receiving side is
/// dropped instead. Dropped while a read waits, it ends the request at once.
struct Request {
    finished: Arc<AtomicBool>,
    parked: Mutex<Option<mpsc::Sender<Outgoing>>>,
    /// A read of the receiving side is under way.
    reading: AtomicBool,
}

impl Request {
    fn parked(&self) -> std::sync::MutexGuard<'_, Option<mpsc::Sender<Outgoing>>> {
        // Nothing panics while holding it; a poisoned lock is still sound.
        self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The caller reads the answer: a sending side it dropped was its end
    /// of input.
    fn end_parked(&self) {
        let queue = self.parked().take();
        if queue.is_some() {
            // Set before the queue is dropped: its close is what ends the
            // request's messages.
            self.finished.store(true, Ordering::Release);
        }
        drop(queue);
    }
}

/// Marks a read under way for as long as it lives.
struct Reading<'a>(&'a Request);

impl<'a> Reading<'a> {
    fn start(request: &'a Request) -> Self {
        request.reading.store(true, Ordering::Release);
        Self(request)
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.reading.store(false, Ordering::Release);
    }
}

/// A call failed before anything was sent: its streams say so.
pub(super) fn failed(status: StatusError) -> (TonicSendStream, TonicRecvStream) {
    (
        TonicSendStream {
            queue: None,
            request: Arc::new(Request {
                finished: Arc::new(AtomicBool::new(true)),
                parked: Mutex::new(None),
                reading: AtomicBool::new(false),
            }),
            cancel: None,
            dispatch: None,
        },
        TonicRecvStream {
            state: State::Failed(status),
            cancel: None,
            request: Arc::new(Request {
                finished: Arc::new(AtomicBool::new(true)),
                parked: Mutex::new(None),
                reading: AtomicBool::new(false),
            }),
        },
    )
}

/// The sending side of a call made through [`TonicInvoke`](super::TonicInvoke).
///
/// A message sent with `final_msg` half-closes the request (`END_STREAM`).
/// Dropped before that, the sending side ends the request when the caller
/// reads the answer (at once if a read is under way) — how the crate's
/// generated client-streaming calls finish an upload — and the call is
/// reset (`RST_STREAM CANCEL`) if the receiving side is dropped instead:
/// the server never takes an abandoned request for a complete one. A send
/// waits while the connection takes the message before it (one is queued
/// per call).
///
/// ```
/// fn sends<S: grpc::client::SendStream>(_: &S) {}
/// # fn check(s: grpc_deadline_grpc::TonicSendStream) {
/// sends(&s);
/// # }
/// ```
pub struct TonicSendStream {
    /// `None` once the request is finished or the call is over.
    queue: Option<mpsc::Sender<Outgoing>>,
    request: Arc<Request>,
    cancel: Option<CancellationHandle>,
    /// Driven while a send waits, until the answer is in.
    dispatch: Option<Arc<Dispatch>>,
}

impl fmt::Debug for TonicSendStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TonicSendStream")
            .field("open", &self.queue.is_some())
            .field("finished", &self.request.finished.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl TonicSendStream {
    /// The call is over for this side: reset unless the request was
    /// finished.
    fn close(&mut self) {
        if !self.request.finished.load(Ordering::Acquire)
            && let Some(cancel) = self.cancel.take()
        {
            // Before the queue is dropped: the request's messages must
            // never see a clean end (see `RequestMessages`).
            cancel.cancel();
        }
        self.queue = None;
        self.dispatch = None;
    }
}

/// See `Request` above: dropped unfinished, the request ends when the caller
/// reads the answer, or the call is reset when it drops the receiving side.
impl Drop for TonicSendStream {
    fn drop(&mut self) {
        let Some(queue) = self.queue.take() else {
            return;
        };
        if self.request.finished.load(Ordering::Acquire) {
            return;
        }
        *self.request.parked() = Some(queue);
        if self.request.reading.load(Ordering::Acquire) {
            self.request.end_parked();
        }
        self.dispatch = None;
    }
}

impl SendStream for TonicSendStream {
    async fn send(&mut self, msg: &dyn SendMessage, options: SendOptions) -> Result<(), ()> {
        // A clone, so that the queue can be closed below; dropped with
        // this call.
        let Some(queue) = self.queue.clone() else {
            return Err(());
        };
        let Ok(message) = msg.encode() else {
            // A message that cannot be encoded ends the call: the request
            // as sent so far is not the one meant.
            self.close();
            return Err(());
        };
        let mut driving = self.dispatch.clone();
        let reserve = queue.reserve();
        tokio::pin!(reserve);
        let permit = loop {
            let Some(dispatch) = driving.clone() else {
                break reserve.await;
            };
            tokio::select! {
                biased;
                permit = &mut reserve => break permit,
                () = poll_fn(|cx| dispatch.poll_side(Side::Send, cx)) => driving = None,
            }
        };
        let Ok(permit) = permit else {
            // The call is over (answered, reset, or dropped).
            self.queue = None;
            return Err(());
        };
        permit.send(message);
        if options.final_msg {
            // Set before the queue is dropped: its close is what ends the
            // request's messages.
            self.request.finished.store(true, Ordering::Release);
            self.queue = None;
            self.dispatch = None;
        }
        Ok(())
    }
}

/// Where a call's receiving side stands.
enum State {
    /// Sent; the server's response headers not yet read.
    Awaiting(Arc<Dispatch>),
    /// The response headers read; messages and trailers to come.
    Streaming(Streaming<Bytes>),
    /// Failed before anything was sent; not yet read.
    Failed(StatusError),
    /// Trailers read.
    Closed,
}

/// The receiving side of a call made through
/// [`TonicInvoke`](super::TonicInvoke). The call belongs to it: dropped
/// before the call's trailers, it resets the call's stream
/// (`RST_STREAM CANCEL`), before the server's response headers as after.
///
/// ```
/// fn receives<R: grpc::client::RecvStream>(_: &R) {}
/// # fn check(r: grpc_deadline_grpc::TonicRecvStream) {
/// receives(&r);
/// # }
/// ```
pub struct TonicRecvStream {
    state: State,
    cancel: Option<CancellationHandle>,
    request: Arc<Request>,
}

impl fmt::Debug for TonicRecvStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Awaiting(_) => "awaiting headers",
            State::Streaming(_) => "streaming",
            State::Failed(_) => "failed",
            State::Closed => "closed",
        };
        f.debug_struct("TonicRecvStream")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl Drop for TonicRecvStream {
    fn drop(&mut self) {
        let state = std::mem::replace(&mut self.state, State::Closed);
        if matches!(state, State::Closed | State::Failed(_)) {
            return;
        }
        // The request body may still be open (a client stream): it must
        // end with the reset, not with a clean end — a queue the sending
        // side left goes only after the cancel.
        if let Some(cancel) = self.cancel.take() {
            cancel.cancel();
        }
        drop(self.request.parked().take());
        if let State::Awaiting(dispatch) = &state {
            // Drops tonic's call now, even while the sending side still
            // holds the dispatch: hyper resets the stream.
            dispatch.drop_call();
        }
    }
}

impl TonicRecvStream {
    /// The call is over: what the caller reads last.
    fn end(
        &mut self,
        status: Result<(), StatusError>,
        metadata: Option<tonic::metadata::MetadataMap>,
    ) -> ResponseStreamItem {
        self.state = State::Closed;
        // The request may still be open: nothing more will be read.
        if let Some(cancel) = self.cancel.take() {
            cancel.cancel();
        }
        drop(self.request.parked().take());
        ResponseStreamItem::Trailers(trailers(status, metadata))
    }
}

impl RecvStream for TonicRecvStream {
    async fn recv(&mut self, msg: &mut dyn RecvMessage) -> ResponseStreamItem {
        // The caller reads: a sending side it dropped was its end of input,
        // and one it drops while this read waits is too.
        let request = self.request.clone();
        let _reading = Reading::start(&request);
        request.end_parked();
        match std::mem::replace(&mut self.state, State::Closed) {
            State::Closed => ResponseStreamItem::StreamClosed,
            State::Failed(status) => ResponseStreamItem::Trailers(Trailers::new(Err(status))),
            State::Awaiting(dispatch) => {
                self.state = State::Awaiting(dispatch.clone());
                let answer = poll_fn(|cx| dispatch.poll_answer(cx)).await;
                match answer {
                    None => self.end(
                        Err(StatusError::new(
                            StatusCodeError::Cancelled,
                            "the call was dropped",
                        )),
                        None,
                    ),
                    Some(Err(status)) => {
                        let metadata = status.metadata().clone();
                        self.end(Err(status_error(&status)), Some(metadata))
                    }
                    Some(Ok(response)) => {
                        let (metadata, body, _) = response.into_parts();
                        match grpc::metadata::MetadataMap::try_from(metadata) {
                            Ok(metadata) => {
                                self.state = State::Streaming(body);
                                ResponseStreamItem::Headers(
                                    ResponseHeaders::new().with_metadata(metadata),
                                )
                            }
                            Err(e) => self.end(
                                Err(StatusError::new(
                                    StatusCodeError::Internal,
                                    format!("malformed response headers: {e}"),
                                )),
                                None,
                            ),
                        }
                    }
                }
            }
            State::Streaming(mut body) => match body.message().await {
                Ok(Some(mut message)) => match msg.decode(&mut message) {
                    Ok(()) => {
                        self.state = State::Streaming(body);
                        ResponseStreamItem::Message
                    }
                    Err(e) => self.end(
                        Err(StatusError::new(
                            StatusCodeError::Internal,
                            format!("error decoding response: {e}"),
                        )),
                        None,
                    ),
                },
                Ok(None) => match body.trailers().await {
                    Ok(metadata) => self.end(Ok(()), metadata),
                    Err(status) => {
                        let metadata = status.metadata().clone();
                        self.end(Err(status_error(&status)), Some(metadata))
                    }
                },
                Err(status) => {
                    let metadata = status.metadata().clone();
                    self.end(Err(status_error(&status)), Some(metadata))
                }
            },
        }
    }
}

/// A tonic status as the `grpc` crate's (the two number codes alike).
fn status_error(status: &tonic::Status) -> StatusError {
    let code = match status.code() {
        // An OK status as an error is the peer's mistake.
        tonic::Code::Ok => StatusCodeError::Unknown,
        code => StatusCodeError::from(code as i32),
    };
    StatusError::new(code, status.message())
}

/// The trailers the caller reads, with the metadata the server sent.
fn trailers(
    status: Result<(), StatusError>,
    metadata: Option<tonic::metadata::MetadataMap>,
) -> Trailers {
    match metadata.map(grpc::metadata::MetadataMap::try_from) {
        None => Trailers::new(status),
        Some(Ok(metadata)) => Trailers::new(status).with_metadata(metadata),
        Some(Err(e)) => Trailers::new(Err(StatusError::new(
            StatusCodeError::Internal,
            format!("malformed trailers: {e}"),
        ))),
    }
}
