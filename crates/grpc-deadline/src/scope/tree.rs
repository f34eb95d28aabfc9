//! The cancellation tree beneath [`Scope`](super::Scope): nodes that end
//! once, with a record of why, and wake whatever waits on them or on any of
//! their descendants.
//!
//! A node knows its parent and never its children. A question ("has this
//! ended?") walks up from the node, reading one atomic flag per ancestor;
//! a wait registers its waker with the node and with every ancestor, so
//! that ending any of them wakes it. Nothing is registered when a child is
//! made or dropped, and nothing is locked to clone, ask or drop: the lock
//! of a node is taken only to end it and to wait on it. A request's tree is
//! shallow (a root, a cap, a reserve), so a wait registers a few times; in
//! exchange a parent keeps no list of children to lock at every `child()`
//! and every drop, which is what tokio-util's `CancellationToken` pays for.
//!
//! The file depends only on `super::sync` and `std`, so the model checker
//! can build it against its own primitives (see the `scope_tree_loom`
//! integration tests).
//!
//! # Invariants
//!
//! 1. A node's record is written once, under its lock, before its flag is
//!    set; the flag is never cleared. A node is *ended* when its flag or an
//!    ancestor's is set.
//! 2. Each waiter's slot in a node is written only under that node's lock,
//!    and [`Node::end`] takes every waker out under the same lock after the
//!    record is written. So a registration either comes first (and is woken)
//!    or sees the record under the lock (and does not wait): no wake-up is
//!    lost, at any depth.
//! 3. A slot belongs to its waiter until the waiter is dropped; an end
//!    empties slots but frees none, so indices never change hands under a
//!    waiter.
//! 4. No waker is woken, cloned or dropped while a lock is held.

use std::fmt;
use std::task::{Context, Poll, Waker};

use super::sync::{Arc, AtomicBool, Mutex, MutexGuard, Ordering};

/// One node: immutable data, an optional parent, and the end once it comes.
pub(crate) struct Node<D, E> {
    data: D,
    parent: Option<Arc<Node<D, E>>>,
    /// Set (never cleared) once `state.record` is written.
    ended: AtomicBool,
    state: Mutex<State<E>>,
}

/// What the lock guards: the record of the end and the waiters' slots.
struct State<E> {
    record: Option<E>,
    /// Slot 0, inline: most nodes never have more than one waiter at a
    /// time (the call racing its caller's scope), so they never allocate.
    first: Slot,
    /// Slots 1.. .
    more: Vec<Slot>,
    /// Vacant slots in `more`, by index into `more`.
    vacant: Vec<u32>,
}

#[derive(Default)]
enum Slot {
    #[default]
    Vacant,
    /// Owned by a waiter: its waker, or `None` once an end took it.
    Held(Option<Waker>),
}

impl<E> State<E> {
    fn new() -> Self {
        Self {
            record: None,
            first: Slot::Vacant,
            more: Vec::new(),
            vacant: Vec::new(),
        }
    }

    fn slot(&mut self, index: u32) -> Option<&mut Slot> {
        match index {
            0 => Some(&mut self.first),
            n => self.more.get_mut(n as usize - 1),
        }
    }

    fn insert(&mut self, waker: Waker) -> u32 {
        if matches!(self.first, Slot::Vacant) {
            self.first = Slot::Held(Some(waker));
            return 0;
        }
        if let Some(n) = self.vacant.pop() {
            self.more[n as usize] = Slot::Held(Some(waker));
            return n + 1;
        }
        self.more.push(Slot::Held(Some(waker)));
        // More waiters at once than a `u32` counts is not a real tree.
        u32::try_from(self.more.len()).expect("fewer than 2^32 waiters on one node")
    }

    /// Frees `index`; returns its waker, to be dropped outside the lock.
    fn remove(&mut self, index: u32) -> Option<Waker> {
        let slot = std::mem::take(self.slot(index)?);
        if index > 0 {
            self.vacant.push(index - 1);
        }
        match slot {
            Slot::Held(waker) => waker,
            Slot::Vacant => None,
        }
    }

    /// Every waker, taken out of its slot (the slots stay held): the
    /// first apart, so that a node with one waiter allocates nothing.
    fn take_wakers(&mut self) -> (Option<Waker>, Vec<Waker>) {
        let take = |slot: &mut Slot| match slot {
            Slot::Held(waker) => waker.take(),
            Slot::Vacant => None,
        };
        let first = take(&mut self.first);
        let more = self.more.iter_mut().filter_map(take).collect();
        (first, more)
    }
}

impl<D, E: Clone> Node<D, E> {
    /// A node with no parent.
    pub(crate) fn root(data: D) -> Arc<Self> {
        Self::make(data, None)
    }

    /// A node under `parent`: ended whenever `parent` is.
    pub(crate) fn child(parent: &Arc<Self>, data: D) -> Arc<Self> {
        Self::make(data, Some(parent.clone()))
    }

    fn make(data: D, parent: Option<Arc<Self>>) -> Arc<Self> {
        Arc::new(Self {
            data,
            parent,
            ended: AtomicBool::new(false),
            state: Mutex::new(State::new()),
        })
    }

    pub(crate) fn data(&self) -> &D {
        &self.data
    }

    pub(crate) fn parent(&self) -> Option<&Arc<Self>> {
        self.parent.as_ref()
    }

    /// This node, then its ancestors up to the root.
    pub(crate) fn path(&self) -> impl Iterator<Item = &Self> {
        std::iter::successors(Some(self), |node| node.parent.as_deref())
    }

    fn lock(&self) -> MutexGuard<'_, State<E>> {
        // A panic never leaves the state half-written (every update is one
        // assignment), so a poisoned lock is still consistent.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether this node or an ancestor has ended: one atomic load per
    /// node on the way up, no lock.
    pub(crate) fn is_ended(&self) -> bool {
        self.path().any(|node| node.ended.load(Ordering::Acquire))
    }

    /// The record of the nearest ended node on the way up (this one
    /// first): the end that reached this node first.
    pub(crate) fn record(&self) -> Option<E> {
        self.path()
            .find(|node| node.ended.load(Ordering::Acquire))
            .and_then(|node| node.lock().record.clone())
    }

    /// Ends this node with `record` and wakes every waiter of it and of its
    /// descendants. `false` (and nothing changes) if it had already ended,
    /// or an ancestor had.
    pub(crate) fn end(&self, record: E) -> bool {
        if self.is_ended() {
            return false;
        }
        let (first, more) = {
            let mut state = self.lock();
            if state.record.is_some() {
                return false;
            }
            state.record = Some(record);
            self.ended.store(true, Ordering::Release);
            state.take_wakers()
        };
        first.into_iter().chain(more).for_each(Waker::wake);
        true
    }

    /// Registers `waker`, for good, with this node and each ancestor: woken
    /// by the first end among them. For a waiter that lives as long as the
    /// node (a bridge to another cancellation type); a waiter that may go
    /// away first uses [`Wait`].
    pub(crate) fn on_end(&self, waker: &Waker) {
        for node in self.path() {
            let mut state = node.lock();
            if state.record.is_some() {
                drop(state);
                waker.wake_by_ref();
                return;
            }
            state.insert(waker.clone());
        }
    }
}

impl<D, E: Clone> Node<D, E> {
    /// How many slots waiters hold in this node (a wait that outlived its
    /// waiter would show here).
    pub(crate) fn held_slots(&self) -> usize {
        let state = self.lock();
        std::iter::once(&state.first)
            .chain(&state.more)
            .filter(|slot| matches!(slot, Slot::Held(_)))
            .count()
    }
}

impl<D, E: Clone> fmt::Debug for Node<D, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("ended", &self.ended.load(Ordering::Relaxed))
            .field("held_slots", &self.held_slots())
            .finish_non_exhaustive()
    }
}

/// The slots a [`Wait`] holds, one per node from the waited node up: inline
/// for trees up to four deep.
enum Held {
    Inline { slots: [u32; 4], len: u8 },
    Heap(Vec<u32>),
}

impl Held {
    const EMPTY: Held = Held::Inline {
        slots: [0; 4],
        len: 0,
    };

    fn push(&mut self, slot: u32) {
        match self {
            Held::Inline { slots, len } if usize::from(*len) < slots.len() => {
                slots[usize::from(*len)] = slot;
                *len += 1;
            }
            Held::Inline { slots, .. } => {
                let mut heap = slots.to_vec();
                heap.push(slot);
                *self = Held::Heap(heap);
            }
            Held::Heap(heap) => heap.push(slot),
        }
    }

    fn as_slice(&self) -> &[u32] {
        match self {
            Held::Inline { slots, len } => &slots[..usize::from(*len)],
            Held::Heap(heap) => heap,
        }
    }

    fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }
}

/// A wait for a node's end (its own or an ancestor's). Registers on its
/// first pending poll, keeps its slots until it is dropped.
///
/// # Cancellation safety
///
/// Dropping it at any point frees its slots; nothing else changes.
pub(crate) struct Wait<D, E: Clone> {
    node: Arc<Node<D, E>>,
    held: Held,
}

impl<D, E: Clone> Wait<D, E> {
    pub(crate) fn new(node: Arc<Node<D, E>>) -> Self {
        Self {
            node,
            held: Held::EMPTY,
        }
    }

    /// Ready once the node has ended; otherwise `cx`'s waker is registered
    /// (or refreshed) with the node and every ancestor.
    pub(crate) fn poll_ended(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.node.is_ended() {
            return Poll::Ready(());
        }
        if self.held.is_empty() {
            return self.register(cx.waker());
        }
        for (node, &index) in self.node.path().zip(self.held.as_slice()) {
            let stale = {
                let mut state = node.lock();
                if state.record.is_some() {
                    return Poll::Ready(());
                }
                match state.slot(index) {
                    Some(Slot::Held(waker))
                        if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) =>
                    {
                        waker.replace(cx.waker().clone())
                    }
                    _ => None,
                }
            };
            drop(stale);
        }
        Poll::Pending
    }

    fn register(&mut self, waker: &Waker) -> Poll<()> {
        let mut held = Held::EMPTY;
        let mut ended = false;
        for node in self.node.path() {
            let mut state = node.lock();
            if state.record.is_some() {
                ended = true;
                break;
            }
            held.push(state.insert(waker.clone()));
        }
        self.held = held;
        if ended {
            // The slots taken on the way are freed when this is dropped.
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl<D, E: Clone> Drop for Wait<D, E> {
    fn drop(&mut self) {
        for (node, &index) in self.node.path().zip(self.held.as_slice()) {
            // The guard goes at the end of the statement, the waker after it.
            let waker = node.lock().remove(index);
            drop(waker);
        }
    }
}

impl<D, E: Clone> fmt::Debug for Wait<D, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wait")
            .field("registered", &!self.held.is_empty())
            .finish_non_exhaustive()
    }
}
