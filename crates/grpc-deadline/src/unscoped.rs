//! What a client layer does with an outbound call that finds no scope.

/// What a client layer (tonic-deadline's `ClientDeadlineLayer`, the `grpc`
/// crate's `DeadlineInterceptor`) does with an outbound call that finds no
/// scope: neither a current scope on its task nor one carried in the
/// request.
///
/// Inside a server such a call has almost always *lost* its request's
/// scope: it was made from a `tokio::spawn`ed task, a tokio `JoinSet`, a
/// thread of `spawn_blocking`, or a worker that runs calls for others. It
/// carries no deadline of its request, and nothing cancels it when the
/// caller gives up.
///
/// ```
/// use grpc_deadline::Unscoped;
/// assert_eq!(Unscoped::default(), Unscoped::Warn);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Unscoped {
    /// Send it as it is: no deadline, no cancellation, no report.
    Allow,
    /// Send it, and report it: counted by the layer, and logged as a `WARN`
    /// naming the method (at most one line every ten seconds per client,
    /// with the number of such calls since the last).
    ///
    /// The default in every process, server or not: a call without a scope
    /// carries no deadline and nothing cancels it, which inside a server
    /// means a request's scope was lost. Code whose call is meant to have
    /// no deadline says so, as Go code passes `context.Background()`: per
    /// call with `Scope::background().enter(call)`, or for a whole client
    /// with [`Unscoped::Allow`].
    #[default]
    Warn,
    /// Refuse it locally with `FAILED_PRECONDITION`, sending nothing; the
    /// message names the fix. Counted like `Warn`.
    Deny,
}
