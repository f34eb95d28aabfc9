//! Retries inside one deadline: a scripted server fails the first attempts
//! of each call the way a case needs, and records what every attempt
//! carried on the wire; the client is a tonic client over our resilience layer
//! over our client layer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use testkit::{CallReply, CallRequest};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::time::Instant;
use tonic::service::Routes;
use tonic::{Code, Request, Response, Status};
use tonic_deadline::client::ClientDeadline;
use tonic_deadline::client::ReadyChannel;
use tonic_deadline::resilience::{Resilience, ResilienceLayer};
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::kit::calls::status_name;
use crate::html::chart;
use crate::html::{Part, Section};
use crate::net;
use crate::registry::{Experiment, NoArgs, Spans};
use crate::report::{Outcome, ms};

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetryCases {
    /// One row per case.
    pub cases: Vec<Case>,
}

/// One call and every attempt it made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// What the case shows.
    pub case: String,
    /// Attempts the server saw.
    pub attempts: u32,
    /// When each attempt reached the server, from the start of the call.
    pub attempt_starts_ms: Vec<f64>,
    /// The budget each attempt carried on the wire (`grpc-timeout`).
    pub attempt_budgets_ms: Vec<f64>,
    /// `grpc-previous-rpc-attempts` of each attempt (0 when absent).
    pub previous_attempts: Vec<u32>,
    /// The caller's budget.
    pub deadline_ms: f64,
    /// The status the caller got.
    pub status: String,
    /// When the caller got it.
    pub client_ms: f64,
    /// Attempts that reached the server at or after the caller's deadline.
    pub attempts_after_deadline: u32,
    /// What the case must show.
    pub expected: String,
}

impl RetryCases {
    /// The case named `name`.
    pub fn case(&self, name: &str) -> Option<&Case> {
        self.cases.iter().find(|c| c.case == name)
    }
}

/// Case names, as the JSON and the tests know them.
pub const THIRD_ATTEMPT: &str = "succeeds on the 3rd attempt";
/// The backoff bound is larger than what is left.
pub const DEADLINE_ENDS_BACKOFF: &str = "a backoff the deadline cannot fit";
/// `grpc-retry-pushback-ms: -1`.
pub const PUSHBACK_STOPS: &str = "pushback -1 stops";
/// `grpc-retry-pushback-ms: 150`.
pub const PUSHBACK_DELAYS: &str = "pushback 150 ms replaces the backoff";
/// DEADLINE_EXCEEDED from the server, method not declared idempotent.
pub const NOT_IDEMPOTENT: &str = "DEADLINE_EXCEEDED, not idempotent: not retried";
/// The same, method declared idempotent.
pub const IDEMPOTENT: &str = "DEADLINE_EXCEEDED, idempotent: retried";
/// What is left after a failure cannot fit the learned attempt time.
pub const NO_TIME: &str = "no time left for a useful attempt";

/// How one attempt of a call is answered.
#[derive(Debug, Clone, Copy)]
struct Step {
    after: Duration,
    code: Code,
    pushback: Option<&'static str>,
}

const fn step(after_ms: u64, code: Code) -> Step {
    Step {
        after: Duration::from_millis(after_ms),
        code,
        pushback: None,
    }
}

/// What the server saw of one attempt.
#[derive(Debug, Clone)]
struct Seen {
    at: Instant,
    budget: Option<Duration>,
    previous: u32,
}

/// The scripted server: per call id, the steps of its attempts.
#[derive(Debug, Clone, Default)]
struct Scripted {
    plans: Arc<Mutex<HashMap<String, Vec<Step>>>>,
    seen: Arc<Mutex<HashMap<String, Vec<Seen>>>>,
}

#[tonic::async_trait]
impl testkit::CallOnly for Scripted {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        let budget = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| tonic_deadline::timeout_header::decode(v.as_bytes()).ok());
        let previous = request
            .metadata()
            .get("grpc-previous-rpc-attempts")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(0);
        let id = request.get_ref().payload.clone();
        let n = {
            let mut seen = self.seen.lock().map_err(|_| Status::internal("poisoned"))?;
            let calls = seen.entry(id.clone()).or_default();
            calls.push(Seen {
                at: Instant::now(),
                budget,
                previous,
            });
            calls.len() - 1
        };
        let step = self
            .plans
            .lock()
            .ok()
            .and_then(|p| p.get(&id).and_then(|s| s.get(n).copied()))
            .unwrap_or(step(0, Code::Ok));
        Scope::current().run(tokio::time::sleep(step.after)).await?;
        if step.code == Code::Ok {
            return Ok(Response::new(CallReply::default()));
        }
        let mut status = Status::new(step.code, "scripted failure");
        if let Some(pushback) = step.pushback {
            status.metadata_mut().insert(
                "grpc-retry-pushback-ms",
                pushback
                    .parse()
                    .map_err(|_| Status::internal("bad pushback"))?,
            );
        }
        Err(status)
    }
}

/// The service config of the cases: probe.v1.Probe/Call, retried on
/// `codes`, up to 4 attempts.
fn config(idempotent: bool, initial_backoff: &str, codes: &[&str]) -> String {
    json!({
        "methodConfig": [{
            "name": [{ "service": "probe.v1.Probe", "method": "Call" }],
            "idempotent": idempotent,
            "retryPolicy": {
                "maxAttempts": 4,
                "initialBackoff": initial_backoff,
                "maxBackoff": "2s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": codes
            }
        }]
    })
    .to_string()
}

type Client = ProbeClient<Resilience<ClientDeadline<ReadyChannel>>>;

async fn client(addr: std::net::SocketAddr, json: &str) -> anyhow::Result<Client> {
    let channel = ReadyChannel::connect(&net::endpoint(addr)?).await?;
    let service = tower::ServiceBuilder::new()
        .layer(ResilienceLayer::from_service_config(json)?)
        .service(net::layered(channel));
    Ok(ProbeClient::new(service))
}

struct Plan {
    case: &'static str,
    steps: Vec<Step>,
    deadline: Duration,
    idempotent: bool,
    /// DEADLINE_EXCEEDED listed as retryable (for a method not declared
    /// idempotent the layer warns once, and does not retry it).
    retry_deadline_exceeded: bool,
    initial_backoff: &'static str,
    /// Calls answered in 100 ms made first, so the layer learns the time
    /// an attempt takes.
    warm_up: usize,
    expected: &'static str,
}

async fn run_case(
    server: &Scripted,
    addr: std::net::SocketAddr,
    plan: Plan,
) -> anyhow::Result<Case> {
    let codes: &[&str] = if plan.retry_deadline_exceeded {
        &["UNAVAILABLE", "DEADLINE_EXCEEDED"]
    } else {
        &["UNAVAILABLE"]
    };
    let json = config(plan.idempotent, plan.initial_backoff, codes);
    let mut client = client(addr, &json).await?;
    for i in 0..plan.warm_up {
        let id = format!("{} warm-up {i}", plan.case);
        if let Ok(mut plans) = server.plans.lock() {
            plans.insert(id.clone(), vec![step(100, Code::Ok)]);
        }
        let scope = Scope::background().with_timeout(Duration::from_secs(1));
        let request = CallRequest {
            payload: id,
            ..Default::default()
        };
        scope.enter(client.call(request)).await?;
    }
    if let Ok(mut plans) = server.plans.lock() {
        plans.insert(plan.case.to_owned(), plan.steps.clone());
    }
    let scope = Scope::background().with_timeout(plan.deadline);
    let deadline = scope.deadline().unwrap_or_else(Instant::now);
    let started = Instant::now();
    let request = CallRequest {
        payload: plan.case.to_owned(),
        ..Default::default()
    };
    let result = scope.enter(client.call(request)).await;
    let client_ms = ms(started.elapsed());
    let seen = server
        .seen
        .lock()
        .ok()
        .and_then(|s| s.get(plan.case).cloned())
        .unwrap_or_default();
    Ok(Case {
        case: plan.case.to_owned(),
        attempts: seen.len() as u32,
        attempt_starts_ms: seen.iter().map(|s| ms(s.at - started)).collect(),
        attempt_budgets_ms: seen
            .iter()
            .map(|s| {
                s.budget
                    .map_or(-1.0, |b| (b.as_secs_f64() * 10_000.0).round() / 10.0)
            })
            .collect(),
        previous_attempts: seen.iter().map(|s| s.previous).collect(),
        deadline_ms: ms(plan.deadline),
        status: status_name(&result).to_owned(),
        client_ms,
        attempts_after_deadline: seen.iter().filter(|s| s.at >= deadline).count() as u32,
        expected: plan.expected.to_owned(),
    })
}

/// Runs every case against one scripted server.
///
/// # Errors
///
/// When the server cannot start or a warm-up call fails.
pub async fn measure() -> anyhow::Result<RetryCases> {
    let server = Scripted::default();
    let addr = net::serve(
        "127.0.0.1:0",
        Routes::new(ProbeServer::new(server.clone())),
        Some(ServerDeadlineLayer::new()),
    )
    .await?;
    let unavailable = step(5, Code::Unavailable);
    let plans = vec![
        Plan {
            case: THIRD_ATTEMPT,
            steps: vec![unavailable, unavailable, step(5, Code::Ok)],
            deadline: Duration::from_secs(1),
            idempotent: false,
            retry_deadline_exceeded: false,
            initial_backoff: "0.05s",
            warm_up: 0,
            expected: "OK, 3 attempts, each carrying less",
        },
        Plan {
            case: DEADLINE_ENDS_BACKOFF,
            steps: vec![unavailable; 4],
            deadline: Duration::from_millis(300),
            idempotent: false,
            retry_deadline_exceeded: false,
            initial_backoff: "1s",
            warm_up: 0,
            expected: "UNAVAILABLE, the last attempt's answer, at once when a backoff and an attempt cannot fit before the deadline; no attempt after it",
        },
        Plan {
            case: PUSHBACK_STOPS,
            steps: vec![
                Step {
                    pushback: Some("-1"),
                    ..unavailable
                },
                step(5, Code::Ok),
            ],
            deadline: Duration::from_secs(1),
            idempotent: false,
            retry_deadline_exceeded: false,
            initial_backoff: "0.05s",
            warm_up: 0,
            expected: "UNAVAILABLE, 1 attempt",
        },
        Plan {
            case: PUSHBACK_DELAYS,
            steps: vec![
                Step {
                    pushback: Some("150"),
                    ..unavailable
                },
                step(5, Code::Ok),
            ],
            deadline: Duration::from_secs(1),
            idempotent: false,
            retry_deadline_exceeded: false,
            initial_backoff: "0.01s",
            warm_up: 0,
            expected: "OK, the 2nd attempt 150 ms after the 1st answered",
        },
        Plan {
            case: NOT_IDEMPOTENT,
            steps: vec![step(5, Code::DeadlineExceeded), step(5, Code::Ok)],
            deadline: Duration::from_secs(1),
            idempotent: false,
            retry_deadline_exceeded: true,
            initial_backoff: "0.05s",
            warm_up: 0,
            expected: "DEADLINE_EXCEEDED, 1 attempt (outcome unknown)",
        },
        Plan {
            case: IDEMPOTENT,
            steps: vec![step(5, Code::DeadlineExceeded), step(5, Code::Ok)],
            deadline: Duration::from_secs(1),
            idempotent: true,
            retry_deadline_exceeded: true,
            initial_backoff: "0.05s",
            warm_up: 0,
            expected: "OK, 2 attempts",
        },
        Plan {
            case: NO_TIME,
            steps: vec![step(100, Code::Unavailable), step(100, Code::Ok)],
            deadline: Duration::from_millis(150),
            idempotent: false,
            retry_deadline_exceeded: false,
            initial_backoff: "0.001s",
            warm_up: 10,
            expected: "UNAVAILABLE (the attempt's answer) at ~100 ms: 50 ms left cannot fit a 100 ms attempt",
        },
    ];
    let mut cases = Vec::new();
    for plan in plans {
        cases.push(run_case(&server, addr, plan).await?);
    }
    Ok(RetryCases { cases })
}

fn list(values: &[f64]) -> String {
    values
        .iter()
        .map(|v| format!("{v:.0}"))
        .collect::<Vec<_>>()
        .join(" / ")
}

impl Experiment for RetryCases {
    const NAME: &'static str = "retry";
    const LIGHT: bool = true;
    const ABOUT: &'static str = "Retries inside one deadline: succeeding on the 3rd attempt, the deadline ending the backoff, pushback, outcome-unknown codes";
    const PRINTS: &'static str =
        "retries inside one deadline: success on the 3rd attempt, a backoff the deadline cannot fit, pushback −1 and 150 ms, DEADLINE_EXCEEDED for a non-idempotent and an idempotent method, no time for a useful attempt; every attempt's start and budget on the wire";
    const SECTION: Option<Section> = Some(Section::RetriesAndHedging);
    type Args = NoArgs;

    async fn run(_: NoArgs, _: Spans) -> anyhow::Result<Self> {
        measure().await
    }

    fn outcome(&self) -> Outcome {
        let rows = self
            .cases
            .iter()
            .map(|c| {
                vec![
                    c.case.clone(),
                    c.status.clone(),
                    c.attempts.to_string(),
                    list(&c.attempt_starts_ms),
                    list(&c.attempt_budgets_ms),
                    format!("{:.0}", c.deadline_ms),
                    format!("{:.1}", c.client_ms),
                    c.expected.clone(),
                ]
            })
            .collect();
        Outcome {
            title: "retry: tonic client → resilience layer → client layer → scripted server; every attempt inside the caller's one deadline".into(),
            json: crate::report::to_json(self),
            columns: vec![
                "case",
                "status",
                "attempts",
                "attempt starts ms",
                "budget on the wire ms",
                "deadline ms",
                "client ms",
                "expected",
            ],
            rows,
            notes: vec![
                "retryPolicy: maxAttempts 4, backoff random(0, min(initialBackoff x 2^(n-1), 2 s)), retryable UNAVAILABLE (and DEADLINE_EXCEEDED in the two DEADLINE_EXCEEDED cases)".into(),
                "budget on the wire: grpc-timeout as the server received it — what was left of the one deadline when that attempt was sent".into(),
                "the WARN logged at this step is the 'not idempotent' case's, on purpose: the layer names a config that lists DEADLINE_EXCEEDED for a method not declared idempotent".into(),
            ],
        }
    }

    fn report(&self, table: &Outcome) -> Vec<Part> {
        vec![Part::new(format!(
            "<h3>retry cases</h3>{}",
            chart::table(table)
        ))]
    }
}
