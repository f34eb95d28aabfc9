//! Across hosts: every service of the chain and of the IM system on a host
//! (network namespace) of its own, one-way latency on every link, and what
//! each hop's deadline gained over the deadline its parent handed on.
//!
//! All namespaces of a machine read one `CLOCK_MONOTONIC`, so every hop
//! reports its deadline as an absolute reading and the experiment subtracts
//! the parent's: the *excess*. `grpc-timeout` is relative and the server
//! starts counting on arrival, so without compensation the excess is the
//! one-way transit — the hop believes it has that much more time than its
//! parent had. With transit compensation the excess drops to what is left
//! of the transit after the allowance, at most 2 ms.
//!
//! The experiment needs root (it makes namespaces and veth pairs) and fails
//! with a clear message without it.

use std::collections::HashMap;
use std::time::Duration;

use testkit::CallRequest;
use testkit::probe_client::ProbeClient;
use serde::{Deserialize, Serialize};
use tonic_deadline::Scope;

use crate::clock::{deadline_ns, diff_ms};
use crate::html::chart::{self, Group};
use crate::html::{Part, Section};
use crate::net::{self, Transit};
use crate::netns::{Host, Link, Network};
use crate::pb::PushReq;
use crate::pb::gateway_client::GatewayClient;
use crate::registry::{Experiment, Needs, Spans};
use crate::report::{Outcome, quantile};

/// The one-way latencies measured by default, in milliseconds.
pub const ONE_WAY_MS: [u64; 2] = [5, 20];

/// The flags of `experiment hosts`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// One-way latency of every link, in milliseconds (repeatable).
    #[arg(long = "one-way-ms", default_values_t = ONE_WAY_MS)]
    one_way_ms: Vec<u64>,
}

/// Calls measured per run (the excess reported is their median).
pub const CALLS: usize = 7;

/// The largest excess transit compensation may leave, in milliseconds.
pub const COMPENSATED_EXCESS_MAX_MS: f64 = 2.0;

/// Where transit compensation comes from: half the round trip each client
/// channel measures with HTTP/2 PINGs — nothing is told the link's latency.
/// (`Transit::Allowance(one_way)` would deduct the known figure instead.)
fn compensation(_one_way: Duration) -> Transit {
    Transit::RoundTrip
}

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hosts {
    /// How links got their latency: `netem` or `capture proxy`.
    pub delay_by: String,
    /// What `tc … netem` answered when it was not available (empty when it was).
    pub netem_error: String,
    /// One row per hop, system, latency and compensation.
    pub rows: Vec<Row>,
}

/// One hop of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// `chain` or `im`.
    pub system: String,
    /// The service (`A`, `logic`, …).
    pub hop: String,
    /// Who handed this hop its deadline (`client`, `A`, `gateway`, …).
    pub parent: String,
    /// The network namespace it ran in.
    pub namespace: String,
    /// The one-way latency of every link.
    pub one_way_ms: u64,
    /// Whether the callers deducted a transit allowance.
    pub compensation: bool,
    /// This hop's deadline less the deadline its parent handed on
    /// (CLOCK_MONOTONIC), the median of [`CALLS`] calls.
    pub deadline_excess_ms: f64,
    /// The smallest of those calls' excess.
    pub deadline_excess_min_ms: f64,
    /// The largest.
    pub deadline_excess_max_ms: f64,
    /// The hop's remaining budget on entry.
    pub remaining_ms: f64,
    /// `grpc-timeout` as the hop received it.
    pub header: String,
}

/// A system spread over hosts: its services in start order (callees first),
/// each with the services it calls (peer name, role), and the entry.
struct Layout {
    system: &'static str,
    services: &'static [(&'static str, &'static [(&'static str, &'static str)])],
    entry: &'static str,
}

const CHAIN: Layout = Layout {
    system: "chain",
    services: &[("C", &[]), ("B", &[("next", "C")]), ("A", &[("next", "B")])],
    entry: "A",
};

const IM: Layout = Layout {
    system: "im",
    services: &[
        ("push", &[]),
        ("route", &[]),
        ("logic", &[("route", "route"), ("push", "push")]),
        ("gateway", &[("logic", "logic")]),
    ],
    entry: "gateway",
};

impl Layout {
    fn args(
        &self,
        role: &str,
        peers: &[(&str, std::net::SocketAddr)],
        transit: Transit,
    ) -> Vec<String> {
        let mut args: Vec<String> = [
            "serve",
            self.system,
            "--role",
            role,
            "--listen",
            "0.0.0.0:0",
        ]
        .map(str::to_owned)
        .into();
        if self.system == "chain" {
            args.extend(["--hop-ms".to_owned(), "1".to_owned()]);
            for (_, addr) in peers {
                args.extend(["--next".to_owned(), addr.to_string()]);
            }
        } else {
            for (name, addr) in peers {
                args.extend(["--peer".to_owned(), format!("{name}={addr}")]);
            }
            // The excess is the transit alone: no reserve kept for the
            // ledger's answer (the chain keeps none either).
            args.extend(["--reply-reserve-ms".to_owned(), "0".to_owned()]);
        }
        args.extend(transit.args());
        args
    }
}

/// The hosts and links of one layout.
struct Placed {
    client: Host,
    hosts: HashMap<&'static str, Host>,
    /// (caller role, callee role) → link; the client's is ("client", entry).
    links: HashMap<(&'static str, &'static str), Link>,
}

async fn place(net: &mut Network, layout: &Layout, one_way: Duration) -> anyhow::Result<Placed> {
    let client = net.host("client").await?;
    let mut hosts = HashMap::new();
    for (role, _) in layout.services {
        hosts.insert(*role, net.host(role).await?);
    }
    let mut links = HashMap::new();
    let entry = &hosts[layout.entry];
    links.insert(
        ("client", layout.entry),
        net.link(&client, entry, one_way).await?,
    );
    for (role, calls) in layout.services {
        for (_, callee) in *calls {
            let link = net.link(&hosts[role], &hosts[callee], one_way).await?;
            links.insert((*role, *callee), link);
        }
    }
    Ok(Placed {
        client,
        hosts,
        links,
    })
}

/// Starts every service (callees first) with `transit`; returns the
/// address the client dials to reach the entry.
async fn start(
    net: &mut Network,
    layout: &Layout,
    placed: &Placed,
    transit: Transit,
) -> anyhow::Result<std::net::SocketAddr> {
    let mut ports: HashMap<&str, u16> = HashMap::new();
    for (role, calls) in layout.services {
        let mut peers = Vec::new();
        for (name, callee) in *calls {
            let link = &placed.links[&(*role, *callee)];
            peers.push((*name, net.reach(link, ports[callee]).await?));
        }
        let args = layout.args(role, &peers, transit);
        let addr = net.start(&placed.hosts[role], &args).await?;
        ports.insert(role, addr.port());
    }
    let link = &placed.links[&("client", layout.entry)];
    net.reach(link, ports[layout.entry]).await
}

/// A hop's deadline as it saw it, and the deadline its parent handed on.
struct Seen {
    hop: String,
    parent: String,
    deadline_ns: i64,
    parent_ns: i64,
    remaining_us: i64,
    header: String,
}

/// A client of one system's entry.
enum Client {
    Chain(ProbeClient<net::Layered>),
    Im(GatewayClient<net::Layered>),
}

const PUSH: PushReq = PushReq {
    uid: 1,
    text: String::new(),
    route_ms: 1,
    push_ms: 1,
    route_blocks: false,
};

impl Client {
    fn new(system: &str, channel: net::Layered) -> Self {
        match system {
            "chain" => Client::Chain(ProbeClient::new(channel)),
            _ => Client::Im(GatewayClient::new(channel)),
        }
    }

    /// Opens every connection along the system, so measured calls pay no
    /// handshake between encoding their budget and sending it.
    async fn warm(&mut self) -> anyhow::Result<()> {
        let scope = Scope::background().with_timeout(Duration::from_secs(5));
        match self {
            Client::Chain(c) => drop(scope.enter(c.call(CallRequest::default())).await?),
            Client::Im(c) => drop(scope.enter(c.push(PUSH)).await?),
        }
        Ok(())
    }

    /// One call: every hop's deadline and the one its parent handed on.
    async fn call(&mut self) -> anyhow::Result<Vec<Seen>> {
        match self {
            Client::Chain(c) => {
                let scope = Scope::background().with_timeout(Duration::from_secs(1));
                let mut parent = ("client".to_owned(), deadline_ns(scope.deadline()));
                let hops = scope
                    .enter(c.call(CallRequest::default()))
                    .await?
                    .into_inner()
                    .hops;
                let mut seen = Vec::new();
                for hop in hops {
                    seen.push(Seen {
                        hop: hop.service.clone(),
                        parent: parent.0.clone(),
                        deadline_ns: hop.deadline_mono_ns,
                        parent_ns: parent.1,
                        remaining_us: hop.remaining_us,
                        header: hop.header,
                    });
                    parent = (hop.service, hop.deadline_mono_ns);
                }
                Ok(seen)
            }
            Client::Im(c) => {
                let scope = Scope::background().with_timeout(crate::systems::im::CLIENT_BUDGET);
                let client_ns = deadline_ns(scope.deadline());
                let trace = scope.enter(c.push(PUSH)).await?.into_inner().trace;
                // Each hop's parent deadline is the grant made to it.
                let mut grants = HashMap::new();
                grants.insert("gateway".to_owned(), ("client".to_owned(), client_ns));
                for t in trace.iter().filter(|t| !t.target.is_empty()) {
                    grants.insert(t.target.clone(), (t.service.clone(), t.deadline_mono_ns));
                }
                trace
                    .iter()
                    .filter(|t| t.target.is_empty())
                    .map(|entry| {
                        let (parent, parent_ns) =
                            grants.get(&entry.service).cloned().ok_or_else(|| {
                                anyhow::anyhow!("no grant recorded for {}", entry.service)
                            })?;
                        Ok(Seen {
                            hop: entry.service.clone(),
                            parent,
                            deadline_ns: entry.deadline_mono_ns,
                            parent_ns,
                            remaining_us: entry.remaining_us,
                            header: entry.header.clone(),
                        })
                    })
                    .collect()
            }
        }
    }
}

/// Runs `layout` on fresh hosts with `one_way` on every link, without and
/// with compensation; [`CALLS`] calls each, the median excess per hop.
async fn run_layout(layout: &Layout, one_way: Duration) -> anyhow::Result<(Vec<Row>, Network)> {
    let mut net = Network::new().await?;
    let placed = place(&mut net, layout, one_way).await?;
    let mut rows = Vec::new();
    for compensated in [false, true] {
        let transit = if compensated {
            compensation(one_way)
        } else {
            Transit::Ignored
        };
        let context = |what: &str, e: anyhow::Error| {
            anyhow::anyhow!(
                "{} at {} ms one-way, compensation {compensated}: {what}: {e:#}",
                layout.system,
                one_way.as_millis()
            )
        };
        let entry = start(&mut net, layout, &placed, transit)
            .await
            .map_err(|e| context("starting the services", e))?;
        let channel =
            net::layered_with(net.channel(&placed.client, entry, transit).await?, transit);
        let mut client = Client::new(layout.system, channel);
        client
            .warm()
            .await
            .map_err(|e| context("warm-up call", e))?;
        if compensated {
            // Each connection's estimate is the least of its PINGs, one
            // every PING_EVERY while calls flow: warm calls for two of
            // them, so that no hop compensates with one sample a busy
            // moment delayed, or with none yet.
            let warming = tokio::time::Instant::now();
            while warming.elapsed() < 2 * net::PING_EVERY + Duration::from_millis(100) {
                client
                    .warm()
                    .await
                    .map_err(|e| context("warm-up call", e))?;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let mut calls = Vec::with_capacity(CALLS);
        for i in 0..CALLS {
            calls.push(
                client
                    .call()
                    .await
                    .map_err(|e| context(&format!("call {i}"), e))?,
            );
        }
        net.stop_processes();
        let Some(first) = calls.first() else {
            anyhow::bail!("no call was made");
        };
        for (i, s) in first.iter().enumerate() {
            let mut excess = Vec::with_capacity(CALLS);
            for call in &calls {
                let seen = call
                    .get(i)
                    .filter(|c| c.hop == s.hop)
                    .ok_or_else(|| anyhow::anyhow!("{} is missing from a reply", s.hop))?;
                anyhow::ensure!(
                    seen.deadline_ns >= 0 && seen.parent_ns >= 0,
                    "{} and its parent must both have a deadline",
                    s.hop
                );
                excess.push(diff_ms(seen.deadline_ns, seen.parent_ns));
            }
            excess.sort_by(f64::total_cmp);
            let namespace = placed
                .hosts
                .iter()
                .find(|(role, _)| **role == s.hop)
                .map(|(_, h)| h.ns.clone())
                .unwrap_or_default();
            let round = |v: f64| (v * 1000.0).round() / 1000.0;
            rows.push(Row {
                system: layout.system.to_owned(),
                hop: s.hop.clone(),
                parent: s.parent.clone(),
                namespace,
                one_way_ms: u64::try_from(one_way.as_millis()).unwrap_or(u64::MAX),
                compensation: compensated,
                deadline_excess_ms: round(quantile(&excess, 0.5)),
                deadline_excess_min_ms: round(excess[0]),
                deadline_excess_max_ms: round(excess[excess.len() - 1]),
                remaining_ms: (s.remaining_us as f64 / 100.0).round() / 10.0,
                header: s.header.clone(),
            });
        }
    }
    Ok((rows, net))
}

/// Measures both systems at every latency of `one_way_ms`.
///
/// # Errors
///
/// When not root or `ip netns` does not work (a clear message), or a
/// service fails.
pub async fn measure(one_way_ms: &[u64]) -> anyhow::Result<Hosts> {
    let mut rows = Vec::new();
    let mut delay = None;
    for layout in [&CHAIN, &IM] {
        for &ms in one_way_ms {
            let (more, net) = run_layout(layout, Duration::from_millis(ms))
                .await
                .map_err(|e| anyhow::anyhow!("experiment hosts: {e:#}"))?;
            rows.extend(more);
            delay = net.delay().cloned().or(delay);
            net.close().await?;
        }
    }
    let (delay_by, netem_error) = match delay {
        Some(crate::netns::Delay::Proxy { netem_error }) => {
            ("capture proxy".to_owned(), netem_error)
        }
        Some(d) => (d.name().to_owned(), String::new()),
        None => ("none".to_owned(), String::new()),
    };
    Ok(Hosts {
        delay_by,
        netem_error,
        rows,
    })
}

impl Experiment for Hosts {
    const NAME: &'static str = "hosts";
    const LIGHT: bool = true;
    const ABOUT: &'static str = "Every service in its own network namespace with one-way latency: what each hop's deadline gains over its parent's (needs root)";
    const PRINTS: &'static str =
        "every service of the chain and the IM system in its own network namespace (veth pairs, 5 and 20 ms one-way): each hop's deadline less its parent's, without and with transit compensation; needs root";
    const NEEDS: &'static [Needs] = &[Needs::NetNamespaces];
    const SECTION: Option<Section> = Some(Section::Across);
    type Args = Args;

    async fn run(args: Args, _: Spans) -> anyhow::Result<Self> {
        measure(&args.one_way_ms).await
    }

    fn outcome(&self) -> Outcome {
        let rows = self
            .rows
            .iter()
            .map(|r| {
                let expected = if r.compensation {
                    format!("≤ {COMPENSATED_EXCESS_MAX_MS}")
                } else {
                    format!("≈ {}", r.one_way_ms)
                };
                vec![
                    r.system.clone(),
                    format!("{} → {}", r.parent, r.hop),
                    r.namespace.clone(),
                    r.one_way_ms.to_string(),
                    if r.compensation { "yes" } else { "no" }.to_owned(),
                    format!("{:.2}", r.deadline_excess_ms),
                    format!(
                        "{:.2} … {:.2}",
                        r.deadline_excess_min_ms, r.deadline_excess_max_ms
                    ),
                    expected,
                    format!("{:.1}", r.remaining_ms),
                    r.header.clone(),
                ]
            })
            .collect();
        let mut notes = vec![
            format!("excess = the hop's deadline − the deadline its parent handed on, both as CLOCK_MONOTONIC readings (one clock for every namespace); median of {CALLS} calls"),
            "without compensation the excess is the one-way transit: a relative grpc-timeout starts counting on arrival; with it, each caller deducts half the round trip its connection measured with HTTP/2 PINGs (ReadyChannelBuilder::measure_round_trip + ClientDeadlineLayer::transit_from), no clock sync and no configured latency".to_owned(),
        ];
        notes.push(match self.delay_by.as_str() {
            "netem" => "latency: tc netem delay on both ends of every veth pair".to_owned(),
            _ => format!(
                "latency: netem is not available on this kernel ({}), so a capture proxy in the caller's namespace delays each direction by the one-way latency",
                self.netem_error
            ),
        });
        Outcome {
            title:
                "hosts: every service in its own network namespace, one-way latency on every link"
                    .into(),
            json: crate::report::to_json(self),
            columns: vec![
                "system",
                "parent → hop",
                "namespace",
                "one-way ms",
                "compensation",
                "deadline excess ms",
                "min … max",
                "expected",
                "remaining ms",
                "grpc-timeout received",
            ],
            rows,
            notes,
        }
    }

    /// A chart of each hop's excess at the largest latency, without and
    /// with compensation, and the whole table.
    fn report(&self, table: &Outcome) -> Vec<Part> {
        let mut html = String::from("<h3>hosts: every service in its own network namespace</h3>");
        if let Some(one_way) = self.rows.iter().map(|r| r.one_way_ms).max() {
            let mut groups: Vec<Group> = Vec::new();
            for r in self
                .rows
                .iter()
                .filter(|r| r.one_way_ms == one_way && !r.compensation)
            {
                let with = self
                    .rows
                    .iter()
                    .find(|c| {
                        c.compensation
                            && c.one_way_ms == one_way
                            && c.system == r.system
                            && c.hop == r.hop
                    })
                    .map_or(0.0, |c| c.deadline_excess_ms);
                groups.push((
                    format!("{} {}", r.system, r.hop),
                    vec![(r.deadline_excess_ms, None), (with, None)],
                ));
            }
            html.push_str(&chart::grouped(
                "hosts",
                &format!("Across namespaces, {one_way} ms one-way: what each hop's deadline gains over its parent's"),
                "ms",
                &["without compensation", "with compensation"],
                &groups,
            ));
        }
        html.push_str(&chart::table(table));
        vec![Part::new(html)]
    }
}
