//! Where the budget went: the ledger a root caller receives with a
//! `DEADLINE_EXCEEDED`, for the lab's stall cases, over many runs.
//!
//! - `IM route stalls`: client → gateway → logic → route, route's lookup
//!   stuck in a blocking call (the waterfall's case); route answers at its
//!   200 ms cap.
//! - `shop pricing late`: client → api → inventory (300 ms), then pricing,
//!   which takes longer than what is left of the API's 900 ms.
//! - `a retried call`: client → A → B, A retrying B from service config;
//!   B fails the first attempt `UNAVAILABLE` and stalls on the second.
//!
//! Every case runs twice: with every hop keeping [`REPLY_RESERVE`] for its
//! answer, and with the defaults (nothing set: the server layer's default
//! reserve, `server::default_reply_reserve`, keeps time for the answer).
//! Then, with the defaults, a chain as a user builds it:
//! `four processes, D stalls, defaults`, four `serve chain` processes
//! A → B → C → D, D stalled, under a 600 ms root scope.
//! For each: the
//! share of runs whose ledger reached the stalled hop's line, the share
//! that named it (the hop that spent the most time itself), how far the
//! ledger's account of the root hop's time is from what the client
//! waited, and the longest line; one ledger is printed whole. Then one
//! more call of each case is traced: its waterfall (the spans every hop
//! exported, collected by an OTLP receiver in this process) is printed
//! beside the ledger the same call brought back.

use std::time::Duration;

use futures_util::StreamExt as _;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic::{Request, Response, Status};
use tonic_deadline::ledger::Ledger;
use tonic_deadline::resilience::ResilienceLayer;
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer};

use crate::kit::traced::{self, Case};
use crate::html::chart::{self, escape};
use crate::html::{Part, Section};
use crate::otlp::Receiver;
use crate::pb::{CheckoutReq, PushReq};
use crate::registry::{Experiment, Spans};
use crate::report::Outcome;
use crate::systems::trace::Journal;
use crate::systems::{REPLY_RESERVE, im, shop};

/// Runs of each case by default.
pub const RUNS: usize = 100;
/// Runs of each case in the demo: one wave of calls in flight at once.
pub const DEMO_RUNS: usize = 25;

/// The flags of `experiment ledger`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Runs of each stall case.
    #[arg(long, default_value_t = RUNS)]
    runs: usize,
    /// Calls in flight at once: each wave reaches the stalled hop's
    /// deadline in the same millisecond, and its answers race their
    /// callers' timers together.
    #[arg(long, default_value_t = AT_ONCE)]
    at_once: usize,
}

/// Calls in flight at once by default.
pub const AT_ONCE: usize = 25;

/// The experiment's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LedgerResult {
    /// One row per case.
    pub rows: Vec<Row>,
}

/// One stall case over many runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// `IM route stalls`, `shop pricing late`, `a retried call` (each
    /// also `…, defaults`), [`FOUR_PROCESSES`].
    pub case: String,
    /// Runs made.
    pub runs: usize,
    /// The hop that stalls (its method's path).
    pub stalled: String,
    /// What each hop's server layer was set to keep for its answer
    /// (`ServerDeadlineLayer::reply_reserve`), in ms; `None` for the
    /// defaults rows, where each keeps `server::default_reply_reserve` of
    /// its budget.
    #[serde(default)]
    pub reserve_ms: Option<f64>,
    /// Share of runs ending `DEADLINE_EXCEEDED` whose ledger reached the
    /// stalled hop's line.
    pub arrived_share: f64,
    /// Share of runs whose ledger named the stalled hop as the one that
    /// spent the most time itself.
    pub named_right_share: f64,
    /// Mean of |the ledger's account of the root hop's time − what the
    /// client waited| ÷ what the client waited.
    pub sum_error_share: f64,
    /// The longest line of one hop, in bytes.
    pub max_bytes_per_hop: usize,
    /// One ledger as received: the status message.
    pub example: String,
    /// Its lines, the root's first.
    pub example_lines: Vec<String>,
    /// One more call, traced: its spans as the receiver got them, and the
    /// ledger it brought back.
    #[serde(default)]
    pub traced: Option<Case>,
}

/// What one run gave: its status, and how long the client waited.
struct Run {
    status: Option<Status>,
    waited: Duration,
}

type Retrying = testkit::probe_client::ProbeClient<
    tonic_deadline::resilience::Resilience<
        tonic_deadline::client::ClientDeadline<tonic::transport::Channel>,
    >,
>;

/// A hop of the retried case: A calls B with retries and passes its answer
/// on; B fails a first attempt `UNAVAILABLE` and stalls on a retry.
#[derive(Clone)]
struct RetriedHop {
    next: Option<Retrying>,
}

#[tonic::async_trait]
impl testkit::CallOnly for RetriedHop {
    async fn call(
        &self,
        request: Request<testkit::CallRequest>,
    ) -> Result<Response<testkit::CallReply>, Status> {
        if let Some(next) = &self.next {
            return next.clone().call(request.into_inner()).await;
        }
        if request
            .metadata()
            .get("grpc-previous-rpc-attempts")
            .is_none()
        {
            return Err(Status::unavailable("B: not yet"));
        }
        // Stuck until its scope ends (the layer answers then).
        let scope = Scope::current();
        scope.ended().await;
        Err(scope
            .check()
            .err()
            .map_or_else(|| Status::deadline_exceeded("stalled"), Status::from))
    }
}

/// A's retry policy for B.
const RETRY: &str = r#"{"methodConfig": [{"name": [{"service": "probe.v1.Probe"}],
    "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
                    "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#;

/// Serves `service` on loopback with the server layer keeping
/// `reserve` for its answer (`None`: its default).
async fn serve_probe<S>(
    service: S,
    reserve: Option<Duration>,
) -> anyhow::Result<std::net::SocketAddr>
where
    S: testkit::probe_server::Probe,
{
    let routes = tonic::service::Routes::new(testkit::probe_server::ProbeServer::new(service));
    let mut layer = ServerDeadlineLayer::new().trace_spans();
    if let Some(reserve) = reserve {
        layer = layer.reply_reserve(reserve);
    }
    crate::net::serve("127.0.0.1:0", routes, Some(layer)).await
}

fn channel(addr: std::net::SocketAddr) -> anyhow::Result<tonic::transport::Channel> {
    Ok(tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?.connect_lazy())
}

/// Runs `call` `runs` times, `at_once` at a time, each under a root
/// scope of `budget`, once the chain's connections are made (by as many
/// calls, not counted).
async fn runs<F, Fut>(runs: usize, at_once: usize, budget: Duration, call: F) -> Vec<Run>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), Status>>,
{
    let warm: Vec<_> = (0..at_once)
        .map(|_| Scope::background().with_timeout(budget).enter(call()))
        .collect();
    futures_util::future::join_all(warm).await;
    futures_util::stream::iter(0..runs)
        .map(|_| {
            let call = call();
            async move {
                let started = Instant::now();
                let status = Scope::background()
                    .with_timeout(budget)
                    .enter(call)
                    .await
                    .err();
                Run {
                    status,
                    waited: started.elapsed(),
                }
            }
        })
        .buffer_unordered(at_once)
        .collect()
        .await
}

/// The row of a case from its runs: `stalled` is the path of the hop that
/// stalls.
fn row(case: &str, stalled: &str, reserve: Option<Duration>, runs: &[Run]) -> Row {
    let mut arrived = 0;
    let mut named = 0;
    let mut errors = Vec::new();
    let mut longest = 0;
    let mut example = None;
    for run in runs {
        let Some(status) = &run.status else { continue };
        let Some(ledger) = Ledger::from_status(status) else {
            continue;
        };
        let hops = ledger.hops();
        if hops.iter().any(|h| h.method == stalled) {
            arrived += 1;
        }
        if ledger.stalled().is_some_and(|h| h.method == stalled) {
            named += 1;
        }
        if let Some(root) = hops.first() {
            let waited = run.waited.as_secs_f64();
            errors.push((root.took.as_secs_f64() - waited).abs() / waited);
        }
        let lines = Ledger::lines(status);
        longest = longest.max(lines.iter().map(String::len).max().unwrap_or(0));
        if example.is_none() && ledger.stalled().is_some_and(|h| h.method == stalled) {
            example = Some((status.message().to_owned(), lines));
        }
    }
    let share = |n: usize| n as f64 / runs.len().max(1) as f64;
    let (example, example_lines) = example.unwrap_or_default();
    Row {
        case: case.to_owned(),
        runs: runs.len(),
        stalled: stalled.to_owned(),
        reserve_ms: reserve.map(|r| r.as_secs_f64() * 1e3),
        arrived_share: share(arrived),
        named_right_share: share(named),
        sum_error_share: if errors.is_empty() {
            1.0
        } else {
            errors.iter().sum::<f64>() / errors.len() as f64
        },
        max_bytes_per_hop: longest,
        example,
        example_lines,
        traced: None,
    }
}

/// Spans a traced call of each case makes, at least: the root's, and a
/// client and a server span per call.
const IM_SPANS: usize = 8;
const SHOP_SPANS: usize = 6;
const RETRIED_SPANS: usize = 7;

/// Measures every case, `n` runs each: first with each hop keeping
/// [`REPLY_RESERVE`], tracing one more call of each with its spans sent to
/// `receiver`; then with the defaults (no reserve set anywhere).
///
/// # Errors
///
/// When a system cannot start, or the traced call's spans do not reach
/// `receiver`.
pub async fn measure(
    n: usize,
    at_once: usize,
    receiver: &Receiver,
) -> anyhow::Result<LedgerResult> {
    let mut rows = cases(n, at_once, Some(REPLY_RESERVE), Some(receiver)).await?;
    rows.extend(cases(n, at_once, None, None).await?);
    rows.push(four_processes(n, at_once).await?);
    Ok(LedgerResult { rows })
}

/// The case of a chain of separate processes: what a user builds.
pub const FOUR_PROCESSES: &str = "four processes, D stalls, defaults";

/// A chain of four `deadline-lab serve chain` processes, A → B → C → D,
/// each with the server layer's defaults and the README's client to the
/// next (`ClientDeadlineLayer` over `ReadyChannel::lazy`); A, B and C work
/// 20 ms, D stalls; the root calls A with a 600 ms scope, `n` runs.
///
/// # Errors
///
/// When a hop's process cannot start.
async fn four_processes(n: usize, at_once: usize) -> anyhow::Result<Row> {
    let exe = crate::process::lab_exe()?;
    let mut hops = Vec::new();
    let mut next: Option<std::net::SocketAddr> = None;
    for (role, work_ms) in [("D", "30000"), ("C", "20"), ("B", "20"), ("A", "20")] {
        let mut command = std::process::Command::new(&exe);
        command.args(["serve", "chain", "--role", role, "--hop-ms", work_ms]);
        command.arg("--default-reply-reserve");
        if let Some(addr) = next {
            command.args(["--next", &addr.to_string()]);
        }
        let mut hop = crate::process::Spawned::spawn(format!("chain {role}"), command)?;
        next = Some(hop.addr().await?);
        hops.push(hop);
    }
    let a = next.ok_or_else(|| anyhow::anyhow!("the chain has no hop"))?;
    let root = testkit::probe_client::ProbeClient::new(crate::net::lazy_layered(a)?);
    let call = || {
        let mut root = root.clone();
        async move { root.call(testkit::CallRequest::default()).await.map(drop) }
    };
    let four = runs(n, at_once, Duration::from_millis(600), call).await;
    let mut row = row(FOUR_PROCESSES, "/probe.v1.Probe/Call", None, &four);
    // Every hop serves the same method: D's is the fourth line.
    let whole = |l: &Ledger| l.hops().len() == 4;
    let ledgers: Vec<Ledger> = four
        .iter()
        .filter_map(|r| r.status.as_ref().and_then(Ledger::from_status))
        .collect();
    let share = |n: usize| n as f64 / four.len().max(1) as f64;
    row.arrived_share = share(ledgers.iter().filter(|l| whole(l)).count());
    row.named_right_share = share(
        ledgers
            .iter()
            .filter(|l| whole(l) && l.stalled().is_some_and(|h| std::ptr::eq(h, &l.hops()[3])))
            .count(),
    );
    drop(hops);
    Ok(row)
}

/// The cases, `n` runs each, every hop keeping `reserve` (`None`: the
/// defaults, and the cases are named so); with a `receiver`, one more call
/// of each is traced.
async fn cases(
    n: usize,
    at_once: usize,
    reserve: Option<Duration>,
    receiver: Option<&Receiver>,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let named = |case: &str| {
        if reserve.is_none() {
            format!("{case}, defaults")
        } else {
            case.to_owned()
        }
    };

    let journal = Journal::new();
    let started = im::start_with_reserve("127.0.0.1:0", &journal, reserve).await?;
    let gateway = crate::systems::addr_of(&started, "gateway")?;
    let client = im::client(gateway).await?;
    let push = |route_blocks| PushReq {
        uid: 1,
        text: "hi".into(),
        route_ms: traced::STALL_MS,
        push_ms: 5,
        route_blocks,
    };
    let im_call = || {
        let mut client = client.clone();
        let request = push(true);
        async move { client.push(request).await.map(drop) }
    };
    let im_runs = runs(n, at_once, im::CLIENT_BUDGET, im_call).await;
    let mut im_row = row(
        &named("IM route stalls"),
        "/lab.v1.Route/GetRoute",
        reserve,
        &im_runs,
    );
    if let Some(receiver) = receiver {
        im_row.traced = Some(
            traced::traced(
                receiver,
                &im_row.case,
                im::CLIENT_BUDGET,
                IM_SPANS,
                im_call(),
            )
            .await?,
        );
    }
    journal.take();
    rows.push(im_row);

    let journal = Journal::new();
    let started = shop::start_with_reserve("127.0.0.1:0", &journal, reserve).await?;
    let api = crate::systems::addr_of(&started, "api")?;
    let client = shop::client(api).await?;
    let shop_call = || {
        let mut client = client.clone();
        async move {
            client
                .checkout(CheckoutReq {
                    sku: "sku-1".into(),
                    inventory_ms: 300,
                    pricing_ms: 2_000,
                    cache_ms: 0,
                    fixed_timeouts: false,
                })
                .await
                .map(drop)
        }
    };
    let shop_budget = Duration::from_secs(1);
    let shop_runs = runs(n, at_once, shop_budget, shop_call).await;
    let mut shop_row = row(
        &named("shop pricing late"),
        "/lab.v1.Pricing/Quote",
        reserve,
        &shop_runs,
    );
    if let Some(receiver) = receiver {
        shop_row.traced = Some(
            traced::traced(
                receiver,
                &shop_row.case,
                shop_budget,
                SHOP_SPANS,
                shop_call(),
            )
            .await?,
        );
    }
    journal.take();
    rows.push(shop_row);

    let b = serve_probe(RetriedHop { next: None }, reserve).await?;
    let retrying = tower::ServiceBuilder::new()
        .layer(ResilienceLayer::from_service_config(RETRY)?)
        .layer(ClientDeadlineLayer::new().trace_spans())
        .service(channel(b)?);
    let a = serve_probe(
        RetriedHop {
            next: Some(testkit::probe_client::ProbeClient::new(retrying)),
        },
        reserve,
    )
    .await?;
    let root = testkit::probe_client::ProbeClient::new(
        tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new().trace_spans())
            .service(channel(a)?),
    );
    let retried_call = || {
        let mut root = root.clone();
        async move { root.call(testkit::CallRequest::default()).await.map(drop) }
    };
    let retried_budget = Duration::from_millis(300);
    let retried_runs = runs(n, at_once, retried_budget, retried_call).await;
    let mut retried = row(
        &named("a retried call"),
        "/probe.v1.Probe/Call",
        reserve,
        &retried_runs,
    );
    // A and B serve the same method: B is the second line.
    let named = retried_runs
        .iter()
        .filter_map(|r| r.status.as_ref().and_then(Ledger::from_status))
        .filter(|l| {
            l.hops().len() == 2
                && l.stalled().is_some_and(|h| std::ptr::eq(h, &l.hops()[1]))
                && l.hops()[0].calls.len() == 2
        })
        .count();
    retried.named_right_share = named as f64 / retried_runs.len().max(1) as f64;
    if let Some(receiver) = receiver {
        retried.traced = Some(
            traced::traced(
                receiver,
                &retried.case,
                retried_budget,
                RETRIED_SPANS,
                retried_call(),
            )
            .await?,
        );
    }
    rows.push(retried);
    Ok(rows)
}

/// Runs `deadline-lab experiment ledger --runs N --json` as a child
/// process, so that its spans stay out of this process.
///
/// # Errors
///
/// When the child fails or prints something else than the result.
async fn run_child(n: usize, at_once: usize) -> anyhow::Result<LedgerResult> {
    let (runs, at_once) = (n.to_string(), at_once.to_string());
    let args = [
        "experiment",
        "ledger",
        "--runs",
        &runs,
        "--at-once",
        &at_once,
        "--json",
    ];
    let out = crate::process::run(&crate::process::lab_exe()?, &args).await?;
    Ok(serde_json::from_str(&out)?)
}

impl Experiment for LedgerResult {
    const NAME: &'static str = "ledger";
    const LIGHT: bool = true;
    const ABOUT: &'static str = "Where the budget of a DEADLINE_EXCEEDED went: the ledger the root caller receives for the IM chain with route stalled, the shop with pricing late and a retried call, over many runs";
    const PRINTS: &'static str =
        "the ledger a root caller receives with a `DEADLINE_EXCEEDED` in three stall cases, `RUNS` runs each (100), `AT_ONCE` calls in flight at once (25), and one call of each traced beside its ledger ([more](#experiment-ledger))";
    const COLLECTS_SPANS: bool = true;
    const SECTION: Option<Section> = Some(Section::Ledger);
    type Args = Args;

    fn demo_args() -> Args {
        Args {
            runs: DEMO_RUNS,
            at_once: AT_ONCE,
        }
    }

    async fn run(args: Args, spans: Spans) -> anyhow::Result<Self> {
        let n = args.runs.clamp(1, 100_000);
        let at_once = args.at_once.clamp(1, 1_000);
        match spans {
            Spans::ChildProcess => run_child(n, at_once).await,
            Spans::Collected(receiver) => {
                let receiver = receiver.ok_or_else(|| {
                    anyhow::anyhow!(
                        "the ledger traces its calls with its own OTLP receiver; none runs"
                    )
                })?;
                measure(n, at_once, &receiver).await
            }
        }
    }

    fn outcome(&self) -> Outcome {
        let rows = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.case.clone(),
                    r.runs.to_string(),
                    r.stalled.clone(),
                    r.reserve_ms
                        .map_or_else(|| "default".to_owned(), |ms| format!("{ms:.0}")),
                    format!("{:.3}", r.arrived_share),
                    format!("{:.3}", r.named_right_share),
                    format!("{:.4}", r.sum_error_share),
                    r.max_bytes_per_hop.to_string(),
                ]
            })
            .collect();
        let mut notes = vec![format!(
            "reserve: what each hop's server layer keeps for its answer, {} ms set with ServerDeadlineLayer::reply_reserve in the first rows; the rows marked defaults set nothing, and each layer keeps its default, server::default_reply_reserve (with the ledger feature a twentieth of the budget, at most {} ms); arrived: the ledger reached the stalled hop's line; named: that hop spent the most time itself; sum error: the root hop's time as the ledger tells it beside what the client waited",
            REPLY_RESERVE.as_millis(),
            tonic_deadline::server::default_reply_reserve(Duration::from_secs(1)).as_millis()
        )];
        for r in self.rows.iter().filter(|r| r.traced.is_some()) {
            notes.push(format!("{}: {}", r.case, r.example));
            for line in &r.example_lines {
                notes.push(format!("    {line}"));
            }
        }
        for case in self.rows.iter().filter_map(|r| r.traced.as_ref()) {
            notes.extend(traced_lines(case));
        }
        Outcome {
            title: "ledger: where the budget of a DEADLINE_EXCEEDED went, hop by hop, as the root caller receives it".into(),
            json: crate::report::to_json(self),
            columns: vec![
                "case",
                "runs",
                "stalled hop",
                "reserve, ms",
                "arrived",
                "named right",
                "sum error",
                "longest line, bytes",
            ],
            rows,
            notes,
        }
    }

    /// Per stall case, how often the ledger reached the root and named the
    /// stalled hop, one ledger as the root received it, and one call
    /// traced: its waterfall beside the ledger it brought back.
    fn report(&self, table: &Outcome) -> Vec<Part> {
        let mut html = String::from(
            "<p class=\"muted\">The ledger a root caller receives with a DEADLINE_EXCEEDED: every hop's line, the root's first. For each case one more call is traced over OTLP; its waterfall is drawn from the spans every hop exported, and under it is the ledger the same call brought back.</p>",
        );
        html.push_str(&chart::rows(table));
        // The first note explains the columns; the rest print the examples
        // and traced calls as text, drawn here instead.
        html.push_str(&chart::notes(table.notes.get(..1).unwrap_or_default()));
        for row in self.rows.iter().filter(|r| r.traced.is_some()) {
            html.push_str(&format!(
                "<h3>{}</h3><pre>{}\n{}</pre>",
                escape(&row.case),
                escape(&row.example),
                escape(&row.example_lines.join("\n"))
            ));
            if let Some(case) = &row.traced {
                let budget_ms = case
                    .spans
                    .first()
                    .and_then(|h| h.budget_on_entry_ms)
                    .unwrap_or(case.client_ms);
                html.push_str(&traced::chart(case, budget_ms));
                html.push_str(&format!(
                    "<p class=\"muted\">The ledger this traced call brought back:</p><pre>{}</pre>",
                    escape(&case.ledger.join("\n"))
                ));
            }
        }
        vec![Part::new(html)]
    }
}

/// A traced call as text: its waterfall (a bar per span, one column per
/// [`traced::BAR_MS`], out to the client's deadline) and, under it, the
/// ledger the same call brought back.
fn traced_lines(case: &Case) -> Vec<String> {
    let budget_ms = case
        .spans
        .first()
        .and_then(|h| h.budget_on_entry_ms)
        .unwrap_or(case.client_ms);
    let width = (case
        .spans
        .iter()
        .map(|h| h.end_ms)
        .fold(budget_ms, f64::max)
        / traced::BAR_MS) as usize;
    let mut lines = vec![format!(
        "{}, one call traced (trace {}): {} after {} ms",
        case.case, case.trace_id, case.status, case.client_ms
    )];
    for hop in &case.spans {
        lines.push(format!(
            "    {:<34} {:>7.1} → {:>7.1} ms  {:<18} {}",
            format!("{}{}", "  ".repeat(hop.depth), hop.service),
            hop.start_ms,
            hop.end_ms,
            hop.outcome,
            traced::bar(hop, width),
        ));
    }
    lines.push("    the ledger it brought back:".to_owned());
    lines.extend(case.ledger.iter().map(|l| format!("      {l}")));
    lines
}
