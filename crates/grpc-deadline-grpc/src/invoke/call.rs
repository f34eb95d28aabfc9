//! A call until the server's response headers: the tonic call's future,
//! shared by the call's two streams, driven by whichever of them waits.
//!
//! Once handed to the connection a request leaves whether or not its
//! future is polled, but the future must be polled before that (a
//! connection being dialled, a free stream awaited) and to read the
//! answer. The receiving side polls it while it waits for the headers, the
//! sending side while it waits to queue a message (a client stream sends
//! before it reads), so neither waits on the other. No task of its own:
//! dropping the receiving side drops the future, and the stream is reset.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

use bytes::Bytes;
use tonic::Streaming;

/// What a tonic call answers: the response headers and its body, or a
/// status.
pub(crate) type Answer = Result<tonic::Response<Streaming<Bytes>>, tonic::Status>;

type CallFuture = Pin<Box<dyn Future<Output = Answer> + Send>>;

/// Which of the call's two streams polls.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Side {
    Send = 0,
    Recv = 1,
}

enum State {
    /// Sent, the answer not yet in.
    Waiting(CallFuture),
    /// Answered while the sending side polled: for the receiving side.
    /// Boxed: the answer (headers and body) is far larger than the rest.
    Answered(Box<Answer>),
    /// Taken by the receiving side, or dropped with it.
    Gone,
}

/// The call until its answer; see the module docs.
pub(crate) struct Dispatch {
    state: Mutex<State>,
    wakers: Arc<Wakers>,
    /// Wakes both sides: what the call's future is polled with.
    waker: Waker,
}

impl fmt::Debug for Dispatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dispatch").finish_non_exhaustive()
    }
}

impl Dispatch {
    pub(crate) fn new(call: CallFuture) -> Self {
        let wakers = Arc::new(Wakers::default());
        Self {
            state: Mutex::new(State::Waiting(call)),
            waker: Waker::from(wakers.clone()),
            wakers,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while polling leaves a state that is still whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Polls the call once (to hand it to the connection); an answer is
    /// kept for the receiving side.
    pub(crate) fn poll_once(&self, cx: &mut Context<'_>) {
        let _ = self.poll_side(Side::Send, cx);
    }

    /// Polls the call for `side`: ready once it is answered (the answer
    /// kept for the receiving side) or gone.
    pub(crate) fn poll_side(&self, side: Side, cx: &mut Context<'_>) -> Poll<()> {
        self.wakers.register(side, cx.waker());
        let mut state = self.lock();
        let State::Waiting(call) = &mut *state else {
            return Poll::Ready(());
        };
        match call.as_mut().poll(&mut Context::from_waker(&self.waker)) {
            Poll::Ready(answer) => {
                *state = State::Answered(Box::new(answer));
                drop(state);
                self.wakers.wake_side(Side::Recv);
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// The answer, for the receiving side; `None` once it was taken.
    pub(crate) fn poll_answer(&self, cx: &mut Context<'_>) -> Poll<Option<Answer>> {
        std::task::ready!(self.poll_side(Side::Recv, cx));
        match std::mem::replace(&mut *self.lock(), State::Gone) {
            State::Answered(answer) => Poll::Ready(Some(*answer)),
            State::Waiting(_) | State::Gone => Poll::Ready(None),
        }
    }

    /// Drops the call: a call not yet answered is reset.
    pub(crate) fn drop_call(&self) {
        let state = std::mem::replace(&mut *self.lock(), State::Gone);
        // Dropped outside the lock: dropping the call wakes others.
        drop(state);
        self.wakers.wake_side(Side::Send);
    }
}

/// The two sides' wakers: the call's future wakes both, whichever polled
/// it last.
#[derive(Debug, Default)]
struct Wakers {
    slots: Mutex<[Option<Waker>; 2]>,
}

impl Wakers {
    fn register(&self, side: Side, waker: &Waker) {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = &mut slots[side as usize];
        match slot {
            Some(kept) if kept.will_wake(waker) => {}
            _ => *slot = Some(waker.clone()),
        }
    }

    fn wake_side(&self, side: Side) {
        let waker = self.slots.lock().unwrap_or_else(PoisonError::into_inner)[side as usize].take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl Wake for Wakers {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let woken = std::mem::take(&mut *self.slots.lock().unwrap_or_else(PoisonError::into_inner));
        for waker in woken.into_iter().flatten() {
            waker.wake();
        }
    }
}
