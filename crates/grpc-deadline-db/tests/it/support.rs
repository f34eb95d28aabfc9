//! What the tests of every pool share: the leak test's body, run against
//! each backend, and the wait for a pool to settle.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use std::future::Future;
use std::time::Duration;

use grpc_deadline::Scope;
use grpc_deadline::admission::Admission;
use grpc_deadline_db::{Error, PoolStats};
use tokio::time::Instant;

/// What the leak test reads of a pool: every pool reports the same stats
/// and has an admission in front of its connections.
pub(crate) trait Pool: Clone + Send + Sync + 'static {
    fn stats(&self) -> PoolStats;
    fn admission(&self) -> &Admission;
}

macro_rules! pools {
    ($($feature:literal => $pool:ty,)*) => {$(
        #[cfg(feature = $feature)]
        impl Pool for $pool {
            fn stats(&self) -> PoolStats {
                <$pool>::stats(self)
            }
            fn admission(&self) -> &Admission {
                <$pool>::admission(self)
            }
        }
    )*};
}

pools! {
    "sqlite" => grpc_deadline_db::sqlite::SqlitePool,
    "sqlx-sqlite" => grpc_deadline_db::sqlx_sqlite::SqlxSqlitePool,
    "postgres" => grpc_deadline_db::postgres::PgPool,
    "sqlx-postgres" => grpc_deadline_db::sqlx_postgres::SqlxPgPool,
}

/// How the leak test cuts its calls short.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cuts {
    /// The shortest budget a call gets, in ms; each gets 0 to
    /// `spread_ms - 1` more.
    pub(crate) shortest_ms: u64,
    pub(crate) spread_ms: u64,
    /// Every fourth call is dropped by an outer timeout this long, mid-wait
    /// or mid-statement.
    pub(crate) drop_after: Duration,
}

/// Makes 100 000 calls, each taking a connection of `pool` under a scope
/// of a few milliseconds and running a statement that does not end on its
/// own (`call`): a fifth are cancelled by their caller, the rest expire
/// queued or mid-statement, a quarter are dropped by an outer timeout.
/// Every call must fail; then, once the pool has settled, every connection
/// is idle again, nothing is queued, no permit is held, no clean-up runs,
/// and no task is alive that was not before (beyond one a connection the
/// pool reopened after discarding one). Returns the stats, for the
/// backend's own checks.
///
/// Open the pool's connections first, so that their tasks count in the
/// baseline.
pub(crate) async fn hundred_thousand_cancelled_calls<P, C, F, T>(
    pool: &P,
    cuts: Cuts,
    call: C,
) -> PoolStats
where
    P: Pool,
    C: Fn(P, Scope) -> F + Copy + Send + 'static,
    F: Future<Output = Result<T, Error>> + Send,
    T: Send + 'static,
{
    let metrics = tokio::runtime::Handle::current().metrics();
    let tasks_before = metrics.num_alive_tasks();
    let mut stopped = 0u64;
    for round in 0..100u64 {
        let mut calls = tokio::task::JoinSet::new();
        let mut scopes = Vec::new();
        for i in 0..1000u64 {
            let budget = cuts.shortest_ms + (i + round) % cuts.spread_ms;
            let scope = Scope::background().with_timeout(Duration::from_millis(budget));
            scopes.push(scope.clone());
            let pool = pool.clone();
            calls.spawn(async move {
                match i % 4 {
                    3 => tokio::time::timeout(cuts.drop_after, call(pool, scope))
                        .await
                        .map_or(true, |r| r.is_err()),
                    _ => call(pool, scope).await.is_err(),
                }
            });
        }
        for scope in scopes.iter().step_by(5) {
            scope.cancel();
        }
        while let Some(done) = calls.join_next().await {
            if done.expect("no panic") {
                stopped += 1;
            }
        }
    }
    assert_eq!(
        stopped, 100_000,
        "every call was cancelled, expired or dropped"
    );
    // Clean-ups of dropped calls finish on tasks of their own, and the
    // task that carries a last cancel request may still be closing its
    // connection: what is left 10 s later has leaked.
    let allowed = |stats: PoolStats| tasks_before + stats.discarded as usize;
    let settled = |stats: PoolStats| {
        stats.idle == stats.size
            && stats.cleanups_running == 0
            && metrics.num_alive_tasks() <= allowed(stats)
    };
    let waited = Instant::now();
    while !settled(pool.stats()) && waited.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let stats = pool.stats();
    eprintln!("after 100 000 cancelled calls: {stats:?}");
    assert_eq!(stats.idle, stats.size, "no connection leaked: {stats:?}");
    assert!(stats.size <= stats.max_size, "{stats:?}");
    assert_eq!(stats.queued, 0, "no caller left queued");
    assert_eq!(stats.cleanups_running, 0, "no statement left running");
    assert_eq!(pool.admission().stats().in_use, 0, "no permit leaked");
    assert!(
        metrics.num_alive_tasks() <= allowed(stats),
        "no task leaked: {} alive, {} before",
        metrics.num_alive_tasks(),
        tasks_before
    );
    stats
}

/// Waits (at most 10 s) until `pool` holds `idle` idle connections and no
/// clean-up runs; fails the test if it never does (a pool opens its
/// connections on first use: a fresh one never settles).
#[cfg(any(feature = "sqlx-sqlite", feature = "postgres-tests"))]
pub(crate) async fn settle(pool: &impl Pool, idle: usize) {
    let waited = Instant::now();
    while pool.stats().idle < idle || pool.stats().cleanups_running > 0 {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "the pool did not settle at {idle} idle: {:?}",
            pool.stats()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
