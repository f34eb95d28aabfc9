//! A `tokio::task::JoinSet` whose tasks belong to a scope.

use std::fmt;

use tokio::task::{AbortHandle, JoinError};

use super::Scope;
use super::cause::Ended;

/// A set of tasks tied to one scope: tokio's `JoinSet`, with every task run
/// as the current scope inside a child of the scope the set was made in.
///
/// A plain `tokio::task::JoinSet` starts each task with no current scope, so
/// outbound calls made inside carry no deadline and nothing cancels them
/// when the request is over (dropping the set aborts them, but only if the
/// set itself is dropped). Here each task sees the request's budget, and
/// stops with [`Ended`] the moment the scope ends — by deadline, cancel, or
/// because the request was answered.
///
/// ```
/// use std::time::Duration;
/// use grpc_deadline::{Cause, JoinSet, Scope};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let request = Scope::background().with_timeout(Duration::from_millis(100));
/// let mut quotes = request.enter(async { JoinSet::new() }).await; // the set belongs to `request`
/// quotes.spawn(async { Scope::current().remaining() });
/// quotes.spawn(async { tokio::time::sleep(Duration::from_secs(5)).await; None });
///
/// let first = quotes.join_next().await.unwrap().unwrap();
/// assert_eq!(first.unwrap(), Some(Duration::from_millis(100)), "a task sees the request's budget");
/// let slow = quotes.join_next().await.unwrap().unwrap();
/// assert_eq!(slow.unwrap_err().cause(), Cause::DeadlineExceeded, "and stops at its deadline");
/// # }
/// ```
pub struct JoinSet<T> {
    scope: Scope,
    tasks: tokio::task::JoinSet<Result<T, Ended>>,
}

impl<T: 'static> JoinSet<T> {
    /// An empty set whose tasks belong to the current scope (see
    /// [`Scope::current`]).
    pub fn new() -> Self {
        Self::in_scope(&Scope::current())
    }

    /// An empty set whose tasks belong to `scope`.
    pub fn in_scope(scope: &Scope) -> Self {
        Self {
            scope: scope.clone(),
            tasks: tokio::task::JoinSet::new(),
        }
    }

    /// The scope the tasks belong to.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Spawns `task` in a child of the set's scope; see [`Scope::spawn`].
    pub fn spawn<F>(&mut self, task: F) -> AbortHandle
    where
        F: Future<Output = T> + Send + 'static,
        T: Send,
    {
        let child = self.scope.child();
        // The one place this set starts a task; the scope goes with it.
        #[allow(clippy::disallowed_methods)]
        self.tasks.spawn(async move { child.run(task).await })
    }

    /// Waits for the next task to finish: its output, or [`Ended`] if the
    /// scope ended first. `None` once the set is empty.
    ///
    /// # Cancellation safety
    ///
    /// Safe, as tokio's `JoinSet::join_next`: a task that finished while the
    /// future was dropped stays in the set.
    pub async fn join_next(&mut self) -> Option<Result<Result<T, Ended>, JoinError>> {
        self.tasks.join_next().await
    }

    /// Waits for every task and collects their outputs, in the order they
    /// finished.
    ///
    /// # Panics
    ///
    /// Resumes the panic of a task that panicked.
    pub async fn join_all(mut self) -> Vec<Result<T, Ended>> {
        let mut out = Vec::with_capacity(self.tasks.len());
        while let Some(joined) = self.tasks.join_next().await {
            match joined {
                Ok(result) => out.push(result),
                Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
                // Aborted through an `AbortHandle`: nothing to collect.
                Err(_) => {}
            }
        }
        out
    }

    /// Aborts every task at once.
    pub fn abort_all(&mut self) {
        self.tasks.abort_all();
    }

    /// How many tasks are in the set.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether the set has no tasks.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }
}

impl<T: 'static> Default for JoinSet<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for JoinSet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinSet")
            .field("scope", &self.scope)
            .field("len", &self.tasks.len())
            .finish()
    }
}
