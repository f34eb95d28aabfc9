//! The connection's state, the dialer that opens it, and the pauses
//! between dials of a call that waits for ready.

use super::*;

/// The pauses between dials of a call that waits for ready: 10 ms, growing
/// by 1.6 up to 1 s, each ±20 % at random (gRPC's connection backoff
/// shape, with a start that suits a server coming up within a deadline).
pub(super) struct Backoff {
    pub(super) next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: Duration::from_millis(10),
        }
    }
}

impl Backoff {
    pub(super) fn next_pause(&mut self) -> Duration {
        use std::hash::BuildHasher;
        let pause = self.next;
        self.next = self.next.mul_f64(1.6).min(Duration::from_secs(1));
        let random = std::hash::RandomState::new().hash_one(0_u8) as f64 / u64::MAX as f64;
        pause.mul_f64(0.8 + 0.4 * random)
    }
}

/// The connection's state, shared by the channel, its connector and the
/// connection's stream.
///
/// # Invariants
///
/// 1. `ready` is true exactly when a connection is in use by tonic or
///    waits in the stash — or the last dial failed and its error waits
///    there, so that tonic reports it (`UNAVAILABLE`) instead of waiting.
/// 2. At most one dial started by the channel runs at a time.
/// 3. A stream that closes ends readiness only if it is still the one in
///    use (`live == its generation`), so an old stream closing late cannot
///    undo a new connection.
#[derive(Default)]
pub(super) struct Link {
    pub(super) ready: AtomicBool,
    pub(super) state: Mutex<LinkState>,
}

#[derive(Default)]
pub(super) struct LinkState {
    pub(super) dialing: bool,
    pub(super) waiters: Vec<Waker>,
    /// Generation of the stream tonic uses now; 0 for none.
    pub(super) live: u64,
    pub(super) generations: u64,
}

pub(super) enum Connected {
    Yes,
    Waiting,
    DialNow,
}

impl Link {
    pub(super) fn poll_connected(&self, cx: &mut Context<'_>) -> Connected {
        if self.ready.load(Ordering::Acquire) {
            return Connected::Yes;
        }
        let mut state = self.lock();
        if self.ready.load(Ordering::Acquire) {
            return Connected::Yes;
        }
        if !state.waiters.iter().any(|w| w.will_wake(cx.waker())) {
            state.waiters.push(cx.waker().clone());
        }
        if state.dialing {
            return Connected::Waiting;
        }
        state.dialing = true;
        Connected::DialNow
    }

    /// A dial finished (its stream or error is in the stash): wake waiters.
    pub(super) fn dialed(&self) {
        let waiters = {
            let mut state = self.lock();
            state.dialing = false;
            self.ready.store(true, Ordering::Release);
            std::mem::take(&mut state.waiters)
        };
        for waiter in waiters {
            waiter.wake();
        }
    }

    /// tonic took a stream; returns its generation.
    pub(super) fn in_use(&self) -> u64 {
        let mut state = self.lock();
        state.generations += 1;
        state.live = state.generations;
        self.ready.store(true, Ordering::Release);
        state.live
    }

    /// A dial's error was handed to tonic: not ready until the next dial.
    pub(super) fn failed(&self) {
        let state = self.lock();
        if state.live == 0 && !state.dialing {
            self.ready.store(false, Ordering::Release);
        }
    }

    /// The stream of `generation` closed.
    pub(super) fn closed(&self, generation: u64, stash_empty: bool) {
        let mut state = self.lock();
        if state.live == generation {
            state.live = 0;
            if stash_empty {
                self.ready.store(false, Ordering::Release);
            }
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, LinkState> {
        // The state stays consistent under a panic (plain fields, no
        // invariant spans two of them), so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Starts a dial in the background.
pub(super) trait Dial: Send + Sync {
    fn start(self: Arc<Self>);
    /// Whether the last dial failed and its error waits to be reported.
    fn failed(&self) -> bool;
    /// Drops the error of a failed dial, unreported: a call that waits for
    /// ready dials again instead.
    fn forget_failure(&self);
}

pub(super) type Stashed<T> = Result<T, BoxError>;

pub(super) struct Dialer<C: Service<Uri>> {
    pub(super) uri: Uri,
    /// Behind a lock so that the dialer is `Sync`, and so that a dial
    /// readies and calls it in one go.
    pub(super) connector: Mutex<C>,
    pub(super) link: Arc<Link>,
    /// A stream dialed ahead of tonic asking for it, or the dial's error.
    pub(super) stash: Mutex<Option<Stashed<C::Response>>>,
    /// Where to measure each connection's round trip, and how often.
    pub(super) round_trip: Option<(RoundTrip, Duration)>,
    /// Told the limit each connection's server sets.
    pub(super) streams: Arc<Streams>,
}

impl<C> Dialer<C>
where
    C: Service<Uri>,
    C::Error: Into<BoxError>,
{
    pub(super) async fn dial(&self) -> Stashed<C::Response> {
        // Readied and called under one lock, as tower asks; the dial itself
        // runs outside it. Not cloned: a connector may be one-shot (a
        // stream made in advance, handed out once).
        let dialing = poll_fn(|cx| {
            let mut connector = self
                .connector
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let ready = std::task::ready!(connector.poll_ready(cx));
            Poll::Ready(ready.map(|()| connector.call(self.uri.clone())))
        })
        .await
        .map_err(Into::into)?;
        dialing.await.map_err(Into::into)
    }

    pub(super) fn take_stash(&self) -> Option<Stashed<C::Response>> {
        self.stash
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    pub(super) fn stash_is_empty(&self) -> bool {
        self.stash
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_none()
    }
}

impl<C> Dial for Dialer<C>
where
    C: Service<Uri> + Send + 'static,
    C::Response: Send + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    fn start(self: Arc<Self>) {
        // A connection is the channel's, not any request's: it outlives the
        // call that asked for it.
        #[allow(clippy::disallowed_methods)]
        tokio::spawn(async move {
            let dialed = self.dial().await;
            if let Err(err) = &dialed {
                tracing::debug!(uri = %self.uri, error = %err, "dial failed");
            }
            *self
                .stash
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(dialed);
            self.link.dialed();
        });
    }

    fn failed(&self) -> bool {
        matches!(
            *self
                .stash
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            Some(Err(_))
        )
    }

    fn forget_failure(&self) {
        let mut stash = self
            .stash
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if matches!(*stash, Some(Err(_))) {
            *stash = None;
            drop(stash);
            self.link.failed();
        }
    }
}

/// The connector tonic is given: hands out the stashed stream, or dials.
pub(super) struct Linked<C: Service<Uri>> {
    pub(super) dialer: Arc<Dialer<C>>,
}

impl<C: Service<Uri>> Clone for Linked<C> {
    fn clone(&self) -> Self {
        Self {
            dialer: self.dialer.clone(),
        }
    }
}

impl<C> Service<Uri> for Linked<C>
where
    C: Service<Uri> + Send + 'static,
    C::Response: Read + Write + Unpin + Send + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = LinkedIo<C::Response>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let dialer = self.dialer.clone();
        Box::pin(async move {
            let dialed = match dialer.take_stash() {
                Some(stashed) => stashed,
                None => dialer.dial().await,
            };
            let io = match dialed {
                Ok(io) => io,
                Err(err) => {
                    // Reported by tonic as UNAVAILABLE; the next call dials anew.
                    dialer.link.failed();
                    return Err(err);
                }
            };
            let generation = dialer.link.in_use();
            let weak: Weak<Dialer<C>> = Arc::downgrade(&dialer);
            let on_close: Box<dyn Fn() + Send + Sync> = Box::new(move || {
                if let Some(dialer) = weak.upgrade() {
                    let empty = dialer.stash_is_empty();
                    dialer.link.closed(generation, empty);
                }
            });
            let meter = dialer
                .round_trip
                .as_ref()
                .map(|(round_trip, every)| Box::new(Metered::new(round_trip.clone(), *every)));
            Ok(LinkedIo {
                io,
                on_close,
                meter,
                scan: Some(Box::new(Scanned {
                    scan: SettingsScan::default(),
                    streams: dialer.streams.clone(),
                    scratch: Vec::new(),
                    resets: Resets::default(),
                    held_back: false,
                })),
            })
        })
    }
}
