//! The server concurrency limit: a tower layer that admits each request
//! through an [`Admission`] before its handler runs.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::{Admission, Permit, Reason, Refused, scope_of};
use crate::observe::{Metrics, Stage};
use crate::scope::Cause;

/// Limits how many requests run their handler at once; the rest wait in a
/// deadline-aware queue (see the [module docs](super)).
///
/// Place it *inside* [`ServerDeadlineLayer`](crate::ServerDeadlineLayer), so
/// the queue sees each request's scope: a queued request then leaves the
/// queue when its deadline passes or its caller resets the stream, and a
/// request that could not finish in time is answered `DEADLINE_EXCEEDED` at
/// once instead of occupying a slot. The permit is held until the response
/// body is finished (or dropped), so a streaming response counts as running.
///
/// How it differs from `tower::limit::ConcurrencyLimitLayer`: that one waits in
/// `poll_ready`, first-in-first-out, for as long as it takes, and knows no
/// deadline; this one queues per request, under the request's own budget.
///
/// ```no_run
/// use tonic_deadline::ServerDeadlineLayer;
/// use tonic_deadline::admission::{Admission, AdmissionLayer};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let (_, health) = tonic_health::server::health_reporter();
/// tonic::transport::Server::builder()
///     .layer(
///         tower::ServiceBuilder::new()
///             .layer(ServerDeadlineLayer::new())
///             .layer(AdmissionLayer::new(Admission::new(64))),
///     )
///     .add_service(health)
///     .serve("127.0.0.1:50051".parse()?)
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct AdmissionLayer {
    admission: Admission,
    metrics: Option<Metrics>,
}

impl AdmissionLayer {
    /// Admits requests through `admission` (shared by every clone).
    pub fn new(admission: Admission) -> Self {
        Self {
            admission,
            metrics: None,
        }
    }

    /// Reports into `metrics` how long each admitted request queued, the
    /// requests not admitted by reason, and those refused as already
    /// expired.
    ///
    /// ```
    /// use tonic_deadline::admission::{Admission, AdmissionLayer};
    /// use tonic_deadline::observe::Metrics;
    /// let metrics = Metrics::new();
    /// let layer = AdmissionLayer::new(Admission::new(8)).metrics(&metrics);
    /// # let _ = layer;
    /// ```
    pub fn metrics(mut self, metrics: &Metrics) -> Self {
        self.metrics = Some(metrics.clone());
        self
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admitted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Admitted {
            inner,
            admission: self.admission.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// The service produced by [`AdmissionLayer`].
#[derive(Debug, Clone)]
pub struct Admitted<S> {
    inner: S,
    admission: Admission,
    metrics: Option<Metrics>,
}

impl<S> Admitted<S> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> Service<Request<B>> for Admitted<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
    RB: Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<AdmittedBody<RB>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The ready service is the one to call; keep a fresh clone for the
        // next request (tower's usual hand-over).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let admission = self.admission.clone();
        let scope = scope_of(&request);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let acquired = admission.acquire(&scope).await;
            if let Some(metrics) = &metrics {
                report(metrics, request.uri().path(), &acquired);
            }
            let permit = match acquired {
                Ok(permit) => permit,
                Err(refused) => {
                    tracing::debug!(path = %request.uri().path(), %refused, "request not admitted");
                    let response: Response<AdmittedBody<RB>> =
                        tonic::Status::from(refused).into_http();
                    return Ok(response);
                }
            };
            let response = inner.call(request).await?;
            Ok(response.map(|body| AdmittedBody::holding(body, permit)))
        })
    }
}

/// Reports one admission decision.
fn report(metrics: &Metrics, path: &str, acquired: &Result<Permit, Refused>) {
    match acquired {
        Ok(permit) => metrics.admitted(&metrics.method(path), permit.waited()),
        Err(refused) => {
            let reason = match refused.reason() {
                Reason::Ended(Cause::DeadlineExceeded) => {
                    metrics.refused(Stage::Admission);
                    "deadline_exceeded"
                }
                Reason::Ended(_) => "cancelled",
                Reason::WouldNotFinish => "would_not_finish",
                Reason::QueueFull => "queue_full",
            };
            metrics.not_admitted(reason);
        }
    }
}

pin_project! {
    /// A response body that holds the request's admission permit until it
    /// is finished or dropped; empty when the request was refused.
    pub struct AdmittedBody<B> {
        #[pin]
        inner: Option<B>,
        permit: Option<Permit>,
    }
}

impl<B> AdmittedBody<B> {
    fn holding(inner: B, permit: Permit) -> Self {
        Self {
            inner: Some(inner),
            permit: Some(permit),
        }
    }
}

impl<B> Default for AdmittedBody<B> {
    fn default() -> Self {
        Self {
            inner: None,
            permit: None,
        }
    }
}

impl<B> fmt::Debug for AdmittedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmittedBody")
            .field("admitted", &self.inner.is_some())
            .finish_non_exhaustive()
    }
}

impl<B: Body> Body for AdmittedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let Some(inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(None);
        };
        let frame = inner.poll_frame(cx);
        if let Poll::Ready(None) = frame {
            // Finished: the resource is free before the stream is torn down.
            this.permit.take();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}
