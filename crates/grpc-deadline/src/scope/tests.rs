//! The scope model: the minimum rule, per-hop reserves, the cancellation
//! tree and its causes, and the ways work is tied to (or freed from) a scope.
//!
//! Every test runs on a paused clock, so deadlines are exact.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tokio::sync::oneshot;
use tokio::time::{Instant, advance};

use super::*;

const MS: Duration = Duration::from_millis(1);

/// Sets its flag when dropped: shows that a future was stopped, not leaked.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn drop_flag() -> (DropFlag, Arc<AtomicBool>) {
    let flag = Arc::new(AtomicBool::new(false));
    (DropFlag(flag.clone()), flag)
}

#[tokio::test(start_paused = true)]
async fn child_cannot_extend_parent_deadline() {
    let parent = Scope::background().with_timeout(100 * MS);
    let parent_deadline = parent.deadline().expect("with_timeout must set a deadline");
    assert_eq!(parent_deadline, Instant::now() + 100 * MS);

    let longer = [
        ("with_timeout", parent.with_timeout(Duration::from_secs(10))),
        (
            "with_deadline",
            parent.with_deadline(Instant::now() + Duration::from_secs(10)),
        ),
        ("child", parent.child()),
        ("with_timeout(MAX)", parent.with_timeout(Duration::MAX)),
    ];
    for (how, child) in &longer {
        assert_eq!(
            child.deadline(),
            Some(parent_deadline),
            "{how}: a child asking for more must keep the parent's deadline"
        );
    }

    let shorter = [
        ("with_timeout", parent.with_timeout(40 * MS)),
        (
            "with_deadline",
            parent.with_deadline(Instant::now() + 40 * MS),
        ),
    ];
    for (how, child) in &shorter {
        assert_eq!(
            child.deadline(),
            Some(Instant::now() + 40 * MS),
            "{how}: a child may shrink the parent's deadline"
        );
        let grandchild = child.with_timeout(Duration::from_secs(1));
        assert_eq!(
            grandchild.deadline(),
            child.deadline(),
            "{how}: the minimum rule must hold at every level"
        );
    }

    advance(30 * MS).await;
    let late = parent.with_timeout(100 * MS);
    assert_eq!(
        late.deadline(),
        Some(parent_deadline),
        "a child made later must still end with its parent"
    );
    assert_eq!(late.remaining(), Some(70 * MS));
}

#[tokio::test(start_paused = true)]
async fn child_of_scope_without_deadline_takes_its_own() {
    let root = Scope::background();
    assert_eq!(root.deadline(), None, "background has no deadline");
    assert_eq!(root.remaining(), None);
    assert_eq!(
        root.child().deadline(),
        None,
        "child() inherits no deadline"
    );
    assert_eq!(
        root.with_timeout(20 * MS).remaining(),
        Some(20 * MS),
        "a cap on an unbounded scope must become the deadline"
    );
    assert_eq!(
        root.with_timeout(Duration::MAX).deadline(),
        None,
        "a timeout beyond the clock's range must mean no deadline, not a panic"
    );
}

proptest! {
    #[test]
    fn child_deadline_is_min_of_parent_and_limit(parent_ms in 0u64..10_000, cap_ms in 0u64..10_000) {
        let parent = Scope::root(Some(Instant::now() + Duration::from_millis(parent_ms)));
        let parent_deadline = parent.deadline().expect("a root with a deadline");
        let limit = Instant::now() + Duration::from_millis(cap_ms);
        let child = parent.with_deadline(limit);
        prop_assert_eq!(child.deadline(), Some(parent_deadline.min(limit)));
        let capped = parent.with_timeout(Duration::from_millis(cap_ms));
        prop_assert!(capped.deadline() <= Some(parent_deadline), "a cap must never extend");
    }
}

#[tokio::test(start_paused = true)]
async fn reserve_gives_the_child_remaining_minus_reserve() {
    let hop = Scope::background().with_timeout(300 * MS);
    let push = hop
        .reserve(50 * MS)
        .expect("250 ms must be left for the dependency");
    assert_eq!(push.remaining(), Some(250 * MS));

    advance(100 * MS).await;
    let later = hop
        .reserve(50 * MS)
        .expect("150 ms must be left for the dependency");
    assert_eq!(
        later.remaining(),
        Some(150 * MS),
        "the reserve must come off what is left now, not the original budget"
    );

    hop.cancel();
    assert_eq!(
        push.cause(),
        Some(Cause::Cancelled),
        "a reserved child must still be part of the tree"
    );
}

#[tokio::test(start_paused = true)]
async fn reserve_refuses_at_once_when_nothing_would_be_left() {
    let hop = Scope::background().with_timeout(300 * MS);
    for reserve in [300 * MS, 301 * MS, Duration::from_secs(3600), Duration::MAX] {
        let refused = hop
            .reserve(reserve)
            .expect_err("a reserve not smaller than what is left must be refused");
        assert_eq!(
            refused.cause(),
            Cause::DeadlineExceeded,
            "reserve {reserve:?}"
        );
    }
    let tight = hop
        .reserve(299 * MS)
        .expect("a reserve just below the budget must leave a sliver");
    assert_eq!(tight.remaining(), Some(MS));
    assert!(
        hop.check().is_ok(),
        "a refused reserve must not end the hop's own scope"
    );

    let cancelled = Scope::background().with_timeout(Duration::from_secs(1));
    cancelled.cancel();
    assert_eq!(
        cancelled
            .reserve(MS)
            .expect_err("an ended scope has nothing to reserve from")
            .cause(),
        Cause::Cancelled,
        "refusing an ended scope must report why it ended"
    );
}

#[tokio::test(start_paused = true)]
async fn reserve_without_deadline_gives_child_without_deadline() {
    let unbounded = Scope::background();
    let child = unbounded
        .reserve(Duration::from_secs(3600))
        .expect("without a deadline there is nothing to refuse");
    assert_eq!(
        child.deadline(),
        None,
        "the child must not invent a deadline"
    );
    unbounded.cancel();
    assert_eq!(
        child.cause(),
        Some(Cause::Cancelled),
        "the child must still be linked"
    );
}

#[tokio::test(start_paused = true)]
async fn cancel_cascades_to_descendants_with_parent_cause() {
    let root = Scope::background().with_timeout(Duration::from_secs(10));
    let child = root.child();
    let sibling = root.with_timeout(Duration::from_secs(5));
    let grandchild = child.with_timeout(Duration::from_secs(1));
    let reserved = grandchild.reserve(100 * MS).expect("time is left");
    let all = [&root, &child, &sibling, &grandchild, &reserved];
    for scope in all {
        assert_eq!(scope.cause(), None, "nothing has ended yet");
    }

    root.cancel();
    for scope in all {
        assert!(scope.is_ended(), "every descendant must end with the root");
        assert_eq!(
            scope.cause(),
            Some(Cause::Cancelled),
            "with the root's cause: {scope:?}"
        );
        assert!(
            !scope.is_expired(),
            "a cancelled scope with time left is not expired"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn caller_cancel_cascades_with_its_own_cause() {
    let request = Scope::root(Some(Instant::now() + Duration::from_secs(1)));
    let downstream = request.with_timeout(200 * MS);
    let task_scope = downstream.child();

    request.end(Cause::Abandoned);
    assert_eq!(downstream.cause(), Some(Cause::Abandoned));
    assert_eq!(
        task_scope.cause(),
        Some(Cause::Abandoned),
        "a descendant must report the caller going away, not a local cancel"
    );
    assert_eq!(
        task_scope.check().expect_err("it ended").cause().code(),
        crate::Code::Cancelled
    );
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_child_leaves_parent_and_siblings_alone() {
    let root = Scope::background().with_timeout(Duration::from_secs(1));
    let left = root.child();
    let right = root.child();
    let left_leaf = left.child();

    left.cancel();
    assert_eq!(
        left_leaf.cause(),
        Some(Cause::Cancelled),
        "the cancel must reach below"
    );
    assert_eq!(root.cause(), None, "a cancel must never travel up");
    assert_eq!(right.cause(), None, "a cancel must never travel sideways");
}

#[tokio::test(start_paused = true)]
async fn deadline_of_parent_ends_descendants_as_deadline_exceeded() {
    let root = Scope::background().with_timeout(100 * MS);
    let child = root.child();
    let grandchild = child.with_timeout(Duration::from_secs(5));

    advance(99 * MS).await;
    assert_eq!(grandchild.cause(), None, "one millisecond is still left");
    advance(MS).await;
    for scope in [&root, &child, &grandchild] {
        assert!(scope.is_expired());
        assert_eq!(scope.cause(), Some(Cause::DeadlineExceeded), "{scope:?}");
        assert_eq!(
            scope.remaining(),
            Some(Duration::ZERO),
            "an expired scope has zero left"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn cause_is_fixed_by_whichever_came_first() {
    // Cancelled first, then the deadline passes: still cancelled.
    let cancelled_first = Scope::background().with_timeout(100 * MS);
    advance(50 * MS).await;
    cancelled_first.cancel();
    advance(100 * MS).await;
    assert_eq!(
        cancelled_first.cause(),
        Some(Cause::Cancelled),
        "a deadline passing after a cancel must not rewrite the cause"
    );

    // The deadline passes first, then a cancel arrives: still the deadline.
    let expired_first = Scope::background().with_timeout(100 * MS);
    advance(150 * MS).await;
    expired_first.cancel();
    assert_eq!(
        expired_first.cause(),
        Some(Cause::DeadlineExceeded),
        "a cancel after the deadline must not rewrite the cause"
    );
    expired_first.end(Cause::Abandoned);
    assert_eq!(
        expired_first.cause(),
        Some(Cause::DeadlineExceeded),
        "the cause never changes"
    );
}

#[tokio::test(start_paused = true)]
async fn with_timeout_is_a_cap_only_where_it_is_tighter() {
    let request = Scope::background().with_timeout(300 * MS);
    assert_eq!(
        request.limits().cap,
        Some((300 * MS, true)),
        "a timeout under no deadline sets the deadline: a cap that binds"
    );
    let lookup = request.with_timeout(20 * MS);
    assert_eq!(
        lookup.limits().cap,
        Some((20 * MS, true)),
        "the nearest cap is the lookup's own, and it set the deadline"
    );
    let roomy = request.with_timeout(Duration::from_secs(5));
    assert_eq!(
        roomy.limits().cap,
        Some((300 * MS, true)),
        "a timeout the parent beats is no cap: the request's own is reported"
    );
    let reserved = lookup.reserve(5 * MS).expect("15 ms are left");
    assert_eq!(
        reserved.limits().cap,
        Some((20 * MS, false)),
        "under a reserve the cap no longer set the deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn child_whose_cap_passed_before_parent_cancel_reports_deadline() {
    let parent = Scope::background();
    let capped = parent.with_timeout(50 * MS);
    let roomy = parent.with_timeout(Duration::from_secs(1));

    advance(60 * MS).await;
    parent.cancel();
    assert_eq!(parent.cause(), Some(Cause::Cancelled));
    assert_eq!(
        capped.cause(),
        Some(Cause::DeadlineExceeded),
        "the child's own cap passed before the parent was cancelled"
    );
    assert_eq!(
        roomy.cause(),
        Some(Cause::Cancelled),
        "a child with time left must take the parent's cause"
    );
}

#[tokio::test(start_paused = true)]
async fn ended_waits_for_the_first_cause() {
    let by_deadline = Scope::background().with_timeout(100 * MS);
    let start = Instant::now();
    assert_eq!(by_deadline.ended().await, Cause::DeadlineExceeded);
    assert_eq!(
        Instant::now() - start,
        100 * MS,
        "ended() must wake exactly at the deadline"
    );

    let by_cancel = Scope::background().with_timeout(Duration::from_secs(10));
    let canceller = by_cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(30 * MS).await;
        canceller.cancel();
    });
    let start = Instant::now();
    assert_eq!(by_cancel.child().ended().await, Cause::Cancelled);
    assert_eq!(
        Instant::now() - start,
        30 * MS,
        "ended() must wake at the cancel"
    );
}

#[tokio::test(start_paused = true)]
async fn cancellation_token_follows_cancel_but_not_deadline() {
    let scope = Scope::background().with_timeout(10 * MS);
    let token = scope.cancellation_token();
    advance(20 * MS).await;
    assert!(scope.is_ended());
    assert!(
        !token.is_cancelled(),
        "the token must not claim to observe the deadline"
    );
    scope.cancel();
    assert!(token.is_cancelled(), "the token must follow a cancel");
}

#[tokio::test(start_paused = true)]
async fn spawned_tasks_are_cancelled_with_the_scope() {
    let scope = Scope::background().with_timeout(Duration::from_secs(10));
    let (flag, dropped) = drop_flag();
    let task = scope.spawn(async move {
        let _flag = flag;
        std::future::pending::<()>().await;
    });
    tokio::time::sleep(10 * MS).await;
    assert!(
        !dropped.load(Ordering::SeqCst),
        "the task must run while the scope lives"
    );

    scope.cancel();
    let ended = task
        .await
        .expect("the task must not panic")
        .expect_err("the task must be stopped by the cancel");
    assert_eq!(ended.cause(), Cause::Cancelled);
    assert!(
        dropped.load(Ordering::SeqCst),
        "the task's future must be dropped"
    );
}

#[tokio::test(start_paused = true)]
async fn spawned_tasks_stop_at_the_deadline() {
    let scope = Scope::background().with_timeout(100 * MS);
    let start = Instant::now();
    let task = scope.spawn(tokio::time::sleep(Duration::from_secs(10)));
    let ended = task
        .await
        .expect("the task must not panic")
        .expect_err("the task must be stopped by the deadline");
    assert_eq!(ended.cause(), Cause::DeadlineExceeded);
    assert_eq!(
        Instant::now() - start,
        100 * MS,
        "stopped exactly at the deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn spawned_task_runs_in_a_child_scope_and_can_finish() {
    let scope = Scope::background().with_timeout(Duration::from_secs(1));
    let parent_deadline = scope.deadline();
    let task = scope.spawn(async {
        let inside = Scope::try_current().expect("a spawned task must have a current scope");
        inside.deadline()
    });
    let seen = task
        .await
        .expect("no panic")
        .expect("the task finishes in time");
    assert_eq!(
        seen, parent_deadline,
        "the task's scope must share the deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn free_spawn_uses_the_current_scope() {
    let request = Scope::background().with_timeout(Duration::from_secs(10));
    let task = request.enter_sync(|| crate::spawn(std::future::pending::<()>()));
    request.cancel();
    let ended = task
        .await
        .expect("no panic")
        .expect_err("a task spawned inside a scope must end with it");
    assert_eq!(ended.cause(), Cause::Cancelled);

    let outside = crate::spawn(async { Scope::current().deadline() });
    assert_eq!(
        outside.await.expect("no panic"),
        Ok(None),
        "outside any scope the task runs without a deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn detach_escapes_deadline_and_cancel() {
    let request = Scope::background().with_timeout(100 * MS);
    let (release, released) = oneshot::channel::<()>();
    let detached = request.enter_sync(|| {
        crate::detach(async move {
            let own = Scope::current();
            assert_eq!(own.deadline(), None, "detached work must carry no deadline");
            released.await.expect("the test releases the work");
            own.cause()
        })
    });

    request.cancel();
    advance(Duration::from_secs(1)).await;
    assert!(request.is_ended());
    release
        .send(())
        .expect("the detached task must still be waiting");
    let cause = detached
        .await
        .expect("the detached task must finish, not be aborted");
    assert_eq!(cause, None, "nothing may end a detached task's scope");
}

#[tokio::test(start_paused = true)]
async fn enter_installs_the_current_scope() {
    assert!(Scope::try_current().is_none(), "no scope outside enter");
    assert_eq!(
        Scope::current().deadline(),
        None,
        "current() falls back to background"
    );

    let outer = Scope::background().with_timeout(Duration::from_secs(2));
    let inner = outer.with_timeout(Duration::from_secs(1));
    let seen = outer
        .enter(async {
            let before = Scope::try_current().map(|s| s.deadline());
            let nested = inner.enter(async { Scope::current().deadline() }).await;
            let after = Scope::current().deadline();
            (before, nested, after)
        })
        .await;
    assert_eq!(
        seen.0,
        Some(outer.deadline()),
        "enter must install the scope"
    );
    assert_eq!(seen.1, inner.deadline(), "a nested enter must take over");
    assert_eq!(
        seen.2,
        outer.deadline(),
        "leaving the nested enter must restore the outer"
    );

    let current = outer.enter(async { Scope::current() }).await;
    outer.cancel();
    assert_eq!(
        current.cause(),
        Some(Cause::Cancelled),
        "the installed scope must be the same node, not a copy"
    );
}

/// Sends the current scope's deadline when dropped.
struct SeesScopeOnDrop(std::sync::mpsc::Sender<Option<Option<Instant>>>);

impl Drop for SeesScopeOnDrop {
    fn drop(&mut self) {
        let _ = self.0.send(Scope::try_current().map(|s| s.deadline()));
    }
}

#[tokio::test(start_paused = true)]
async fn an_entered_future_is_dropped_with_its_scope_current() {
    let scope = Scope::background().with_timeout(Duration::from_secs(1));
    let (tx, rx) = std::sync::mpsc::channel();

    // Dropped before it ever ran to completion (the way hyper drops a
    // handler): drop guards inside still see the scope.
    let guard = SeesScopeOnDrop(tx.clone());
    let pending = scope.enter(async move {
        let _guard = guard;
        std::future::pending::<()>().await;
    });
    let mut pending = Box::pin(pending);
    let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(pending.as_mut().poll(cx))).await;
    assert!(polled.is_pending());
    assert!(
        Scope::try_current().is_none(),
        "between polls no scope is current"
    );
    drop(pending);
    assert_eq!(rx.recv().ok(), Some(Some(scope.deadline())));

    // Finished: its state is dropped inside the scope too, at once.
    let guard = SeesScopeOnDrop(tx);
    scope
        .enter(async move {
            let _guard = guard;
        })
        .await;
    assert_eq!(rx.recv().ok(), Some(Some(scope.deadline())));
    assert!(Scope::try_current().is_none());
}

#[test]
fn a_panic_inside_a_scope_restores_the_outer_one() {
    let outer = Scope::background();
    let inner = outer.child();
    outer.enter_sync(|| {
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            inner.enter_sync(|| panic!("handler panicked"));
        }));
        assert!(panicked.is_err());
        outer.cancel();
        assert_eq!(
            Scope::try_current().and_then(|s| s.cause()),
            Some(Cause::Cancelled),
            "the outer scope must be current again after the panic"
        );
    });
    assert!(Scope::try_current().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_travels_with_its_task_across_threads() {
    let scope = Scope::background().with_timeout(Duration::from_secs(5));
    let expected = scope.deadline();
    // A spawned task (not the test's own future): each yield may resume it
    // on the other worker.
    #[allow(clippy::disallowed_methods)]
    let task = tokio::spawn(async move {
        scope
            .enter(async {
                let mut seen = Vec::new();
                for _ in 0..50 {
                    tokio::task::yield_now().await;
                    seen.push(Scope::try_current().map(|s| s.deadline()));
                }
                seen
            })
            .await
    });
    let seen = task.await.expect("the task must not panic");
    assert!(seen.iter().all(|d| *d == Some(expected)), "{seen:?}");
}

#[tokio::test(start_paused = true)]
async fn run_returns_output_or_the_cause() {
    let scope = Scope::background().with_timeout(100 * MS);
    let quick = scope
        .run(async {
            tokio::time::sleep(10 * MS).await;
            Scope::current().deadline()
        })
        .await;
    assert_eq!(
        quick,
        Ok(scope.deadline()),
        "run must install the scope and return the output"
    );

    let (flag, dropped) = drop_flag();
    let start = Instant::now();
    let slow = scope
        .run(async move {
            let _flag = flag;
            tokio::time::sleep(Duration::from_secs(10)).await;
        })
        .await;
    assert_eq!(slow.map_err(|e| e.cause()), Err(Cause::DeadlineExceeded));
    assert_eq!(
        Instant::now() - start,
        90 * MS,
        "run must stop the future at the deadline"
    );
    assert!(
        dropped.load(Ordering::SeqCst),
        "the stopped future must be dropped"
    );

    let cancelled = Scope::background();
    cancelled.cancel();
    let polled = AtomicBool::new(false);
    let refused = cancelled
        .run(async {
            polled.store(true, Ordering::SeqCst);
        })
        .await;
    assert_eq!(refused.map_err(|e| e.cause()), Err(Cause::Cancelled));
    assert!(
        !polled.load(Ordering::SeqCst),
        "an ended scope must not start the work"
    );
}

#[cfg(feature = "tonic")]
#[tokio::test(start_paused = true)]
async fn check_converts_to_the_right_status() {
    fn handler_step(scope: &Scope) -> Result<&'static str, tonic::Status> {
        scope.check()?;
        Ok("done")
    }

    let live = Scope::background().with_timeout(100 * MS);
    assert_eq!(
        handler_step(&live).expect("a live scope passes check"),
        "done"
    );

    let cancelled = live.child();
    cancelled.cancel();
    let status = handler_step(&cancelled).expect_err("a cancelled scope must fail check");
    assert_eq!(status.code(), tonic::Code::Cancelled);

    advance(100 * MS).await;
    let status = handler_step(&live).expect_err("an expired scope must fail check");
    assert_eq!(
        status.code(),
        tonic::Code::DeadlineExceeded,
        "never UNKNOWN"
    );
    assert_eq!(
        status.message(),
        "deadline exceeded",
        "a fixed text, no request details"
    );
    assert_eq!(live.check(), Err(Ended::new(Cause::DeadlineExceeded)));
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "work panicked")]
async fn spawn_blocking_resumes_a_panic_of_the_work() {
    let scope = Scope::background();
    let _ = scope
        .spawn_blocking(|_| -> u8 { panic!("work panicked") })
        .await;
}

#[tokio::test(flavor = "current_thread")]
async fn spawn_blocking_never_reports_work_cut_short_by_its_scope_as_complete() {
    let scope = Scope::background().child();
    let (go, wait_for_go) = std::sync::mpsc::channel::<()>();
    let (stopped, wait_until_stopped) = std::sync::mpsc::channel::<()>();
    // The cooperative loop of a handler: check, and hand back what was done.
    let work = scope.spawn_blocking(move |scope| {
        wait_for_go.recv().expect("the test says go");
        let partial: u32 = if scope.check().is_err() { 1 } else { 2 };
        stopped.send(()).expect("the test waits");
        partial
    });
    let mut work = std::pin::pin!(work);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(work.as_mut().poll(&mut cx).is_pending(), "the work waits");
    scope.cancel();
    go.send(()).expect("the work waits for go");
    wait_until_stopped.recv().expect("the work stops");
    // The runtime's one thread is held here, so the next poll finds the
    // work's result and the scope's end both ready.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        work.await,
        Err(Ended::new(Cause::Cancelled)),
        "a result made after the scope ended must not read as complete"
    );
}

#[test]
fn cause_maps_to_code_and_text() {
    assert_eq!(
        Cause::DeadlineExceeded.code(),
        crate::Code::DeadlineExceeded
    );
    for cause in [Cause::Cancelled, Cause::Abandoned, Cause::Completed] {
        assert_eq!(cause.code(), crate::Code::Cancelled, "{cause}");
    }
    assert_ne!(
        Cause::Abandoned.to_string(),
        Cause::Cancelled.to_string(),
        "logs must tell a caller cancel from a local one"
    );
}

#[tokio::test(start_paused = true)]
async fn waits_given_up_leave_no_registration_behind() {
    let root = Scope::background();
    let capped = root.with_timeout(Duration::from_secs(1));
    for _ in 0..1000 {
        let mut wait = capped.cancelled();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(
            std::pin::Pin::new(&mut wait).poll(&mut cx).is_pending(),
            "a live scope keeps its waiter waiting"
        );
    }
    assert_eq!(
        root.node.held_slots(),
        0,
        "the root keeps no slot of a wait dropped"
    );
    assert_eq!(capped.node.held_slots(), 0, "nor does the child waited on");
}

#[test]
fn every_token_handed_out_shares_one_registration() {
    let scope = Scope::background().child();
    let tokens: Vec<_> = (0..100).map(|_| scope.cancellation_token()).collect();
    assert_eq!(
        scope.node.held_slots(),
        1,
        "a hundred tokens must not register a hundred times"
    );
    scope.cancel();
    assert!(
        tokens
            .iter()
            .all(tokio_util::sync::CancellationToken::is_cancelled)
    );
}
