//! The scope's cancellation tree under the loom model checker: every
//! interleaving of an end with the waits, registrations and drops around it
//! (loom explores them all, and reports a wait that is never woken as a
//! deadlock).
//!
//! The tree's source is built here against loom's primitives instead of
//! `std`'s: it takes them from `super::sync`, which is this module's.

use std::future::poll_fn;
use std::sync::atomic::Ordering as StdOrdering;
use std::task::{Poll, Wake, Waker};

use loom::thread;

#[allow(dead_code, unreachable_pub)]
#[path = "../src/scope/tree.rs"]
mod tree;

mod sync {
    pub(crate) use loom::sync::atomic::{AtomicBool, Ordering};
    pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};
}

use sync::Arc;
use tree::{Node, Wait};

type Tree = Node<&'static str, u8>;

/// Explores every interleaving with up to three preemptions (unbounded,
/// one test takes minutes in a debug build; a wake-up lost by taking the
/// wakers outside the lock is found at two).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

/// Blocks (in loom's scheduler) until `node` ends.
fn wait_for(node: &Arc<Tree>) {
    let mut wait = Wait::new(node.clone());
    loom::future::block_on(poll_fn(|cx| wait.poll_ended(cx)));
}

#[test]
fn an_end_at_the_root_wakes_a_waiter_two_levels_down() {
    model(|| {
        let root = Tree::root("root");
        let child = Tree::child(&root, "child");
        let grandchild = Tree::child(&child, "grandchild");
        let waiter = thread::spawn(move || wait_for(&grandchild));
        assert!(root.end(1), "the first end of the root takes effect");
        waiter
            .join()
            .expect("the waiter must be woken, not left waiting");
        assert_eq!(child.record(), Some(1), "the child sees the root's record");
    });
}

#[test]
fn two_ends_racing_leave_one_record_and_wake_every_waiter() {
    model(|| {
        let root = Tree::root("root");
        let child = Tree::child(&root, "child");
        let waiter = {
            let child = child.clone();
            thread::spawn(move || wait_for(&child))
        };
        let ender = {
            let child = child.clone();
            thread::spawn(move || child.end(2))
        };
        let root_ended = root.end(1);
        let child_ended = ender.join().expect("no panic");
        waiter
            .join()
            .expect("the waiter must be woken by either end");
        assert!(root_ended, "nothing ends the root before it");
        let record = child.record().expect("the child has ended");
        if child_ended {
            assert_eq!(record, 2, "a child that ended first keeps its own record");
        } else {
            assert_eq!(
                record, 1,
                "a child ended by its parent shows the parent's record"
            );
        }
    });
}

#[test]
fn a_wait_dropped_while_the_node_ends_leaves_no_slot_behind() {
    model(|| {
        let root = Tree::root("root");
        let child = Tree::child(&root, "child");
        let dropper = {
            let child = child.clone();
            thread::spawn(move || {
                let mut wait = Wait::new(child);
                // One poll registers (or finds the end); then the waiter goes away.
                let _ = loom::future::block_on(poll_fn(|cx| Poll::Ready(wait.poll_ended(cx))));
                drop(wait);
            })
        };
        root.end(1);
        dropper.join().expect("no panic");
        assert_eq!(
            root.held_slots(),
            0,
            "the root keeps no slot of a dropped wait"
        );
        assert_eq!(child.held_slots(), 0, "nor does the child");
    });
}

#[test]
fn a_permanent_registration_racing_an_end_is_always_told() {
    struct Flag(std::sync::atomic::AtomicBool);
    impl Wake for Flag {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.store(true, StdOrdering::SeqCst);
        }
    }
    model(|| {
        let root = Tree::root("root");
        let child = Tree::child(&root, "child");
        let told = std::sync::Arc::new(Flag(std::sync::atomic::AtomicBool::new(false)));
        let registrar = {
            let child = child.clone();
            let waker = Waker::from(told.clone());
            thread::spawn(move || child.on_end(&waker))
        };
        root.end(1);
        registrar.join().expect("no panic");
        assert!(
            told.0.load(StdOrdering::SeqCst),
            "a registration either precedes the end and is woken, or sees it"
        );
    });
}

#[test]
fn a_child_made_while_its_parent_ends_is_ended_and_its_waiter_woken() {
    model(|| {
        let root = Tree::root("root");
        let maker = {
            let root = root.clone();
            thread::spawn(move || {
                let child = Tree::child(&root, "late child");
                wait_for(&child);
                assert_eq!(child.record(), Some(1));
            })
        };
        root.end(1);
        maker.join().expect("the late child's waiter must be woken");
    });
}
