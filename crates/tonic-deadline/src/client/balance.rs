//! A round-robin over replicas that says which one answered.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::replica::{Avoid, Replica, ReplicaFailed};
use crate::BoxError;

/// A round-robin over replicas of one service, each its own channel: every
/// response says which replica took the call ([`Replica`] in its
/// extensions, [`ReplicaFailed`] around a failure made on this side), and
/// a request whose extensions hold an [`Avoid`] goes to a replica it does
/// not name — to none, failing with `UNAVAILABLE`, when it names them all.
///
/// Put it under the [`resilience`](crate::resilience) layer: a retry then
/// goes to another replica than the one that failed, and a failure the hop
/// below marked as spent for the chain is still retried, once, elsewhere.
/// Each call takes a clone of its replica and waits for that clone's
/// readiness, so what a [`ReadyChannel`](super::ReadyChannel) counts (one
/// stream of its connection per call, the connect time in the budget)
/// holds per replica. Put the [`ClientDeadlineLayer`](crate::ClientDeadlineLayer)
/// on each replica, under the balancer, so that a local failure is tagged
/// too.
///
/// Unlike `tower::balance::p2c::Balance` it picks in turn rather than by
/// load, and it tells the layer above which replica it picked.
///
/// # Example
///
/// ```no_run
/// use tonic_deadline::client::{Balanced, ReadyChannel};
/// use tonic_deadline::resilience::ResilienceLayer;
/// use tonic_deadline::ClientDeadlineLayer;
/// use tower::Layer;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let mut replicas = Vec::new();
/// for uri in ["http://10.0.0.1:50051", "http://10.0.0.2:50051", "http://10.0.0.3:50051"] {
///     let endpoint = tonic::transport::Endpoint::from_shared(uri)?;
///     replicas.push(ClientDeadlineLayer::new().layer(ReadyChannel::lazy(&endpoint)));
/// }
/// let resilience = ResilienceLayer::from_service_config(r#"{"methodConfig": [{
///     "name": [{"service": "grpc.health.v1.Health"}],
///     "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
///                     "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#)?;
/// let channel = resilience.layer(Balanced::new(replicas));
/// let client = tonic_health::pb::health_client::HealthClient::new(channel);
/// # let _ = client;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Balanced<S> {
    replicas: Arc<[S]>,
    next: Arc<AtomicUsize>,
}

impl<S> Clone for Balanced<S> {
    fn clone(&self) -> Self {
        Self {
            replicas: self.replicas.clone(),
            next: self.next.clone(),
        }
    }
}

impl<S> Balanced<S> {
    /// A round-robin over `replicas`, whose ids are their places in the
    /// list (0, 1, …).
    ///
    /// # Panics
    ///
    /// When `replicas` is empty.
    pub fn new(replicas: impl IntoIterator<Item = S>) -> Self {
        let replicas: Arc<[S]> = replicas.into_iter().collect();
        assert!(!replicas.is_empty(), "a balanced channel needs a replica");
        Self {
            replicas,
            next: Arc::default(),
        }
    }

    /// The replicas, in the order of their ids.
    pub fn replicas(&self) -> &[S] {
        &self.replicas
    }

    /// The next replica in turn that `avoid` does not name, if any.
    fn pick(&self, avoid: Option<&Avoid>) -> Option<usize> {
        let n = self.replicas.len();
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let Some(avoid) = avoid.filter(|a| !a.is_empty()) else {
            return Some(turn);
        };
        (0..n)
            .map(|step| (turn + step) % n)
            .find(|&i| !avoid.contains(i as u64))
    }
}

impl<S, B, RB> Service<Request<B>> for Balanced<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = BalancedFuture<S, B>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each call waits for its own replica's readiness.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let n = self.replicas.len();
        match self.pick(request.extensions().get::<Avoid>()) {
            Some(i) => BalancedFuture {
                call: None,
                service: Some(self.replicas[i].clone()),
                request: Some(request),
                replica: Replica::new(i as u64, n),
            },
            None => BalancedFuture {
                call: None,
                service: None,
                request: None,
                replica: Replica::new(0, n),
            },
        }
    }
}

pin_project! {
    /// The response future of [`Balanced`]: the picked replica's readiness,
    /// then its call.
    ///
    /// # Cancellation safety
    ///
    /// Dropping it drops the replica's call (its stream is reset) or the
    /// wait for its readiness.
    ///
    /// ```
    /// use tonic_deadline::client::{Balanced, BalancedFuture, ClientDeadline, ReadyChannel};
    /// use tower_service::Service;
    ///
    /// fn future_of(
    ///     channel: &mut Balanced<ClientDeadline<ReadyChannel>>,
    ///     request: http::Request<tonic::body::Body>,
    /// ) -> BalancedFuture<ClientDeadline<ReadyChannel>, tonic::body::Body> {
    ///     channel.call(request)
    /// }
    /// ```
    pub struct BalancedFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        call: Option<S::Future>,
        // `None` when every replica was avoided: nothing is sent.
        service: Option<S>,
        request: Option<Request<B>>,
        replica: Replica,
    }
}

impl<S, B> std::fmt::Debug for BalancedFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BalancedFuture")
            .field("replica", &self.replica)
            .field("sent", &self.call.is_some())
            .finish_non_exhaustive()
    }
}

impl<S, B, RB> Future for BalancedFuture<S, B>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let replica = *this.replica;
        let failed = |err: BoxError| -> BoxError { Box::new(ReplicaFailed::new(replica, err)) };
        if this.call.is_none() {
            let Some(service) = this.service.as_mut() else {
                return Poll::Ready(Err(Box::new(tonic::Status::unavailable(
                    "every replica of the balanced channel was to be avoided",
                ))));
            };
            if let Err(err) = ready!(service.poll_ready(cx)) {
                return Poll::Ready(Err(failed(err.into())));
            }
            let request = this
                .request
                .take()
                .expect("BalancedFuture polled after completion");
            this.call.set(Some(service.call(request)));
        }
        let call = this.call.as_pin_mut().expect("the call was made");
        Poll::Ready(match ready!(call.poll(cx)) {
            Ok(mut response) => {
                response.extensions_mut().insert(replica);
                Ok(response)
            }
            Err(err) => Err(failed(err.into())),
        })
    }
}
