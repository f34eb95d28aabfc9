//! A real proxy hop: Debian's nginx (`grpc_pass`) between two hops.
//!
//! client → A → capture proxy → nginx → B. The capture proxy (no delay)
//! reads the `grpc-timeout` A sent; B reports the one it received and its
//! deadline. Then the client cancels a call while B works: how long until
//! B's scope ends, through nginx and (for comparison) with A calling B
//! directly. Last, nginx with a `grpc_read_timeout` shorter than the call's
//! deadline: what the caller gets and when.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use testkit::{CallReply, CallRequest, Hop};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tonic_deadline::{Cause, Scope, ServerDeadlineLayer};

use crate::capture::{Capture, Direction};
use crate::clock::deadline_ns;
use crate::kit::calls::{layered_client, status_name};
use crate::html::chart;
use crate::html::{Part, Section};
use crate::nginx::{Config, Nginx};
use crate::registry::{Experiment, Needs, NoArgs, Spans};
use crate::report::{Outcome, ms, quantile};
use crate::systems::chain::{self, Plan};
use crate::{clock, net};

/// The budget of the calls that measure the header and the transit.
const BUDGET: Duration = Duration::from_secs(1);

/// How long B works in the calls that are cancelled: far beyond the wait.
const LONG_WORK_MS: u64 = 10_000;

/// The proxy read timeout of the last case, shorter than its deadline.
const READ_TIMEOUT: Duration = Duration::from_millis(500);

/// The experiment's result: the contract's figures for nginx's default
/// upstream handling (a new connection per request), then the same with
/// upstream keepalive, then a read timeout below the deadline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proxy {
    /// The proxy's name and version (`nginx/1.22.1`).
    pub proxy: String,
    /// `grpc-timeout` as A sent it (read on the wire before nginx).
    pub header_sent: String,
    /// `grpc-timeout` as B received it.
    pub header_received: String,
    /// Whether nginx passed the header on unchanged.
    pub header_unchanged: bool,
    /// B's deadline less A's (CLOCK_MONOTONIC), median of [`CALLS`] calls:
    /// the time the hop through nginx added to B's view of the budget.
    pub transit_ms: f64,
    /// The client cancels while B works: until B's scope ends, through nginx.
    pub reset_reaches_downstream_ms: f64,
    /// Why B's scope ended then.
    pub downstream_cause: String,
    /// The same cancel with A calling B directly.
    pub reset_direct_ms: f64,
    /// The same figures with `keepalive` to the upstream.
    pub keepalive: Through,
    /// A `grpc_read_timeout` shorter than the deadline.
    pub read_timeout: ReadTimeout,
}

/// The figures of one nginx configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Through {
    /// The configuration, in a few words.
    pub config: String,
    /// `grpc-timeout` as A sent it.
    pub header_sent: String,
    /// `grpc-timeout` as B received it.
    pub header_received: String,
    /// B's deadline less A's, median of [`CALLS`] calls.
    pub transit_ms: f64,
    /// Client cancel → B's scope ends.
    pub reset_reaches_downstream_ms: f64,
    /// Why B's scope ended.
    pub downstream_cause: String,
}

/// Calls measured for the transit.
pub const CALLS: usize = 5;

/// nginx with `grpc_read_timeout` below the call's deadline, B silent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadTimeout {
    /// nginx's `grpc_read_timeout`.
    pub grpc_read_timeout_ms: f64,
    /// The call's deadline.
    pub deadline_ms: f64,
    /// How long B would work.
    pub work_ms: f64,
    /// What the client got.
    pub status: String,
    /// Its message.
    pub message: String,
    /// When, from the start of the call.
    pub answered_ms: f64,
    /// When B's scope ended, from the start of the call.
    pub downstream_ended_ms: f64,
    /// Why.
    pub downstream_cause: String,
}

/// B: reports the header and deadline it saw, works `work_ms` watching its
/// scope, and tells when its scope ended.
#[derive(Debug, Clone, Default)]
struct Downstream {
    entered: Arc<Notify>,
    ended: Arc<Mutex<Vec<(Instant, Cause)>>>,
}

impl Downstream {
    fn take_ended(&self) -> Vec<(Instant, Cause)> {
        self.ended
            .lock()
            .map(|mut e| std::mem::take(&mut *e))
            .unwrap_or_default()
    }

    /// Waits (bounded) for the scope of the call in B to end.
    async fn wait_ended(&self, within: Duration) -> Option<(Instant, Cause)> {
        let until = Instant::now() + within;
        loop {
            if let Some(end) = self.take_ended().into_iter().next() {
                return Some(end);
            }
            if Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

#[tonic::async_trait]
impl testkit::CallOnly for Downstream {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        let scope = Scope::current();
        let header = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let watched = scope.clone();
        let ended = self.ended.clone();
        // Outlives the handler, which the server drops when the call ends.
        tonic_deadline::detach(async move {
            let cause = watched.ended().await;
            if let Ok(mut ended) = ended.lock() {
                ended.push((Instant::now(), cause));
            }
        });
        // Wakes only the waits already begun: a call that nobody waits for
        // leaves nothing behind for the next one.
        self.entered.notify_waiters();
        let work = Duration::from_millis(request.get_ref().work_ms);
        scope.run(tokio::time::sleep(work)).await?;
        Ok(Response::new(CallReply {
            hops: vec![Hop {
                service: "B".into(),
                remaining_us: crate::systems::trace::micros(scope.remaining()),
                header,
                deadline_mono_ns: deadline_ns(scope.deadline()),
            }],
            payload: String::new(),
        }))
    }
}

/// Starts A calling `next`; returns a warmed client of A.
async fn start_a(next: std::net::SocketAddr) -> anyhow::Result<ProbeClient<net::Layered>> {
    let (a, _) = chain::start_hop(
        "A",
        "127.0.0.1:0",
        Plan::default(),
        Some(next),
        net::Transit::Ignored,
        false,
        chain::EXACT,
    )
    .await?;
    layered_client(a).await
}

/// Cancels a call while B works; returns (ms until B's scope ended, cause).
async fn cancel_reaches(
    client: &mut ProbeClient<net::Layered>,
    b: &Downstream,
) -> anyhow::Result<(f64, Cause)> {
    b.take_ended();
    let scope = Scope::background().with_timeout(Duration::from_secs(30));
    let entered = b.entered.notified();
    let call = scope.enter(client.call(CallRequest {
        work_ms: LONG_WORK_MS,
        ..CallRequest::default()
    }));
    tokio::pin!(call, entered);
    tokio::select! {
        () = &mut entered => {}
        result = &mut call => anyhow::bail!("the call must still be running, got {}", status_name(&result)),
    }
    // Only the call's own end reported from here on.
    b.take_ended();
    let cancelled = Instant::now();
    scope.cancel();
    let result = call.await;
    anyhow::ensure!(
        status_name(&result) == "CANCELLED",
        "a cancelled call must answer CANCELLED, got {}",
        status_name(&result)
    );
    let (at, cause) = b
        .wait_ended(Duration::from_secs(5))
        .await
        .ok_or_else(|| anyhow::anyhow!("B's scope did not end within 5 s of the cancel"))?;
    Ok((ms(at.saturating_duration_since(cancelled)), cause))
}

async fn read_timeout_case(
    b_addr: std::net::SocketAddr,
    b: &Downstream,
) -> anyhow::Result<ReadTimeout> {
    let nginx = Nginx::grpc_proxy(
        b_addr,
        &Config {
            location: format!("grpc_read_timeout {}ms;", READ_TIMEOUT.as_millis()),
            ..Config::default()
        },
    )
    .await?;
    let mut client = start_a(nginx.addr()).await?;
    b.take_ended();
    let deadline = Duration::from_secs(2);
    let work = Duration::from_millis(1500);
    let started = Instant::now();
    let result = Scope::background()
        .with_timeout(deadline)
        .enter(client.call(CallRequest {
            work_ms: u64::try_from(work.as_millis()).unwrap_or(u64::MAX),
            ..CallRequest::default()
        }))
        .await;
    let answered = Instant::now();
    let ended = b.wait_ended(Duration::from_secs(3)).await;
    Ok(ReadTimeout {
        grpc_read_timeout_ms: ms(READ_TIMEOUT),
        deadline_ms: ms(deadline),
        work_ms: ms(work),
        status: status_name(&result).to_owned(),
        message: result
            .as_ref()
            .err()
            .map(|s| s.message().to_owned())
            .unwrap_or_default(),
        answered_ms: ms(answered.saturating_duration_since(started)),
        downstream_ended_ms: ended.map_or(f64::NAN, |(at, _)| {
            ms(at.saturating_duration_since(started))
        }),
        downstream_cause: ended
            .map_or_else(|| "still running".to_owned(), |(_, c)| format!("{c:?}")),
    })
}

/// Header, transit and cancel through nginx configured as `config`.
async fn through(
    b_addr: std::net::SocketAddr,
    b: &Downstream,
    config: &Config,
    name: &str,
) -> anyhow::Result<(Through, String)> {
    let nginx = Nginx::grpc_proxy(b_addr, config).await?;
    let capture = Capture::start(nginx.addr()).await?;
    let mut client = start_a(capture.addr()).await?;
    let mut transits = Vec::with_capacity(CALLS);
    let mut headers = (String::new(), String::new());
    for _ in 0..CALLS {
        capture.clear();
        let reply = Scope::background()
            .with_timeout(BUDGET)
            .enter(client.call(CallRequest::default()))
            .await
            .map_err(|s| {
                anyhow::anyhow!(
                    "a call through nginx must succeed: {s}; nginx: {}",
                    nginx.error_log()
                )
            })?
            .into_inner();
        let [a, b_hop] = reply.hops.as_slice() else {
            anyhow::bail!("A and B must both report, got {:?}", reply.hops);
        };
        let sent = capture
            .records()
            .iter()
            .filter(|r| r.direction == Direction::ClientToServer)
            .find_map(|r| r.header("grpc-timeout").map(str::to_owned))
            .unwrap_or_default();
        transits.push(clock::diff_ms(b_hop.deadline_mono_ns, a.deadline_mono_ns));
        headers = (sent, b_hop.header.clone());
    }
    transits.sort_by(f64::total_cmp);
    let (reset_ms, cause) = cancel_reaches(&mut client, b).await?;
    Ok((
        Through {
            config: name.to_owned(),
            header_sent: headers.0,
            header_received: headers.1,
            transit_ms: (quantile(&transits, 0.5) * 1000.0).round() / 1000.0,
            reset_reaches_downstream_ms: reset_ms,
            downstream_cause: format!("{cause:?}"),
        },
        nginx.version().to_owned(),
    ))
}

/// Runs the experiment.
///
/// # Errors
///
/// When nginx is not installed (a clear message) or a hop fails.
pub async fn measure() -> anyhow::Result<Proxy> {
    let b = Downstream::default();
    let b_addr = net::serve(
        "127.0.0.1:0",
        Routes::new(ProbeServer::new(b.clone())),
        // B's deadline is A's plus the transit, exactly: no reserve kept.
        Some(ServerDeadlineLayer::new().reply_reserve(std::time::Duration::ZERO)),
    )
    .await?;
    let (plain, version) = through(
        b_addr,
        &b,
        &Config::default(),
        "grpc_pass to the address (a new upstream connection per request)",
    )
    .await?;
    let (keepalive, _) = through(
        b_addr,
        &b,
        &Config {
            keepalive: Some(16),
            ..Config::default()
        },
        "upstream block with keepalive 16",
    )
    .await?;
    let mut direct = start_a(b_addr).await?;
    let (direct_ms, _) = cancel_reaches(&mut direct, &b).await?;
    let read_timeout = read_timeout_case(b_addr, &b).await?;
    Ok(Proxy {
        proxy: version,
        header_unchanged: plain.header_sent == plain.header_received
            && keepalive.header_sent == keepalive.header_received,
        header_sent: plain.header_sent,
        header_received: plain.header_received,
        transit_ms: plain.transit_ms,
        reset_reaches_downstream_ms: plain.reset_reaches_downstream_ms,
        downstream_cause: plain.downstream_cause,
        reset_direct_ms: direct_ms,
        keepalive,
        read_timeout,
    })
}

impl Experiment for Proxy {
    const NAME: &'static str = "proxy";
    const LIGHT: bool = true;
    const ABOUT: &'static str = "Debian's nginx (grpc_pass) between two hops: the header it forwards, the transit, and whether a client's cancel reaches the hop behind it";
    const PRINTS: &'static str =
        "Debian's nginx (`grpc_pass`) between two hops: `grpc-timeout` sent vs received, transit, how fast a client's cancel reaches the hop behind it, a `grpc_read_timeout` below the deadline";
    const NEEDS: &'static [Needs] = &[Needs::Nginx];
    const SECTION: Option<Section> = Some(Section::Across);
    type Args = NoArgs;

    async fn run(_: NoArgs, _: Spans) -> anyhow::Result<Self> {
        measure().await
    }

    fn outcome(&self) -> Outcome {
        let r = &self.read_timeout;
        let rows = vec![
            vec!["proxy".to_owned(), self.proxy.clone()],
            vec![
                "grpc-timeout sent by A".to_owned(),
                self.header_sent.clone(),
            ],
            vec![
                "grpc-timeout received by B".to_owned(),
                self.header_received.clone(),
            ],
            vec![
                "forwarded unchanged".to_owned(),
                if self.header_unchanged { "yes" } else { "no" }.to_owned(),
            ],
            vec![
                "transit through nginx (B's deadline − A's), new upstream connection per call"
                    .to_owned(),
                format!("{:.2} ms", self.transit_ms),
            ],
            vec![
                "client cancel → B's scope ends, through nginx".to_owned(),
                format!(
                    "{:.1} ms ({})",
                    self.reset_reaches_downstream_ms, self.downstream_cause
                ),
            ],
            vec![
                "with upstream keepalive: transit".to_owned(),
                format!("{:.2} ms", self.keepalive.transit_ms),
            ],
            vec![
                "with upstream keepalive: client cancel → B's scope ends".to_owned(),
                format!(
                    "{:.1} ms ({})",
                    self.keepalive.reset_reaches_downstream_ms, self.keepalive.downstream_cause
                ),
            ],
            vec![
                "client cancel → B's scope ends, A → B directly".to_owned(),
                format!("{:.1} ms", self.reset_direct_ms),
            ],
            vec![
                format!(
                    "grpc_read_timeout {:.0} ms, deadline {:.0} ms, B works {:.0} ms",
                    r.grpc_read_timeout_ms, r.deadline_ms, r.work_ms
                ),
                format!(
                    "{} after {:.0} ms ({}); B's scope ended at {:.0} ms ({})",
                    r.status, r.answered_ms, r.message, r.downstream_ended_ms, r.downstream_cause
                ),
            ],
        ];
        Outcome {
            title: "proxy: client → A → nginx (grpc_pass) → B".into(),
            json: crate::report::to_json(self),
            columns: vec!["measured", "value"],
            rows,
            notes: vec![
                "nginx passes grpc-timeout on as any other header and keeps its own clock: its grpc_read_timeout (60 s by default) cuts a call with INTERNAL however long the deadline".into(),
                "a client's RST_STREAM reaches B through nginx: nginx ends its upstream request, and B's scope ends as Abandoned (with or without upstream keepalive)".into(),
            ],
        }
    }

    fn report(&self, table: &Outcome) -> Vec<Part> {
        vec![Part::new(format!(
            "<h3>proxy: nginx between two hops</h3>{}",
            chart::table(table)
        ))]
    }
}
