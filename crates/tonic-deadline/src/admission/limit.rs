//! The server concurrency limit: a tower layer that admits each request
//! through an [`Admission`] before its handler runs.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::observer::Observer;
use super::{Admission, Permit, scope_of};

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
    /// Who observes the decisions (metrics); none by default.
    observer: Option<Arc<dyn Observer>>,
}

impl AdmissionLayer {
    /// Admits requests through `admission` (shared by every clone).
    pub fn new(admission: Admission) -> Self {
        Self {
            admission,
            observer: None,
        }
    }

    /// The layer with `observer` observing its decisions, in place of any
    /// it had (`observe` builds it: see `metrics`).
    #[cfg_attr(
        not(feature = "metrics"),
        allow(dead_code, reason = "only `observe::Metrics` observes this layer")
    )]
    pub(crate) fn observed_by(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admitted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Admitted {
            inner,
            admission: self.admission.clone(),
            observer: self.observer.clone(),
        }
    }
}

/// The service produced by [`AdmissionLayer`].
///
/// ```
/// use tonic_deadline::admission::{Admission, AdmissionLayer, Admitted};
/// use tower_layer::Layer;
/// let admitted: Admitted<&str> = AdmissionLayer::new(Admission::new(8)).layer("inner service");
/// assert_eq!(*admitted.get_ref(), "inner service");
/// ```
#[derive(Debug, Clone)]
pub struct Admitted<S> {
    inner: S,
    admission: Admission,
    observer: Option<Arc<dyn Observer>>,
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
        let observer = self.observer.clone();
        Box::pin(async move {
            let acquired = admission.acquire(&scope).await;
            if let Some(observer) = &observer {
                observer.decided(request.uri().path(), &acquired);
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

pin_project! {
    /// A response body that holds the request's admission permit until it
    /// is finished or dropped; empty when the request was refused.
    ///
    /// ```
    /// use http_body::Body;
    /// use tonic_deadline::admission::AdmittedBody;
    /// // The body of a refused request: empty, and no permit held.
    /// let body = AdmittedBody::<tonic::body::Body>::default();
    /// assert!(body.is_end_stream());
    /// ```
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
