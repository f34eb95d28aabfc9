//! Durable hand-off beyond one process: jobs accepted into a
//! PostgreSQL queue, two worker processes taking them from the same table
//! (`FOR UPDATE SKIP LOCKED`), one killed with SIGKILL in the middle of a
//! non-idempotent job.
//!
//! The first worker runs alone until it is caught in the middle of a
//! non-idempotent job (frozen with SIGSTOP, so that the catch cannot go
//! stale before the kill), whatever the scheduler does: with two workers
//! racing, a busy machine could let the other one claim every job first.
//! Then the survivor starts on another host.
//!
//! Counted from the database alone: every job records a `start` and an
//! `end` row as its effect. After the kill the survivor drains the queue;
//! the killed worker's job is recovered once its lease expires (by the
//! server's clock) and, being non-idempotent, is marked `interrupted` rather
//! than run again.
//!
//! Each worker runs in a network namespace of its own (as root) and reaches
//! the server across a veth pair, so the queue is shared between hosts, not
//! only processes.
//!
//! The server is `TONIC_DEADLINE_PG_URL` if set, otherwise a throwaway one
//! started here (as for `db-cancel`); without either the experiment fails.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use grpc_deadline_db::postgres::{PgPool, tokio_postgres};
use grpc_deadline_jobs::JobState;
use rustix::process::Signal;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic_deadline::Scope;

use crate::kit::postgres::server;
use crate::html::chart;
use crate::html::{Part, Section};
use crate::netns::{self, Host, Network};
use crate::report::{Outcome, ms};
use crate::systems::jobs::{Setup, query};

/// Jobs submitted before the workers start.
const JOBS: i64 = 40;

/// The worker killed mid-job (the first of them).
const KILLED: &str = "w1";

/// The killed worker's job, followed through its recovery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KilledJob {
    /// The job's id.
    pub id: i64,
    /// Whether it may run twice.
    pub idempotent: bool,
    /// Its state after the drain.
    pub state: String,
    /// How many times it started.
    pub starts: u64,
    /// From the kill until the job was no longer `running` (lease expiry
    /// and a survivor's recovery).
    pub recovered_after_ms: f64,
}

/// What the experiment measured (printed, `--json`, and read by the tests).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobsRun {
    /// The queue's store.
    pub backend: String,
    /// The database server's version.
    pub server: String,
    /// Worker processes started.
    pub workers: u64,
    /// Worker processes killed with SIGKILL mid-job.
    pub killed: u64,
    /// Where each worker ran.
    pub placement: BTreeMap<String, String>,
    /// Jobs accepted (committed before `submit` returned).
    pub accepted: u64,
    /// Accepted jobs missing, still pending after the drain, or done
    /// without their effect.
    pub lost: u64,
    /// Non-idempotent jobs that started more than once.
    pub duplicated_non_idempotent: u64,
    /// Idempotent jobs that started more than once (allowed: run again
    /// after a crash).
    pub rerun_idempotent: u64,
    /// Jobs done after the drain.
    pub done: u64,
    /// Jobs interrupted (non-idempotent, their worker died mid-way).
    pub interrupted: u64,
    /// Job starts by worker name.
    pub starts_by_worker: BTreeMap<String, u64>,
    /// The killed worker's job.
    pub killed_job: KilledJob,
    /// The lease every claim holds without renewal.
    pub lease_ms: f64,
    /// How long each job works.
    pub job_ms: f64,
    /// From the kill until the queue was empty.
    pub drained_after_kill_ms: f64,
}

impl crate::registry::Experiment for JobsRun {
    const NAME: &'static str = "jobs";
    const LIGHT: bool = true;
    const ABOUT: &'static str = "Jobs on PostgreSQL, two worker processes, one killed mid-job";
    const PRINTS: &'static str =
        "40 jobs in a PostgreSQL queue, two worker processes in two network namespaces (as root), one SIGKILLed mid-job: accepted, lost, run twice, where each worker ran";
    const SECTION: Option<Section> = Some(Section::LeftBehind);
    type Args = crate::registry::NoArgs;

    async fn run(_: Self::Args, _: crate::registry::Spans) -> anyhow::Result<Self> {
        measure().await
    }

    fn outcome(&self) -> Outcome {
        let row = |what: &str, value: String| vec![what.to_owned(), value];
        Outcome {
            title: format!(
                "experiment jobs: {} jobs on {} ({}), {} worker processes, {} SIGKILLed mid-job",
                self.accepted, self.backend, self.server, self.workers, self.killed
            ),
            json: crate::report::to_json(self),
            columns: vec!["figure", "measured"],
            rows: vec![
                row("accepted", self.accepted.to_string()),
                row("lost", self.lost.to_string()),
                row(
                    "non-idempotent run twice",
                    self.duplicated_non_idempotent.to_string(),
                ),
                row("idempotent run again", self.rerun_idempotent.to_string()),
                row(
                    "done / interrupted",
                    format!("{} / {}", self.done, self.interrupted),
                ),
                row(
                    "killed worker's job",
                    format!(
                        "#{} ({}), {}, started {}x",
                        self.killed_job.id,
                        if self.killed_job.idempotent {
                            "idempotent"
                        } else {
                            "non-idempotent"
                        },
                        self.killed_job.state,
                        self.killed_job.starts
                    ),
                ),
                row(
                    "kill -> job recovered ms",
                    format!("{:.0}", self.killed_job.recovered_after_ms),
                ),
                row(
                    "kill -> queue drained ms",
                    format!("{:.0}", self.drained_after_kill_ms),
                ),
                row(
                    "starts by worker",
                    self.starts_by_worker
                        .iter()
                        .map(|(w, n)| format!("{w} {n}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                ),
            ],
            notes: vec![
                format!(
                    "lease {:.0} ms (renewed every third while a job runs), jobs of {:.0} ms; claims with FOR UPDATE SKIP LOCKED",
                    self.lease_ms, self.job_ms
                ),
                format!(
                    "workers: {}",
                    self.placement
                        .iter()
                        .map(|(w, p)| format!("{w} on {p}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ],
        }
    }

    fn report(&self, table: &Outcome) -> Vec<Part> {
        vec![Part::new(chart::table(table))]
    }
}

/// A worker process, killed (SIGKILL) when dropped.
#[derive(Debug)]
struct Process(Child);

impl Process {
    fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        let pid = i32::try_from(self.0.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| anyhow::anyhow!("a worker without a valid pid"))?;
        rustix::process::kill_process(pid, signal)
            .map_err(|e| anyhow::anyhow!("cannot send {signal:?} to a worker: {e}"))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Where the workers run: each in a network namespace of its own when the
/// lab can make them (as root, with iproute2), reaching the server across a
/// veth pair; otherwise as processes on this host over loopback, and the
/// placement says why.
enum Placement {
    Namespaces {
        network: Box<Network>,
        /// Per worker: its host and the address it dials for the server.
        hosts: Vec<(Host, SocketAddr)>,
        /// Relays on the lab's end of each uplink; dropped with the placement.
        relays: Vec<tokio::task::JoinHandle<()>>,
    },
    Loopback {
        why: String,
    },
}

impl Placement {
    /// Hosts for `workers` workers of the server at `url`.
    async fn new(url: &str, workers: usize) -> anyhow::Result<Self> {
        if let Err(why) = netns::check_support().await {
            return Ok(Placement::Loopback {
                why: format!("{why:#}"),
            });
        }
        let server = server_addr(url).await?;
        let mut network = Network::new().await?;
        let mut hosts = Vec::new();
        let mut relays = Vec::new();
        for index in 0..workers {
            let host = network.host(&format!("worker{index}")).await?;
            let uplink = network.uplink(&host).await?;
            // The server listens where the lab runs, often on loopback only:
            // a relay on the lab's end of the pair carries the connections.
            let listener = tokio::net::TcpListener::bind((uplink.lab_addr, 0)).await?;
            let dial = listener.local_addr()?;
            relays.push(tonic_deadline::detach(relay(listener, server)));
            hosts.push((host, dial));
        }
        Ok(Placement::Namespaces {
            network: Box::new(network),
            hosts,
            relays,
        })
    }

    /// The command that starts worker `index`, and where it runs.
    fn worker(&self, index: usize, setup: &Setup, name: &str) -> anyhow::Result<(Command, String)> {
        let exe = std::env::current_exe()?;
        let args = |url: &str| -> Vec<String> {
            [
                "serve",
                "jobs-worker",
                "--pg-url",
                url,
                "--table",
                &setup.table,
                "--name",
                name,
                "--lease-ms",
                &setup.lease.as_millis().to_string(),
                "--job-ms",
                &setup.job_time.as_millis().to_string(),
            ]
            .map(str::to_owned)
            .into()
        };
        match self {
            Placement::Namespaces { network, hosts, .. } => {
                let (host, dial) = &hosts[index];
                let url = with_address(&setup.url, *dial)?;
                Ok((
                    network.command(host, &exe, &args(&url)),
                    format!("namespace {}, server at {dial} across a veth pair", host.ns),
                ))
            }
            Placement::Loopback { why } => {
                let mut command = Command::new(exe);
                command.args(args(&setup.url));
                Ok((
                    command,
                    format!("this host, loopback (no namespaces: {why})"),
                ))
            }
        }
    }
}

impl Drop for Placement {
    fn drop(&mut self) {
        if let Placement::Namespaces { relays, .. } = self {
            relays.iter().for_each(tokio::task::JoinHandle::abort);
        }
    }
}

/// Carries every connection made to `listener` to `server`, until aborted
/// (which also ends the connections it carries).
async fn relay(listener: tokio::net::TcpListener, server: SocketAddr) {
    // The relay's own tasks; no request is involved.
    let mut carried = tokio::task::JoinSet::new();
    while let Ok((mut inbound, _)) = listener.accept().await {
        #[allow(clippy::disallowed_methods)]
        carried.spawn(async move {
            if let Ok(mut outbound) = tokio::net::TcpStream::connect(server).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

/// The TCP address of the server a `postgres://` URL names.
async fn server_addr(url: &str) -> anyhow::Result<SocketAddr> {
    let config: tokio_postgres::Config = url.parse()?;
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => anyhow::bail!(
            "experiment jobs places workers in namespaces and needs a TCP server address, not {url}"
        ),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    tokio::net::lookup_host((host.as_str(), port))
        .await?
        .next()
        .ok_or_else(|| anyhow::anyhow!("{host} has no address"))
}

/// `url` (`postgres://user@host:port/db…`) with `host:port` replaced.
fn with_address(url: &str, addr: SocketAddr) -> anyhow::Result<String> {
    let (scheme, rest) = url
        .split_once("://")
        .filter(|(scheme, _)| matches!(*scheme, "postgres" | "postgresql"))
        .ok_or_else(|| {
            anyhow::anyhow!("experiment jobs needs a postgres:// URL to move workers, not {url}")
        })?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let user = authority
        .rsplit_once('@')
        .map_or(String::new(), |(user, _)| format!("{user}@"));
    Ok(format!("{scheme}://{user}{addr}{path}"))
}

/// Starts a worker and waits for its `ready` line.
fn spawn(mut command: Command) -> anyhow::Result<Process> {
    let mut child = Process(
        command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let stdout = child
        .0
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("the worker's stdout is not piped"))?;
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.starts_with("ready "));
    anyhow::ensure!(ready, "the worker exited before it was ready");
    Ok(child)
}

/// Kills `worker` (running alone) with SIGKILL in the middle of a
/// non-idempotent job; returns the job and its idempotence.
///
/// A job seen mid-way in the database may have ended by the time a signal
/// lands; so the worker is frozen first (SIGSTOP), the job looked up again,
/// and killed only if it is still mid-way — otherwise let go on (SIGCONT).
async fn kill_mid_non_idempotent_job(
    worker: &mut Process,
    effects: &PgPool,
    table: &str,
) -> anyhow::Result<(i64, bool)> {
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        anyhow::ensure!(
            Instant::now() < give_up,
            "{KILLED} ran no non-idempotent job in 30 s: is it taking jobs?"
        );
        if let Some((job, false)) = mid_job(effects, table, KILLED).await? {
            worker.signal(Signal::STOP)?;
            if mid_job(effects, table, KILLED).await? == Some((job, false)) {
                worker.0.kill()?;
                worker.0.wait()?;
                return Ok((job, false));
            }
            worker.signal(Signal::CONT)?;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The job `worker` is in the middle of (started, not ended), with its
/// idempotence.
async fn mid_job(pool: &PgPool, table: &str, worker: &str) -> anyhow::Result<Option<(i64, bool)>> {
    let rows = query(
        pool,
        &format!(
            "SELECT e.job, j.idempotent FROM {table}_effects e JOIN {table} j ON j.id = e.job
                 WHERE e.worker = $1 AND e.phase = 'start' AND NOT EXISTS (
                     SELECT 1 FROM {table}_effects f
                     WHERE f.job = e.job AND f.attempt = e.attempt AND f.phase = 'end')"
        ),
        &[&worker],
    )
    .await?;
    Ok(rows.first().map(|r| (r.get(0), r.get(1))))
}

/// Runs the jobs and kills a worker.
///
/// # Errors
///
/// No PostgreSQL server could be had, or a worker did not start or the
/// queue did not drain in time.
pub async fn measure() -> anyhow::Result<JobsRun> {
    let Some((url, _server)) = server().await? else {
        anyhow::bail!(
            "experiment jobs needs PostgreSQL: set TONIC_DEADLINE_PG_URL or install the server (apt-get install postgresql)"
        );
    };
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos();
    let setup = Setup {
        url,
        table: format!("lab_jobs_{}_{wall}", std::process::id()),
        lease: Duration::from_millis(600),
        job_time: Duration::from_millis(100),
    };
    let (queue, effects) = setup.open().await?;
    let server: String = query(&effects, "SHOW server_version", &[]).await?[0].get(0);

    let mut accepted = BTreeMap::new();
    for i in 0..JOBS {
        let idempotent = i % 2 == 0;
        let id = queue.submit("effect", &i.to_le_bytes(), idempotent).await?;
        accepted.insert(id, idempotent);
    }

    let names = [KILLED, "w2"];
    let hosts = Placement::new(&setup.url, names.len()).await?;
    let mut placement = BTreeMap::new();
    let mut start = |index: usize| -> anyhow::Result<Process> {
        let name = names[index];
        let (command, place) = hosts.worker(index, &setup, name)?;
        let process = tokio::task::block_in_place(|| spawn(command))?;
        placement.insert(name.to_owned(), place);
        Ok(process)
    };

    // The first worker runs alone, so the jobs it takes do not depend on
    // how the scheduler treats two: every other job it claims is
    // non-idempotent. Kill it in the middle of one.
    let mut doomed = start(0)?;
    let (killed_id, killed_idempotent) =
        kill_mid_non_idempotent_job(&mut doomed, &effects, &setup.table).await?;
    let killed_at = Instant::now();
    // The survivor, on another host, takes the rest of the queue from the
    // same table, and the killed job once its lease has expired.
    let processes = [doomed, start(1)?];

    // The survivor drains the queue; follow the killed job's recovery.
    let mut recovered_after = None;
    let drain = Scope::background().with_timeout(Duration::from_secs(60));
    loop {
        anyhow::ensure!(!drain.is_ended(), "the queue did not drain within 60 s");
        if recovered_after.is_none() && queue.state(killed_id).await? != Some(JobState::Running) {
            recovered_after = Some(killed_at.elapsed());
        }
        if recovered_after.is_some() && queue.pending().await? == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let drained_after = killed_at.elapsed();
    drop(processes);
    drop(hosts);

    let states: BTreeMap<i64, JobState> = queue
        .list()
        .await?
        .into_iter()
        .map(|(id, state, _)| (id, state))
        .collect();
    let rows = query(
        &effects,
        &format!("SELECT job, worker, phase FROM {}_effects", setup.table),
        &[],
    )
    .await?;
    let mut starts: BTreeMap<i64, u64> = BTreeMap::new();
    let mut ends: BTreeMap<i64, u64> = BTreeMap::new();
    let mut by_worker: BTreeMap<String, u64> = BTreeMap::new();
    for row in &rows {
        let (job, worker, phase): (i64, String, String) = (row.get(0), row.get(1), row.get(2));
        if phase == "start" {
            *starts.entry(job).or_default() += 1;
            *by_worker.entry(worker).or_default() += 1;
        } else {
            *ends.entry(job).or_default() += 1;
        }
    }
    let count = |f: &dyn Fn(i64, bool) -> bool| {
        accepted.iter().filter(|(id, i)| f(**id, **i)).count() as u64
    };
    let started = |id: i64| starts.get(&id).copied().unwrap_or(0);
    let lost = count(&|id, _| match states.get(&id) {
        None | Some(JobState::Queued | JobState::Running) => true,
        Some(JobState::Done) => ends.get(&id).copied().unwrap_or(0) == 0,
        Some(_) => false,
    });
    let result = JobsRun {
        backend: "postgres".into(),
        server,
        workers: names.len() as u64,
        killed: 1,
        placement,
        accepted: accepted.len() as u64,
        lost,
        duplicated_non_idempotent: count(&|id, idempotent| !idempotent && started(id) > 1),
        rerun_idempotent: count(&|id, idempotent| idempotent && started(id) > 1),
        done: count(&|id, _| states.get(&id) == Some(&JobState::Done)),
        interrupted: count(&|id, _| states.get(&id) == Some(&JobState::Interrupted)),
        starts_by_worker: by_worker,
        killed_job: KilledJob {
            id: killed_id,
            idempotent: killed_idempotent,
            state: states
                .get(&killed_id)
                .map_or("missing", |s| s.as_str())
                .to_owned(),
            starts: started(killed_id),
            recovered_after_ms: recovered_after.map_or(f64::NAN, ms),
        },
        lease_ms: ms(setup.lease),
        job_ms: ms(setup.job_time),
        drained_after_kill_ms: ms(drained_after),
    };
    let _ = query(
        &effects,
        &format!("DROP TABLE {t}, {t}_effects", t = setup.table),
        &[],
    )
    .await;
    Ok(result)
}
