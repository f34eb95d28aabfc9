//! A public API with a 900 ms request deadline in front of inventory, pricing
//! and a cache.
//!
//! * `Checkout` calls inventory, then pricing with what is left less a
//!   reserve — not a fresh 800 ms. `fixed_timeouts` shows the mistake the
//!   seed warns about: each downstream gets its own 800 ms, and the two calls
//!   together overrun the request's 900 ms.
//! * `Browse` fans out in parallel — one pricing quote per item and a cache
//!   lookup capped at 20 ms — all under the request's one deadline.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::future::join_all;
use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::net::Layered;
use crate::pb::cache_client::CacheClient;
use crate::pb::cache_server::{Cache, CacheServer};
use crate::pb::inventory_client::InventoryClient;
use crate::pb::inventory_server::{Inventory, InventoryServer};
use crate::pb::pricing_client::PricingClient;
use crate::pb::pricing_server::{Pricing, PricingServer};
use crate::pb::shop_client::ShopClient;
use crate::pb::shop_server::{Shop, ShopServer};
use crate::pb::{BrowseReq, CheckoutReq, CheckoutResp, ItemReq, ItemResp};
use crate::systems::trace::{Journal, Tracer, work};
use crate::systems::{Peers, Started, millis, serve_lab, start_in_order};

/// The API's deadline for one request.
pub const API_DEADLINE: Duration = Duration::from_millis(900);
/// The cap on a cache lookup: waiting longer makes the fallback better.
pub const CACHE_CAP: Duration = Duration::from_millis(20);
/// Time the API keeps for itself after pricing answers.
pub const PRICING_RESERVE: Duration = Duration::from_millis(50);
/// The fixed per-call timeout of the `fixed_timeouts` variant.
pub const FIXED_TIMEOUT: Duration = Duration::from_millis(800);

/// The services, in the order they must start (callees first).
pub const ROLES: [&str; 4] = ["inventory", "pricing", "cache", "api"];

#[derive(Debug, Clone)]
struct Api {
    inventory: InventoryClient<Layered>,
    pricing: PricingClient<Layered>,
    cache: CacheClient<Layered>,
    journal: Journal,
}

impl Api {
    /// The request's scope: whatever the caller sent, at most 900 ms.
    fn request_scope() -> Scope {
        Scope::current().with_timeout(API_DEADLINE)
    }

    /// A fresh 800 ms that ignores the request: the explicit opt-out used to
    /// show the seed's mistake.
    fn fixed_scope() -> Scope {
        Scope::background().with_timeout(FIXED_TIMEOUT)
    }

    async fn cache_lookup(&self, tracer: &Tracer, scope: &Scope, sku: &str, ms: u64) -> bool {
        let lookup = scope.with_timeout(CACHE_CAP);
        let item = ItemReq {
            sku: sku.to_owned(),
            work_ms: ms,
        };
        // A miss or a slow cache is not an error: the API falls back.
        tracer
            .call("cache", &lookup, self.cache.clone().lookup(item))
            .await
            .is_ok()
    }
}

#[tonic::async_trait]
impl Shop for Api {
    async fn checkout(
        &self,
        request: Request<CheckoutReq>,
    ) -> Result<Response<CheckoutResp>, Status> {
        let tracer = Tracer::enter("api", &request, &self.journal);
        let request = request.into_inner();
        let scope = Self::request_scope();
        let item = |ms| ItemReq {
            sku: request.sku.clone(),
            work_ms: ms,
        };
        let inventory_scope = if request.fixed_timeouts {
            Self::fixed_scope()
        } else {
            scope.clone()
        };
        let stock = tracer
            .call(
                "inventory",
                &inventory_scope,
                self.inventory.clone().reserve(item(request.inventory_ms)),
            )
            .await?;
        let pricing_scope = if request.fixed_timeouts {
            Self::fixed_scope()
        } else {
            scope.reserve(PRICING_RESERVE)?
        };
        let price = tracer
            .call(
                "pricing",
                &pricing_scope,
                self.pricing.clone().quote(item(request.pricing_ms)),
            )
            .await?;
        Ok(Response::new(CheckoutResp {
            cache_hit: false,
            price_cents: price.value,
            trace: tracer.finish(stock.trace.into_iter().chain(price.trace)),
        }))
    }

    async fn browse(&self, request: Request<BrowseReq>) -> Result<Response<CheckoutResp>, Status> {
        let tracer = Tracer::enter("api", &request, &self.journal);
        let request = request.into_inner();
        let scope = Self::request_scope();
        // Every child shares the request's one deadline; the cache uses less.
        let quotes = (0..request.items).map(|i| {
            let pricing = self.pricing.clone();
            let tracer = &tracer;
            let scope = &scope;
            async move {
                let item = ItemReq {
                    sku: format!("sku-{i}"),
                    work_ms: request.pricing_ms,
                };
                tracer
                    .call(&format!("pricing#{i}"), scope, pricing.clone().quote(item))
                    .await
            }
        });
        let cache = self.cache_lookup(&tracer, &scope, "browse", request.cache_ms);
        let (quotes, cache_hit) = tokio::join!(join_all(quotes), cache);
        let mut price_cents = 0;
        let mut below = Vec::new();
        for quote in quotes {
            let quote = quote?;
            price_cents += quote.value;
            below.extend(quote.trace);
        }
        Ok(Response::new(CheckoutResp {
            cache_hit,
            price_cents,
            trace: tracer.finish(below),
        }))
    }
}

/// A downstream that spends `work_ms` (watching its scope) and answers.
#[derive(Debug, Clone)]
struct Leaf {
    name: &'static str,
    value: i64,
    journal: Journal,
}

impl Leaf {
    async fn answer(&self, request: Request<ItemReq>) -> Result<Response<ItemResp>, Status> {
        let tracer = Tracer::enter(self.name, &request, &self.journal);
        work(&tracer, millis(request.get_ref().work_ms), None).await?;
        Ok(Response::new(ItemResp {
            value: self.value,
            trace: tracer.finish([]),
        }))
    }
}

#[tonic::async_trait]
impl Inventory for Leaf {
    async fn reserve(&self, request: Request<ItemReq>) -> Result<Response<ItemResp>, Status> {
        self.answer(request).await
    }
}

#[tonic::async_trait]
impl Pricing for Leaf {
    async fn quote(&self, request: Request<ItemReq>) -> Result<Response<ItemResp>, Status> {
        self.answer(request).await
    }
}

#[tonic::async_trait]
impl Cache for Leaf {
    async fn lookup(&self, request: Request<ItemReq>) -> Result<Response<ItemResp>, Status> {
        self.answer(request).await
    }
}

/// Starts one service on `listen`; `api` needs peers `inventory`, `pricing`
/// and `cache`.
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
    let leaf = |name, value| Leaf {
        name,
        value,
        journal: journal.clone(),
    };
    // Every shop service opens a span per request, as the IM chain does:
    // the system's traces.
    let mut layer = ServerDeadlineLayer::new().trace_spans();
    if let Some(reserve) = reply_reserve {
        layer = layer.reply_reserve(reserve);
    }
    let (role, routes, layer) = match role {
        "api" => (
            "api",
            Routes::new(ShopServer::new(Api {
                inventory: InventoryClient::new(peers.traced_channel("inventory")?),
                pricing: PricingClient::new(peers.traced_channel("pricing")?),
                cache: CacheClient::new(peers.traced_channel("cache")?),
                journal: journal.clone(),
            })),
            // A public caller may send no deadline: the API's own applies.
            layer.default_timeout(API_DEADLINE),
        ),
        "inventory" => (
            "inventory",
            Routes::new(InventoryServer::new(leaf("inventory", 1))),
            layer,
        ),
        "pricing" => (
            "pricing",
            Routes::new(PricingServer::new(leaf("pricing", 1999))),
            layer,
        ),
        "cache" => (
            "cache",
            Routes::new(CacheServer::new(leaf("cache", 1))),
            layer,
        ),
        other => anyhow::bail!("shop has no service {other}; roles: {ROLES:?}"),
    };
    let addr = serve_lab(listen, routes, layer).await?;
    Ok(Started { role, addr })
}

/// The whole shop in this process: the API on `entry`, the rest on free
/// loopback ports. Returns every service, the API last.
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
    start_in_order(&ROLES, "api", entry, async |role, listen, peers| {
        start_role(role, listen, peers, journal, reply_reserve).await
    })
    .await
}

/// A client of the API at `addr`.
///
/// # Errors
///
/// When the connection cannot be made.
pub async fn client(addr: SocketAddr) -> anyhow::Result<ShopClient<Layered>> {
    Ok(ShopClient::new(crate::net::connect_traced(addr).await?))
}
