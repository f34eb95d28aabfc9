//! Orders → payments with SQLite behind orders: a payment that stalls past the
//! deadline, and what "outcome unknown" means for the order row.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;
use tonic_deadline::Scope;

use crate::experiments::im::hops;
use crate::experiments::status_name;
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

/// Runs the cases on one in-process orders + payments pair.
pub async fn run() -> anyhow::Result<Outcome> {
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
    let lookup = client
        .get_order(GetOrderReq {
            order_id: "o-stall".into(),
        })
        .await;
    let stall = json!({
        "client_status": status_name(&result),
        "client_ms": client_ms,
        "payment_cancelled": cancelled() > cancelled0,
        "payment_completed": charged() > charged0,
        "order_written": lookup.is_ok(),
        "get_order_status": status_name(&lookup),
        "hops": hops(&shared.journal.take(), &["orders", "payments"]),
    });

    // 2. The order commits, then the reply misses the deadline.
    let charged0 = charged();
    let t = Instant::now();
    let result = scope()
        .enter(client.create_order(create("o-late", PAYMENT_MS, SLOW_REPLY_MS)))
        .await;
    let client_ms = ms(t.elapsed());
    let lookup = client
        .get_order(GetOrderReq {
            order_id: "o-late".into(),
        })
        .await;
    // The client retries the same order id: found, not charged again.
    let retry = scope()
        .enter(client.create_order(create("o-late", PAYMENT_MS, 0)))
        .await;
    let late = json!({
        "client_status": status_name(&result),
        "client_ms": client_ms,
        "order_written": lookup.is_ok(),
        "retry_status": status_name(&retry),
        "charges": charged() - charged0,
        "hops": hops(&shared.journal.take(), &["orders", "payments"]),
    });

    let meaning = "DEADLINE_EXCEEDED is not \"nothing happened\": in the stalled case the payment was cancelled and no row exists, but in the late-reply case the row was committed although the client saw the same DEADLINE_EXCEEDED. The client cannot tell which; only an idempotent retry (same order id) is safe.";
    let yes = |v: &Value| {
        if v.as_bool() == Some(true) {
            "yes"
        } else {
            "no"
        }
        .to_owned()
    };
    let rows = vec![
        vec![
            format!("payment stalls ({STALL_MS} ms)"),
            format!(
                "{} at {} ms",
                stall["client_status"].as_str().unwrap_or_default(),
                stall["client_ms"]
            ),
            yes(&stall["payment_cancelled"]),
            yes(&stall["order_written"]),
            "—".to_owned(),
        ],
        vec![
            format!("committed, reply takes {SLOW_REPLY_MS} ms"),
            format!(
                "{} at {} ms",
                late["client_status"].as_str().unwrap_or_default(),
                late["client_ms"]
            ),
            "no".to_owned(),
            yes(&late["order_written"]),
            format!(
                "{} ({} charge)",
                late["retry_status"].as_str().unwrap_or_default(),
                late["charges"]
            ),
        ],
    ];
    Ok(Outcome {
        title: format!(
            "orders: CreateOrder with a {} ms budget, payments inside, SQLite behind",
            BUDGET.as_millis()
        ),
        json: json!({
            "budget_ms": BUDGET.as_millis() as u64,
            "client_status": stall["client_status"],
            "payment_cancelled": stall["payment_cancelled"],
            "order_written": stall["order_written"],
            "stall": stall,
            "late_reply": late,
            "outcome_unknown": meaning,
            "orders_in_db": shared.db.count(),
        }),
        columns: vec![
            "case",
            "client",
            "payment cancelled",
            "order row written",
            "retry, same id",
        ],
        rows,
        notes: vec![meaning.to_owned()],
    })
}
