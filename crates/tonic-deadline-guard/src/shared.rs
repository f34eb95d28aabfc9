//! What a guard and every connection it wraps share: its rules, what it
//! reports to, its warnings, and the addresses it cut off lately; and what
//! it decides with them about a connection, when it starts (probation, TLS
//! it cannot read) and when it spends its allowance (cut off, or held).

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use grpc_deadline::rate_limited_warnings::WarnLimit;
use tokio::time::Instant;

use crate::observer::Observer;
use crate::probation::{FORGET, HELD, Held, Peers};
use crate::reset_account::Breach;
use crate::rules::Rules;

/// What a guard and its connections share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) rules: Rules,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    pub(crate) warnings: WarnLimit,
    pub(crate) held_warnings: WarnLimit,
    /// The addresses cut off lately.
    pub(crate) peers: Arc<Peers>,
    /// A connection that is TLS, which the guard cannot read, was refused.
    pub(crate) saw_tls: AtomicBool,
}

impl Shared {
    /// What a guard with `rules`, reporting to `observer`, shares with its
    /// connections: nothing said or remembered yet.
    pub(crate) fn new(rules: Rules, observer: Option<Arc<dyn Observer>>) -> Self {
        Self {
            rules,
            observer,
            warnings: WarnLimit::new(),
            held_warnings: WarnLimit::new(),
            peers: Arc::default(),
            saw_tls: AtomicBool::new(false),
        }
    }

    /// Whether a connection from `peer`, accepted at `now`, is on
    /// probation: its address was cut off lately.
    pub(crate) fn probation(&self, peer: Option<IpAddr>, now: Instant) -> bool {
        match (peer, self.rules.hold) {
            (Some(ip), Some(_)) => self.peers.on_probation(ip, now),
            _ => false,
        }
    }

    /// A connection that does not start with HTTP/2's preface: TLS (which
    /// the guard cannot read: refused, and said plainly, at once), or
    /// HTTP/1 (nothing to guard). Whether it is refused.
    pub(crate) fn not_http2(&self, start: &[u8]) -> bool {
        // A TLS record of the handshake: content type 22, version 3.x.
        let tls = matches!(start, [0x16, 0x03, ..]);
        if tls && !self.saw_tls.swap(true, Ordering::Relaxed) {
            if let Some(observer) = &self.observer {
                observer.unguarded();
            }
            tracing::error!(
                "reset guard: refused a TLS connection, which the guard cannot read: TLS is set \
                 on tonic's Server, around the guard, so nothing would bound reset floods on it \
                 (the guard's builder raised hyper's own bound for the guard). Every TLS \
                 connection is refused until the guard terminates TLS itself: serve with \
                 guard.builder()...serve_tls(addr, ServerTls::new(cert_pem, key_pem)), or \
                 guard.incoming_tls(incoming, ServerTls::new(cert_pem, key_pem))?, and no \
                 tls_config (feature tls)"
            );
        }
        tls
    }

    /// A connection breached its allowance at `now`: a hold to keep it
    /// unread for, if it was on probation and may be held; cut off at once
    /// otherwise.
    #[cold]
    pub(crate) fn breached(
        &self,
        breach: &Breach,
        peer: Option<IpAddr>,
        probation: bool,
        now: Instant,
    ) -> Option<(Held, Duration)> {
        if let Some(observer) = &self.observer {
            observer.reset_flood_cut();
        }
        let (Some(ip), Some(hold)) = (peer, self.rules.hold) else {
            self.warn_cut(breach);
            return None;
        };
        self.peers.cut(ip, now);
        if !probation {
            self.warn_cut(breach);
            return None;
        }
        let held = self.peers.hold(ip);
        if let Some(observer) = &self.observer {
            match held {
                Some(_) => observer.connection_held(),
                None => observer.connection_refused(),
            }
        }
        if let Some(similar) = self.held_warnings.admit() {
            let what = match held {
                Some(_) => format!("holding it unread for {hold:?}, then cutting it off"),
                None => format!(
                    "cutting it off at once: {} of its address's connections are held already",
                    HELD
                ),
            };
            tracing::warn!(
                peer = %ip,
                early_resets = breach.early_resets,
                similar_since_last_warning = similar,
                "reset guard: a connection from an address cut off for a reset flood within the \
                 last {} s reset streams early again: {what}. Its address's other connections \
                 are served as any other",
                FORGET.as_secs(),
            );
        }
        held.map(|held| (held, hold))
    }

    pub(crate) fn warn_cut(&self, breach: &Breach) {
        if let Some(similar) = self.warnings.admit() {
            tracing::warn!(
                early_resets = breach.early_resets,
                opened = breach.opened,
                ended_honestly = breach.honest_ends,
                last_stream = breach.last_stream,
                similar_since_last_warning = similar,
                "reset guard: closed a connection (GOAWAY ENHANCE_YOUR_CALM) whose client reset \
                 more streams soon after opening them, long before their deadlines, than the \
                 allowance of {} earned back by streams that end by themselves: an HTTP/2 \
                 reset flood (Rapid Reset, CVE-2023-44487)",
                self.rules.allowance,
            );
        }
    }
}
