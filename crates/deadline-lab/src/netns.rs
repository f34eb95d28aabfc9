//! Several hosts on one machine: network namespaces joined by veth pairs,
//! made by the lab (as root, with iproute2) and removed when dropped.
//!
//! Each [`Host`] is a network namespace of its own with loopback up; a
//! [`Link`] is a veth pair between two hosts, a point-to-point /30 from
//! 198.18.0.0/15 (the range set aside for benchmarking networks). One-way
//! latency comes from `tc … netem delay` on both ends of a link where the
//! kernel has netem, and otherwise from a capture proxy with a delay in the
//! caller's namespace ([`Network::reach`]). Processes run inside a host with
//! `ip netns exec`; the lab's own client connects from inside a host through
//! [`Network::channel`].
//!
//! Namespace names carry the lab's pid (`dlab-<pid>-<n>-<role>`), so
//! parallel runs never collide, and namespaces left behind by a run that was
//! killed are removed by the next one. Everything made is removed on drop —
//! on success, on error and when the experiment is interrupted (the CLI
//! drops the experiment on Ctrl-C).

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Endpoint, Uri};
use tonic_deadline::client::ReadyChannel;

use crate::process::{Spawned, find_program, lab_exe, run};

/// Namespaces of one process are numbered, so two networks made by one
/// process (parallel tests) get different names.
static NEXT_NETWORK: AtomicU32 = AtomicU32::new(0);

/// The prefix of every namespace the lab makes.
const PREFIX: &str = "dlab-";

/// How a link's one-way latency is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delay {
    /// `tc qdisc … netem delay` on both ends of the veth pair.
    Netem,
    /// A capture proxy in the caller's namespace delays each direction
    /// (`deadline-lab capture --delay-ms N --reply-delay-ms N --quiet`): netem is
    /// not available, and this says why.
    Proxy {
        /// What `tc` answered when asked for netem.
        netem_error: String,
    },
}

impl Delay {
    /// `netem` or `capture proxy`.
    pub fn name(&self) -> &'static str {
        match self {
            Delay::Netem => "netem",
            Delay::Proxy { .. } => "capture proxy",
        }
    }
}

/// One host: a network namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The role it runs (`A`, `gateway`, `client`, …).
    pub role: String,
    /// The namespace's name.
    pub ns: String,
}

/// A veth pair between two hosts; `a` is the caller's end.
#[derive(Debug, Clone)]
pub struct Link {
    /// The calling side.
    pub a: Host,
    /// The called side.
    pub b: Host,
    /// The address of `a`'s end.
    pub a_addr: Ipv4Addr,
    /// The address of `b`'s end (what `a` dials).
    pub b_addr: Ipv4Addr,
    /// The one-way latency each direction gets.
    pub one_way: Duration,
    a_if: String,
    b_if: String,
}

/// Hosts, links and the processes running in them; all removed on drop.
#[derive(Debug)]
pub struct Network {
    ip: PathBuf,
    tc: Option<PathBuf>,
    prefix: String,
    hosts: Vec<Host>,
    links: Vec<Link>,
    processes: Vec<Spawned>,
    delay: Option<Delay>,
    uplinks: u8,
    uplink_subnet: u8,
    uplink_prefix: String,
}

/// A veth pair between a host and the namespace the lab itself runs in
/// (where a database server it uses listens).
#[derive(Debug, Clone)]
pub struct Uplink {
    /// The host.
    pub host: Host,
    /// The address of the lab's end: what the host dials.
    pub lab_addr: Ipv4Addr,
    /// The address of the host's end.
    pub host_addr: Ipv4Addr,
}

/// Why the lab cannot make hosts here, in one sentence a user can act on.
///
/// # Errors
///
/// When not running as root, or `ip netns` does not work.
pub async fn check_support() -> anyhow::Result<PathBuf> {
    if !rustix::process::geteuid().is_root() {
        anyhow::bail!(
            "needs root: it creates network namespaces and veth pairs (`ip netns add`); run it as root (sudo)"
        );
    }
    let ip = find_program("ip").ok_or_else(|| {
        anyhow::anyhow!(
            "needs iproute2's `ip` to create network namespaces: apt-get install iproute2"
        )
    })?;
    run(&ip, &["netns", "list"])
        .await
        .map_err(|e| anyhow::anyhow!("`ip netns` does not work here: {e}"))?;
    Ok(ip)
}

impl Network {
    /// An empty network. Removes namespaces left by lab runs that no longer
    /// exist.
    ///
    /// # Errors
    ///
    /// As [`check_support`].
    pub async fn new() -> anyhow::Result<Self> {
        let ip = check_support().await?;
        sweep_stale(&ip).await;
        let n = NEXT_NETWORK.fetch_add(1, Ordering::Relaxed);
        Ok(Self {
            ip,
            tc: find_program("tc"),
            prefix: format!("{PREFIX}{}-{n}-", std::process::id()),
            hosts: Vec::new(),
            links: Vec::new(),
            processes: Vec::new(),
            delay: None,
            uplinks: 0,
            uplink_subnet: u8::try_from((std::process::id() + 37 * n) % 256)?,
            uplink_prefix: format!("dl{}-{n}u", std::process::id()),
        })
    }

    /// Runs `ip args…` to its end without yielding: an interrupted run
    /// (Ctrl-C drops the experiment at an await) can then never leave a
    /// namespace made but not yet recorded for removal. Each call takes
    /// milliseconds.
    #[allow(clippy::unused_async)]
    async fn ip(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(&self.ip)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", self.ip.display()))?;
        anyhow::ensure!(
            out.status.success(),
            "`{} {}` failed ({}): {}",
            self.ip.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Adds a host for `role`: a new namespace with loopback up.
    ///
    /// # Errors
    ///
    /// When `ip netns add` fails.
    pub async fn host(&mut self, role: &str) -> anyhow::Result<Host> {
        let host = Host {
            role: role.to_owned(),
            ns: format!("{}{role}", self.prefix),
        };
        self.ip(&["netns", "add", &host.ns]).await?;
        // Recorded before anything else can fail, so it is always removed.
        self.hosts.push(host.clone());
        self.ip(&["-n", &host.ns, "link", "set", "lo", "up"])
            .await?;
        Ok(host)
    }

    /// Joins `a` (the caller) to `b` with a veth pair whose every direction
    /// gets `one_way` of latency: netem where the kernel has it (checked on
    /// the first link), otherwise a capture proxy [`reach`](Self::reach)
    /// starts.
    ///
    /// # Errors
    ///
    /// When a veth pair or an address cannot be set up.
    pub async fn link(&mut self, a: &Host, b: &Host, one_way: Duration) -> anyhow::Result<Link> {
        let i = self.links.len();
        anyhow::ensure!(i < 256, "a lab network has at most 256 links");
        let subnet = u8::try_from(i)?;
        let link = Link {
            a: a.clone(),
            b: b.clone(),
            a_addr: Ipv4Addr::new(198, 18, subnet, 1),
            b_addr: Ipv4Addr::new(198, 18, subnet, 2),
            one_way,
            a_if: interface_name(&b.role, i),
            b_if: interface_name(&a.role, i),
        };
        // Both ends are made inside their namespaces: interface names only
        // need to be unique per namespace, never on the machine.
        self.ip(&[
            "link", "add", &link.a_if, "netns", &a.ns, "type", "veth", "peer", "name", &link.b_if,
            "netns", &b.ns,
        ])
        .await?;
        for (ns, dev, addr) in [
            (&a.ns, &link.a_if, link.a_addr),
            (&b.ns, &link.b_if, link.b_addr),
        ] {
            self.ip(&["-n", ns, "addr", "add", &format!("{addr}/30"), "dev", dev])
                .await?;
            self.ip(&["-n", ns, "link", "set", dev, "up"]).await?;
        }
        if self.delay.is_none() {
            self.delay = Some(self.try_netem(&link).await);
        } else if self.delay == Some(Delay::Netem) {
            self.netem(&link).await?;
        }
        self.links.push(link.clone());
        Ok(link)
    }

    /// Joins `host` to the namespace the lab runs in with a veth pair (no
    /// added latency): a point-to-point /30 from 198.19.0.0/16, numbered by
    /// the lab's pid so two lab processes rarely share one. The pair goes
    /// with the host's namespace.
    ///
    /// # Errors
    ///
    /// When the pair or an address cannot be set up.
    pub async fn uplink(&mut self, host: &Host) -> anyhow::Result<Uplink> {
        let i = self.uplinks;
        anyhow::ensure!(i < 63, "a lab network has at most 63 uplinks");
        self.uplinks += 1;
        let subnet = self.uplink_subnet;
        let uplink = Uplink {
            host: host.clone(),
            lab_addr: Ipv4Addr::new(198, 19, subnet, 4 * i + 1),
            host_addr: Ipv4Addr::new(198, 19, subnet, 4 * i + 2),
        };
        // The lab's end lives in a namespace shared with everything else on
        // the machine: its name carries the pid and the network's number.
        let mut lab_if = format!("{}{i}", self.uplink_prefix);
        lab_if.truncate(15);
        self.ip(&[
            "link", "add", &lab_if, "type", "veth", "peer", "name", "uplink", "netns", &host.ns,
        ])
        .await?;
        self.ip(&[
            "addr",
            "add",
            &format!("{}/30", uplink.lab_addr),
            "dev",
            &lab_if,
        ])
        .await?;
        self.ip(&["link", "set", &lab_if, "up"]).await?;
        self.ip(&[
            "-n",
            &host.ns,
            "addr",
            "add",
            &format!("{}/30", uplink.host_addr),
            "dev",
            "uplink",
        ])
        .await?;
        self.ip(&["-n", &host.ns, "link", "set", "uplink", "up"])
            .await?;
        Ok(uplink)
    }

    /// How links get their latency (known once a link exists).
    pub fn delay(&self) -> Option<&Delay> {
        self.delay.as_ref()
    }

    async fn try_netem(&self, link: &Link) -> Delay {
        match self.netem(link).await {
            Ok(()) => Delay::Netem,
            Err(e) => Delay::Proxy {
                netem_error: format!("{e:#}"),
            },
        }
    }

    async fn netem(&self, link: &Link) -> anyhow::Result<()> {
        let tc = self
            .tc
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("iproute2's `tc` is not installed"))?;
        let delay = format!("{}us", link.one_way.as_micros());
        for (ns, dev) in [(&link.a.ns, &link.a_if), (&link.b.ns, &link.b_if)] {
            self.ip(&[
                "netns",
                "exec",
                ns,
                &tc.to_string_lossy(),
                "qdisc",
                "add",
                "dev",
                dev,
                "root",
                "netem",
                "delay",
                &delay,
            ])
            .await?;
        }
        Ok(())
    }

    /// A command that runs `program args…` inside `host`.
    pub fn command(&self, host: &Host, program: &Path, args: &[String]) -> Command {
        let mut command = Command::new(&self.ip);
        command
            .args(["netns", "exec", &host.ns])
            .arg(program)
            .args(args);
        command
    }

    /// Starts `deadline-lab args…` inside `host` and returns the address it
    /// printed first. The process runs until [`stop_processes`](Self::stop_processes)
    /// or the network is dropped.
    ///
    /// # Errors
    ///
    /// When it cannot start or prints no address.
    pub async fn start(&mut self, host: &Host, args: &[String]) -> anyhow::Result<SocketAddr> {
        let exe = lab_exe()?;
        let command = self.command(host, &exe, args);
        let mut spawned = Spawned::spawn(format!("{} in {}", args.join(" "), host.ns), command)?;
        let addr = spawned.addr().await;
        self.processes.push(spawned);
        addr
    }

    /// The address `link.a` dials to reach port `port` of `link.b` through
    /// the link's latency: `b`'s own address with netem; otherwise a capture
    /// proxy started in `a`'s namespace that delays both directions.
    ///
    /// # Errors
    ///
    /// When the proxy cannot start.
    pub async fn reach(&mut self, link: &Link, port: u16) -> anyhow::Result<SocketAddr> {
        let target = SocketAddr::from((link.b_addr, port));
        match &self.delay {
            Some(Delay::Proxy { .. }) if !link.one_way.is_zero() => {
                let ms = link.one_way.as_millis().to_string();
                let args: Vec<String> = [
                    "capture",
                    "--listen",
                    "127.0.0.1:0",
                    "--upstream",
                    &target.to_string(),
                    "--delay-ms",
                    &ms,
                    "--reply-delay-ms",
                    &ms,
                    "--quiet",
                ]
                .map(str::to_owned)
                .into();
                self.start(&link.a, &args).await
            }
            _ => Ok(target),
        }
    }

    /// Kills every process started in the network (hosts and links stay).
    pub fn stop_processes(&mut self) {
        self.processes.clear();
    }

    /// A tonic channel to `addr` whose connections are made from inside
    /// `host`: the lab's own client, placed on a host of its own.
    ///
    /// # Errors
    ///
    /// When the endpoint is invalid or the connection cannot be made.
    pub async fn channel(
        &self,
        host: &Host,
        addr: SocketAddr,
        transit: crate::net::Transit,
    ) -> anyhow::Result<ReadyChannel> {
        let ns = PathBuf::from("/run/netns").join(&host.ns);
        let connector = tower::service_fn(move |_: Uri| {
            let ns = ns.clone();
            async move { connect_in(ns, addr).await.map(TokioIo::new) }
        });
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))?;
        Ok(transit
            .builder(&endpoint)
            .connect_with_connector(connector)
            .await?)
    }

    /// Kills the processes and removes every namespace (and with them the
    /// veth pairs); reports what could not be removed.
    ///
    /// # Errors
    ///
    /// When a namespace is still there afterwards.
    pub async fn close(mut self) -> anyhow::Result<()> {
        self.processes.clear();
        let hosts = std::mem::take(&mut self.hosts);
        let mut failed = Vec::new();
        for host in &hosts {
            if let Err(e) = self.ip(&["netns", "del", &host.ns]).await {
                failed.push(format!("{e:#}"));
            }
        }
        anyhow::ensure!(
            failed.is_empty(),
            "namespaces left behind: {}",
            failed.join("; ")
        );
        Ok(())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Processes first: a namespace with a process in it outlives `ip
        // netns del` until the process exits.
        self.processes.clear();
        for host in self.hosts.drain(..) {
            let _ = Command::new(&self.ip)
                .args(["netns", "del", &host.ns])
                .output();
        }
    }
}

/// An interface name for the end that faces `peer` (at most 15 bytes, the
/// kernel's limit), unique within its namespace by the link number.
fn interface_name(peer: &str, link: usize) -> String {
    let mut name = format!("v{link}-{peer}");
    name.truncate(15);
    name
}

/// The namespaces the lab made in runs whose process is gone.
async fn sweep_stale(ip: &Path) {
    let Ok(list) = run(ip, &["netns", "list"]).await else {
        return;
    };
    for ns in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = ns
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run(ip, &["netns", "del", ns]).await;
        }
    }
}

/// Lists the lab's namespaces whose name starts with `dlab-<pid>-`.
///
/// # Errors
///
/// When `ip netns list` fails.
pub async fn namespaces_of(pid: u32) -> anyhow::Result<Vec<String>> {
    let ip = find_program("ip").ok_or_else(|| anyhow::anyhow!("iproute2 is not installed"))?;
    let prefix = format!("{PREFIX}{pid}-");
    Ok(run(&ip, &["netns", "list"])
        .await?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|ns| ns.starts_with(&prefix))
        .map(str::to_owned)
        .collect())
}

/// Opens a TCP connection to `addr` from inside the namespace at `ns`.
///
/// The connection is made on a fresh thread that enters the namespace and
/// exits afterwards, so no runtime thread ever changes namespace; the socket
/// stays in the namespace it was made in wherever it is used from.
async fn connect_in(ns: PathBuf, addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let connected = (|| {
            let file = File::open(&ns)?;
            rustix::thread::move_into_link_name_space(
                file.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
            let stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
            stream.set_nodelay(true)?;
            stream.set_nonblocking(true)?;
            std::io::Result::Ok(stream)
        })();
        let _ = tx.send(connected);
    });
    let stream = rx
        .await
        .map_err(|_| std::io::Error::other("the connecting thread died"))??;
    tokio::net::TcpStream::from_std(stream)
}
