//! Orders with a database behind them, calling payments inside `CreateOrder`.
//!
//! `CreateOrder` charges the payment under the request's scope, then writes
//! the order row to SQLite only while the request is still wanted (the write
//! checks the scope right before it commits). The row's key is the order id,
//! so a retry after an outcome-unknown answer (`DEADLINE_EXCEEDED`,
//! `CANCELLED`) finds the order instead of charging twice.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};
use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::net::Layered;
use crate::pb::orders_client::OrdersClient;
use crate::pb::orders_server::{Orders, OrdersServer};
use crate::pb::payments_client::PaymentsClient;
use crate::pb::payments_server::{Payments, PaymentsServer};
use crate::pb::{ChargeReq, ChargeResp, CreateOrderReq, GetOrderReq, Order};
use crate::systems::trace::{Journal, Tracer, work};
use crate::systems::{Peers, Started, millis, serve_lab, start_in_order};

/// The services, in the order they must start (callees first).
pub const ROLES: [&str; 2] = ["payments", "orders"];

/// The orders table (SQLite; in memory unless a file is given).
#[derive(Debug, Clone)]
pub struct Db {
    conn: Arc<Mutex<Connection>>,
}

impl Db {
    /// An in-memory database.
    ///
    /// # Errors
    ///
    /// When SQLite cannot create the table.
    pub fn in_memory() -> anyhow::Result<Self> {
        Self::init(Connection::open_in_memory()?)
    }

    /// A database in the file at `path`.
    ///
    /// # Errors
    ///
    /// When the file cannot be opened or the table created.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        Self::init(Connection::open(path)?)
    }

    fn init(conn: Connection) -> anyhow::Result<Self> {
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS orders (
                order_id TEXT PRIMARY KEY,
                amount_cents INTEGER NOT NULL,
                payment_id TEXT NOT NULL
            )",
        )?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Connection>, Status> {
        self.conn
            .lock()
            .map_err(|_| Status::internal("database unavailable"))
    }

    /// The order with `order_id`, if written (blocking).
    ///
    /// # Errors
    ///
    /// `INTERNAL` when SQLite fails.
    pub fn get(&self, order_id: &str) -> Result<Option<Order>, Status> {
        self.lock()?
            .query_row(
                "SELECT order_id, amount_cents, payment_id FROM orders WHERE order_id = ?1",
                params![order_id],
                |row| {
                    Ok(Order {
                        order_id: row.get(0)?,
                        amount_cents: row.get(1)?,
                        payment_id: row.get(2)?,
                        trace: Vec::new(),
                    })
                },
            )
            .optional()
            .map_err(|e| {
                tracing::warn!(%e, "order lookup failed");
                Status::internal("database error")
            })
    }

    /// Writes `order` in a transaction that commits only if `scope` is still
    /// live at commit time (blocking).
    fn insert(&self, order: &Order, scope: &Scope) -> Result<(), Status> {
        let mut conn = self.lock()?;
        let failed = |e: rusqlite::Error| {
            tracing::warn!(%e, "order write failed");
            Status::internal("database error")
        };
        let tx = conn.transaction().map_err(failed)?;
        tx.execute(
            "INSERT OR IGNORE INTO orders (order_id, amount_cents, payment_id) VALUES (?1, ?2, ?3)",
            params![order.order_id, order.amount_cents, order.payment_id],
        )
        .map_err(failed)?;
        // Dropping the transaction rolls it back.
        scope.check()?;
        tx.commit().map_err(failed)
    }

    /// How many orders are written.
    pub fn count(&self) -> u64 {
        self.lock()
            .ok()
            .and_then(|c| {
                c.query_row("SELECT COUNT(*) FROM orders", [], |r| r.get::<_, i64>(0))
                    .ok()
            })
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(0)
    }
}

/// What payments did: charges completed and charges stopped by their scope.
#[derive(Debug, Default)]
pub struct PaymentStats {
    /// Charges that ran to the end.
    pub charged: AtomicU64,
    /// Charges whose work stopped because the request's scope ended.
    pub cancelled: AtomicU64,
}

/// State shared by the services of one in-process system.
#[derive(Debug, Clone)]
pub struct Shared {
    /// Budget records.
    pub journal: Journal,
    /// The orders table.
    pub db: Db,
    /// Payments' counters.
    pub payments: Arc<PaymentStats>,
}

impl Shared {
    /// Fresh state with an in-memory database.
    ///
    /// # Errors
    ///
    /// When SQLite cannot be set up.
    pub fn in_memory() -> anyhow::Result<Self> {
        Ok(Self {
            journal: Journal::new(),
            db: Db::in_memory()?,
            payments: Arc::default(),
        })
    }
}

#[derive(Debug, Clone)]
struct OrdersSvc {
    payments: PaymentsClient<Layered>,
    shared: Shared,
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    // A transaction runs to its commit or rollback as one unit; the handler
    // decides afterwards whether its caller is still there to hear of it.
    #[allow(clippy::disallowed_methods)]
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|_| Status::internal("database task failed"))?
}

#[tonic::async_trait]
impl Orders for OrdersSvc {
    async fn create_order(
        &self,
        request: Request<CreateOrderReq>,
    ) -> Result<Response<Order>, Status> {
        let tracer = Tracer::enter("orders", &request, &self.shared.journal);
        let request = request.into_inner();
        let db = self.shared.db.clone();
        let id = request.order_id.clone();
        if let Some(order) = blocking(move || db.get(&id)).await? {
            // A retry of an order already written: same answer, no new charge.
            return Ok(Response::new(order));
        }
        let charge = tracer
            .call(
                "payments",
                &Scope::current(),
                self.payments.clone().charge(ChargeReq {
                    order_id: request.order_id.clone(),
                    amount_cents: request.amount_cents,
                    work_ms: request.payment_ms,
                }),
            )
            .await?;
        let order = Order {
            order_id: request.order_id,
            amount_cents: request.amount_cents,
            payment_id: charge.payment_id,
            trace: Vec::new(),
        };
        let db = self.shared.db.clone();
        let row = order.clone();
        Scope::current()
            .spawn_blocking(move |scope| db.insert(&row, scope))
            .await??;
        tracer.work_ended(Ok(()));
        if request.reply_ms > 0 {
            // A slow reply path after the commit: the answer may be lost to
            // the deadline although the order exists.
            tokio::time::sleep(millis(request.reply_ms)).await;
        }
        Ok(Response::new(Order {
            trace: tracer.finish(charge.trace),
            ..order
        }))
    }

    async fn get_order(&self, request: Request<GetOrderReq>) -> Result<Response<Order>, Status> {
        let db = self.shared.db.clone();
        let id = request.into_inner().order_id;
        match blocking(move || db.get(&id)).await? {
            Some(order) => Ok(Response::new(order)),
            None => Err(Status::not_found("no such order")),
        }
    }
}

#[derive(Debug, Clone)]
struct PaymentsSvc {
    shared: Shared,
}

#[tonic::async_trait]
impl Payments for PaymentsSvc {
    async fn charge(&self, request: Request<ChargeReq>) -> Result<Response<ChargeResp>, Status> {
        let tracer = Tracer::enter("payments", &request, &self.shared.journal);
        let request = request.into_inner();
        let stats = &self.shared.payments;
        work(&tracer, millis(request.work_ms), Some(&stats.cancelled)).await?;
        stats.charged.fetch_add(1, Ordering::Relaxed);
        Ok(Response::new(ChargeResp {
            payment_id: format!("pay-{}", request.order_id),
            trace: tracer.finish([]),
        }))
    }
}

/// Starts one service on `listen`; `orders` needs peer `payments`.
///
/// # Errors
///
/// An unknown role, a missing peer, or a port that cannot be bound.
pub async fn start_role(
    role: &str,
    listen: &str,
    peers: &Peers,
    shared: &Shared,
) -> anyhow::Result<Started> {
    let (role, routes) = match role {
        "orders" => (
            "orders",
            Routes::new(OrdersServer::new(OrdersSvc {
                payments: PaymentsClient::new(peers.channel("payments")?),
                shared: shared.clone(),
            })),
        ),
        "payments" => (
            "payments",
            Routes::new(PaymentsServer::new(PaymentsSvc {
                shared: shared.clone(),
            })),
        ),
        other => anyhow::bail!("orders has no service {other}; roles: {ROLES:?}"),
    };
    let addr = serve_lab(listen, routes, ServerDeadlineLayer::new()).await?;
    Ok(Started { role, addr })
}

/// Orders on `entry` and payments on a free loopback port, in this process.
///
/// # Errors
///
/// A port that cannot be bound.
pub async fn start(entry: &str, shared: &Shared) -> anyhow::Result<Vec<Started>> {
    start_in_order(&ROLES, "orders", entry, async |role, listen, peers| {
        start_role(role, listen, peers, shared).await
    })
    .await
}

/// A client of orders at `addr`.
///
/// # Errors
///
/// When the connection cannot be made.
pub async fn client(addr: SocketAddr) -> anyhow::Result<OrdersClient<Layered>> {
    Ok(OrdersClient::new(crate::net::connect_layered(addr).await?))
}
