//! The middle hop of the mixed-language chains: `conformance.relay.Relay`.
//!
//! A foreign client calls `Forward`; the relay notes the budget it received,
//! spends its own hop time, then calls a foreign `Downstream.Work` with no
//! deadline code at all — the client layer takes the remaining budget from
//! the request's scope, and the server layer cancels that scope when the
//! foreign client resets the stream, which resets the downstream call too.
//!
//! # Example
//!
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let relay = interop::relay::Relay::connect_lazy("127.0.0.1:50052")?;
//! interop::relay::serve(listener, relay, std::future::pending()).await?;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};
use tonic_deadline::client::Balanced;
use tonic_deadline::resilience::{Resilience, ResilienceLayer};
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer};
use tower_layer::Layer;

use crate::client::DeadlineChannel;
use crate::relay_pb::downstream_client::DownstreamClient;
use crate::relay_pb::relay_server::{Relay as RelayService, RelayServer};
use crate::relay_pb::{ForwardReply, ForwardRequest, WorkRequest};

/// The relay: a `Relay` service that forwards to one downstream address, or
/// to replicas of it in turn.
#[derive(Debug, Clone)]
pub struct Relay {
    downstream: Downstream,
}

/// The downstream stub: calls sent once, or through a resilience layer.
#[derive(Debug, Clone)]
enum Downstream {
    Once(DownstreamClient<DeadlineChannel>),
    Retried(DownstreamClient<Resilience<DeadlineChannel>>),
    /// Through a resilience layer over replicas, each with the client layer:
    /// a retry goes to another replica than the one that failed.
    Balanced(DownstreamClient<Resilience<Balanced<DeadlineChannel>>>),
}

impl Relay {
    /// A relay forwarding to `addr` (`host:port`), connecting on first use.
    ///
    /// # Errors
    ///
    /// When `addr` does not form a URI.
    pub fn connect_lazy(addr: &str) -> anyhow::Result<Self> {
        Ok(Self {
            downstream: Downstream::Once(DownstreamClient::new(deadline_channel(addr)?)),
        })
    }

    /// A relay forwarding to `addr` through `resilience` (retries as its
    /// service config says), connecting on first use.
    ///
    /// # Errors
    ///
    /// When `addr` does not form a URI.
    pub fn connect_lazy_with(addr: &str, resilience: &ResilienceLayer) -> anyhow::Result<Self> {
        let channel = resilience.layer(deadline_channel(addr)?);
        Ok(Self {
            downstream: Downstream::Retried(DownstreamClient::new(channel)),
        })
    }

    /// A relay forwarding to the replicas at `addrs` in turn
    /// ([`Balanced`]), through `resilience`, connecting on first use.
    ///
    /// # Errors
    ///
    /// When an address does not form a URI, or there is none.
    pub fn connect_lazy_balanced(
        addrs: &[String],
        resilience: &ResilienceLayer,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(!addrs.is_empty(), "no downstream replica given");
        let replicas = addrs
            .iter()
            .map(|addr| deadline_channel(addr))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let channel = resilience.layer(Balanced::new(replicas));
        Ok(Self {
            downstream: Downstream::Balanced(DownstreamClient::new(channel)),
        })
    }
}

fn deadline_channel(addr: &str) -> anyhow::Result<DeadlineChannel> {
    let channel: Channel = Endpoint::from_shared(format!("http://{addr}"))?.connect_lazy();
    Ok(ClientDeadlineLayer::new().layer(channel))
}

fn micros(budget: Option<Duration>) -> i64 {
    budget.map_or(-1, |left| {
        i64::try_from(left.as_micros()).unwrap_or(i64::MAX)
    })
}

#[tonic::async_trait]
impl RelayService for Relay {
    async fn forward(
        &self,
        request: Request<ForwardRequest>,
    ) -> Result<Response<ForwardReply>, Status> {
        let entered = Instant::now();
        let remaining = Scope::current().remaining();
        let header = request
            .metadata()
            .get("grpc-timeout")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        let request = request.into_inner();
        // The relay's own work. It ignores its scope on purpose: the server
        // layer must stop it (and everything under it) by itself.
        tokio::time::sleep(Duration::from_millis(request.hop_ms.into())).await;
        let hop = entered.elapsed();
        let work = WorkRequest {
            work_ms: request.work_ms,
            tag: request.tag,
        };
        // The downstream's status is answered as it came, metadata and all
        // (a `grpc-retry-pushback-ms` the resilience layer set with it).
        let downstream = match &self.downstream {
            Downstream::Once(stub) => stub.clone().work(work).await?,
            Downstream::Retried(stub) => stub.clone().work(work).await?,
            Downstream::Balanced(stub) => stub.clone().work(work).await?,
        }
        .into_inner();
        Ok(Response::new(ForwardReply {
            relay_remaining_us: micros(remaining),
            relay_hop_us: micros(Some(hop)),
            relay_timeout_header: header,
            downstream: Some(downstream),
        }))
    }
}

/// Serves the relay on `listener` behind [`ServerDeadlineLayer`] until
/// `shutdown` completes.
///
/// # Errors
///
/// When the server fails to run.
pub async fn serve(
    listener: TcpListener,
    relay: Relay,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    serve_with(listener, relay, ServerDeadlineLayer::new(), shutdown).await
}

/// [`serve`] behind `layer` (a reply reserve, for the ledger to arrive).
///
/// # Errors
///
/// When the server fails to run.
pub async fn serve_with(
    listener: TcpListener,
    relay: Relay,
    layer: ServerDeadlineLayer,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    Server::builder()
        .layer(layer)
        .add_service(RelayServer::new(relay))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
}
