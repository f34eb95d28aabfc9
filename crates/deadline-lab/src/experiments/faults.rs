//! Faults below a hop: the downstream process is killed, the connection is
//! cut in the middle of a message, the downstream hangs. What the upstream
//! hop answers, how fast, and whether it released everything it held.
//!
//! The upstream hop runs in this process, so its resources can be watched:
//! its request scope, an admission permit it takes, and a task it spawns in
//! its scope. The downstream is a real `deadline-lab serve chain --role C`
//! process, so it can be SIGKILLed and SIGSTOPped; the cut is made by the
//! capture proxy between the two.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use testkit::{CallReply, CallRequest};
use rustix::process::Signal;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tonic_deadline::admission::Admission;
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::capture::{Capture, Options};
use crate::kit::calls::status_name;
use crate::html::chart;
use crate::html::{Part, Section};
use crate::net::{self, Layered};
use crate::process::{Spawned, lab_exe};
use crate::registry::{Experiment, NoArgs, Spans};
use crate::report::{Outcome, ms};

/// How fast a killed downstream must surface as `UNAVAILABLE` upstream.
pub const KILL_DETECTED_WITHIN_MS: f64 = 50.0;

/// How long after the call reached the upstream hop the fault strikes (the
/// request is at the downstream by then).
const STRIKE_AFTER: Duration = Duration::from_millis(100);

/// The reply's payload in the cut case: several DATA frames (16 KB each).
const REPLY_PAYLOAD: usize = 40_000;

/// Where the reply is cut: inside its second DATA frame, so the client has
/// the start of the message and never its end.
const CUT_AFTER: u64 = 20_000;

/// How long the upstream's resources may take to be released after the
/// answer before they count as leaked.
const RELEASE_GRACE: Duration = Duration::from_millis(500);

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Faults {
    /// One row per fault.
    pub cases: Vec<Case>,
}

/// One fault and what the upstream hop made of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// `downstream killed`, `connection cut mid-message`, `downstream hung`.
    pub case: String,
    /// The status the client got from the upstream hop.
    pub status: String,
    /// Its message.
    pub message: String,
    /// From the fault to the client's answer.
    pub detected_ms: f64,
    /// The client's budget.
    pub deadline_ms: f64,
    /// From the start of the call to the answer.
    pub answered_ms: f64,
    /// The upstream request's scope had ended once everything settled.
    pub upstream_scope_ended: bool,
    /// What the upstream still held after the grace period: scopes not
    /// ended, admission permits in use, spawned tasks still running.
    pub leaked: u64,
    /// The same, one by one.
    pub permits_held: u64,
    /// Spawned tasks still running.
    pub tasks_running: u64,
}

/// What the upstream hop holds while a request is in it.
#[derive(Debug, Clone)]
struct Upstream {
    next: ProbeClient<Layered>,
    admission: Admission,
    tasks: Arc<AtomicUsize>,
    scopes: Arc<Mutex<Vec<Scope>>>,
    entered: Arc<Notify>,
}

/// Counts a running task; the count drops when the task's future is dropped.
struct Running(Arc<AtomicUsize>);

impl Running {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[tonic::async_trait]
impl testkit::CallOnly for Upstream {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        let scope = Scope::current();
        if let Ok(mut scopes) = self.scopes.lock() {
            scopes.push(scope.clone());
        }
        let _permit = self.admission.acquire(&scope).await?;
        // A helper task that lives as long as the request (a heartbeat, a
        // prefetch): it must end with the request's scope.
        let running = Running::new(self.tasks.clone());
        let _helper = scope.spawn(async move {
            let _running = running;
            std::future::pending::<()>().await
        });
        self.entered.notify_one();
        let reply = self.next.clone().call(request.into_inner()).await?;
        Ok(Response::new(reply.into_inner()))
    }
}

impl Upstream {
    /// What is still held: (scopes not ended, permits in use, tasks running),
    /// waiting up to the grace period for everything to be released.
    async fn held(&self) -> (u64, u64, u64) {
        let until = Instant::now() + RELEASE_GRACE;
        loop {
            let open = self
                .scopes
                .lock()
                .map(|s| s.iter().filter(|s| !s.is_ended()).count())
                .unwrap_or(usize::MAX);
            let permits = self.admission.stats().in_use;
            let tasks = self.tasks.load(Ordering::SeqCst);
            let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
            if (open, permits, tasks) == (0, 0, 0) || Instant::now() >= until {
                return (count(open), count(permits), count(tasks));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The fault to inject.
#[derive(Debug, Clone, Copy)]
enum Fault {
    Kill,
    Cut,
    Hang,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "downstream killed",
            Fault::Cut => "connection cut mid-message",
            Fault::Hang => "downstream hung",
        }
    }

    /// The client's budget.
    fn budget(self) -> Duration {
        match self {
            Fault::Kill | Fault::Cut => Duration::from_secs(2),
            Fault::Hang => Duration::from_millis(500),
        }
    }

    /// How long the downstream works: long enough to be struck mid-call
    /// (kill, hang), or at once, so its reply can be cut.
    fn downstream_work_ms(self) -> u64 {
        match self {
            Fault::Kill => 5_000,
            Fault::Cut => 0,
            Fault::Hang => 300,
        }
    }
}

async fn case(fault: Fault) -> anyhow::Result<Case> {
    let mut command = std::process::Command::new(lab_exe()?);
    command.args([
        "serve",
        "chain",
        "--role",
        "C",
        "--hop-ms",
        &fault.downstream_work_ms().to_string(),
    ]);
    let mut downstream = Spawned::spawn("downstream C", command)?;
    let downstream_addr = downstream.addr().await?;
    let cutter = match fault {
        Fault::Cut => Some(
            Capture::start_with(
                downstream_addr,
                Options {
                    cut_reply_after: Some(CUT_AFTER),
                    forget: true,
                    ..Options::default()
                },
            )
            .await?,
        ),
        _ => None,
    };
    let next_addr = cutter.as_ref().map_or(downstream_addr, Capture::addr);
    let upstream = Upstream {
        next: ProbeClient::new(net::lazy_layered(next_addr)?),
        admission: Admission::new(4),
        tasks: Arc::new(AtomicUsize::new(0)),
        scopes: Arc::default(),
        entered: Arc::new(Notify::new()),
    };
    let addr = net::serve(
        "127.0.0.1:0",
        Routes::new(ProbeServer::new(upstream.clone())),
        Some(ServerDeadlineLayer::new()),
    )
    .await?;
    let mut client = ProbeClient::new(net::connect_layered(addr).await?);

    let budget = fault.budget();
    let scope = Scope::background().with_timeout(budget);
    let started = Instant::now();
    let request = CallRequest {
        payload: match fault {
            Fault::Cut => "x".repeat(REPLY_PAYLOAD),
            _ => String::new(),
        },
        ..CallRequest::default()
    };
    let call = scope.enter(client.call(request));
    let strike = async {
        upstream.entered.notified().await;
        tokio::time::sleep(STRIKE_AFTER).await;
        match fault {
            Fault::Kill => downstream.signal(Signal::KILL)?,
            Fault::Hang => downstream.signal(Signal::STOP)?,
            Fault::Cut => {}
        }
        anyhow::Ok(Instant::now())
    };
    let (result, struck) = {
        tokio::pin!(call, strike);
        let mut struck = None;
        let result = loop {
            tokio::select! {
                result = &mut call => break result,
                at = &mut strike, if struck.is_none() => struck = Some(at?),
            }
        };
        (result, struck)
    };
    let answered = Instant::now();
    let fault_at = match fault {
        Fault::Cut => cutter.as_ref().and_then(Capture::cut_at),
        _ => struck,
    };
    let (open, permits, tasks) = upstream.held().await;
    if matches!(fault, Fault::Hang) {
        downstream.signal(Signal::CONT)?;
    }
    drop(downstream);
    Ok(Case {
        case: fault.name().to_owned(),
        status: status_name(&result).to_owned(),
        message: result
            .as_ref()
            .err()
            .map(|s| s.message().to_owned())
            .unwrap_or_default(),
        detected_ms: fault_at.map_or(f64::NAN, |at| ms(answered.saturating_duration_since(at))),
        deadline_ms: ms(budget),
        answered_ms: ms(answered.saturating_duration_since(started)),
        upstream_scope_ended: open == 0,
        leaked: open + permits + tasks,
        permits_held: permits,
        tasks_running: tasks,
    })
}

/// Runs the three faults, one after the other.
///
/// # Errors
///
/// When a process or server cannot start.
pub async fn measure() -> anyhow::Result<Faults> {
    let mut cases = Vec::new();
    for fault in [Fault::Kill, Fault::Cut, Fault::Hang] {
        cases.push(
            case(fault)
                .await
                .map_err(|e| anyhow::anyhow!("{}: {e:#}", fault.name()))?,
        );
    }
    Ok(Faults { cases })
}

impl Experiment for Faults {
    const NAME: &'static str = "faults";
    const LIGHT: bool = true;
    const ABOUT: &'static str = "A downstream process killed, a connection cut mid-message, a downstream hung: the upstream hop's answer and what it released";
    const PRINTS: &'static str =
        "a downstream process SIGKILLed, the connection cut inside a reply message, a downstream SIGSTOPped: the upstream hop's status, when, and what it still held";
    const SECTION: Option<Section> = Some(Section::Across);
    type Args = NoArgs;

    async fn run(_: NoArgs, _: Spans) -> anyhow::Result<Self> {
        measure().await
    }

    fn outcome(&self) -> Outcome {
        let expected = |case: &str| match case {
            "downstream killed" => format!("UNAVAILABLE within {KILL_DETECTED_WITHIN_MS} ms"),
            "connection cut mid-message" => "INTERNAL".to_owned(),
            _ => "DEADLINE_EXCEEDED at the deadline".to_owned(),
        };
        let rows = self
            .cases
            .iter()
            .map(|c| {
                vec![
                    c.case.clone(),
                    c.status.clone(),
                    format!("{:.1}", c.detected_ms),
                    format!("{:.1}", c.answered_ms),
                    format!("{:.0}", c.deadline_ms),
                    if c.upstream_scope_ended { "yes" } else { "no" }.to_owned(),
                    c.leaked.to_string(),
                    expected(&c.case),
                ]
            })
            .collect();
        Outcome {
            title: "faults: client → upstream hop (this process) → downstream process; what the upstream answers and releases".into(),
            json: crate::report::to_json(self),
            columns: vec![
                "case",
                "status",
                "detected ms",
                "answered ms",
                "deadline ms",
                "upstream scope ended",
                "leaked",
                "expected",
            ],
            rows,
            notes: vec![
                "detected: from the fault (SIGKILL, the proxy's cut, SIGSTOP) to the client's answer; answered: from the start of the call".into(),
                "leaked: what the upstream hop still held 500 ms after answering — request scopes not ended, admission permits in use, tasks it spawned in its scope still running".into(),
            ],
        }
    }

    fn report(&self, table: &Outcome) -> Vec<Part> {
        vec![Part::new(format!(
            "<h3>faults below a hop</h3>{}",
            chart::table(table)
        ))]
    }
}
