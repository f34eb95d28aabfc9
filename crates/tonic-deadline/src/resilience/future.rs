use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::BytesMut;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::core::{self, Buffered, Core, Replay, Template};
use super::hedge::Hedging;
use super::retry::Retrying;
use crate::BoxError;
use crate::observe::CallReport;
use crate::scope::{Cancelled, Scope};
use crate::status::status_for;

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

/// What every retried or hedged call keeps: the ready service, the caller's
/// scope, the request to make each attempt from, and how many were sent.
pub(super) struct Call<S> {
    pub(super) service: S,
    pub(super) core: Arc<Core>,
    pub(super) scope: Option<Scope>,
    template: Template,
    /// The body while it is read; the replay once read.
    body: Option<tonic::body::Body>,
    read: BytesMut,
    replay: Option<Replay>,
    /// Attempts sent.
    pub(super) attempts: u32,
}

impl<S> Call<S>
where
    S: Service<Request<tonic::body::Body>>,
{
    /// A call of `request` through `service`, which is ready for its first
    /// attempt, in the caller's `scope`.
    pub(super) fn new(
        service: S,
        core: Arc<Core>,
        scope: Option<Scope>,
        request: Request<tonic::body::Body>,
    ) -> Self {
        core.limiter.on_call();
        let (parts, body) = request.into_parts();
        Self {
            service,
            core,
            scope,
            template: Template::new(parts),
            body: Some(body),
            read: BytesMut::new(),
            replay: None,
            attempts: 0,
        }
    }

    pub(super) fn path(&self) -> &str {
        self.template.path()
    }

    /// The end of the caller's scope, to watch between attempts.
    fn watch(&self) -> Option<Cancelled> {
        self.scope.as_ref().map(Scope::cancelled)
    }

    /// Reads the request body for replay: `Ok(None)` once it is (at once if
    /// it was before); `Ok(Some(attempt))` when it is a live stream or too
    /// large, and was sent as the call's one attempt.
    pub(super) fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<S::Future>, BoxError>> {
        if self.replay.is_some() {
            return Poll::Ready(Ok(None));
        }
        let limit = self.core.settings.replay_buffer;
        match ready!(core::poll_buffer(&mut self.body, &mut self.read, limit, cx))? {
            Buffered::Replayable(replay) => {
                self.replay = Some(replay);
                Poll::Ready(Ok(None))
            }
            Buffered::Live(body) => {
                if let Some(metrics) = self.core.metrics() {
                    metrics.committed_unreplayable_call();
                }
                Poll::Ready(Ok(Some(self.send_with(body))))
            }
        }
    }

    /// Sends the next attempt, with the replayed body.
    pub(super) fn send(&mut self) -> S::Future {
        let body = self
            .replay
            .as_ref()
            .expect("read before the first attempt")
            .body();
        self.send_with(body)
    }

    fn send_with(&mut self, body: tonic::body::Body) -> S::Future {
        let scope = self.scope.as_ref().map(|s| self.core.attempt_scope(s));
        self.attempts += 1;
        let request = self.template.attempt(self.attempts, body, scope);
        self.service.call(request)
    }

    /// The status for a caller's scope that ended.
    pub(super) fn ended(&self) -> Option<tonic::Status> {
        self.scope.as_ref().and_then(Scope::cause).map(status_for)
    }

    /// Reports the call as it ends with `result`: `hedged` or retried, with
    /// `delay` spent backing off.
    pub(super) fn finish<T>(&self, hedged: bool, delay: Duration, result: T) -> Poll<T> {
        if let Some(metrics) = self.core.metrics() {
            metrics.resilient_call(
                self.template.path(),
                CallReport {
                    attempts: self.attempts,
                    hedged,
                    delay,
                },
            );
        }
        Poll::Ready(result)
    }
}
