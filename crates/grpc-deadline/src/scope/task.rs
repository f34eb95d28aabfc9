//! Tasks tied to a scope, the explicit way out, and the report of work that
//! outlived its scope.

use tokio::task::JoinHandle;

use super::Scope;
use super::cause::Ended;

/// Spawns `future` under the current scope (see [`Scope::spawn`]): the task is
/// cancelled with the request that started it.
pub fn spawn<F>(future: F) -> JoinHandle<Result<F::Output, Ended>>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    Scope::current().spawn(future)
}

/// Spawns `future` **outside** the current scope: no deadline, and nothing
/// cancels it — not the caller giving up, not the request finishing.
///
/// This is the one way to break the chain, and it is meant to be rare and
/// easy to find (`grep detach`). Outbound calls made inside carry no
/// `grpc-timeout`. Prefer a durable hand-off for work that must survive the
/// request; use `detach` only for work whose loss is acceptable.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let audit = grpc_deadline::detach(async {
///     assert!(grpc_deadline::Scope::current().deadline().is_none());
///     "written"
/// });
/// assert_eq!(audit.await.unwrap(), "written");
/// # }
/// ```
pub fn detach<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    // The one explicit way out of the chain.
    #[allow(clippy::disallowed_methods)]
    tokio::spawn(Scope::background().enter_owned(future))
}

impl Scope {
    fn enter_owned<F: Future>(self, future: F) -> impl Future<Output = F::Output> {
        super::current::Entered::new(self, future)
    }
}

/// For layers: logs work that finished after its scope had already ended,
/// and tells the root's [`Attachment`](super::Attachment) (a server layer
/// counts it). Nothing happens while the scope is live.
///
/// ```
/// let scope = grpc_deadline::Scope::background();
/// grpc_deadline::scope::note_if_outlived(&scope, "a query"); // live: nothing to note
/// ```
pub fn note_if_outlived(scope: &Scope, what: &'static str) {
    let Some(cause) = scope.cause() else { return };
    let outlived = scope
        .deadline()
        .map(|d| tokio::time::Instant::now().saturating_duration_since(d));
    if let Some(attached) = scope.attachment() {
        attached.outlived(what, outlived);
    }
    tracing::warn!(
        what,
        %cause,
        outlived_deadline_by = ?outlived,
        "work outlived its scope",
    );
}
