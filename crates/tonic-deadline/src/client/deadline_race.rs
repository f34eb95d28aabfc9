//! What a call races against — its deadline and its scope — shared by the
//! response future and the response body.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderValue};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use super::abandon::Abandon;
use super::observer::Observation;
use super::transport::{lost_connection_status, reset_guard_status, unsent_status};
use crate::BoxError;
use crate::scope::{Cancelled, Cause, Scope};
use crate::status::status_for;
use crate::wire::{GRPC_MESSAGE, GRPC_STATUS, status_code};

pin_project! {
    /// What a call races against: its deadline and its scope's cancellation.
    ///
    /// Both are *armed* — a timer registered, a wait on the scope's token —
    /// only once the call is pending: a call that is answered on its first
    /// poll pays for neither. Before that the deadline is read off the clock
    /// (not at all on the call's first poll: `call` just did).
    ///
    /// Where the armed waits live is `W`: in place in the response future
    /// ([`Waits`]), boxed on first need in the response body
    /// ([`BoxedWaits`]), so that a body answered without waiting (a unary
    /// answer, read in one go) carries no timer to every place it is moved.
    ///
    /// It also owns the call's *abandon* signal: dropping the race (or
    /// [`abandon`](Race::abandon)) ends the request body with a stream reset.
    pub(crate) struct Race<W = Waits> {
        deadline: Option<Instant>,
        // Read the clock before the timer is armed.
        check_clock: bool,
        #[pin]
        waits: W,
        scope: Option<Scope>,
        abandon: Option<Abandon>,
        // Told once, with the first status seen (a layer with an observer
        // only).
        observed: Option<Box<dyn Observation>>,
        // Kept until the call ends, for the request's ledger.
        note: Option<CallNote>,
        // When the budget told to the server (`grpc-timeout`) runs out.
        told: Option<Instant>,
    }

    impl<W> PinnedDrop for Race<W> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if this.note.is_some() {
                // Dropped before it ended: its hop gave up on it.
                let code = match this.scope.as_ref().and_then(Scope::cause) {
                    Some(Cause::DeadlineExceeded) => tonic::Code::DeadlineExceeded,
                    _ => tonic::Code::Cancelled,
                };
                end_note(this.note, this.scope.as_ref(), *this.told, code, None);
            }
        }
    }
}

pin_project! {
    /// A call's armed waits: the timer at its deadline and the wait on its
    /// scope, each made when the call is first pending.
    #[derive(Default)]
    pub(crate) struct Waits {
        #[pin]
        timer: Option<Sleep>,
        #[pin]
        cancelled: Option<Cancelled>,
    }
}

/// The response body's waits, boxed when the body is first pending.
pub(crate) type BoxedWaits = Option<Pin<Box<Waits>>>;

/// Where a [`Race`] keeps its waits.
pub(crate) trait WaitSlot {
    /// The waits, if any were made.
    fn waits(self: Pin<&mut Self>) -> Option<Pin<&mut Waits>>;

    /// The waits, made now if they were not.
    fn made(self: Pin<&mut Self>) -> Pin<&mut Waits>;
}

impl WaitSlot for Waits {
    fn waits(self: Pin<&mut Self>) -> Option<Pin<&mut Waits>> {
        Some(self)
    }

    fn made(self: Pin<&mut Self>) -> Pin<&mut Waits> {
        self
    }
}

impl WaitSlot for BoxedWaits {
    fn waits(self: Pin<&mut Self>) -> Option<Pin<&mut Waits>> {
        // The box is the pinned place; the option around it moves freely.
        self.get_mut().as_mut().map(Pin::as_mut)
    }

    fn made(self: Pin<&mut Self>) -> Pin<&mut Waits> {
        self.get_mut()
            .get_or_insert_with(|| Box::pin(Waits::default()))
            .as_mut()
    }
}

#[cfg(feature = "ledger")]
pub(crate) use crate::ledger::CallNote;

/// Without the ledger, nothing is kept.
#[cfg(not(feature = "ledger"))]
#[derive(Debug)]
pub(crate) enum CallNote {}

#[cfg(not(feature = "ledger"))]
impl CallNote {
    pub(crate) fn ended(self, _: &Scope, _: crate::Code, _: Option<&HeaderMap>, _: Instant) {
        match self {}
    }
}

/// Ends the call's ledger note, if it has one, with `code` (and the answer
/// in `headers`, if one came).
fn end_note(
    note: &mut Option<CallNote>,
    scope: Option<&Scope>,
    told: Option<Instant>,
    code: tonic::Code,
    headers: Option<&HeaderMap>,
) {
    if let Some(note) = note.take()
        && let (Some(scope), Some(told)) = (scope, told)
    {
        note.ended(scope, code.into(), headers, told);
    }
}

impl Race {
    /// The race of a call made now: nothing armed yet.
    pub(crate) fn new(
        deadline: Option<Instant>,
        scope: Option<Scope>,
        abandon: Option<Abandon>,
        observed: Option<Box<dyn Observation>>,
        note: Option<CallNote>,
        told: Option<Instant>,
    ) -> Self {
        Self {
            deadline,
            check_clock: false,
            waits: Waits::default(),
            scope,
            abandon,
            observed,
            note,
            told,
        }
    }

    /// The same race for the response body, armed anew (and its waits
    /// boxed) only if the body is pending.
    pub(crate) fn for_body(self: Pin<&mut Self>) -> Race<BoxedWaits> {
        let this = self.project();
        Race {
            deadline: *this.deadline,
            check_clock: true,
            waits: None,
            scope: this.scope.take(),
            abandon: this.abandon.take(),
            observed: this.observed.take(),
            note: this.note.take(),
            told: *this.told,
        }
    }
}

impl<W: WaitSlot> Race<W> {
    /// The call's span, to enter while it is polled.
    pub(crate) fn span(&self) -> Option<&tracing::Span> {
        self.observed.as_deref().map(Observation::span)
    }

    /// Ends the call's report with `code` (the first status seen wins).
    pub(crate) fn settle(self: Pin<&mut Self>, code: tonic::Code) {
        let this = self.project();
        if let Some(observed) = this.observed.take() {
            observed.settle(code, None);
        }
        end_note(this.note, this.scope.as_ref(), *this.told, code, None);
    }

    /// The server's answer in `headers` (a trailers-only answer, or
    /// trailers), read once: a `CANCELLED` that arrives after our deadline
    /// is really ours expiring (gRPC spec, "Client Cancellation") and is
    /// rewritten as such; the call's report and ledger note end with its
    /// status.
    pub(crate) fn settle_answer(self: Pin<&mut Self>, headers: &mut HeaderMap) {
        if self.deadline.is_none() && self.observed.is_none() && self.note.is_none() {
            return;
        }
        // An OK answer, the usual one, is read without parsing.
        let mut code = match headers.get(GRPC_STATUS) {
            None => return,
            Some(ok) if ok == "0" => tonic::Code::Ok,
            Some(_) => match status_code(headers) {
                Some(code) => code,
                None => return,
            },
        };
        if code == tonic::Code::Cancelled && self.is_past_deadline() {
            headers.insert(GRPC_STATUS, HeaderValue::from_static("4"));
            headers.insert(GRPC_MESSAGE, HeaderValue::from_static("deadline exceeded"));
            code = tonic::Code::DeadlineExceeded;
        }
        let this = self.project();
        if let Some(observed) = this.observed.take() {
            observed.settle(code, this.scope.as_ref());
        }
        end_note(
            this.note,
            this.scope.as_ref(),
            *this.told,
            code,
            Some(headers),
        );
    }

    /// Gives the call up now: the request body ends with a stream reset, so
    /// the server learns even if the caller still holds its request stream.
    pub(crate) fn abandon(self: Pin<&mut Self>) {
        drop(self.project().abandon.take());
    }

    /// Ready with the status to report once the deadline has passed or the
    /// scope has ended; what is armed registers for a wake-up.
    pub(crate) fn poll_lost(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<tonic::Status> {
        let this = self.project();
        let (timer, cancelled) = match this.waits.waits() {
            Some(waits) => {
                let waits = waits.project();
                (waits.timer.as_pin_mut(), waits.cancelled.as_pin_mut())
            }
            None => (None, None),
        };
        match timer {
            Some(timer) => {
                if timer.poll(cx).is_ready() {
                    return Poll::Ready(status_for(Cause::DeadlineExceeded));
                }
            }
            None => {
                if std::mem::take(this.check_clock)
                    && this.deadline.is_some_and(|d| d <= Instant::now())
                {
                    return Poll::Ready(status_for(Cause::DeadlineExceeded));
                }
            }
        }
        match cancelled {
            Some(cancelled) => {
                if cancelled.poll(cx).is_ready() {
                    return Poll::Ready(status_for(cancel_cause(this.scope.as_ref())));
                }
            }
            None => {
                // The deadline is the timer's business; only a cancel here.
                if let Some(scope) = this.scope.as_ref()
                    && scope.is_cancelled()
                {
                    return Poll::Ready(status_for(scope.cause().unwrap_or(Cause::Cancelled)));
                }
            }
        }
        Poll::Pending
    }

    /// The call is pending: arm what is not armed yet, and poll it once so
    /// it registers. Ready if it already fired.
    pub(crate) fn arm(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<tonic::Status> {
        let this = self.project();
        if this.deadline.is_none() && this.scope.is_none() {
            return Poll::Pending;
        }
        let mut waits = this.waits.made().project();
        if waits.timer.is_none()
            && let Some(deadline) = *this.deadline
        {
            waits.timer.set(Some(tokio::time::sleep_until(deadline)));
            if let Some(timer) = waits.timer.as_mut().as_pin_mut()
                && timer.poll(cx).is_ready()
            {
                return Poll::Ready(status_for(Cause::DeadlineExceeded));
            }
        }
        if waits.cancelled.is_none()
            && let Some(scope) = this.scope.as_ref()
        {
            waits.cancelled.set(Some(scope.cancelled()));
            if let Some(cancelled) = waits.cancelled.as_mut().as_pin_mut()
                && cancelled.poll(cx).is_ready()
            {
                return Poll::Ready(status_for(cancel_cause(this.scope.as_ref())));
            }
        }
        Poll::Pending
    }

    pub(crate) fn is_past_deadline(&self) -> bool {
        self.deadline.is_some_and(|d| d <= Instant::now())
    }

    /// Maps an error of the inner call: any failure after our deadline is the
    /// deadline's doing; a connection closed by a guard against reset
    /// streams says so; a call the connection closed before it was sent is
    /// `UNAVAILABLE`; a lost connection is `UNAVAILABLE` too, or `INTERNAL`
    /// when it broke off a response message (`mid_message`); the rest
    /// passes through for tonic to classify.
    pub(crate) fn map_error(&self, err: BoxError, mid_message: bool) -> BoxError {
        // tonic's channel times each call by the `grpc-timeout` it carries
        // and fails it `CANCELLED` ("Timeout expired"): the budget told to
        // the server ran out, which is the call's deadline.
        // (`Endpoint::timeout`, shorter than the budget told, stays tonic's.)
        let told_ran_out = || {
            self.told.is_some_and(|told| told <= Instant::now())
                && crate::status::chain(&*err).any(|e| e.is::<tonic::TimeoutExpired>())
        };
        if self.is_past_deadline() || told_ran_out() {
            Box::new(status_for(Cause::DeadlineExceeded))
        } else if let Some(status) = reset_guard_status(&*err) {
            Box::new(status)
        } else if let Some(status) = unsent_status(&*err) {
            Box::new(status)
        } else if let Some(status) = lost_connection_status(&*err, mid_message) {
            Box::new(status)
        } else {
            err
        }
    }
}

/// The code of an error a call ends with.
pub(crate) fn error_code(err: &BoxError) -> tonic::Code {
    err.downcast_ref::<tonic::Status>()
        .map_or(tonic::Code::Unknown, tonic::Status::code)
}

/// Why a call's scope was cancelled, for its status.
fn cancel_cause(scope: Option<&Scope>) -> Cause {
    scope.and_then(Scope::cause).unwrap_or(Cause::Cancelled)
}
