//! The deadline-aware semaphore.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Reason, Refused};
use crate::scope::Scope;

/// Which waiter gets a permit when one is freed.
///
/// Under open-loop load at 2× and 4× the capacity of a pool of 4
/// connections held ~10 ms each, with 100 ms deadlines, first-in-first-out serves the waiters that waited longest, which under
/// overload are the ones closest to their deadline — answers arrive just
/// too late and goodput falls; last-in-first-out keeps goodput near capacity
/// but starves old waiters even when there is no overload; the adaptive mix
/// keeps LIFO's goodput under overload and FIFO's order when calm.
///
/// ```
/// use std::time::Duration;
/// use grpc_deadline::admission::{Admission, Discipline};
/// let fair = Admission::new(8).discipline(Discipline::Fifo);
/// let newest_first = Admission::new(8).discipline(Discipline::AdaptiveLifo {
///     after: Duration::from_millis(5),
/// });
/// assert_eq!(
///     Discipline::default(),
///     Discipline::AdaptiveLifo { after: Duration::from_millis(10) }
/// );
/// # let _ = (fair, newest_first);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Discipline {
    /// First in, first out (the order of `tokio::sync::Semaphore`).
    Fifo,
    /// Last in, first out: always the newest waiter.
    Lifo,
    /// FIFO while the oldest waiter has waited less than `after`; LIFO once
    /// it has waited longer (the queue is then a standing queue, not a burst).
    AdaptiveLifo {
        /// How long the oldest waiter may wait before the queue counts as
        /// congested.
        after: Duration,
    },
}

impl Default for Discipline {
    fn default() -> Self {
        Discipline::AdaptiveLifo {
            after: Duration::from_millis(10),
        }
    }
}

#[derive(Debug, Clone)]
struct Config {
    permits: usize,
    discipline: Discipline,
    max_queue: Option<usize>,
    /// Weight of a new sample in the service-time average.
    alpha: f64,
    /// Kept for the caller after the resource is released (its reply).
    reserve: Duration,
}

/// Counters of an [`Admission`], for metrics and leak checks.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use grpc_deadline::{Scope, admission::Admission};
/// let admission = Admission::new(2);
/// let _permit = admission.try_acquire(&Scope::background()).expect("a free permit");
/// let stats = admission.stats();
/// assert_eq!((stats.permits, stats.in_use, stats.granted), (2, 1, 1));
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Permits in all.
    pub permits: usize,
    /// Permits held right now.
    pub in_use: usize,
    /// Callers waiting right now.
    pub queued: usize,
    /// Permits granted since creation.
    pub granted: u64,
    /// Callers refused because their scope ended (before or while waiting).
    pub ended: u64,
    /// Callers refused because they could not finish in time.
    pub would_not_finish: u64,
    /// Callers refused because the queue was full.
    pub queue_full: u64,
    /// Callers admitted to an idle resource although the expected service
    /// time said they could not finish: probes of an estimate that has
    /// refused callers for as long as it is, with nothing finishing in
    /// between (see [`Admission::acquire`]).
    pub probes: u64,
    /// The current expected service time (EWMA of permit hold times).
    pub service_time: Option<Duration>,
}

struct Waiter {
    tx: oneshot::Sender<Result<Permit, Refused>>,
    deadline: Option<Instant>,
    since: Instant,
}

struct State {
    free: usize,
    waiters: BTreeMap<u64, Waiter>,
    next_id: u64,
    ewma: Option<Duration>,
    /// Since when the estimate has refused callers with nothing finishing
    /// in between; `None` once a permit's release refreshes it.
    refusing_since: Option<Instant>,
    stats: Stats,
}

struct Shared {
    config: Config,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the counters consistent
        // (every update is a single step), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether work with `deadline` still fits the expected service time.
    fn fits(&self, state: &State, deadline: Option<Instant>, now: Instant) -> bool {
        let (Some(deadline), Some(service)) = (deadline, state.ewma) else {
            return true;
        };
        // An estimate too large to add to a time can never fit.
        now.checked_add(self.needed(service))
            .is_some_and(|done| done <= deadline)
    }

    /// The budget work needs: the service time and the reserve after it.
    fn needed(&self, service: Duration) -> Duration {
        service.saturating_add(self.config.reserve)
    }

    /// Whether a caller that does not fit may go in anyway, to measure the
    /// service time again: nothing holds a permit, and the estimate has
    /// refused callers for as long as itself without anything finishing.
    /// A seeded estimate is judged the same way: its first callers are
    /// refused however long the resource has been idle.
    ///
    /// Only finished work refreshes the estimate. Without probes, an
    /// estimate above every caller's budget (one slow spell is enough)
    /// would refuse all of them, nothing would finish, and it would never
    /// come down: the resource would stay idle and every caller refused.
    fn may_probe(state: &State, now: Instant) -> bool {
        state.stats.in_use == 0
            && state.free > 0
            && state
                .ewma
                .zip(state.refusing_since)
                .and_then(|(service, since)| since.checked_add(service))
                .is_some_and(|stale| now >= stale)
    }

    /// Returns a permit: hands it to the next waiter that can use it, or
    /// frees it.
    fn release(self: &Arc<Self>, held: Duration) {
        let mut state = self.lock();
        let sample = held.as_secs_f64();
        state.ewma = Some(match state.ewma {
            None => held,
            Some(old) => Duration::try_from_secs_f64(
                old.as_secs_f64() * (1.0 - self.config.alpha) + sample * self.config.alpha,
            )
            .unwrap_or(Duration::MAX),
        });
        state.stats.service_time = state.ewma;
        state.stats.in_use -= 1;
        state.refusing_since = None;
        let now = Instant::now();
        while let Some(waiter) = self.next_waiter(&mut state, now) {
            if !self.fits(&state, waiter.deadline, now) {
                state.stats.would_not_finish += 1;
                let _ = waiter.tx.send(Err(Refused::new(Reason::WouldNotFinish)));
                continue;
            }
            state.stats.in_use += 1;
            state.stats.granted += 1;
            let permit = Permit::new(self.clone(), now, now - waiter.since);
            match waiter.tx.send(Ok(permit)) {
                Ok(()) => return,
                Err(returned) => {
                    // The waiter went away between leaving its wait and
                    // removing its entry: take the permit back without
                    // re-entering this function.
                    if let Ok(mut permit) = returned {
                        permit.shared = None;
                    }
                    state.stats.in_use -= 1;
                    state.stats.granted -= 1;
                }
            }
        }
        state.free += 1;
    }

    fn next_waiter(&self, state: &mut State, now: Instant) -> Option<Waiter> {
        let entry = if self.newest_first(state, now) {
            state.waiters.pop_last()
        } else {
            state.waiters.pop_first()
        };
        entry.map(|(_, w)| w)
    }

    fn newest_first(&self, state: &State, now: Instant) -> bool {
        match self.config.discipline {
            Discipline::Fifo => false,
            Discipline::Lifo => true,
            Discipline::AdaptiveLifo { after } => state
                .waiters
                .first_key_value()
                .is_some_and(|(_, oldest)| now.saturating_duration_since(oldest.since) >= after),
        }
    }
}

/// A deadline-aware semaphore. Cheap to clone: clones share the permits.
///
/// See the [module docs](super) for the rules.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::time::Duration;
/// use grpc_deadline::Scope;
/// use grpc_deadline::admission::Admission;
/// let database = Admission::new(8).max_queue(64);
/// let request = Scope::background().with_timeout(Duration::from_millis(300));
/// let permit = database.acquire(&request).await.expect("a free permit");
/// assert_eq!(database.stats().in_use, 1);
/// drop(permit);
/// assert_eq!(database.stats().in_use, 0);
/// # }
/// ```
#[derive(Clone)]
pub struct Admission {
    shared: Arc<Shared>,
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("discipline", &self.shared.config.discipline)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Admission {
    /// `permits` permits, [`Discipline::AdaptiveLifo`] after 10 ms, no queue
    /// bound, no reserve.
    ///
    /// # Panics
    ///
    /// If `permits` is zero.
    pub fn new(permits: usize) -> Self {
        Self::with(Config {
            permits,
            discipline: Discipline::default(),
            max_queue: None,
            alpha: 0.1,
            reserve: Duration::ZERO,
        })
    }

    fn with(config: Config) -> Self {
        assert!(config.permits > 0, "an admission needs at least one permit");
        let state = State {
            free: config.permits,
            waiters: BTreeMap::new(),
            next_id: 0,
            ewma: None,
            refusing_since: None,
            stats: Stats {
                permits: config.permits,
                ..Stats::default()
            },
        };
        Self {
            shared: Arc::new(Shared {
                config,
                state: Mutex::new(state),
            }),
        }
    }

    fn reconfigure(self, change: impl FnOnce(&mut Config)) -> Self {
        let mut config = self.shared.config.clone();
        change(&mut config);
        let service = self.shared.lock().ewma;
        let fresh = Self::with(config);
        fresh.shared.lock().ewma = service;
        fresh
    }

    /// Sets the queue discipline (a builder step, before first use).
    ///
    /// ```
    /// use grpc_deadline::admission::{Admission, Discipline};
    /// let fifo = Admission::new(8).discipline(Discipline::Fifo);
    /// # let _ = fifo;
    /// ```
    pub fn discipline(self, discipline: Discipline) -> Self {
        self.reconfigure(|c| c.discipline = discipline)
    }

    /// Bounds the queue: beyond `max` waiters a newcomer is refused with
    /// [`Reason::QueueFull`] — or, while the queue serves the newest first,
    /// the *oldest* waiter is refused to make room (builder step).
    pub fn max_queue(self, max: usize) -> Self {
        self.reconfigure(|c| c.max_queue = Some(max))
    }

    /// Seeds the expected service time before any has been observed, so the
    /// first callers are already judged by it (builder step).
    pub fn expected_service_time(self, service: Duration) -> Self {
        let admission = self.reconfigure(|_| {});
        let mut state = admission.shared.lock();
        state.ewma = Some(service);
        state.stats.service_time = Some(service);
        drop(state);
        admission
    }

    /// Time each caller needs after releasing the permit (building and
    /// sending its reply); work is admitted only if `service + reserve` fits
    /// its remaining budget (builder step).
    pub fn reserve(self, reserve: Duration) -> Self {
        self.reconfigure(|c| c.reserve = reserve)
    }

    /// Weight of each new sample in the service-time average, in `(0, 1]`;
    /// 0.1 by default (builder step).
    pub fn smoothing(self, alpha: f64) -> Self {
        self.reconfigure(|c| c.alpha = alpha.clamp(f64::MIN_POSITIVE, 1.0))
    }

    /// Counters: permits in use, waiters, grants and refusals.
    pub fn stats(&self) -> Stats {
        let state = self.shared.lock();
        Stats {
            queued: state.waiters.len(),
            ..state.stats
        }
    }

    /// Takes a permit at once if one is free and the work fits the caller's
    /// budget; never waits.
    ///
    /// # Errors
    ///
    /// [`Reason::Ended`], [`Reason::WouldNotFinish`], or
    /// [`Reason::QueueFull`] when no permit is free.
    pub fn try_acquire(&self, scope: &Scope) -> Result<Permit, Refused> {
        match self.admit_or_enqueue(scope, false)? {
            Admit::Granted(permit) => Ok(permit),
            // Without waiting nothing is queued; a queued entry cannot appear.
            Admit::Queued(..) => Err(Refused::new(Reason::QueueFull)),
        }
    }

    /// Waits for a permit under `scope`: the wait spends the scope's budget.
    ///
    /// A caller whose remaining budget is below the expected service time is
    /// refused before it takes the resource — except one at a time while the
    /// resource is idle and the estimate has refused callers for as long as
    /// it is, with nothing finishing since: that caller goes in as a probe
    /// (counted in
    /// [`Stats::probes`]), so an estimate from a slow spell comes down once
    /// the work is fast again instead of refusing every caller for good.
    ///
    /// # Errors
    ///
    /// See [`Reason`]: the scope ended (before or while waiting), the work
    /// could not finish in time, or the queue is full.
    ///
    /// # Cancellation safety
    ///
    /// Safe: dropping the future removes the caller from the queue, and a
    /// permit granted in that instant is released, not lost.
    pub async fn acquire(&self, scope: &Scope) -> Result<Permit, Refused> {
        let (id, rx) = match self.admit_or_enqueue(scope, true)? {
            Admit::Granted(permit) => return Ok(permit),
            Admit::Queued(id, rx) => (id, rx),
        };
        let slot = Slot {
            shared: &self.shared,
            id,
        };
        // However the wait ends, the request's ledger gets its length.
        #[cfg(feature = "ledger")]
        let _waiting = Waiting {
            scope,
            since: Instant::now(),
        };
        // Leave as soon as the work can no longer fit: waiting on would
        // only spend the caller's last milliseconds on a refusal.
        let give_up = self.give_up_at(scope);
        let out = tokio::select! {
            biased;
            answer = rx => match answer {
                Ok(answer) => answer,
                // The admission was dropped with us in it.
                Err(_) => Err(Refused::new(Reason::QueueFull)),
            },
            cause = scope.ended() => Err(Refused::new(Reason::Ended(cause))),
            () = sleep_until_opt(give_up) => Err(Refused::new(Reason::WouldNotFinish)),
        };
        slot.leave(&out);
        out
    }

    fn give_up_at(&self, scope: &Scope) -> Option<Instant> {
        let deadline = scope.deadline()?;
        let service = self.shared.lock().ewma?;
        deadline.checked_sub(self.shared.needed(service))
    }

    fn admit_or_enqueue(&self, scope: &Scope, wait: bool) -> Result<Admit, Refused> {
        let shared = &self.shared;
        let mut state = shared.lock();
        if let Err(ended) = scope.check() {
            state.stats.ended += 1;
            return Err(ended.into());
        }
        let now = Instant::now();
        if !shared.fits(&state, scope.deadline(), now) {
            if !Shared::may_probe(&state, now) {
                state.refusing_since.get_or_insert(now);
                state.stats.would_not_finish += 1;
                return Err(Refused::new(Reason::WouldNotFinish));
            }
            // Its release refreshes the estimate; if it cannot finish
            // after all, its scope stops it at the deadline.
            state.stats.probes += 1;
            tracing::debug!(
                service_time = ?state.ewma,
                "admitting a probe past a stale service-time estimate"
            );
        }
        if state.free > 0 {
            state.free -= 1;
            state.stats.in_use += 1;
            state.stats.granted += 1;
            return Ok(Admit::Granted(Permit::new(
                shared.clone(),
                now,
                Duration::ZERO,
            )));
        }
        if !wait {
            state.stats.queue_full += 1;
            return Err(Refused::new(Reason::QueueFull));
        }
        if let Some(max) = shared.config.max_queue
            && state.waiters.len() >= max
        {
            let evict_oldest = max > 0 && shared.newest_first(&state, now);
            state.stats.queue_full += 1;
            match evict_oldest.then(|| state.waiters.pop_first()).flatten() {
                Some((_, oldest)) => {
                    let _ = oldest.tx.send(Err(Refused::new(Reason::QueueFull)));
                }
                None => return Err(Refused::new(Reason::QueueFull)),
            }
        }
        let (tx, rx) = oneshot::channel();
        let id = state.next_id;
        state.next_id += 1;
        state.waiters.insert(
            id,
            Waiter {
                tx,
                deadline: scope.deadline(),
                since: now,
            },
        );
        Ok(Admit::Queued(id, rx))
    }
}

enum Admit {
    Granted(Permit),
    Queued(u64, oneshot::Receiver<Result<Permit, Refused>>),
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A wait in the queue, noted on the request's ledger when it ends.
#[cfg(feature = "ledger")]
struct Waiting<'a> {
    scope: &'a Scope,
    since: Instant,
}

#[cfg(feature = "ledger")]
impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        crate::ledger::note_queued(self.scope, self.since.elapsed());
    }
}

/// A caller's place in the queue; removes it when the wait ends, however it
/// ends.
struct Slot<'a> {
    shared: &'a Arc<Shared>,
    id: u64,
}

impl Slot<'_> {
    fn leave(self, out: &Result<Permit, Refused>) {
        let mut state = self.shared.lock();
        if state.waiters.remove(&self.id).is_some() {
            match out {
                Err(Refused {
                    reason: Reason::Ended(_),
                }) => state.stats.ended += 1,
                Err(Refused {
                    reason: Reason::WouldNotFinish,
                }) => state.stats.would_not_finish += 1,
                _ => {}
            }
        }
        drop(state);
        std::mem::forget(self);
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        // The acquire future was dropped mid-wait (its caller went away).
        let removed = {
            let mut state = self.shared.lock();
            let removed = state.waiters.remove(&self.id);
            if removed.is_some() {
                state.stats.ended += 1;
            }
            removed
        };
        // Dropped outside the lock: nothing was sent on it.
        drop(removed);
    }
}

/// The right to use one unit of the resource. Dropping it releases the unit
/// (or hands it to the next waiter) and records how long it was held.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::time::Duration;
/// use grpc_deadline::{Scope, admission::Admission};
/// let admission = Admission::new(1);
/// let scope = Scope::background();
/// let first = admission.try_acquire(&scope).expect("a free permit");
/// assert_eq!(first.waited(), Duration::ZERO);
/// assert!(admission.try_acquire(&scope).is_err(), "the only permit is held");
/// drop(first);
/// assert!(admission.try_acquire(&scope).is_ok(), "dropping a permit releases it");
/// # }
/// ```
#[must_use = "the permit is released as soon as it is dropped"]
pub struct Permit {
    shared: Option<Arc<Shared>>,
    granted: Instant,
    waited: Duration,
}

impl Permit {
    fn new(shared: Arc<Shared>, granted: Instant, waited: Duration) -> Self {
        Self {
            shared: Some(shared),
            granted,
            waited,
        }
    }

    /// How long the caller waited in the queue for this permit.
    pub fn waited(&self) -> Duration {
        self.waited
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("waited", &self.waited)
            .finish_non_exhaustive()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.release(self.granted.elapsed());
        }
    }
}
