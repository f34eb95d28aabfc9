//! The seed systems, as real tonic services on real loopback sockets.
//!
//! Each system runs whole in one process (every service on its own port), or
//! one service per process: `deadline-lab serve <system> --role <service>
//! --peer <name>=<addr>`.

pub mod chain;
pub mod echo;
pub mod im;
pub mod jobs;
pub mod orders;
pub mod shop;
pub mod trace;
pub mod worker;

use std::collections::HashMap;
use std::net::SocketAddr;

use tonic::service::Routes;
use tonic_deadline::ServerDeadlineLayer;

use crate::{net, pb};

/// Addresses of the services a role calls, by service name, and how the
/// role's calls to them pay for transit.
#[derive(Debug, Clone, Default)]
pub struct Peers {
    addrs: HashMap<String, SocketAddr>,
    transit: net::Transit,
}

impl Peers {
    /// Parses `name=addr` pairs.
    ///
    /// # Errors
    ///
    /// When a pair has no `=` or its address does not parse.
    pub fn parse<'a>(pairs: impl IntoIterator<Item = &'a str>) -> anyhow::Result<Self> {
        let mut peers = HashMap::new();
        for pair in pairs {
            let (name, addr) = pair
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--peer takes name=addr, got {pair}"))?;
            peers.insert(name.to_owned(), addr.parse()?);
        }
        Ok(Self {
            addrs: peers,
            transit: net::Transit::Ignored,
        })
    }

    /// Calls to every peer get `transit` compensation.
    pub fn with_transit(mut self, transit: net::Transit) -> Self {
        self.transit = transit;
        self
    }

    /// Adds or replaces one peer.
    pub fn insert(&mut self, name: &str, addr: SocketAddr) {
        self.addrs.insert(name.to_owned(), addr);
    }

    /// The address of `name`.
    ///
    /// # Errors
    ///
    /// When `name` was not given.
    pub fn get(&self, name: &str) -> anyhow::Result<SocketAddr> {
        self.addrs
            .get(name)
            .copied()
            .ok_or_else(|| anyhow::anyhow!("this role needs --peer {name}=ADDR"))
    }

    /// A layered client channel to `name` (connects on first use), with
    /// this role's transit compensation.
    ///
    /// # Errors
    ///
    /// When `name` was not given.
    pub fn channel(&self, name: &str) -> anyhow::Result<net::Layered> {
        net::lazy_with(self.get(name)?, self.transit)
    }

    /// [`channel`](Self::channel), its calls opening trace spans.
    ///
    /// # Errors
    ///
    /// When `name` was not given.
    pub fn traced_channel(&self, name: &str) -> anyhow::Result<net::Layered> {
        net::lazy_traced(self.get(name)?, self.transit)
    }
}

/// One service of a system, started.
#[derive(Debug, Clone)]
pub struct Started {
    /// The service name.
    pub role: &'static str,
    /// Where it listens.
    pub addr: SocketAddr,
}

/// Where `role` of a started system listens.
///
/// # Errors
///
/// When no service of that role was started.
pub fn addr_of(started: &[Started], role: &str) -> anyhow::Result<SocketAddr> {
    started
        .iter()
        .find(|s| s.role == role)
        .map(|s| s.addr)
        .ok_or_else(|| anyhow::anyhow!("{role} started"))
}

/// Starts a system's `roles` in order (callees before callers), each
/// learning the addresses of those started before it; `entry_role` listens
/// on `entry`, the others on free loopback ports.
///
/// # Errors
///
/// The first role that fails to start.
pub async fn start_in_order(
    roles: &[&'static str],
    entry_role: &str,
    entry: &str,
    mut start_role: impl AsyncFnMut(&'static str, &str, &Peers) -> anyhow::Result<Started>,
) -> anyhow::Result<Vec<Started>> {
    let mut peers = Peers::default();
    let mut started = Vec::new();
    for &role in roles {
        let listen = if role == entry_role {
            entry
        } else {
            "127.0.0.1:0"
        };
        let s = start_role(role, listen, &peers).await?;
        peers.insert(s.role, s.addr);
        started.push(s);
    }
    Ok(started)
}

/// Serves `routes` with gRPC server reflection for the lab's protos.
pub async fn serve_lab(
    listen: &str,
    routes: Routes,
    layer: ServerDeadlineLayer,
) -> anyhow::Result<SocketAddr> {
    let routes = with_reflection(routes, pb::FILE_DESCRIPTOR_SET)?;
    net::serve(listen, routes, Some(layer)).await
}

/// Adds gRPC server reflection for `descriptors`, in both its versions:
/// `v1`, and `v1alpha` for the tools that speak only that one (grpcurl
/// before 1.9, grpcui, older Evans). `google.rpc`'s error details are
/// served too, so that grpcurl decodes a ledger's `DebugInfo`.
///
/// # Errors
///
/// When the descriptors do not decode.
pub fn with_reflection(routes: Routes, descriptors: &[u8]) -> anyhow::Result<Routes> {
    let v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(descriptors)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(descriptors)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    Ok(routes.add_service(v1).add_service(v1alpha))
}

/// What each hop of the IM and shop systems keeps of its budget for its
/// answer's way back (`ServerDeadlineLayer::reply_reserve`) in the
/// experiments that read ledgers (`ledger`, `waterfall`), so that a
/// `DEADLINE_EXCEEDED` and its ledger reach the caller before the caller's
/// own timer gives up on them. The other experiments run without one.
pub const REPLY_RESERVE: std::time::Duration = std::time::Duration::from_millis(10);

/// The milliseconds of a request field as a duration.
pub fn millis(ms: u64) -> std::time::Duration {
    std::time::Duration::from_millis(ms)
}
