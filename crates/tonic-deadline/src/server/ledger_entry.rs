//! This hop's entry in the ledger: what the response future and the body
//! each write into a failure's answer. Its own module, so that the future
//! and the body both import it and neither imports the other's.

#[cfg(feature = "ledger")]
use tokio::time::Instant;

use crate::scope::Scope;

/// This hop as the ledger tells it: the method it serves, when it arrived
/// and the budget it had.
#[cfg(feature = "ledger")]
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) method: http::uri::PathAndQuery,
    pub(super) arrived: Instant,
    pub(super) budget: std::time::Duration,
}

#[cfg(feature = "ledger")]
impl Entry {
    pub(super) fn answer(self, headers: &mut http::HeaderMap, scope: &Scope) {
        crate::ledger::answer(
            headers,
            scope,
            self.method.path(),
            self.arrived,
            Some(self.budget),
        );
    }

    /// Puts the ledger on the handler's status in `headers` (a
    /// trailers-only answer, or trailers) if it is due one, taking `entry`
    /// then; a status that is not (the usual one) leaves it in place,
    /// unmoved.
    pub(super) fn answer_handler(
        entry: &mut Option<Self>,
        headers: &mut http::HeaderMap,
        scope: &Scope,
    ) {
        if entry.is_some()
            && crate::ledger::due(scope, headers)
            && let Some(entry) = entry.take()
        {
            entry.answer(headers, scope);
        }
    }
}

/// Without the ledger, nothing is kept.
#[cfg(not(feature = "ledger"))]
#[derive(Debug)]
pub(super) enum Entry {}

#[cfg(not(feature = "ledger"))]
impl Entry {
    #[inline]
    pub(super) fn answer_handler(_: &mut Option<Self>, _: &mut http::HeaderMap, _: &Scope) {}
}
