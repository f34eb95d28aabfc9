//! Relative timeouts ignore transit time: a 1 s budget sent through the
//! capture proxy with injected client → server delay.
//!
//! The server turns `grpc-timeout` into a deadline from its own clock when the
//! request arrives, so it always sees about the full second; the client's
//! deadline was fixed when the call started, so by then it really has the
//! transit time less. Both clocks are this process's, so "what the client
//! really has left" is read at the instant the handler runs.

use std::time::Duration;

use tower::Layer;

use futures_util::future::join_all;
use serde::{Deserialize, Serialize};
use tonic_deadline::Scope;

use crate::capture::{Capture, Direction, Options};
use crate::kit::calls::{status_name, wire_lines, without_deadline};
use crate::html::chart::{self, Group};
use crate::html::{Part, Section};
use crate::net;
use crate::pb::WorkReq;
use crate::pb::worker_client::WorkerClient;
use crate::registry::{Experiment, NoArgs, Spans};
use crate::report::{Outcome, ms};
use crate::systems::worker::{self, WorkerSvc};

/// The client's budget.
pub const BUDGET: Duration = Duration::from_secs(1);
/// The injected delays, with the seed's (server sees, client left) in ms.
pub const ROWS: [(u64, u32, u32); 3] = [(0, 999, 999), (100, 999, 798), (300, 999, 598)];
/// The delay of the row repeated with transit compensation.
const COMPENSATED_DELAY_MS: u64 = 100;

/// How the client pays for the trip in a row.
#[derive(Debug, Clone, Copy)]
enum Compensation {
    None,
    /// A fixed allowance, in milliseconds.
    Allowance(u64),
    /// Half the round trip measured with HTTP/2 PINGs (the link is made
    /// symmetric: replies are delayed as much as requests).
    RoundTrip,
}

/// One call through the delaying proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The injected client → server delay.
    pub delay_ms: u64,
    /// The client's configured transit allowance (0: none).
    pub transit_allowance_ms: u64,
    /// What the client got.
    pub status: String,
    /// The budget the server saw on entry (`None`: the call failed).
    pub server_sees_ms: Option<f64>,
    /// What the client really had left when the handler ran.
    pub client_left_ms: f64,
    /// The `grpc-timeout` the server received.
    pub header: Option<String>,
    /// Client → server chunks of the call.
    pub request_chunks: usize,
    /// When the request reached the handler, after the call began.
    pub arrived_late_ms: f64,
    /// The round trip measured with PINGs, when measured.
    pub measured_rtt_ms: Option<f64>,
    /// The frames of the call, as the capture proxy decoded them.
    pub wire: Vec<String>,
}

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Drift {
    /// The client's budget.
    pub budget_ms: u64,
    /// One row per injected delay, uncompensated.
    pub rows: Vec<Row>,
    /// A known one-way delay deducted as the client's transit allowance.
    pub compensated: Row,
    /// Half the measured PING round trip deducted.
    pub rtt_compensated: Row,
}

async fn row(delay_ms: u64, compensation: Compensation) -> anyhow::Result<Row> {
    let svc = WorkerSvc::new();
    let addr = worker::start("127.0.0.1:0", svc.clone()).await?;
    let delay = Duration::from_millis(delay_ms);
    let symmetric = matches!(compensation, Compensation::RoundTrip);
    let capture = Capture::start_with(
        addr,
        Options {
            delay,
            reply_delay: if symmetric { delay } else { Duration::ZERO },
            ..Options::default()
        },
    )
    .await?;
    let endpoint = net::endpoint(capture.addr())?;
    let mut layer = tonic_deadline::ClientDeadlineLayer::new();
    let mut builder = tonic_deadline::client::ReadyChannel::builder(&endpoint);
    if symmetric {
        builder = builder.measure_round_trip(Duration::from_millis(500));
    }
    let channel = builder.connect().await?;
    let round_trip = channel.round_trip();
    match (compensation, &round_trip) {
        (Compensation::Allowance(ms), _) => {
            layer = layer.transit_allowance(Duration::from_millis(ms));
        }
        (Compensation::RoundTrip, Some(round_trip)) => {
            layer = layer.transit_from(round_trip.clone());
        }
        _ => {}
    }
    let allowance_ms = match compensation {
        Compensation::Allowance(ms) => ms,
        _ => 0,
    };
    let mut client = WorkerClient::new(layer.layer(channel));
    without_deadline(client.work(WorkReq::default())).await?;
    if let Some(round_trip) = &round_trip {
        // The first PING left right after the connection opened.
        let waited = tokio::time::timeout(Duration::from_secs(5), async {
            while round_trip.samples() == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        anyhow::ensure!(waited.is_ok(), "no PING came back within 5 s");
    }
    // Let the warm-up's trailing frames (acks, window updates) pass.
    tokio::time::sleep(Duration::from_millis(delay_ms * 2 + 20)).await;
    svc.take();
    capture.clear();

    let scope = Scope::background().with_timeout(BUDGET);
    let started = tokio::time::Instant::now();
    let deadline = scope
        .deadline()
        .ok_or_else(|| anyhow::anyhow!("a timeout scope has a deadline"))?;
    let result = scope.enter(client.work(WorkReq::default())).await;
    let times = svc.take();
    let reply = result.as_ref().ok().map(|r| r.get_ref().clone());
    let entered = times
        .entered
        .ok_or_else(|| anyhow::anyhow!("the handler must have run"))?;
    let server_sees_ms = reply
        .as_ref()
        .map(|r| (r.remaining_us as f64 / 100.0).round() / 10.0);
    let records = capture.records();
    let chunks = records
        .iter()
        .filter(|r| r.direction == Direction::ClientToServer)
        .map(|r| r.chunk)
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    Ok(Row {
        delay_ms,
        transit_allowance_ms: allowance_ms,
        status: status_name(&result).to_owned(),
        server_sees_ms,
        client_left_ms: ms(deadline.saturating_duration_since(entered)),
        header: reply.map(|r| r.header),
        request_chunks: chunks,
        arrived_late_ms: ms(entered.saturating_duration_since(started)),
        measured_rtt_ms: round_trip.and_then(|r| r.estimate()).map(ms),
        wire: wire_lines(&records),
    })
}

/// Runs the three delays at once (separate servers and proxies), and the
/// two compensated rows.
///
/// # Errors
///
/// When a server or proxy cannot be started, or no PING comes back.
pub async fn measure() -> anyhow::Result<Drift> {
    let (rows, compensated, rtt) = tokio::join!(
        join_all(ROWS.iter().map(|(d, _, _)| row(*d, Compensation::None))),
        // Opt-in compensation: the client deducts the known one-way delay.
        row(
            COMPENSATED_DELAY_MS,
            Compensation::Allowance(COMPENSATED_DELAY_MS)
        ),
        // Or half the round trip it measured, with no clock sync.
        row(COMPENSATED_DELAY_MS, Compensation::RoundTrip),
    );
    Ok(Drift {
        budget_ms: BUDGET.as_millis() as u64,
        rows: rows.into_iter().collect::<anyhow::Result<_>>()?,
        compensated: compensated?,
        rtt_compensated: rtt?,
    })
}

impl Experiment for Drift {
    const NAME: &'static str = "drift";
    const LIGHT: bool = true;
    const ABOUT: &'static str = "Relative timeouts under injected client → server delay";
    const PRINTS: &'static str =
        "1 s budget through the capture proxy with 0 / 100 / 300 ms delay: what the server sees vs what the client really has";
    const SECTION: Option<Section> = Some(Section::Transit);
    type Args = NoArgs;

    async fn run(_: NoArgs, _: Spans) -> anyhow::Result<Self> {
        measure().await
    }

    fn outcome(&self) -> Outcome {
        let cells = |r: &Row| {
            [
                r.header.clone().unwrap_or_else(|| "—".to_owned()),
                r.server_sees_ms
                    .map_or_else(|| "—".to_owned(), |v| v.to_string()),
                r.client_left_ms.to_string(),
                r.request_chunks.to_string(),
            ]
        };
        let mut table: Vec<Vec<String>> = self
            .rows
            .iter()
            .zip(ROWS)
            .map(|(r, (_, seed_server, seed_client))| {
                let mut row = vec![r.delay_ms.to_string()];
                row.extend(cells(r));
                row.push(format!("{seed_server} / {seed_client}"));
                row
            })
            .collect();
        let (compensated, rtt) = (&self.compensated, &self.rtt_compensated);
        let mut row = vec![format!(
            "{} (client allowance {} ms)",
            compensated.delay_ms, compensated.transit_allowance_ms
        )];
        row.extend(cells(compensated));
        row.push("—".to_owned());
        table.push(row);
        let mut row = vec![format!(
            "{} both ways (half the PING round trip, {} ms)",
            rtt.delay_ms,
            rtt.measured_rtt_ms
                .map_or_else(|| "—".to_owned(), |v| v.to_string())
        )];
        row.extend(cells(rtt));
        row.push("—".to_owned());
        table.push(row);
        Outcome {
            title: format!(
                "drift: {} s budget through the capture proxy, each client → server chunk delayed",
                self.budget_ms as f64 / 1000.0
            ),
            json: crate::report::to_json(self),
            columns: vec![
                "delay ms",
                "grpc-timeout received",
                "server sees ms",
                "client really has ms",
                "c→s chunks",
                "seed server / client",
            ],
            rows: table,
            notes: vec![
                "relative timeouts need no clock sync, but transit time is not deducted: every hop should keep a reserve".into(),
                "row 4: ClientDeadlineLayer::transit_allowance(100 ms) deducts the known one-way delay, so server and client agree again".into(),
                "row 5: ReadyChannel measures the round trip with HTTP/2 PINGs and ClientDeadlineLayer::transit_from deducts half of it: no clock sync, no configured figure".into(),
                "ours differs from the seed's client column by the delay itself: our proxy adds a true one-way delay, so the request arrives 1 × delay late; \
                 the seed's proxy slept before each chunk in turn and its request queued behind another chunk, arriving ≈ 2 × delay late (its own note: 100 ms → ≈200 ms). \
                 Same law either way: the server sees the full budget, the client has the budget less the transit time".into(),
            ],
        }
    }

    fn report(&self, _: &Outcome) -> Vec<Part> {
        const SEED: [(f64, f64); 3] = [(999.0, 999.0), (999.0, 798.0), (999.0, 598.0)];
        let groups: Vec<Group> = self
            .rows
            .iter()
            .zip(SEED)
            .map(|(r, (ss, sc))| {
                (
                    format!("{} ms delay", r.delay_ms),
                    vec![
                        (r.server_sees_ms.unwrap_or(0.0), Some(ss)),
                        (r.client_left_ms, Some(sc)),
                    ],
                )
            })
            .collect();
        let mut parts = vec![Part::new(chart::grouped(
            "drift",
            "Relative timeouts: what the server sees vs what the client really has left (1 s budget)",
            "ms",
            &["server sees", "client really has"],
            &groups,
        ))];
        parts.extend(self.rows.iter().map(|row| {
            Part::in_section(
                Section::OnTheWire,
                chart::wire_block(
                    &format!("drift, {} ms injected delay", row.delay_ms),
                    &row.wire,
                ),
            )
        }));
        parts
    }
}
