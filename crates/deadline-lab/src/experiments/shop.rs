//! The API with a 900 ms request deadline: inventory then pricing share it
//! (pricing gets what is left less a reserve, not a fresh 800 ms), a cache
//! lookup is capped at 20 ms, and a parallel fan-out shares one deadline.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::kit::journal::{Grant, Hop, cell, find, hops};
use crate::kit::calls::{status_name, without_deadline};
use crate::html::chart::{self, Bar};
use crate::html::{Part, Section};
use crate::pb::{BrowseReq, CheckoutReq};
use crate::registry::{Experiment, NoArgs, Spans};
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

/// One request through the shop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// What the client got.
    pub status: String,
    /// When, after the call began.
    pub client_ms: f64,
    /// Every hop that recorded its entry, the API first.
    pub hops: Vec<Hop>,
    /// Pricing's budget on entry, once per quote.
    pub pricing_entries_ms: Vec<f64>,
}

impl Case {
    /// The budget `service` had on entry.
    pub fn entry(&self, service: &str) -> Option<f64> {
        find(&self.hops, service).and_then(|h| h.entry_ms)
    }

    /// The first grant any hop made to `to`.
    fn grant(&self, to: &str) -> Option<&Grant> {
        self.hops.iter().find_map(|h| h.gave_to(to))
    }

    fn work_end(&self, service: &str) -> String {
        find(&self.hops, service)
            .and_then(|h| h.work.as_ref())
            .map_or("—".to_owned(), |w| {
                format!("{} at {} ms", w.outcome, cell(w.at_ms))
            })
    }
}

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shop {
    /// The API's own deadline for every request.
    pub api_deadline_ms: u64,
    /// Inventory's work.
    pub inventory_ms: u64,
    /// What the API keeps back when it calls pricing.
    pub reserve_ms: u64,
    /// Inventory's budget on entry (propagated case).
    pub inventory_budget_ms: Option<f64>,
    /// Pricing's budget on entry (propagated case).
    pub pricing_budget_ms: Option<f64>,
    /// What pricing should get: the deadline less inventory less the reserve.
    pub expected_pricing_ms: u64,
    /// The cap on a cache lookup.
    pub cache_cap_ms: u64,
    /// The cache's budget on entry (fan-out case).
    pub cache_budget_ms: Option<f64>,
    /// Checkout, the budget propagated.
    pub propagated: Case,
    /// Checkout with a fixed 800 ms per call.
    pub fixed_timeouts: Case,
    /// Browse: quotes in parallel, and the cache.
    pub fan_out: Case,
}

async fn case<T>(
    journal: &Journal,
    settle: Duration,
    call: impl Future<Output = Result<T, tonic::Status>>,
) -> Case {
    journal.take();
    let started = Instant::now();
    let result = call.await;
    let client_ms = ms(started.elapsed());
    tokio::time::sleep(settle).await;
    let records = journal.take();
    Case {
        status: status_name(&result).to_owned(),
        client_ms,
        hops: hops(&records, &["api", "inventory", "pricing", "cache"]),
        pricing_entries_ms: records
            .iter()
            .filter(|t| t.service == "pricing" && t.target.is_empty())
            .map(|t| (t.remaining_us as f64 / 100.0).round() / 10.0)
            .collect(),
    }
}

/// Runs the cases on one in-process shop.
///
/// # Errors
///
/// When the shop cannot be started or warmed.
pub async fn measure() -> anyhow::Result<Shop> {
    let journal = Journal::new();
    let started = shop::start("127.0.0.1:0", &journal).await?;
    let api = crate::systems::addr_of(&started, "api")?;
    let mut client = shop::client(api).await?;
    // Warm every connection.
    without_deadline(client.checkout(CheckoutReq::default())).await?;
    without_deadline(client.browse(BrowseReq {
        items: ITEMS,
        ..BrowseReq::default()
    }))
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
        without_deadline(client.checkout(checkout(false, PRICING_MS))),
    )
    .await;
    let fixed = case(
        &journal,
        Duration::from_millis(300),
        without_deadline(client.checkout(checkout(true, SLOW_PRICING_MS))),
    )
    .await;
    let browse = case(
        &journal,
        settle,
        without_deadline(client.browse(BrowseReq {
            items: ITEMS,
            pricing_ms: PRICING_MS,
            cache_ms: SLOW_CACHE_MS,
        })),
    )
    .await;

    let expected_pricing =
        API_DEADLINE.as_millis() as u64 - INVENTORY_MS - PRICING_RESERVE.as_millis() as u64;
    Ok(Shop {
        api_deadline_ms: API_DEADLINE.as_millis() as u64,
        inventory_ms: INVENTORY_MS,
        reserve_ms: PRICING_RESERVE.as_millis() as u64,
        inventory_budget_ms: propagated.entry("inventory"),
        pricing_budget_ms: propagated.entry("pricing"),
        expected_pricing_ms: expected_pricing,
        cache_cap_ms: CACHE_CAP.as_millis() as u64,
        cache_budget_ms: browse.entry("cache"),
        propagated,
        fixed_timeouts: fixed,
        fan_out: browse,
    })
}

impl Experiment for Shop {
    const NAME: &'static str = "shop";
    const LIGHT: bool = true;
    const ABOUT: &'static str =
        "The API's 900 ms shared by inventory and pricing, the cache cap, fan-out";
    const PRINTS: &'static str =
        "900 ms API: inventory takes 650 ms, pricing gets what is left less a reserve; 20 ms cache cap; fan-out sharing one deadline";
    const SECTION: Option<Section> = Some(Section::BudgetPerHop);
    type Args = NoArgs;

    async fn run(_: NoArgs, _: Spans) -> anyhow::Result<Self> {
        measure().await
    }

    fn outcome(&self) -> Outcome {
        let (propagated, fixed, browse) = (&self.propagated, &self.fixed_timeouts, &self.fan_out);
        let expected_pricing = self.expected_pricing_ms;
        let rows = vec![
            vec![
                "propagated".to_owned(),
                cell(propagated.entry("api")),
                cell(propagated.entry("inventory")),
                cell(propagated.entry("pricing")),
                format!("{} at {} ms", propagated.status, propagated.client_ms),
                format!("900 / ≈900 / ≈250 − reserve ({expected_pricing})"),
            ],
            vec![
                format!("fixed 800 ms per call, pricing takes {SLOW_PRICING_MS} ms"),
                cell(fixed.entry("api")),
                cell(fixed.entry("inventory")),
                cell(fixed.entry("pricing")),
                format!("{} at {} ms", fixed.status, fixed.client_ms),
                "900 / 800 / a fresh 800".to_owned(),
            ],
        ];
        let quotes: Vec<String> = browse
            .pricing_entries_ms
            .iter()
            .map(f64::to_string)
            .collect();
        let cache = browse.grant("cache");
        let notes = vec![
            format!(
                "fan-out (Browse, {ITEMS} quotes in parallel + cache): quotes entered with [{}] ms — one shared deadline; the cache got {} ms (cap {} ms) and, taking {SLOW_CACHE_MS} ms, was cut: {}",
                quotes.join(", "),
                cell(cache.and_then(|g| g.ms)),
                self.cache_cap_ms,
                cache.map_or("?", |g| g.outcome.as_str()),
            ),
            format!(
                "with fixed timeouts pricing was promised {} ms although only ≈{} ms of the request were left; the caller got {} at {} ms and pricing's work ended {}",
                FIXED_TIMEOUT.as_millis(),
                self.api_deadline_ms - self.inventory_ms,
                fixed.status,
                fixed.client_ms,
                fixed.work_end("pricing"),
            ),
        ];
        Outcome {
            title: format!(
                "shop: API deadline {} ms, inventory takes {} ms, then pricing; ms on entry",
                self.api_deadline_ms, self.inventory_ms
            ),
            json: crate::report::to_json(self),
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
        }
    }

    fn report(&self, _: &Outcome) -> Vec<Part> {
        let bars = vec![
            Bar::new(
                "inventory (propagated)",
                self.inventory_budget_ms.unwrap_or(0.0),
                Some(900.0),
            ),
            Bar::new(
                "pricing (propagated)",
                self.pricing_budget_ms.unwrap_or(0.0),
                Some(self.expected_pricing_ms as f64),
            )
            .note("≈ 250 − 50 reserve"),
            Bar::new(
                "cache (capped)",
                self.cache_budget_ms.unwrap_or(0.0),
                Some(self.cache_cap_ms as f64),
            ),
        ];
        vec![Part::new(chart::hbars(
            "shop",
            "Shop API (900 ms): inventory took 650 ms; pricing gets what is left",
            "ms",
            &bars,
        ))]
    }
}
