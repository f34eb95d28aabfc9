//! The chain A → B → C: each hop reports the budget it saw on entry, spends
//! its work, and calls the next.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use testkit::probe_client::ProbeClient;
use testkit::probe_server::{Probe, ProbeServer};
use testkit::{CallReply, CallRequest, Hop as HopReport};
use tokio_stream::Stream;
use tonic::service::Routes;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::net::{self, Layered};

/// The next hop, called through our layer or through plain tonic.
#[derive(Debug, Clone)]
pub enum Next {
    /// Through [`tonic_deadline::ClientDeadlineLayer`]: the budget propagates.
    Layered(ProbeClient<Layered>),
    /// Plain tonic: nothing propagates unless written by hand.
    Plain(ProbeClient<Channel>),
}

impl Next {
    /// Calls `Probe/Call` on the next hop.
    pub async fn call(self, request: CallRequest) -> Result<CallReply, Status> {
        let reply = match self {
            Next::Layered(mut c) => c.call(request).await?,
            Next::Plain(mut c) => c.call(request).await?,
        };
        Ok(reply.into_inner())
    }
}

/// How a hop spends its time.
#[derive(Debug, Clone, Copy, Default)]
pub struct Plan {
    /// Work done by this hop.
    pub work: Duration,
    /// Call the next hop at once, concurrently with the work (otherwise
    /// after it).
    pub call_first: bool,
    /// Call the next hop from a detached task: the chain is broken on purpose.
    pub detach_next: bool,
}

/// One service of the chain.
#[derive(Debug, Clone)]
pub struct Hop {
    name: &'static str,
    plan: Plan,
    next: Option<Next>,
    completed: Arc<AtomicU64>,
}

impl Hop {
    /// A hop named `name` calling `next` (if any).
    pub fn new(name: &'static str, plan: Plan, next: Option<Next>) -> Self {
        Self {
            name,
            plan,
            next,
            completed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// How many times this hop finished its work.
    pub fn completed(&self) -> Arc<AtomicU64> {
        self.completed.clone()
    }

    /// The gRPC routes serving this hop.
    pub fn routes(self) -> Routes {
        Routes::new(ProbeServer::new(self))
    }

    fn report<T>(&self, request: &Request<T>) -> HopReport {
        let header = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let scope = Scope::try_current();
        let remaining_us = scope
            .as_ref()
            .and_then(Scope::remaining)
            .map_or(-1, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        HopReport {
            service: self.name.to_owned(),
            remaining_us,
            header,
            deadline_mono_ns: crate::clock::deadline_ns(scope.and_then(|s| s.deadline())),
        }
    }

    async fn downstream(&self, request: CallRequest) -> Result<CallReply, Status> {
        let Some(next) = self.next.clone() else {
            // The last hop echoes the payload back.
            return Ok(CallReply {
                hops: Vec::new(),
                payload: request.payload,
            });
        };
        if self.plan.detach_next {
            // The chain is broken here on purpose: B and C get no deadline and
            // nothing cancels them when our caller gives up.
            tonic_deadline::detach(next.call(request))
                .await
                .map_err(|e| Status::internal(format!("detached call failed: {e}")))?
        } else {
            next.call(request).await
        }
    }
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<CallReply, Status>> + Send>>;

#[tonic::async_trait]
impl Probe for Hop {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        let me = self.report(&request);
        let request = request.into_inner();
        let work = tokio::time::sleep(self.plan.work);
        let below = if self.plan.call_first {
            let (below, ()) = tokio::join!(self.downstream(request), work);
            below?
        } else {
            work.await;
            self.downstream(request).await?
        };
        self.completed.fetch_add(1, Ordering::Relaxed);
        let mut hops = vec![me];
        hops.extend(below.hops);
        Ok(Response::new(CallReply {
            hops,
            payload: below.payload,
        }))
    }

    type WatchStream = ReplyStream;

    async fn watch(&self, request: Request<CallRequest>) -> Result<Response<ReplyStream>, Status> {
        let me = self.report(&request);
        let request = request.into_inner();
        let interval = Duration::from_millis(request.interval_ms);
        let stream = tokio_stream::StreamExt::take(
            tokio_stream::StreamExt::throttle(
                tokio_stream::iter(std::iter::repeat_with(move || {
                    Ok(CallReply {
                        hops: vec![me.clone()],
                        payload: String::new(),
                    })
                })),
                interval,
            ),
            request.count as usize,
        );
        Ok(Response::new(Box::pin(stream)))
    }

    type ChatStream = ReplyStream;

    async fn chat(
        &self,
        request: Request<Streaming<CallRequest>>,
    ) -> Result<Response<ReplyStream>, Status> {
        let stream = tokio_stream::StreamExt::map(request.into_inner(), |m| {
            m.map(|m| CallReply {
                hops: Vec::new(),
                payload: m.payload,
            })
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// A running chain.
#[derive(Debug)]
pub struct Chain {
    /// Where A listens.
    pub entry: SocketAddr,
    /// Completions of A, B, C.
    pub completed: [Arc<AtomicU64>; 3],
}

/// The reserve of a chain's hops: none, so that each shows what the header
/// gives it, to the microsecond.
pub const EXACT: Option<std::time::Duration> = Some(std::time::Duration::ZERO);

/// Starts one hop named `name` on `listen`, calling `next` (if any) through
/// our client layer with `transit` compensation; with `reflection` it also
/// serves gRPC server reflection. Its server layer keeps `reply_reserve` of
/// each budget for its answer's way back ([`EXACT`]: none; `None`: the
/// layer's default, `server::default_reply_reserve`, as a server with
/// nothing set keeps). Returns its address and its completion counter.
///
/// # Errors
///
/// A port that cannot be bound.
pub async fn start_hop(
    name: &'static str,
    listen: &str,
    plan: Plan,
    next: Option<SocketAddr>,
    transit: net::Transit,
    reflection: bool,
    reply_reserve: Option<std::time::Duration>,
) -> anyhow::Result<(SocketAddr, Arc<AtomicU64>)> {
    let next = match next {
        Some(addr) => Some(Next::Layered(ProbeClient::new(net::lazy_with(
            addr, transit,
        )?))),
        None => None,
    };
    let hop = Hop::new(name, plan, next);
    let done = hop.completed();
    let mut routes = hop.routes();
    if reflection {
        routes = super::with_reflection(routes, testkit::FILE_DESCRIPTOR_SET)?;
    }
    let mut layer = ServerDeadlineLayer::new();
    if let Some(reserve) = reply_reserve {
        layer = layer.reply_reserve(reserve);
    }
    let addr = net::serve(listen, routes, Some(layer)).await?;
    Ok((addr, done))
}

/// The name of a hop given on the command line (`A`, `B` or `C`).
///
/// # Errors
///
/// Any other name.
pub fn hop_name(role: &str) -> anyhow::Result<&'static str> {
    match role {
        "A" | "a" => Ok("A"),
        "B" | "b" => Ok("B"),
        "C" | "c" => Ok("C"),
        "D" | "d" => Ok("D"),
        other => anyhow::bail!("the chain has no service {other}; roles: A, B, C, D"),
    }
}

/// Starts C, then B, then A (A on `entry_addr`), each on its own loopback
/// port, with our layers; `plans` are for A, B, C. With `reflection`, A
/// also serves gRPC server reflection.
///
/// # Errors
///
/// A port that cannot be bound.
pub async fn start(entry_addr: &str, plans: [Plan; 3], reflection: bool) -> anyhow::Result<Chain> {
    let ignored = net::Transit::Ignored;
    let (c_addr, c_done) =
        start_hop("C", "127.0.0.1:0", plans[2], None, ignored, false, EXACT).await?;
    let (b_addr, b_done) = start_hop(
        "B",
        "127.0.0.1:0",
        plans[1],
        Some(c_addr),
        ignored,
        false,
        EXACT,
    )
    .await?;
    let (entry, a_done) = start_hop(
        "A",
        entry_addr,
        plans[0],
        Some(b_addr),
        ignored,
        reflection,
        EXACT,
    )
    .await?;
    Ok(Chain {
        entry,
        completed: [a_done, b_done, c_done],
    })
}
