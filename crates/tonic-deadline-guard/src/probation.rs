//! Probation: what a guard remembers of the addresses it cut off, and the
//! address a connection comes from. A flood that connects again as soon as
//! it is cut off costs the server a connection (its accept, its handshake,
//! its allowance of streams) each time, and a guard on each connection
//! bounds only what one connection costs. So for [`FORGET`] after its last
//! cut, an address's new connections are on *probation*: they start with
//! no early resets allowed, and one that resets a stream early is held
//! unread for [`Rules::hold`] before it is cut off, at most [`HELD`] of an
//! address at once. What is held is only what floods again: an honest
//! client sharing the address (behind a NAT or a proxy that hides its
//! clients' addresses) is read as any other. An IPv6 address is remembered
//! by its /64 prefix, what one host is usually given: a flooder choosing a
//! new address within it for each connection is the same flooder.
//!
//! [`Rules::hold`]: crate::rules::Rules::hold

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::server::TcpConnectInfo;
#[cfg(unix)]
use tonic::transport::server::UdsConnectInfo;

/// How long after its last cut an address's new connections are on
/// probation.
pub(super) const FORGET: Duration = Duration::from_secs(10);

/// The most connections of an address held at once; one more that floods
/// on probation is cut off at once. A flood that opens connections
/// without waiting for them holds no more than these.
pub(super) const HELD: u32 = 20;

/// The most addresses remembered at once; beyond it, a new one is not
/// (what an attacker with that many addresses gets is what every
/// connection gets: the guard on each).
const MAX_PEERS: usize = 4096;

/// The address a connection came from, which a guard keys its memory of
/// floods by ([`ResetGuard::incoming`](crate::ResetGuard::incoming)).
/// Implemented for what tonic's TCP and Unix-socket streams tell, and
/// (feature `tls`) their TLS; for a stream of your own, implement it:
///
/// ```
/// use std::net::IpAddr;
/// use tonic_deadline_guard::PeerAddress;
///
/// #[derive(Clone)]
/// struct MyInfo { from: IpAddr }
///
/// impl PeerAddress for MyInfo {
///     fn peer_address(&self) -> Option<IpAddr> {
///         Some(self.from)
///     }
/// }
/// # let _ = MyInfo { from: IpAddr::from([127, 0, 0, 1]) }.peer_address();
/// ```
pub trait PeerAddress {
    /// The address of the connection's peer, if it has one.
    fn peer_address(&self) -> Option<IpAddr>;
}

impl PeerAddress for TcpConnectInfo {
    fn peer_address(&self) -> Option<IpAddr> {
        self.remote_addr().map(|a| a.ip())
    }
}

#[cfg(unix)]
impl PeerAddress for UdsConnectInfo {
    /// A Unix socket's peers share no address to tell them apart by.
    fn peer_address(&self) -> Option<IpAddr> {
        None
    }
}

/// What an address is remembered by: an IPv4 address as it is (an IPv6
/// one that maps it, too), an IPv6 address by its /64 prefix.
fn key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

/// An address cut off lately.
#[derive(Debug, Clone, Copy)]
struct Peer {
    last_cut: Instant,
    /// Its connections held now.
    held: u32,
}

/// The addresses cut off lately.
#[derive(Debug, Default)]
pub(super) struct Peers {
    cut: Mutex<HashMap<IpAddr, Peer>>,
}

impl Peers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Peer>> {
        self.cut.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A connection from `ip` was cut off at `now`.
    pub(super) fn cut(&self, ip: IpAddr, now: Instant) {
        let ip = key(ip);
        let mut cut = self.lock();
        if cut.len() >= MAX_PEERS && !cut.contains_key(&ip) {
            cut.retain(|_, peer| now.duration_since(peer.last_cut) < FORGET || peer.held > 0);
            if cut.len() >= MAX_PEERS {
                return;
            }
        }
        cut.entry(ip)
            .and_modify(|peer| peer.last_cut = now)
            .or_insert(Peer {
                last_cut: now,
                held: 0,
            });
    }

    /// Whether a new connection from `ip`, accepted at `now`, is on
    /// probation: its address was cut off within [`FORGET`].
    pub(super) fn on_probation(&self, ip: IpAddr, now: Instant) -> bool {
        let ip = key(ip);
        let mut cut = self.lock();
        let Some(peer) = cut.get(&ip) else {
            return false;
        };
        if now.duration_since(peer.last_cut) < FORGET {
            return true;
        }
        if peer.held == 0 {
            cut.remove(&ip);
        }
        false
    }

    /// A connection from `ip` flooded on probation: a hold for it, unless
    /// [`HELD`] of its address are held already.
    pub(super) fn hold(self: &Arc<Self>, ip: IpAddr) -> Option<Held> {
        let ip = key(ip);
        let mut cut = self.lock();
        let peer = cut.get_mut(&ip)?;
        if peer.held >= HELD {
            return None;
        }
        peer.held += 1;
        Some(Held {
            peers: self.clone(),
            ip,
        })
    }
}

/// A connection held: its address's count, given back when dropped.
#[derive(Debug)]
pub(super) struct Held {
    peers: Arc<Peers>,
    ip: IpAddr,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(peer) = self.peers.lock().get_mut(&self.ip) {
            peer.held = peer.held.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_address_cut_off_is_on_probation_until_forgotten() {
        let peers = Peers::default();
        let flooder = IpAddr::from([10, 0, 0, 1]);
        let other = IpAddr::from([10, 0, 0, 2]);
        let t0 = Instant::now();
        assert!(!peers.on_probation(flooder, t0), "nothing cut yet");
        peers.cut(flooder, t0);
        assert!(peers.on_probation(flooder, t0));
        assert!(peers.on_probation(flooder, t0 + Duration::from_secs(9)));
        assert!(!peers.on_probation(other, t0), "another address is not");
        // A later cut starts the time again.
        peers.cut(flooder, t0 + Duration::from_secs(5));
        assert!(peers.on_probation(flooder, t0 + Duration::from_secs(14)));
        // Forgotten once it has gone FORGET without a cut.
        assert!(!peers.on_probation(flooder, t0 + Duration::from_secs(15)));
        assert!(peers.lock().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_so_many_connections_of_an_address_are_held() {
        let peers = Arc::new(Peers::default());
        let flooder = IpAddr::from([10, 0, 0, 1]);
        assert!(peers.hold(flooder).is_none(), "not cut: nothing to hold");
        peers.cut(flooder, Instant::now());
        let mut held: Vec<Held> = (0..HELD).filter_map(|_| peers.hold(flooder)).collect();
        assert_eq!(held.len(), HELD as usize);
        assert!(peers.hold(flooder).is_none(), "one more is not held");
        held.pop();
        assert!(
            peers.hold(flooder).is_some(),
            "a hold given back makes room"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_ipv6_flooder_is_remembered_by_its_64_prefix() {
        let peers = Peers::default();
        let t0 = Instant::now();
        let ip = |s: &str| s.parse::<IpAddr>().expect("an address");
        peers.cut(ip("2001:db8:1:2::1"), t0);
        assert!(
            peers.on_probation(ip("2001:db8:1:2:ffff::9"), t0),
            "another address of the same /64"
        );
        assert!(
            !peers.on_probation(ip("2001:db8:1:3::1"), t0),
            "another /64"
        );
        // An IPv4 address, whether it comes as itself or mapped.
        peers.cut(ip("192.0.2.7"), t0);
        assert!(peers.on_probation(ip("::ffff:192.0.2.7"), t0));
    }

    #[tokio::test(start_paused = true)]
    async fn the_memory_is_bounded() {
        let peers = Peers::default();
        let t0 = Instant::now();
        for i in 0..(MAX_PEERS as u32 + 10) {
            peers.cut(IpAddr::from(i.to_be_bytes()), t0);
        }
        assert_eq!(peers.lock().len(), MAX_PEERS);
        // Once the first are forgotten, room is made.
        let later = t0 + FORGET;
        peers.cut(IpAddr::from([192, 0, 2, 1]), later);
        assert_eq!(peers.lock().len(), 1);
    }
}
