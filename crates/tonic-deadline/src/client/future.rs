use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use pin_project_lite::pin_project;

use super::WaitCheck;
use super::body::ClientBody;
use super::deadline_race::{Race, error_code};
use crate::BoxError;

pin_project! {
    /// The response future of [`ClientDeadline`](super::ClientDeadline).
    ///
    /// # Cancellation safety
    ///
    /// Dropping it drops the inner call, which resets the HTTP/2 stream.
    ///
    /// ```
    /// use tonic_deadline::BoxError;
    /// use tonic_deadline::client::{ClientDeadline, ResponseFuture};
    /// use tower_service::Service;
    ///
    /// // The future of one call through the client layer.
    /// fn future_of<S>(
    ///     client: &mut ClientDeadline<S>,
    ///     request: http::Request<tonic::body::Body>,
    /// ) -> ResponseFuture<S::Future>
    /// where
    ///     S: Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>>,
    ///     S::Error: Into<BoxError>,
    /// {
    ///     client.call(request)
    /// }
    /// ```
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
            // Set for a call that asked to wait for ready.
            waits: Option<Box<WaitCheck>>,
        },
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

    pub(super) fn running(inner: F, race: Race, waits: Option<Box<WaitCheck>>) -> Self {
        Self {
            state: State::Running { inner, race, waits },
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
        let mut state = self.project().state;
        let lost = match state.as_mut().project() {
            StateProj::Failed { status } => {
                let status = status
                    .take()
                    .expect("ResponseFuture polled after completion");
                return Poll::Ready(Err(Box::new(status)));
            }
            StateProj::Running {
                inner,
                mut race,
                waits,
            } => {
                // The call first: a head that has arrived goes on to the
                // body, whose first poll reads the clock and the scope (see
                // `Race::for_body`), so a deadline or cancel that came with
                // it is still reported; a call still pending asks the race.
                let polled = {
                    let _entered = race.span().map(tracing::Span::enter);
                    inner.poll(cx)
                };
                match polled {
                    Poll::Pending => {
                        let mut lost = race.as_mut().poll_lost(cx);
                        if lost.is_pending() {
                            lost = race.as_mut().arm(cx);
                        }
                        let Poll::Ready(status) = lost else {
                            return Poll::Pending;
                        };
                        race.as_mut().settle(status.code());
                        race.abandon();
                        status
                    }
                    Poll::Ready(Err(err)) => {
                        let mut err = race.map_error(err.into(), false);
                        if let Some(waits) = waits {
                            err = waits.map_error(err);
                        }
                        race.settle(error_code(&err));
                        return Poll::Ready(Err(err));
                    }
                    Poll::Ready(Ok(mut response)) => {
                        race.as_mut().settle_answer(response.headers_mut());
                        let race = race.for_body();
                        return Poll::Ready(Ok(response.map(|body| ClientBody::new(body, race))));
                    }
                }
            }
        };
        // Lost: let go of the stream now, so its reset goes out before the
        // caller has even seen the status, not when it drops this future.
        state.set(State::Failed { status: None });
        Poll::Ready(Err(Box::new(lost)))
    }
}
