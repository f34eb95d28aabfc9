//! The task-local current scope.

use super::Scope;

tokio::task_local! {
    /// Set by the server layer around each handler and by [`Scope::enter`].
    pub(crate) static CURRENT: Scope;
}

pub(crate) fn try_current() -> Option<Scope> {
    CURRENT.try_with(Scope::clone).ok()
}
