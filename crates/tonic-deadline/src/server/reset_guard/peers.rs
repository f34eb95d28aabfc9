//! What a guard remembers of the addresses it cut off: a flood that
//! connects again as soon as it is cut off costs the server a connection
//! (its accept, its handshake, its allowance of streams) each time, and
//! a guard on each connection bounds only what one connection costs. The
//! new connections of an address cut off lately are read one at a time,
//! [`Rules::pace`] apart, until it has gone [`FORGET`] without a cut.
//! An IPv6 address is remembered by its /64 prefix, what one host is
//! usually given: a flooder choosing a new address within it for each
//! connection is the same flooder.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::server::TcpConnectInfo;
#[cfg(unix)]
use tonic::transport::server::UdsConnectInfo;

/// How long after its last cut an address is paced.
pub(super) const FORGET: Duration = Duration::from_secs(10);

/// The most turns an address's new connections may wait for at once; one
/// that would wait for more is closed unread. A flood that opens
/// connections without waiting for them holds no more than these.
pub(super) const WAITING: u32 = 20;

/// The most addresses remembered at once; beyond it, a new one is not
/// (what an attacker with that many addresses gets is what every
/// connection gets: the guard on each).
const MAX_PEERS: usize = 4096;

/// The address a connection came from, which a guard keys its memory of
/// floods by ([`ResetGuard::incoming`](super::ResetGuard::incoming)).
/// Implemented for what tonic's TCP and Unix-socket streams tell;
/// implement it for your own connections' info (`None`: not paced).
///
/// ```
/// use std::net::IpAddr;
/// use tonic_deadline::server::PeerAddress;
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

/// When a new connection may be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Turn {
    /// At once: its address was not cut off lately, or its turn is now.
    Now,
    /// Held unread until then.
    At(Instant),
    /// Never: [`WAITING`] turns of its address wait already. It is closed
    /// unread.
    Refused,
}

/// An address cut off lately.
#[derive(Debug, Clone, Copy)]
struct Peer {
    last_cut: Instant,
    /// When its next new connection may be read.
    next: Instant,
}

/// The addresses cut off lately.
#[derive(Debug, Default)]
pub(super) struct Peers {
    cut: Mutex<HashMap<IpAddr, Peer>>,
}

impl Peers {
    /// A connection from `ip` was cut off at `now`.
    pub(super) fn cut(&self, ip: IpAddr, now: Instant) {
        let ip = key(ip);
        let mut cut = self.cut.lock().unwrap_or_else(|e| e.into_inner());
        if cut.len() >= MAX_PEERS && !cut.contains_key(&ip) {
            cut.retain(|_, peer| now.duration_since(peer.last_cut) < FORGET);
            if cut.len() >= MAX_PEERS {
                return;
            }
        }
        cut.entry(ip)
            .and_modify(|peer| peer.last_cut = now)
            .or_insert(Peer {
                last_cut: now,
                next: now,
            });
    }

    /// When a new connection from `ip`, accepted at `now`, may be read:
    /// at once if its address was not cut off within [`FORGET`], else at
    /// its turn, `pace` after the one before, unless [`WAITING`] turns
    /// wait already.
    pub(super) fn admit(&self, ip: IpAddr, now: Instant, pace: Duration) -> Turn {
        let ip = key(ip);
        let mut cut = self.cut.lock().unwrap_or_else(|e| e.into_inner());
        let Some(peer) = cut.get_mut(&ip) else {
            return Turn::Now;
        };
        if now.duration_since(peer.last_cut) >= FORGET {
            cut.remove(&ip);
            return Turn::Now;
        }
        let turn = peer.next.max(now);
        if turn.duration_since(now) >= pace * WAITING {
            return Turn::Refused;
        }
        peer.next = turn + pace;
        if turn > now {
            Turn::At(turn)
        } else {
            Turn::Now
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PACE: Duration = Duration::from_millis(50);

    #[tokio::test(start_paused = true)]
    async fn an_address_cut_off_is_read_one_connection_at_a_time_until_forgotten() {
        let peers = Peers::default();
        let flooder = IpAddr::from([10, 0, 0, 1]);
        let other = IpAddr::from([10, 0, 0, 2]);
        let t0 = Instant::now();
        assert_eq!(peers.admit(flooder, t0, PACE), Turn::Now, "nothing cut yet");
        peers.cut(flooder, t0);
        // The first one after the cut goes at once; the next wait their turns.
        assert_eq!(peers.admit(flooder, t0, PACE), Turn::Now);
        assert_eq!(peers.admit(flooder, t0, PACE), Turn::At(t0 + PACE));
        assert_eq!(peers.admit(flooder, t0, PACE), Turn::At(t0 + PACE * 2));
        assert_eq!(
            peers.admit(other, t0, PACE),
            Turn::Now,
            "another address is not paced"
        );
        // Turns that have passed are not owed.
        let later = t0 + Duration::from_secs(1);
        assert_eq!(peers.admit(flooder, later, PACE), Turn::Now);
        assert_eq!(peers.admit(flooder, later, PACE), Turn::At(later + PACE));
        // Forgotten once it has gone FORGET without a cut.
        let quiet = t0 + FORGET;
        assert_eq!(peers.admit(flooder, quiet, PACE), Turn::Now);
        assert_eq!(peers.admit(flooder, quiet, PACE), Turn::Now);
    }

    #[tokio::test(start_paused = true)]
    async fn connections_beyond_the_turns_that_may_wait_are_refused() {
        let peers = Peers::default();
        let flooder = IpAddr::from([10, 0, 0, 1]);
        let t0 = Instant::now();
        peers.cut(flooder, t0);
        let turns: Vec<Turn> = (0..WAITING + 5)
            .map(|_| peers.admit(flooder, t0, PACE))
            .collect();
        assert_eq!(turns[0], Turn::Now);
        assert_eq!(
            turns[WAITING as usize - 1],
            Turn::At(t0 + PACE * (WAITING - 1))
        );
        assert!(
            turns[WAITING as usize..]
                .iter()
                .all(|t| *t == Turn::Refused),
            "{turns:?}"
        );
        // As turns pass, room is made again.
        assert_eq!(
            peers.admit(flooder, t0 + PACE, PACE),
            Turn::At(t0 + PACE * WAITING)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_ipv6_flooder_is_remembered_by_its_64_prefix() {
        let peers = Peers::default();
        let t0 = Instant::now();
        let ip = |s: &str| s.parse::<IpAddr>().expect("an address");
        peers.cut(ip("2001:db8:1:2::1"), t0);
        peers.admit(ip("2001:db8:1:2::1"), t0, PACE);
        assert_eq!(
            peers.admit(ip("2001:db8:1:2:ffff::9"), t0, PACE),
            Turn::At(t0 + PACE),
            "another address of the same /64"
        );
        assert_eq!(
            peers.admit(ip("2001:db8:1:3::1"), t0, PACE),
            Turn::Now,
            "another /64"
        );
        // An IPv4 address, whether it comes as itself or mapped.
        peers.cut(ip("192.0.2.7"), t0);
        peers.admit(ip("192.0.2.7"), t0, PACE);
        assert_eq!(
            peers.admit(ip("::ffff:192.0.2.7"), t0, PACE),
            Turn::At(t0 + PACE)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_memory_is_bounded() {
        let peers = Peers::default();
        let t0 = Instant::now();
        for i in 0..(MAX_PEERS as u32 + 10) {
            peers.cut(IpAddr::from(i.to_be_bytes()), t0);
        }
        assert_eq!(peers.cut.lock().expect("not poisoned").len(), MAX_PEERS);
        // Once the first are forgotten, room is made.
        let later = t0 + FORGET;
        peers.cut(IpAddr::from([192, 0, 2, 1]), later);
        assert_eq!(peers.cut.lock().expect("not poisoned").len(), 1);
    }
}
