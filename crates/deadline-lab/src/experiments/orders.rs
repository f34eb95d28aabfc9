//! Orders → payments with SQLite behind orders: a payment that stalls past the
//! deadline, and what "outcome unknown" means for the order row.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic_deadline::Scope;

use crate::kit::journal::{Hop, hops};
use crate::kit::calls::{status_name, without_deadline};
use crate::pb::{CreateOrderReq, GetOrderReq};
use crate::report::{Outcome, ms};
use crate::systems::orders::{self, Shared};

/// The client's budget for CreateOrder.
pub const BUDGET: Duration = Duration::from_millis(300);
/// A payment far beyond the budget.
const STALL_MS: u64 = 5_000;
/// A normal payment.
const PAYMENT_MS: u64 = 50;
/// A reply path slower than what is left after the commit.
const SLOW_REPLY_MS: u64 = 600;

/// The payment stalls past the deadline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stall {
    /// What the client got.
    pub client_status: String,
    /// When, after the call began.
    pub client_ms: f64,
    /// Whether payments saw its work cancelled.
    pub payment_cancelled: bool,
    /// Whether the payment ran to the end.
    pub payment_completed: bool,
    /// Whether the order row exists afterwards.
    pub order_written: bool,
    /// What `GetOrder` answered afterwards.
    pub get_order_status: String,
    /// What orders and payments recorded.
    pub hops: Vec<Hop>,
}

/// The order commits, then the reply misses the deadline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LateReply {
    /// What the client got.
    pub client_status: String,
    /// When, after the call began.
    pub client_ms: f64,
    /// Whether the order row exists afterwards.
    pub order_written: bool,
    /// What a retry with the same order id answered.
    pub retry_status: String,
    /// Payments charged for the order and its retry together.
    pub charges: u64,
    /// What orders and payments recorded.
    pub hops: Vec<Hop>,
}

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Orders {
    /// The client's budget for CreateOrder.
    pub budget_ms: u64,
    /// The stalled case's client status.
    pub client_status: String,
    /// The stalled case: was the payment cancelled?
    pub payment_cancelled: bool,
    /// The stalled case: was the order written?
    pub order_written: bool,
    /// The payment stalls.
    pub stall: Stall,
    /// The reply is late.
    pub late_reply: LateReply,
    /// What DEADLINE_EXCEEDED means for the order.
    pub outcome_unknown: String,
    /// Orders in the database at the end.
    pub orders_in_db: u64,
}

/// Runs the cases on one in-process orders + payments pair.
///
/// # Errors
///
/// When the services cannot be started or warmed.
pub async fn measure() -> anyhow::Result<Orders> {
    let shared = Shared::in_memory()?;
    let started = orders::start("127.0.0.1:0", &shared).await?;
    let entry = started
        .iter()
        .find(|s| s.role == "orders")
        .map(|s| s.addr)
        .ok_or_else(|| anyhow::anyhow!("orders started"))?;
    let mut client = orders::client(entry).await?;
    let scope = || Scope::background().with_timeout(BUDGET);
    let create = |id: &str, payment_ms, reply_ms| CreateOrderReq {
        order_id: id.to_owned(),
        amount_cents: 4200,
        payment_ms,
        reply_ms,
    };
    // Warm both connections.
    scope()
        .enter(client.create_order(create("warm-up", 0, 0)))
        .await?;
    shared.journal.take();
    let charged = || shared.payments.charged.load(Ordering::Relaxed);
    let cancelled = || shared.payments.cancelled.load(Ordering::Relaxed);

    // 1. The payment stalls past the deadline.
    let (charged0, cancelled0) = (charged(), cancelled());
    let t = Instant::now();
    let result = scope()
        .enter(client.create_order(create("o-stall", STALL_MS, 0)))
        .await;
    let client_ms = ms(t.elapsed());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let lookup = without_deadline(client.get_order(GetOrderReq {
        order_id: "o-stall".into(),
    }))
    .await;
    let stall = Stall {
        client_status: status_name(&result).to_owned(),
        client_ms,
        payment_cancelled: cancelled() > cancelled0,
        payment_completed: charged() > charged0,
        order_written: lookup.is_ok(),
        get_order_status: status_name(&lookup).to_owned(),
        hops: hops(&shared.journal.take(), &["orders", "payments"]),
    };

    // 2. The order commits, then the reply misses the deadline.
    let charged0 = charged();
    let t = Instant::now();
    let result = scope()
        .enter(client.create_order(create("o-late", PAYMENT_MS, SLOW_REPLY_MS)))
        .await;
    let client_ms = ms(t.elapsed());
    let lookup = without_deadline(client.get_order(GetOrderReq {
        order_id: "o-late".into(),
    }))
    .await;
    // The client retries the same order id: found, not charged again.
    let retry = scope()
        .enter(client.create_order(create("o-late", PAYMENT_MS, 0)))
        .await;
    let late_reply = LateReply {
        client_status: status_name(&result).to_owned(),
        client_ms,
        order_written: lookup.is_ok(),
        retry_status: status_name(&retry).to_owned(),
        charges: charged() - charged0,
        hops: hops(&shared.journal.take(), &["orders", "payments"]),
    };

    let meaning = "DEADLINE_EXCEEDED is not \"nothing happened\": in the stalled case the payment was cancelled and no row exists, but in the late-reply case the row was committed although the client saw the same DEADLINE_EXCEEDED. The client cannot tell which; only an idempotent retry (same order id) is safe.";
    Ok(Orders {
        budget_ms: BUDGET.as_millis() as u64,
        client_status: stall.client_status.clone(),
        payment_cancelled: stall.payment_cancelled,
        order_written: stall.order_written,
        stall,
        late_reply,
        outcome_unknown: meaning.to_owned(),
        orders_in_db: shared.db.count(),
    })
}

impl crate::registry::Experiment for Orders {
    const NAME: &'static str = "orders";
    const LIGHT: bool = true;
    const ABOUT: &'static str = "CreateOrder with a payment that stalls past the deadline";
    const PRINTS: &'static str =
        "CreateOrder whose payment stalls past the deadline: payment cancelled, no row; and what \"outcome unknown\" means";
    type Args = crate::registry::NoArgs;

    async fn run(_: Self::Args, _: crate::registry::Spans) -> anyhow::Result<Self> {
        measure().await
    }

    fn outcome(&self) -> Outcome {
        let (stall, late) = (&self.stall, &self.late_reply);
        let yes = |v: bool| if v { "yes" } else { "no" }.to_owned();
        let rows = vec![
            vec![
                format!("payment stalls ({STALL_MS} ms)"),
                format!("{} at {} ms", stall.client_status, stall.client_ms),
                yes(stall.payment_cancelled),
                yes(stall.order_written),
                "—".to_owned(),
            ],
            vec![
                format!("committed, reply takes {SLOW_REPLY_MS} ms"),
                format!("{} at {} ms", late.client_status, late.client_ms),
                "no".to_owned(),
                yes(late.order_written),
                format!("{} ({} charge)", late.retry_status, late.charges),
            ],
        ];
        Outcome {
            title: format!(
                "orders: CreateOrder with a {} ms budget, payments inside, SQLite behind",
                self.budget_ms
            ),
            json: crate::report::to_json(self),
            columns: vec![
                "case",
                "client",
                "payment cancelled",
                "order row written",
                "retry, same id",
            ],
            rows,
            notes: vec![self.outcome_unknown.clone()],
        }
    }
}
