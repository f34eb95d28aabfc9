//! The current scope: the one the running poll (or synchronous call) of a
//! request's work entered, in a thread-local for the length of that poll.
//!
//! A task-local as tokio's is (the value moved into the thread-local
//! around each poll and back out after), on a `Cell` rather than tokio's
//! `RefCell` inside a `LocalKey`: a scope is one pointer, moved in and out
//! with no borrow flag to check and no error to map.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::Scope;

thread_local! {
    /// The scope entered on this thread now; `None` outside any.
    static CURRENT: Cell<Option<Scope>> = const { Cell::new(None) };
}

/// Puts the scope entered back into its slot and the one before it back in
/// the thread-local when dropped: when the work returns, and when it
/// unwinds.
struct Restore<'a> {
    slot: &'a mut Option<Scope>,
    previous: Option<Scope>,
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        let previous = self.previous.take();
        // During the thread's teardown the thread-local is gone: the
        // entered scope is then dropped with the slot left empty.
        if let Ok(entered) = CURRENT.try_with(|current| current.replace(previous)) {
            *self.slot = entered;
        }
    }
}

/// Runs `work` with the scope in `slot` current, and puts it back after.
///
/// # Panics
///
/// When called during the thread's teardown, as tokio's task-locals do.
fn scoped<R>(slot: &mut Option<Scope>, work: impl FnOnce() -> R) -> R {
    let previous = CURRENT.with(|current| current.replace(slot.take()));
    let _restore = Restore { slot, previous };
    work()
}

/// The scope the running work entered, if any.
pub(crate) fn try_current() -> Option<Scope> {
    CURRENT
        .try_with(|current| {
            let scope = current.take();
            let copy = scope.clone();
            current.set(scope);
            copy
        })
        .ok()
        .flatten()
}

/// Runs `work` with a clone of `scope` current.
pub(crate) fn enter_sync<R>(scope: &Scope, work: impl FnOnce() -> R) -> R {
    scoped(&mut Some(scope.clone()), work)
}

pin_project! {
    /// A future run with a scope as the current one: what
    /// [`Scope::enter`] returns.
    ///
    /// Every poll of the future, and its drop, run with the scope current;
    /// the future is not moved (a layer keeps it in a field, and a large
    /// future, a call's, is not moved once more on its first poll).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use grpc_deadline::scope::Entered;
    /// use grpc_deadline::Scope;
    ///
    /// let scope = Scope::background();
    /// let entered: Entered<_> = scope.enter(async { Scope::try_current().is_some() });
    /// assert!(entered.await, "the scope is current while the future runs");
    /// assert!(Scope::try_current().is_none(), "and only then");
    /// # }
    /// ```
    pub struct Entered<F> {
        scope: Option<Scope>,
        #[pin]
        future: Option<F>,
    }

    impl<F> PinnedDrop for Entered<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if std::mem::needs_drop::<F>() && this.future.is_some() {
                let mut future = this.future;
                scoped(this.scope, || future.set(None));
            }
        }
    }
}

impl<F> Entered<F> {
    pub(crate) fn new(scope: Scope, future: F) -> Self {
        Self {
            scope: Some(scope),
            future: Some(future),
        }
    }
}

impl<F: Future> Future for Entered<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let future = this.future;
        scoped(this.scope, || {
            future
                .as_pin_mut()
                .expect("an entered future is not polled after it was dropped")
                .poll(cx)
        })
    }
}

impl<F> std::fmt::Debug for Entered<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entered")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}
