//! The signal from a call to its request body: the call was given up.
//!
//! One small shared flag and a waker, instead of a cancellation-tree node:
//! every call makes one, and most never use it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;

#[derive(Debug, Default)]
struct State {
    given_up: AtomicBool,
    waker: AtomicWaker,
}

/// Held by the call: dropping it gives the call up.
#[derive(Debug)]
pub(crate) struct Abandon {
    state: Arc<State>,
}

/// Held by the request body: ready once the call was given up.
#[derive(Debug)]
pub(crate) struct Abandoned {
    state: Arc<State>,
}

/// A connected pair.
pub(crate) fn pair() -> (Abandon, Abandoned) {
    let state = Arc::new(State::default());
    (
        Abandon {
            state: state.clone(),
        },
        Abandoned { state },
    )
}

impl Drop for Abandon {
    fn drop(&mut self) {
        self.state.given_up.store(true, Ordering::Release);
        self.state.waker.wake();
    }
}

impl Abandoned {
    /// Whether the call was given up, without registering for a wake-up.
    pub(crate) fn is_given_up(&self) -> bool {
        self.state.given_up.load(Ordering::Acquire)
    }

    /// Ready once the call was given up; registers for a wake-up otherwise.
    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.state.given_up.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        self.state.waker.register(cx.waker());
        // Given up between the check and the registration: seen here.
        if self.state.given_up.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dropping_the_call_side_wakes_the_body_side() {
        let (abandon, abandoned) = pair();
        let wait = std::future::poll_fn(|cx| abandoned.poll(cx));
        let give_up = async move {
            tokio::task::yield_now().await;
            drop(abandon);
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            tokio::join!(wait, give_up)
        })
        .await
        .expect("the body side must be woken");
    }
}
