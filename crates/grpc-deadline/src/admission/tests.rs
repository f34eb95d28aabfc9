// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use tokio::time::{Instant, advance};

use super::*;
use crate::{Cause, Scope};

const MS: Duration = Duration::from_millis(1);

fn scope(timeout: Duration) -> Scope {
    Scope::background().with_timeout(timeout)
}

#[tokio::test(start_paused = true)]
async fn queue_time_spends_the_callers_budget() {
    let admission = Admission::new(1);
    let _held = admission
        .acquire(&scope(Duration::from_secs(10)))
        .await
        .expect("a free permit is granted");
    let start = Instant::now();
    let refused = admission
        .acquire(&scope(80 * MS))
        .await
        .expect_err("the only permit is never freed");
    assert_eq!(refused.reason(), Reason::Ended(Cause::DeadlineExceeded));
    assert_eq!(
        Instant::now() - start,
        80 * MS,
        "the waiter must leave exactly when its budget is spent"
    );
    assert_eq!(
        admission.stats().queued,
        0,
        "an expired waiter must leave the queue"
    );
}

#[tokio::test(start_paused = true)]
async fn expired_waiter_leaves_without_reaching_the_head() {
    let admission = Admission::new(1);
    let held = admission
        .acquire(&scope(Duration::from_secs(10)))
        .await
        .expect("granted");
    let patient = tokio::spawn({
        let admission = admission.clone();
        async move { admission.acquire(&scope(Duration::from_secs(1))).await }
    });
    tokio::task::yield_now().await;
    let hasty = tokio::spawn({
        let admission = admission.clone();
        async move { admission.acquire(&scope(50 * MS)).await }
    });
    tokio::task::yield_now().await;
    assert_eq!(admission.stats().queued, 2);

    advance(50 * MS).await;
    let refused = hasty
        .await
        .expect("no panic")
        .expect_err("its deadline passed");
    assert_eq!(refused.reason(), Reason::Ended(Cause::DeadlineExceeded));
    assert_eq!(
        admission.stats().queued,
        1,
        "the expired entry must be gone while an older one still waits ahead of it"
    );
    drop(held);
    let permit = patient
        .await
        .expect("no panic")
        .expect("the patient waiter gets the freed permit");
    assert_eq!(permit.waited(), 50 * MS);
}

#[tokio::test(start_paused = true)]
async fn cancelled_waiter_leaves_the_queue_at_once() {
    let admission = Admission::new(1);
    let _held = admission
        .acquire(&Scope::background())
        .await
        .expect("granted");
    let request = Scope::background();
    let waiter = tokio::spawn({
        let (admission, request) = (admission.clone(), request.clone());
        async move { admission.acquire(&request).await }
    });
    tokio::task::yield_now().await;
    assert_eq!(admission.stats().queued, 1);
    request.cancel();
    let refused = waiter
        .await
        .expect("no panic")
        .expect_err("it was cancelled");
    assert_eq!(refused.reason(), Reason::Ended(Cause::Cancelled));
    assert_eq!(refused.code(), crate::Code::Cancelled);
    assert_eq!(admission.stats().queued, 0);
}

#[tokio::test(start_paused = true)]
async fn work_that_cannot_finish_is_refused_before_it_takes_the_resource() {
    let admission = Admission::new(1).expected_service_time(30 * MS);
    let refused = admission
        .acquire(&scope(20 * MS))
        .await
        .expect_err("20 ms cannot fit a 30 ms service");
    assert_eq!(refused.reason(), Reason::WouldNotFinish);
    assert_eq!(refused.code(), crate::Code::DeadlineExceeded);
    assert_eq!(admission.stats().in_use, 0, "the resource was not taken");

    // A waiter gives up as soon as its remaining budget drops below the
    // service time, not at its deadline.
    let _held = admission
        .acquire(&scope(Duration::from_secs(1)))
        .await
        .expect("fits");
    let start = Instant::now();
    let refused = admission
        .acquire(&scope(100 * MS))
        .await
        .expect_err("never freed");
    assert_eq!(refused.reason(), Reason::WouldNotFinish);
    assert_eq!(
        Instant::now() - start,
        70 * MS,
        "left at deadline - service time"
    );
}

#[tokio::test(start_paused = true)]
async fn observed_hold_times_become_the_expected_service_time() {
    let admission = Admission::new(1).smoothing(1.0);
    let permit = admission
        .acquire(&Scope::background())
        .await
        .expect("granted");
    advance(40 * MS).await;
    drop(permit);
    assert_eq!(admission.stats().service_time, Some(40 * MS));
    let refused = admission
        .try_acquire(&scope(30 * MS))
        .expect_err("30 ms left cannot fit the observed 40 ms");
    assert_eq!(refused.reason(), Reason::WouldNotFinish);
}

#[tokio::test(start_paused = true)]
async fn an_estimate_from_a_slow_spell_comes_down_once_the_work_is_fast_again() {
    let admission = Admission::new(2).smoothing(0.5);
    // One slow spell: a permit held 400 ms sets the estimate above every
    // caller's 100 ms budget.
    let slow = admission
        .acquire(&Scope::background())
        .await
        .expect("granted");
    advance(400 * MS).await;
    drop(slow);
    assert_eq!(admission.stats().service_time, Some(400 * MS));
    let refused = admission
        .try_acquire(&scope(100 * MS))
        .expect_err("a fresh 400 ms estimate refuses a 100 ms budget");
    assert_eq!(refused.reason(), Reason::WouldNotFinish);

    // The work is fast again (10 ms). Callers keep arriving; once the
    // estimate is as old as itself, an idle resource admits one as a probe.
    // Each probe halves the estimate (smoothing 0.5): 400, 205, 107, then
    // 58 ms, which fits a 100 ms budget.
    let mut served = Vec::new();
    for _ in 0..200 {
        advance(5 * MS).await;
        let ok = match admission.try_acquire(&scope(100 * MS)) {
            Ok(permit) => {
                assert!(
                    admission.try_acquire(&scope(100 * MS)).is_err()
                        || admission.stats().service_time < Some(100 * MS),
                    "while the estimate is stale, only one probe at a time"
                );
                advance(10 * MS).await;
                drop(permit);
                true
            }
            Err(_) => false,
        };
        served.push(ok);
    }
    let stats = admission.stats();
    assert!(
        stats.service_time < Some(20 * MS),
        "the estimate must come down to the fast work: {stats:?}"
    );
    assert_eq!(stats.probes, 3, "{stats:?}");
    assert!(
        served[150..].iter().all(|ok| *ok),
        "callers must be served again, not refused for good: {served:?}, {stats:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_seeded_estimate_refuses_its_first_caller_however_long_the_resource_was_idle() {
    let admission = Admission::new(1).expected_service_time(200 * MS);
    advance(Duration::from_secs(60)).await;
    let refused = admission
        .try_acquire(&scope(100 * MS))
        .expect_err("an idle minute is no evidence against the seed");
    assert_eq!(refused.reason(), Reason::WouldNotFinish);
    advance(199 * MS).await;
    admission
        .try_acquire(&scope(100 * MS))
        .expect_err("refusing for less than the estimate: still no probe");
    advance(MS).await;
    let probe = admission
        .try_acquire(&scope(100 * MS))
        .expect("refusing for as long as the estimate: one probe goes in");
    assert_eq!(admission.stats().probes, 1);
    advance(10 * MS).await;
    drop(probe);
    let stats = admission.stats();
    assert!(stats.service_time < Some(200 * MS), "{stats:?}");
    assert_eq!(stats.would_not_finish, 2, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn an_absurd_expected_service_time_refuses_deadlines_and_never_panics() {
    let admission = Admission::new(1)
        .expected_service_time(Duration::MAX)
        .reserve(Duration::from_secs(1));
    let refused = admission
        .acquire(&scope(Duration::from_secs(3600)))
        .await
        .expect_err("no deadline fits an endless service time");
    assert_eq!(refused.reason(), Reason::WouldNotFinish);
    let permit = admission
        .acquire(&Scope::background())
        .await
        .expect("work without a deadline always fits");
    advance(MS).await;
    drop(permit);
    assert!(admission.stats().service_time.is_some());
}

#[tokio::test(start_paused = true)]
async fn dropping_a_granted_but_unclaimed_wait_hands_the_permit_on() {
    let admission = Admission::new(1);
    let held = admission
        .acquire(&Scope::background())
        .await
        .expect("granted");
    let first = tokio::spawn({
        let admission = admission.clone();
        async move { admission.acquire(&Scope::background()).await }
    });
    tokio::task::yield_now().await;
    let second = tokio::spawn({
        let admission = admission.clone();
        async move { admission.acquire(&Scope::background()).await }
    });
    tokio::task::yield_now().await;
    first.abort();
    drop(held);
    let _ = first.await;
    let permit = second
        .await
        .expect("no panic")
        .expect("the permit must reach the remaining waiter");
    let stats = admission.stats();
    assert_eq!((stats.in_use, stats.queued), (1, 0));
    drop(permit);
    assert_eq!(admission.stats().in_use, 0);
}

async fn order_of_service(admission: &Admission, waiters: usize, gap: Duration) -> Vec<usize> {
    let held = admission
        .acquire(&Scope::background())
        .await
        .expect("granted");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..waiters {
        let (admission, tx) = (admission.clone(), tx.clone());
        tokio::spawn(async move {
            let permit = admission.acquire(&Scope::background()).await;
            let _ = tx.send(i);
            drop(permit);
        });
        tokio::task::yield_now().await;
        advance(gap).await;
    }
    drop(tx);
    drop(held);
    let mut order = Vec::new();
    while let Some(i) = rx.recv().await {
        order.push(i);
    }
    order
}

#[tokio::test(start_paused = true)]
async fn adaptive_lifo_is_fifo_when_calm_and_serves_the_newest_when_congested() {
    let adaptive = Discipline::AdaptiveLifo { after: 10 * MS };
    let calm = order_of_service(&Admission::new(1).discipline(adaptive), 3, MS).await;
    assert_eq!(calm, vec![0, 1, 2], "a short burst is served in order");

    let congested = order_of_service(&Admission::new(1).discipline(adaptive), 3, 10 * MS).await;
    assert_eq!(
        congested.first(),
        Some(&2),
        "a standing queue serves the newest first: {congested:?}"
    );

    let fifo = order_of_service(&Admission::new(1).discipline(Discipline::Fifo), 3, 10 * MS).await;
    assert_eq!(fifo, vec![0, 1, 2]);
}

#[tokio::test(start_paused = true)]
async fn bounded_queue_refuses_or_evicts_the_oldest() {
    let fifo = Admission::new(1).discipline(Discipline::Fifo).max_queue(1);
    let _held = fifo.acquire(&Scope::background()).await.expect("granted");
    let waiting = tokio::spawn({
        let fifo = fifo.clone();
        async move { fifo.acquire(&scope(Duration::from_secs(1))).await }
    });
    tokio::task::yield_now().await;
    let refused = fifo
        .acquire(&Scope::background())
        .await
        .expect_err("the queue is full");
    assert_eq!(refused.reason(), Reason::QueueFull);
    assert_eq!(refused.code(), crate::Code::ResourceExhausted);
    waiting.abort();

    let lifo = Admission::new(1).discipline(Discipline::Lifo).max_queue(1);
    let _held = lifo.acquire(&Scope::background()).await.expect("granted");
    let oldest = tokio::spawn({
        let lifo = lifo.clone();
        async move { lifo.acquire(&Scope::background()).await }
    });
    tokio::task::yield_now().await;
    let newest = tokio::spawn({
        let lifo = lifo.clone();
        async move { lifo.acquire(&scope(Duration::from_secs(1))).await }
    });
    let evicted = oldest
        .await
        .expect("no panic")
        .expect_err("evicted for the newest");
    assert_eq!(evicted.reason(), Reason::QueueFull);
    assert_eq!(lifo.stats().queued, 1);
    newest.abort();
}

#[tokio::test(start_paused = true)]
async fn hundred_thousand_cancelled_acquires_leak_nothing() {
    let admission = Admission::new(4).expected_service_time(5 * MS);
    let holders: Vec<Permit> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(
                admission
                    .acquire(&Scope::background())
                    .await
                    .expect("granted"),
            );
        }
        v
    };
    let tasks_before = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let mut refused = 0u64;
    for round in 0..100 {
        let mut waits = tokio::task::JoinSet::new();
        let scopes: Vec<Scope> = (0..1000)
            .map(|i| scope(Duration::from_millis(10 + (i % 50))))
            .collect();
        for (i, s) in scopes.iter().enumerate() {
            let (admission, s) = (admission.clone(), s.clone());
            waits.spawn(async move {
                match i % 3 {
                    // Cancelled by its caller while queued.
                    0 => admission.acquire(&s).await,
                    // Its deadline passes while queued.
                    1 => admission.acquire(&s).await,
                    // Its future is dropped while queued.
                    _ => {
                        tokio::select! {
                            r = admission.acquire(&s) => r,
                            () = tokio::time::sleep(MS) => Err(Refused::new(Reason::QueueFull)),
                        }
                    }
                }
            });
        }
        tokio::task::yield_now().await;
        for s in scopes.iter().step_by(3) {
            s.cancel();
        }
        if round % 10 == 0 {
            // Free and retake one permit mid-round, so grants race with exits.
            drop(admission.try_acquire(&Scope::background()));
        }
        advance(Duration::from_millis(100)).await;
        while let Some(done) = waits.join_next().await {
            if done.expect("no panic").is_err() {
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 100_000, "every call was cancelled or expired");
    let stats = admission.stats();
    assert_eq!(stats.queued, 0, "no waiter may stay queued");
    assert_eq!(stats.in_use, 4, "only the four real holders hold permits");
    drop(holders);
    assert_eq!(admission.stats().in_use, 0, "no permit leaked");
    let mut all = Vec::new();
    for _ in 0..4 {
        all.push(
            admission
                .try_acquire(&Scope::background())
                .expect("every permit is free again"),
        );
    }
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        tasks_before,
        "no task leaked"
    );
}

#[cfg(feature = "tonic")]
#[test]
fn a_refusal_answers_its_code_in_tonic_boxed_or_not() {
    let reasons = Cause::ALL
        .map(Reason::Ended)
        .into_iter()
        .chain([Reason::WouldNotFinish, Reason::QueueFull]);
    for reason in reasons {
        let refused = Refused::new(reason);
        let code = tonic::Code::from(refused.code());
        assert_eq!(tonic::Status::from(refused).code(), code, "{reason:?}");
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(refused);
        assert_eq!(
            tonic::Status::from_error(boxed).code(),
            code,
            "{reason:?}, boxed"
        );
    }
}
