//! The scope: a deadline plus a cancellation tree, the Rust counterpart of
//! Go's request `context.Context`.
//!
//! A [`Scope`] holds an optional absolute deadline (no deadline is a real
//! state, not a very large one), a node of a cancellation tree and, once it
//! has ended, the [`Cause`]. Scopes form a tree: children obey the *minimum
//! rule* — a child's deadline is never later than its parent's — and
//! cancelling a parent ends every descendant with the parent's cause.
//!
//! A stack's server layer installs a scope as the task-local *current scope*
//! around every handler, and its client layer reads it for every outbound
//! call, so a
//! handler that calls another service passes its remaining budget on with no
//! code at all. Work that must outlive the request has to say so with
//! [`detach`]; nothing else breaks the chain.
//!
//! How it differs from `tokio::time::timeout`: a timeout is a local race
//! around one future; a scope is shared by everything done on behalf of one
//! request — outbound calls, spawned tasks, blocking work — and it travels.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use grpc_deadline::{Cause, Scope};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let request = Scope::background().with_timeout(Duration::from_secs(1));
//! let lookup = request.with_timeout(Duration::from_millis(20)); // a cache may take 20 ms at most
//! assert!(lookup.remaining() <= Some(Duration::from_millis(20)));
//!
//! let worker = request.spawn(async {
//!     tokio::time::sleep(Duration::from_secs(10)).await; // far beyond the budget
//! });
//! request.cancel();
//! assert_eq!(worker.await.unwrap().unwrap_err().cause(), Cause::Cancelled);
//! assert_eq!(lookup.cause(), Some(Cause::Cancelled), "children end with their parent");
//! # }
//! ```
//!
//! # Invariants
//!
//! 1. A child's deadline is `min(parent deadline, own limit)`; no operation
//!    produces a child that ends later than its parent.
//! 2. The cause is fixed by whichever happens first: the deadline passing or
//!    a cancellation (of this scope or an ancestor). It never changes after.
//! 3. A scope is ended exactly when its cause is `Some`.
//! 4. Cloning, asking ([`is_ended`](Scope::is_ended), [`check`](Scope::check)
//!    while live) and dropping a scope take no lock and allocate nothing;
//!    making a child allocates its node and locks nothing. The tree beneath
//!    (`tree.rs`) says how an end reaches the waiters of every descendant.

pub(crate) mod cause;
mod current;
mod join_set;
mod sync;
mod task;
mod tree;

use std::any::Any;
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use tree::{Node, Wait};

pub use cause::{Cause, Ended};
pub use current::Entered;
pub use join_set::JoinSet;
pub use task::{detach, note_if_outlived, spawn};

/// A deadline plus a node in the cancellation tree. Cheap to clone: clones
/// share the same node.
///
/// See the [module docs](self) for the model.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::time::Duration;
/// use grpc_deadline::{Cause, Scope};
/// let request = Scope::background().with_timeout(Duration::from_millis(300));
/// let pricing = request.with_timeout(Duration::from_millis(100));
/// assert_eq!(pricing.remaining(), Some(Duration::from_millis(100)));
/// request.cancel();
/// assert_eq!(pricing.cause(), Some(Cause::Cancelled), "a child ends with its parent");
/// # }
/// ```
#[derive(Clone)]
pub struct Scope {
    node: Arc<Node<Data, End>>,
}

/// How a node ended: the cause, and when, if anything could ask (see
/// [`Scope::end`]).
type End = (Cause, Option<Instant>);

/// What a node knows of itself, fixed when it is made.
struct Data {
    deadline: Option<Instant>,
    /// How this node limited its parent's budget.
    limit: Option<Limit>,
    /// What the layer that made this root attached to it (roots only).
    attached: Option<Arc<dyn Attachment>>,
    /// Set once a child is made: an end then reads the clock, so that a
    /// child whose own deadline had passed first says so.
    has_children: AtomicBool,
    /// Whether a call under this root spent its retries on a failure:
    /// see [`Scope::note_retries_spent`].
    retries_spent: AtomicBool,
    /// Notes a layer keeps on a request's root, made on first use (the
    /// ledger's record of calls that failed under it).
    notes: OnceLock<Box<dyn Any + Send + Sync>>,
    /// The token handed to libraries that take one, made on first use.
    bridge: OnceLock<CancellationToken>,
}

/// What the layer that made a root scope attaches to it: found again by
/// type anywhere under that root ([`Scope::attached`]), and told of the
/// work under it that the scope cannot stop by itself. The scope knows
/// nothing else of the layers above it.
///
/// For layers: a stack's server layer implements it to count and trace
/// what the scope reports.
pub trait Attachment: Any + Send + Sync + fmt::Debug {
    /// Work tied to a scope under this root returned after that scope had
    /// ended (`by`: how long after its deadline, when it had one).
    fn outlived(&self, what: &'static str, by: Option<Duration>) {
        let _ = (what, by);
    }

    /// The span to run blocking work in, if the layer traces.
    fn blocking_span(&self) -> Option<tracing::Span> {
        None
    }

    /// Blocking work that ran in `span` returned; `scope` is its scope.
    fn blocking_returned(&self, span: &tracing::Span, scope: &Scope) {
        let _ = (span, scope);
    }
}

/// How a child scope cut its parent's budget: what a call span reports as
/// the cap or reserve applied on the way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    /// [`Scope::with_timeout`] where it set the deadline: at most this
    /// long from when it was made.
    Cap(Duration),
    /// [`Scope::reserve`]: this much kept back for the hop itself.
    Reserve(Duration),
}

impl Scope {
    /// A root scope with no deadline that is never cancelled unless
    /// [`cancel`](Scope::cancel) is called on it: Go's `context.Background()`.
    pub fn background() -> Scope {
        Scope::root(None)
    }

    /// A root scope ending at `deadline` (or never, with `None`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// let scope = grpc_deadline::Scope::root(Some(Instant::now() + Duration::from_secs(1)));
    /// assert_eq!(scope.remaining(), Some(Duration::from_secs(1)));
    /// # }
    /// ```
    pub fn root(deadline: Option<Instant>) -> Scope {
        Scope::root_attached(deadline, None)
    }

    /// For layers: a root scope carrying what its layer attaches (see
    /// [`Attachment`]), found again with [`attached`](Scope::attached)
    /// anywhere under it.
    pub fn root_attached(
        deadline: Option<Instant>,
        attached: Option<Arc<dyn Attachment>>,
    ) -> Scope {
        Scope {
            node: Node::root(Data::new(deadline, None, attached)),
        }
    }

    /// Whether this node was ended by a cancel or an [`end`](Scope::end)
    /// (of itself or an ancestor), not by its deadline passing: one atomic
    /// load per node up to the root, no clock read.
    pub fn is_cancelled(&self) -> bool {
        self.node.is_ended()
    }

    /// The current scope of this task, installed by the server layer or by
    /// [`Scope::enter`]; `None` outside any.
    pub fn try_current() -> Option<Scope> {
        current::try_current()
    }

    /// The current scope of this task, or [`Scope::background`] outside any.
    pub fn current() -> Scope {
        current::try_current().unwrap_or_else(Scope::background)
    }

    /// The absolute deadline, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.node.data().deadline
    }

    /// Time left before the deadline: `None` without a deadline,
    /// `Some(Duration::ZERO)` once it has passed.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline()
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// Whether the deadline has passed (a cancelled scope with time left is
    /// not expired; see [`is_ended`](Scope::is_ended)).
    pub fn is_expired(&self) -> bool {
        self.deadline().is_some_and(|d| d <= Instant::now())
    }

    /// Whether the scope has ended, by deadline or cancellation.
    pub fn is_ended(&self) -> bool {
        self.is_cancelled() || self.is_expired()
    }

    /// Why the scope ended, or `None` while it is still live.
    pub fn cause(&self) -> Option<Cause> {
        if let Some((cause, at)) = self.node.record() {
            // A deadline that passed before the cancellation came first.
            let expired_first = self
                .deadline()
                .is_some_and(|d| at.is_some_and(|at| d <= at));
            return Some(if expired_first {
                Cause::DeadlineExceeded
            } else {
                cause
            });
        }
        self.is_expired().then_some(Cause::DeadlineExceeded)
    }

    /// `Ok(())` while live; the reason as an error once ended. The error
    /// converts into the right status of the stack (`tonic::Status` with the
    /// `tonic` feature), so `scope.check()?` in a handler answers
    /// `DEADLINE_EXCEEDED` or `CANCELLED`, never `UNKNOWN`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use grpc_deadline::Code;
    /// let scope = grpc_deadline::Scope::background().with_timeout(Duration::from_millis(5));
    /// assert!(scope.check().is_ok());
    /// tokio::time::advance(Duration::from_millis(5)).await;
    /// assert_eq!(scope.check().unwrap_err().cause().code(), Code::DeadlineExceeded);
    /// # }
    /// ```
    pub fn check(&self) -> Result<(), Ended> {
        match self.cause() {
            None => Ok(()),
            Some(cause) => Err(Ended::new(cause)),
        }
    }

    /// Cancels this scope and all its descendants with [`Cause::Cancelled`].
    /// Does nothing to a scope that has already ended.
    pub fn cancel(&self) {
        self.end(Cause::Cancelled);
    }

    /// For layers: ends the scope and its descendants with `cause` unless
    /// it already ended. A server layer ends a request's scope with
    /// [`Cause::Abandoned`] when the request is dropped unanswered, and with
    /// [`Cause::Completed`] once the answer is handed over.
    pub fn end(&self, cause: Cause) {
        if self.is_cancelled() {
            return;
        }
        // The time only tells a deadline that passed first from a cancel.
        // A node without children needs none when it has no deadline, or
        // when it completed: an answer handed over in full is `Completed`,
        // whatever the clock said since. Those skip the clock.
        let data = self.node.data();
        let at = (data.has_children.load(Ordering::Relaxed)
            || (data.deadline.is_some() && cause != Cause::Completed))
            .then(Instant::now);
        self.node.end((cause, at));
    }

    /// Waits until the scope ends and returns why.
    ///
    /// # Cancellation safety
    ///
    /// Safe: dropping the future only stops the wait.
    pub async fn ended(&self) -> Cause {
        if let Some(cause) = self.cause() {
            return cause;
        }
        let cancelled = self.cancelled();
        match self.deadline() {
            Some(deadline) => {
                tokio::select! {
                    biased;
                    () = cancelled => {}
                    () = tokio::time::sleep_until(deadline) => {}
                }
            }
            None => cancelled.await,
        }
        self.cause().unwrap_or(Cause::DeadlineExceeded)
    }

    /// A future ready once this scope is cancelled or
    /// [ended](Scope::end) (by itself or an ancestor); it does not watch the
    /// deadline, so it needs no timer (see [`ended`](Scope::ended) for
    /// both).
    pub fn cancelled(&self) -> Cancelled {
        Cancelled(Wait::new(self.node.clone()))
    }

    /// Runs `cleanup` once this scope ends, with the cause, on a task of its
    /// own: the way to do asynchronous cleanup for a request.
    ///
    /// A handler cannot await its own end: when the caller goes away, the
    /// server drops the handler's future, so an `ended().await` inside it
    /// never returns. Register the cleanup instead. The server layer ends
    /// the request's scope *before* it drops the handler, so synchronous
    /// drop guards in the handler see [`cause`](Scope::cause) already set,
    /// and the cleanup task starts right after.
    ///
    /// `cleanup` runs outside the ended scope (under
    /// [`Scope::background`]), so the calls it makes are not refused for
    /// lack of time; give it a budget of its own if it needs one. A scope
    /// that never ends (a background scope nobody cancels) never runs it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// use grpc_deadline::{Cause, Scope};
    /// let request = Scope::background();
    /// let cleanup = request.on_end(|cause| async move { format!("released after: {cause}") });
    /// request.cancel();
    /// assert_eq!(cleanup.await.unwrap(), "released after: cancelled");
    /// # }
    /// ```
    pub fn on_end<F, Fut>(&self, cleanup: F) -> tokio::task::JoinHandle<Fut::Output>
    where
        F: FnOnce(Cause) -> Fut + Send + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: Send + 'static,
    {
        let scope = self.clone();
        // The cleanup's lifecycle is the scope's end, not the scope itself.
        #[allow(clippy::disallowed_methods)]
        tokio::spawn(async move {
            let cause = scope.ended().await;
            drop(scope);
            Scope::background().enter(cleanup(cause)).await
        })
    }

    /// A child token for libraries that take a [`CancellationToken`]. It is
    /// cancelled when this scope is *cancelled*; it does not observe the
    /// deadline by itself (pair it with [`deadline`](Scope::deadline)).
    ///
    /// ```
    /// let scope = grpc_deadline::Scope::background();
    /// let token = scope.cancellation_token();
    /// scope.cancel();
    /// assert!(token.is_cancelled());
    /// ```
    pub fn cancellation_token(&self) -> CancellationToken {
        self.node
            .data()
            .bridge
            .get_or_init(|| {
                let token = CancellationToken::new();
                // Registered for the node's lifetime: one per node, however
                // many tokens are handed out (each is a child of this one).
                self.node
                    .on_end(&Waker::from(Arc::new(CancelOnEnd(token.clone()))));
                token
            })
            .child_token()
    }

    fn child_limited(&self, deadline: Option<Instant>, limit: Option<Limit>) -> Scope {
        let children = &self.node.data().has_children;
        if !children.load(Ordering::Relaxed) {
            children.store(true, Ordering::Relaxed);
        }
        Scope {
            node: Node::child(&self.node, Data::new(deadline, limit, None)),
        }
    }

    /// The nearest cap ([`with_timeout`](Scope::with_timeout)) and the
    /// nearest [`reserve`](Scope::reserve) on the way from this scope up to
    /// its root, each with whether it was what set this scope's deadline
    /// (the tightest limit on the way): what a call's span reports.
    pub fn limits(&self) -> Limits {
        let own = self.deadline();
        let mut found = Limits::default();
        for node in self.node.path() {
            let data = node.data();
            // A limit binds when it made the deadline earlier than the
            // parent's, and that deadline is the one this scope still has.
            let binds = data.deadline.is_some()
                && data.deadline == own
                && node
                    .parent()
                    .is_none_or(|p| p.data().deadline.is_none_or(|d| Some(d) > data.deadline));
            match data.limit {
                Some(Limit::Cap(cap)) if found.cap.is_none() => found.cap = Some((cap, binds)),
                Some(Limit::Reserve(r)) if found.reserve.is_none() => {
                    found.reserve = Some((r, binds));
                }
                _ => {}
            }
        }
        found
    }

    /// A child with the same deadline that can be cancelled on its own.
    pub fn child(&self) -> Scope {
        self.child_limited(self.deadline(), None)
    }

    /// A child ending at `min(parent deadline, deadline)`.
    pub fn with_deadline(&self, deadline: Instant) -> Scope {
        let deadline = match self.deadline() {
            Some(parent) => parent.min(deadline),
            None => deadline,
        };
        self.child_limited(Some(deadline), None)
    }

    /// A child ending at `min(parent deadline, now + timeout)`: Go's
    /// `context.WithTimeout`, and the way to cap a dependency tighter than
    /// the caller (a cache lookup at 20 ms, logic → route at 200 ms).
    ///
    /// When `now + timeout` is the tighter of the two, the child remembers
    /// the timeout as a local cap: a call span under it reports it as
    /// `cap_ms` (see [`Scope::limits`]). A timeout the parent's
    /// deadline already beats changes nothing and is not reported.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use grpc_deadline::Scope;
    /// let request = Scope::background().with_timeout(Duration::from_millis(300));
    /// let lookup = request.with_timeout(Duration::from_millis(20));
    /// assert_eq!(lookup.remaining(), Some(Duration::from_millis(20)));
    /// // A child cannot outlive its parent.
    /// let slow = request.with_timeout(Duration::from_secs(5));
    /// assert_eq!(slow.remaining(), Some(Duration::from_millis(300)));
    /// # }
    /// ```
    pub fn with_timeout(&self, timeout: Duration) -> Scope {
        let Some(own) = Instant::now().checked_add(timeout) else {
            return self.child();
        };
        match self.deadline() {
            Some(parent) if parent <= own => self.child(),
            _ => self.child_limited(Some(own), Some(Limit::Cap(timeout))),
        }
    }

    /// Keeps `reserve` of the budget for this hop's own completion and gives
    /// the rest to a child: `deadline − reserve`.
    ///
    /// A scope without a deadline has nothing to reserve from; the child has
    /// no deadline either.
    ///
    /// # Errors
    ///
    /// `DEADLINE_EXCEEDED` at once when what is left is not more than the
    /// reserve: calling on would only start work that cannot be used.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// use std::time::Duration;
    /// let hop = grpc_deadline::Scope::background().with_timeout(Duration::from_millis(300));
    /// let push = hop.reserve(Duration::from_millis(50)).expect("250 ms are left for push");
    /// assert_eq!(push.remaining(), Some(Duration::from_millis(250)));
    /// assert!(hop.reserve(Duration::from_millis(300)).is_err(), "nothing would be left");
    /// # }
    /// ```
    pub fn reserve(&self, reserve: Duration) -> Result<Scope, Ended> {
        self.check()?;
        let Some(deadline) = self.deadline() else {
            return Ok(self.child());
        };
        match deadline.checked_sub(reserve) {
            Some(child) if child > Instant::now() => {
                Ok(self.child_limited(Some(child), Some(Limit::Reserve(reserve))))
            }
            _ => Err(Ended::new(Cause::DeadlineExceeded)),
        }
    }

    /// Runs `future` with this scope as the current scope, without racing it.
    /// Outbound calls made inside carry this scope's budget.
    ///
    /// The future returned holds its own clone of the scope, and wraps
    /// `future` where it is: no state machine around it, so a large future
    /// (a call's) is not moved once more on its first poll. It is named,
    /// [`Entered`], so that a layer can keep it in a field.
    pub fn enter<F: Future>(&self, future: F) -> Entered<F> {
        Entered::new(self.clone(), future)
    }

    /// Runs `f` with this scope as the current scope, synchronously: for a
    /// layer that polls the work of a request (a service's `call`, a body's
    /// `poll_frame`) inside the request's scope.
    ///
    /// ```
    /// let scope = grpc_deadline::Scope::background();
    /// let seen = scope.enter_sync(|| grpc_deadline::Scope::try_current().is_some());
    /// assert!(seen);
    /// assert!(grpc_deadline::Scope::try_current().is_none());
    /// ```
    pub fn enter_sync<R>(&self, f: impl FnOnce() -> R) -> R {
        current::enter_sync(self, f)
    }

    /// Runs `future` as the current scope and stops it when the scope ends.
    ///
    /// # Errors
    ///
    /// [`Ended`] with the cause if the scope ended first; the future is
    /// dropped at that point.
    ///
    /// # Cancellation safety
    ///
    /// As safe as `future` itself.
    pub async fn run<F: Future>(&self, future: F) -> Result<F::Output, Ended> {
        let work = self.enter(future);
        tokio::select! {
            biased;
            cause = self.ended() => Err(Ended::new(cause)),
            out = work => Ok(out),
        }
    }

    /// Spawns `future` on the runtime in a child scope: it is the current
    /// scope inside, and the task stops when this scope ends.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let scope = grpc_deadline::Scope::background();
    /// let task = scope.spawn(async { 40 + 2 });
    /// assert_eq!(task.await.unwrap().unwrap(), 42);
    /// # }
    /// ```
    pub fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<Result<F::Output, Ended>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let child = self.child();
        // The one place a scoped task is started; the scope goes with it.
        #[allow(clippy::disallowed_methods)]
        tokio::spawn(async move { child.run(future).await })
    }

    /// Runs blocking or CPU-bound `work` on tokio's blocking pool and returns
    /// as soon as it finishes or the scope ends, whichever is first.
    ///
    /// Threads cannot be stopped from outside, so `work` receives the scope
    /// and should call [`check`](Scope::check) between steps. Work that is
    /// still running after the scope ended is logged with how long it
    /// outlived its scope, and told to the [`Attachment`] of the layer that
    /// made the request's scope (tonic-deadline's server layer counts it as
    /// `tonic_deadline_outlived_total`).
    ///
    /// # Errors
    ///
    /// [`Ended`] if the scope ended before the work returned — also when
    /// the work returned *because* it ended (it checked, stopped and handed
    /// back what it had): a result made after the scope ended is never
    /// reported as a complete one.
    ///
    /// # Panics
    ///
    /// Resumes a panic raised by `work`.
    pub async fn spawn_blocking<F, R>(&self, work: F) -> Result<R, Ended>
    where
        F: FnOnce(&Scope) -> R + Send + 'static,
        R: Send + 'static,
    {
        let scope = self.child();
        let watched = scope.clone();
        // Closes when the work returns, which may be after its parent's span
        // closed at the deadline: the trace shows the lost cancellation.
        let span = self.attachment().and_then(Attachment::blocking_span);
        #[allow(clippy::disallowed_methods)] // the scope goes with the work
        let handle = tokio::task::spawn_blocking(move || {
            let out = match &span {
                Some(span) => span.in_scope(|| work(&watched)),
                None => work(&watched),
            };
            if let (Some(span), Some(attached)) = (&span, watched.attachment()) {
                attached.blocking_returned(span, &watched);
            }
            task::note_if_outlived(&watched, "blocking work");
            // Read as the work returns: work that stopped because its scope
            // ended returns at once, and its result may be ready in the same
            // poll as the end.
            (out, watched.cause())
        });
        tokio::select! {
            biased;
            joined = handle => match joined {
                Ok((out, None)) => Ok(out),
                Ok((_, Some(cause))) => Err(Ended::new(cause)),
                Err(err) => std::panic::resume_unwind(err.into_panic()),
            },
            cause = scope.ended() => Err(Ended::new(cause)),
        }
    }

    /// Notes on this scope's root that a call made under it spent its
    /// retries on a failure (and told its caller so): the server layer
    /// then tells the request's own caller the same when the handler
    /// answers a failure of its own making.
    ///
    /// This is the chain budget's rule: a hop that spent its retries says
    /// so, and the hops above it do not retry again.
    pub fn note_retries_spent(&self) {
        if let Some(root) = self.node.path().last() {
            root.data().retries_spent.store(true, Ordering::Relaxed);
        }
    }

    /// Whether [`note_retries_spent`](Scope::note_retries_spent) was
    /// called on this node (the server layer asks the request's root).
    pub fn retries_spent(&self) -> bool {
        self.node.data().retries_spent.load(Ordering::Relaxed)
    }

    /// For layers: the notes of type `T` on this scope's root, made on
    /// first use (a root that holds notes of another type gives none). The
    /// ledger keeps its record of the calls made under a request here.
    pub fn root_notes<T: Any + Default + Send + Sync>(&self) -> Option<&T> {
        let root = self.node.path().last()?;
        root.data()
            .notes
            .get_or_init(|| Box::new(T::default()))
            .downcast_ref()
    }

    /// For layers: the notes of type `T` on this node, if any were made.
    pub fn notes<T: Any>(&self) -> Option<&T> {
        self.node.data().notes.get()?.downcast_ref()
    }

    /// What the layer that made this scope's root attached, if anything.
    fn attachment(&self) -> Option<&dyn Attachment> {
        self.node
            .path()
            .find_map(|node| node.data().attached.as_deref())
    }

    /// For layers: the root's [`Attachment`], if it is a `T`.
    pub fn attached<T: Attachment>(&self) -> Option<&T> {
        let attached: &dyn Any = self.attachment()?;
        attached.downcast_ref()
    }
}

impl Data {
    fn new(
        deadline: Option<Instant>,
        limit: Option<Limit>,
        attached: Option<Arc<dyn Attachment>>,
    ) -> Self {
        Self {
            deadline,
            limit,
            attached,
            has_children: AtomicBool::new(false),
            retries_spent: AtomicBool::new(false),
            notes: OnceLock::new(),
            bridge: OnceLock::new(),
        }
    }
}

/// See [`Scope::cancelled`].
///
/// # Cancellation safety
///
/// Safe: dropping it only stops the wait.
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Cancelled(Wait<Data, End>);

impl Future for Cancelled {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.poll_ended(cx)
    }
}

/// Cancels a token when woken: how [`Scope::cancellation_token`] hears of
/// the end.
struct CancelOnEnd(CancellationToken);

impl Wake for CancelOnEnd {
    fn wake(self: Arc<Self>) {
        self.0.cancel();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.cancel();
    }
}

/// See [`Scope::limits`]: each limit found, and whether it bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// The nearest [`Scope::with_timeout`] that set a deadline, and
    /// whether it is the one this scope still has.
    pub cap: Option<(Duration, bool)>,
    /// The nearest [`Scope::reserve`], and whether it set this scope's
    /// deadline.
    pub reserve: Option<(Duration, bool)>,
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("remaining", &self.remaining())
            .field("cause", &self.cause())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
