use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::hedge::Hedging;
use super::retry::Retrying;
use crate::BoxError;
use crate::scope::Cancelled;

pin_project! {
    /// The response future of [`Resilience`](super::Resilience): one call,
    /// sent once, retried (attempts one after another) or hedged (attempts
    /// racing), as its method's policy says.
    ///
    /// # Cancellation safety
    ///
    /// Dropping it drops every attempt in flight, which resets their
    /// streams.
    ///
    /// # Example
    ///
    /// One future type for every method, whatever its policy:
    ///
    /// ```
    /// use tonic_deadline::client::{ClientDeadline, ReadyChannel};
    /// use tonic_deadline::resilience::{Resilience, ResponseFuture};
    /// use tower::Service;
    ///
    /// type Stack = Resilience<ClientDeadline<ReadyChannel>>;
    /// fn calls_return<S>()
    /// where
    ///     S: Service<
    ///         http::Request<tonic::body::Body>,
    ///         Future = ResponseFuture<ClientDeadline<ReadyChannel>>,
    ///     >,
    /// {
    /// }
    /// calls_return::<Stack>();
    /// ```
    pub struct ResponseFuture<S>
    where
        S: Service<Request<tonic::body::Body>>,
    {
        // The attempt of a call sent once, or the one in flight of a
        // retried call (a hedged call boxes its attempts, so that their set
        // can grow and shrink).
        #[pin]
        attempt: Option<S::Future>,
        // The caller's scope ending, watched while no attempt is in flight
        // to see it.
        #[pin]
        cancelled: Option<Cancelled>,
        plan: Plan<S>,
    }
}

enum Plan<S: Service<Request<tonic::body::Body>>> {
    /// No policy: `attempt` is the call.
    Once,
    Retry(Retrying<S>),
    Hedge(Hedging<S>),
}

impl<S> std::fmt::Debug for ResponseFuture<S>
where
    S: Service<Request<tonic::body::Body>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (plan, call) = match &self.plan {
            Plan::Once => ("once", None),
            Plan::Retry(retrying) => ("retry", Some(&retrying.call)),
            Plan::Hedge(hedging) => ("hedge", Some(&hedging.call)),
        };
        f.debug_struct("ResponseFuture")
            .field("plan", &plan)
            .field("attempts", &call.map(|c| c.attempts))
            .finish_non_exhaustive()
    }
}

impl<S> ResponseFuture<S>
where
    S: Service<Request<tonic::body::Body>>,
{
    pub(super) fn once(future: S::Future) -> Self {
        Self {
            attempt: Some(future),
            cancelled: None,
            plan: Plan::Once,
        }
    }

    pub(super) fn retry(retrying: Retrying<S>) -> Self {
        Self {
            attempt: None,
            cancelled: retrying.call.watch(),
            plan: Plan::Retry(retrying),
        }
    }

    pub(super) fn hedge(hedging: Hedging<S>) -> Self {
        Self {
            attempt: None,
            cancelled: hedging.call.watch(),
            plan: Plan::Hedge(hedging),
        }
    }
}

impl<S, RB> Future for ResponseFuture<S>
where
    S: Service<Request<tonic::body::Body>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.plan {
            Plan::Once => this
                .attempt
                .as_pin_mut()
                .expect("ResponseFuture polled after completion")
                .poll(cx)
                .map_err(Into::into),
            Plan::Retry(retrying) => retrying.poll(this.attempt, this.cancelled, cx),
            Plan::Hedge(hedging) => hedging.poll(this.cancelled, cx),
        }
    }
}
