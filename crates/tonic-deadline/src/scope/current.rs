//! The task-local current scope.

use super::Scope;

tokio::task_local! {
    /// Set by the server layer around each handler and by [`Scope::enter`].
    pub(crate) static CURRENT: Scope;
}

pub(crate) fn try_current() -> Option<Scope> {
    CURRENT.try_with(Scope::clone).ok()
}

/// The current scope, or a fresh background scope outside any.
///
/// The same as [`Scope::current`]; a free function for call sites that read
/// better without the type name.
pub fn current_or_background() -> Scope {
    try_current().unwrap_or_else(Scope::background)
}
