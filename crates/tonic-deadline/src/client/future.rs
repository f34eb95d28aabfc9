use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderValue, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{DropGuard, WaitForCancellationFutureOwned};

use super::body::ClientBody;
use super::transport::lost_connection_status;
use crate::BoxError;
use crate::scope::{Cause, Scope};
use crate::status::status_for;

pin_project! {
    /// The response future of [`ClientDeadline`](super::ClientDeadline).
    ///
    /// # Cancellation safety
    ///
    /// Dropping it drops the inner call, which resets the HTTP/2 stream.
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Failed { status: Option<tonic::Status> },
        Running {
            #[pin]
            inner: F,
            #[pin]
            race: Race,
        },
    }
}

pin_project! {
    /// What a call races against: its deadline and its scope's cancellation.
    ///
    /// It also owns the call's *abandon* signal: dropping the race (or
    /// [`abandon`](Race::abandon)) ends the request body with a stream reset.
    pub(crate) struct Race {
        deadline: Option<Instant>,
        timer: Option<Pin<Box<Sleep>>>,
        #[pin]
        cancelled: Option<WaitForCancellationFutureOwned>,
        scope: Option<Scope>,
        abandon: Option<DropGuard>,
    }
}

impl Race {
    pub(crate) fn new(
        deadline: Option<Instant>,
        scope: Option<Scope>,
        abandon: Option<DropGuard>,
    ) -> Self {
        Self::with_timer(
            deadline,
            deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
            scope,
            abandon,
        )
    }

    fn with_timer(
        deadline: Option<Instant>,
        timer: Option<Pin<Box<Sleep>>>,
        scope: Option<Scope>,
        abandon: Option<DropGuard>,
    ) -> Self {
        Self {
            deadline,
            timer,
            cancelled: scope.as_ref().map(|s| s.token().clone().cancelled_owned()),
            scope,
            abandon,
        }
    }

    /// The same race for the response body, reusing the registered timer.
    pub(crate) fn for_body(self: Pin<&mut Self>) -> Race {
        let this = self.project();
        Race::with_timer(
            *this.deadline,
            this.timer.take(),
            this.scope.take(),
            this.abandon.take(),
        )
    }

    /// Gives the call up now: the request body ends with a stream reset, so
    /// the server learns even if the caller still holds its request stream.
    pub(crate) fn abandon(self: Pin<&mut Self>) {
        drop(self.project().abandon.take());
    }

    /// Ready with the status to report once the deadline passes or the
    /// scope ends.
    pub(crate) fn poll_lost(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<tonic::Status> {
        let mut this = self.project();
        if let Some(timer) = this.timer.as_mut()
            && timer.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(status_for(Cause::DeadlineExceeded));
        }
        if let Some(cancelled) = this.cancelled.as_mut().as_pin_mut()
            && cancelled.poll(cx).is_ready()
        {
            let cause = this
                .scope
                .as_ref()
                .and_then(Scope::cause)
                .unwrap_or(Cause::Cancelled);
            return Poll::Ready(status_for(cause));
        }
        Poll::Pending
    }

    pub(crate) fn is_past_deadline(&self) -> bool {
        self.deadline.is_some_and(|d| d <= Instant::now())
    }

    /// Our deadline passed, so a `CANCELLED` the server sent is really ours
    /// expiring (gRPC spec, "Client Cancellation"): report it as such.
    pub(crate) fn correct_late_cancel(&self, headers: &mut HeaderMap) {
        if headers.get("grpc-status").is_some_and(|v| v == "1") && self.is_past_deadline() {
            headers.insert("grpc-status", HeaderValue::from_static("4"));
            headers.insert(
                "grpc-message",
                HeaderValue::from_static("deadline exceeded"),
            );
        }
    }

    /// Maps an error of the inner call: any failure after our deadline is the
    /// deadline's doing; a lost connection is `UNAVAILABLE`, or `INTERNAL`
    /// when it broke off a response message (`mid_message`); the rest passes
    /// through for tonic to classify.
    pub(crate) fn map_error(&self, err: BoxError, mid_message: bool) -> BoxError {
        if self.is_past_deadline() {
            Box::new(status_for(Cause::DeadlineExceeded))
        } else if let Some(status) = lost_connection_status(&*err, mid_message) {
            Box::new(status)
        } else {
            err
        }
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn failed(status: tonic::Status) -> Self {
        Self {
            state: State::Failed {
                status: Some(status),
            },
        }
    }

    pub(super) fn running(
        inner: F,
        deadline: Option<Instant>,
        scope: Option<Scope>,
        abandon: DropGuard,
    ) -> Self {
        Self {
            state: State::Running {
                inner,
                race: Race::new(deadline, scope, Some(abandon)),
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Response<ClientBody<B>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Failed { status } => {
                let status = status
                    .take()
                    .expect("ResponseFuture polled after completion");
                Poll::Ready(Err(Box::new(status)))
            }
            StateProj::Running { inner, mut race } => {
                if let Poll::Ready(status) = race.as_mut().poll_lost(cx) {
                    race.abandon();
                    return Poll::Ready(Err(Box::new(status)));
                }
                match inner.poll(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(Err(err)) => Poll::Ready(Err(race.map_error(err.into(), false))),
                    Poll::Ready(Ok(mut response)) => {
                        race.correct_late_cancel(response.headers_mut());
                        let race = race.for_body();
                        Poll::Ready(Ok(response.map(|body| ClientBody::new(body, race))))
                    }
                }
            }
        }
    }
}
