//! The API with a 900 ms request deadline: inventory then pricing share it
//! (pricing gets what is left less a reserve, not a fresh 800 ms), a cache
//! lookup is capped at 20 ms, and a parallel fan-out shares one deadline.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::experiments::im::hops;
use crate::experiments::status_name;
use crate::pb::{BrowseReq, CheckoutReq};
use crate::report::{Outcome, ms};
use crate::systems::shop::{self, API_DEADLINE, CACHE_CAP, FIXED_TIMEOUT, PRICING_RESERVE};
use crate::systems::trace::Journal;

/// Inventory's time in the seed's example.
pub const INVENTORY_MS: u64 = 650;
/// Pricing's work.
const PRICING_MS: u64 = 100;
/// Pricing's work in the fixed-timeouts case: more than the request has left.
const SLOW_PRICING_MS: u64 = 300;
/// A cache slower than its cap.
const SLOW_CACHE_MS: u64 = 60;
/// Items quoted in parallel by `Browse`.
const ITEMS: u32 = 3;

async fn case<T>(
    journal: &Journal,
    settle: Duration,
    call: impl Future<Output = Result<T, tonic::Status>>,
) -> Value {
    journal.take();
    let started = Instant::now();
    let result = call.await;
    let client_ms = ms(started.elapsed());
    tokio::time::sleep(settle).await;
    let records = journal.take();
    json!({
        "status": status_name(&result),
        "client_ms": client_ms,
        "hops": hops(&records, &["api", "inventory", "pricing", "cache"]),
        "pricing_entries_ms": records
            .iter()
            .filter(|t| t.service == "pricing" && t.target.is_empty())
            .map(|t| (t.remaining_us as f64 / 100.0).round() / 10.0)
            .collect::<Vec<_>>(),
    })
}

fn entry(case: &Value, service: &str) -> Value {
    case["hops"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|h| h["service"] == service)
        .map_or(Value::Null, |h| h["entry_ms"].clone())
}

fn gave(case: &Value, to: &str) -> Value {
    case["hops"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|h| h["gave"].as_array().into_iter().flatten())
        .find(|g| g["to"] == to)
        .map_or(Value::Null, |g| g["ms"].clone())
}

fn work_end(case: &Value, service: &str) -> String {
    case["hops"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|h| h["service"] == service)
        .and_then(|h| h["work"].as_object())
        .map_or("—".to_owned(), |w| {
            format!(
                "{} at {} ms",
                w["outcome"].as_str().unwrap_or_default(),
                w["at_ms"]
            )
        })
}

/// Runs the cases on one in-process shop.
pub async fn run() -> anyhow::Result<Outcome> {
    let journal = Journal::new();
    let started = shop::start("127.0.0.1:0", &journal).await?;
    let api = started
        .iter()
        .find(|s| s.role == "api")
        .map(|s| s.addr)
        .ok_or_else(|| anyhow::anyhow!("api started"))?;
    let mut client = shop::client(api).await?;
    // Warm every connection.
    client.checkout(CheckoutReq::default()).await?;
    client
        .browse(BrowseReq {
            items: ITEMS,
            ..BrowseReq::default()
        })
        .await?;

    // The public client sends no deadline: the API's own 900 ms applies.
    let settle = Duration::from_millis(50);
    let checkout = |fixed_timeouts, pricing_ms| CheckoutReq {
        sku: "sku-1".into(),
        inventory_ms: INVENTORY_MS,
        pricing_ms,
        cache_ms: 0,
        fixed_timeouts,
    };
    let propagated = case(
        &journal,
        settle,
        client.checkout(checkout(false, PRICING_MS)),
    )
    .await;
    let fixed = case(
        &journal,
        Duration::from_millis(300),
        client.checkout(checkout(true, SLOW_PRICING_MS)),
    )
    .await;
    let browse = case(
        &journal,
        settle,
        client.browse(BrowseReq {
            items: ITEMS,
            pricing_ms: PRICING_MS,
            cache_ms: SLOW_CACHE_MS,
        }),
    )
    .await;

    let expected_pricing =
        API_DEADLINE.as_millis() as u64 - INVENTORY_MS - PRICING_RESERVE.as_millis() as u64;
    let rows = vec![
        vec![
            "propagated".to_owned(),
            entry(&propagated, "api").to_string(),
            entry(&propagated, "inventory").to_string(),
            entry(&propagated, "pricing").to_string(),
            format!(
                "{} at {} ms",
                propagated["status"].as_str().unwrap_or_default(),
                propagated["client_ms"]
            ),
            format!("900 / ≈900 / ≈250 − reserve ({expected_pricing})"),
        ],
        vec![
            format!("fixed 800 ms per call, pricing takes {SLOW_PRICING_MS} ms"),
            entry(&fixed, "api").to_string(),
            entry(&fixed, "inventory").to_string(),
            entry(&fixed, "pricing").to_string(),
            format!(
                "{} at {} ms",
                fixed["status"].as_str().unwrap_or_default(),
                fixed["client_ms"]
            ),
            "900 / 800 / a fresh 800".to_owned(),
        ],
    ];
    let quotes = browse["pricing_entries_ms"].clone();
    let cache_gave = gave(&browse, "cache");
    let notes = vec![
        format!(
            "fan-out (Browse, {ITEMS} quotes in parallel + cache): quotes entered with {quotes} ms — one shared deadline; the cache got {cache_gave} ms (cap {} ms) and, taking {SLOW_CACHE_MS} ms, was cut: {}",
            CACHE_CAP.as_millis(),
            browse["hops"][0]["gave"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|g| g["to"] == "cache")
                .map_or("?".to_owned(), |g| g["outcome"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()),
        ),
        format!(
            "with fixed timeouts pricing was promised {} ms although only ≈{} ms of the request were left; the caller got {} at {} ms and pricing's work ended {}",
            FIXED_TIMEOUT.as_millis(),
            API_DEADLINE.as_millis() as u64 - INVENTORY_MS,
            fixed["status"].as_str().unwrap_or_default(),
            fixed["client_ms"],
            work_end(&fixed, "pricing"),
        ),
    ];
    Ok(Outcome {
        title: format!(
            "shop: API deadline 900 ms, inventory takes {INVENTORY_MS} ms, then pricing; ms on entry"
        ),
        json: json!({
            "api_deadline_ms": API_DEADLINE.as_millis() as u64,
            "inventory_ms": INVENTORY_MS,
            "reserve_ms": PRICING_RESERVE.as_millis() as u64,
            "inventory_budget_ms": entry(&propagated, "inventory"),
            "pricing_budget_ms": entry(&propagated, "pricing"),
            "expected_pricing_ms": expected_pricing,
            "cache_cap_ms": CACHE_CAP.as_millis() as u64,
            "cache_budget_ms": entry(&browse, "cache"),
            "propagated": propagated,
            "fixed_timeouts": fixed,
            "fan_out": browse,
        }),
        columns: vec![
            "variant",
            "api ms",
            "inventory ms",
            "pricing ms",
            "status",
            "seed api / inventory / pricing",
        ],
        rows,
        notes,
    })
}
