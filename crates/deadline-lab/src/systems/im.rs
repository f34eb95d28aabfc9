//! The IM delivery chain: client → gateway → logic → route, then logic → push,
//! with the seed's per-hop budgets.
//!
//! | hop | budget |
//! |---|---|
//! | client → gateway | 800 ms |
//! | gateway → logic | 500 ms (gateway keeps 300 ms for reconnects and the reply) |
//! | logic → route | 200 ms (a routing table lookup) |
//! | logic → push | what is left − 50 ms (logic's own completion) |
//!
//! Logic gives itself 500 ms when a request arrives without a deadline.

use std::net::SocketAddr;
use std::time::Duration;

use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::net::Layered;
use crate::pb::gateway_client::GatewayClient;
use crate::pb::gateway_server::{Gateway, GatewayServer};
use crate::pb::logic_client::LogicClient;
use crate::pb::logic_server::{Logic, LogicServer};
use crate::pb::pusher_client::PusherClient;
use crate::pb::pusher_server::{Pusher, PusherServer};
use crate::pb::route_client::RouteClient;
use crate::pb::route_server::{Route, RouteServer};
use crate::pb::{DeliverReq, DeliverResp, PushReq, PushResp, RouteReq, RouteResp};
use crate::systems::trace::{Journal, Tracer, work};
use crate::systems::{Peers, Started, millis, serve_lab, start_in_order};

/// The client's budget.
pub const CLIENT_BUDGET: Duration = Duration::from_millis(800);
/// Gateway → logic.
pub const GATEWAY_TO_LOGIC: Duration = Duration::from_millis(500);
/// Logic → route.
pub const LOGIC_TO_ROUTE: Duration = Duration::from_millis(200);
/// Logic keeps this much for itself when calling push.
pub const LOGIC_RESERVE: Duration = Duration::from_millis(50);
/// Logic's own budget for requests that arrive without a deadline.
pub const LOGIC_DEFAULT: Duration = Duration::from_millis(500);

/// The services, in the order they must start (callees first).
pub const ROLES: [&str; 4] = ["push", "route", "logic", "gateway"];

#[derive(Debug, Clone)]
struct GatewaySvc {
    logic: LogicClient<Layered>,
    journal: Journal,
}

#[tonic::async_trait]
impl Gateway for GatewaySvc {
    async fn push(&self, request: Request<PushReq>) -> Result<Response<PushResp>, Status> {
        let tracer = Tracer::enter("gateway", &request, &self.journal);
        let logic_scope = Scope::current().with_timeout(GATEWAY_TO_LOGIC);
        let reply = tracer
            .call(
                "logic",
                &logic_scope,
                self.logic.clone().push(request.into_inner()),
            )
            .await?;
        Ok(Response::new(PushResp {
            msg_id: reply.msg_id,
            trace: tracer.finish(reply.trace),
        }))
    }
}

#[derive(Debug, Clone)]
struct LogicSvc {
    route: RouteClient<Layered>,
    push: PusherClient<Layered>,
    journal: Journal,
}

#[tonic::async_trait]
impl Logic for LogicSvc {
    async fn push(&self, request: Request<PushReq>) -> Result<Response<PushResp>, Status> {
        let tracer = Tracer::enter("logic", &request, &self.journal);
        let request = request.into_inner();
        // budget = remaining − 50 ms; refused at once when nothing is left.
        let budget = Scope::current().reserve(LOGIC_RESERVE)?;
        let route_scope = budget.with_timeout(LOGIC_TO_ROUTE);
        let route = tracer
            .call(
                "route",
                &route_scope,
                self.route.clone().get_route(RouteReq {
                    uid: request.uid,
                    work_ms: request.route_ms,
                    blocks: request.route_blocks,
                }),
            )
            .await?;
        let delivered = tracer
            .call(
                "push",
                &budget,
                self.push.clone().deliver(DeliverReq {
                    conn_id: route.conn_id,
                    text: request.text,
                    work_ms: request.push_ms,
                }),
            )
            .await?;
        Ok(Response::new(PushResp {
            msg_id: format!("m-{}", request.uid),
            trace: tracer.finish(route.trace.into_iter().chain(delivered.trace)),
        }))
    }
}

#[derive(Debug, Clone)]
struct RouteSvc {
    journal: Journal,
}

#[tonic::async_trait]
impl Route for RouteSvc {
    async fn get_route(&self, request: Request<RouteReq>) -> Result<Response<RouteResp>, Status> {
        let tracer = Tracer::enter("route", &request, &self.journal);
        let request = request.into_inner();
        if request.blocks {
            // A lookup stuck in a blocking call that never checks its scope:
            // the answer goes at the deadline, the thread runs on.
            let stall = millis(request.work_ms);
            let result = Scope::current()
                .spawn_blocking(move |_ignored| std::thread::sleep(stall))
                .await;
            tracer.work_ended(result);
            result.map_err(Status::from)?;
        } else {
            work(&tracer, millis(request.work_ms), None).await?;
        }
        Ok(Response::new(RouteResp {
            conn_id: format!("conn-{}", request.uid),
            trace: tracer.finish([]),
        }))
    }
}

#[derive(Debug, Clone)]
struct PushSvc {
    journal: Journal,
}

#[tonic::async_trait]
impl Pusher for PushSvc {
    async fn deliver(&self, request: Request<DeliverReq>) -> Result<Response<DeliverResp>, Status> {
        let tracer = Tracer::enter("push", &request, &self.journal);
        work(&tracer, millis(request.get_ref().work_ms), None).await?;
        Ok(Response::new(DeliverResp {
            trace: tracer.finish([]),
        }))
    }
}

/// Starts one service of the chain on `listen`; `peers` names the services it
/// calls (gateway: `logic`; logic: `route` and `push`).
///
/// # Errors
///
/// An unknown role, a missing peer, or a port that cannot be bound.
pub async fn start_role(
    role: &str,
    listen: &str,
    peers: &Peers,
    journal: &Journal,
    reply_reserve: Option<std::time::Duration>,
) -> anyhow::Result<Started> {
    let journal = journal.clone();
    // Every IM service opens a span per request: the system's traces.
    let mut layer = ServerDeadlineLayer::new().trace_spans();
    if let Some(reserve) = reply_reserve {
        layer = layer.reply_reserve(reserve);
    }
    let (role, routes, layer) = match role {
        "gateway" => (
            "gateway",
            Routes::new(GatewayServer::new(GatewaySvc {
                logic: LogicClient::new(peers.traced_channel("logic")?),
                journal,
            })),
            layer,
        ),
        "logic" => (
            "logic",
            Routes::new(LogicServer::new(LogicSvc {
                route: RouteClient::new(peers.traced_channel("route")?),
                push: PusherClient::new(peers.traced_channel("push")?),
                journal,
            })),
            layer.default_timeout(LOGIC_DEFAULT),
        ),
        "route" => (
            "route",
            Routes::new(RouteServer::new(RouteSvc { journal })),
            layer,
        ),
        "push" => (
            "push",
            Routes::new(PusherServer::new(PushSvc { journal })),
            layer,
        ),
        other => anyhow::bail!("im has no service {other}; roles: {ROLES:?}"),
    };
    let addr = serve_lab(listen, routes, layer).await?;
    Ok(Started { role, addr })
}

/// The whole chain in this process: gateway on `entry`, the rest on free
/// loopback ports. Returns every service, gateway last.
///
/// # Errors
///
/// A port that cannot be bound.
pub async fn start(entry: &str, journal: &Journal) -> anyhow::Result<Vec<Started>> {
    start_with_reserve(entry, journal, None).await
}

/// [`start`], each service keeping `reply_reserve` of its budget for its
/// answer's way back (`ServerDeadlineLayer::reply_reserve`; `None`: the
/// layer's default).
///
/// # Errors
///
/// A port that cannot be bound.
pub async fn start_with_reserve(
    entry: &str,
    journal: &Journal,
    reply_reserve: Option<std::time::Duration>,
) -> anyhow::Result<Vec<Started>> {
    start_in_order(&ROLES, "gateway", entry, async |role, listen, peers| {
        start_role(role, listen, peers, journal, reply_reserve).await
    })
    .await
}

/// A client of the gateway at `addr`.
///
/// # Errors
///
/// When the connection cannot be made.
pub async fn client(addr: SocketAddr) -> anyhow::Result<GatewayClient<Layered>> {
    Ok(GatewayClient::new(crate::net::connect_traced(addr).await?))
}

/// A client of logic at `addr` (to call it without a deadline).
///
/// # Errors
///
/// When the connection cannot be made.
pub async fn logic_client(addr: SocketAddr) -> anyhow::Result<LogicClient<Layered>> {
    Ok(LogicClient::new(crate::net::connect_layered(addr).await?))
}
