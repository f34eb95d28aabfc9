//! The SQLite pool: cancellation reaches the query, cleanup is
//! deterministic, queue time spends the budget.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use grpc_deadline::{Cause, Code, Scope};
use grpc_deadline_db::Error;
use grpc_deadline_db::sqlite::{SqlitePool, rusqlite};
use tokio::time::Instant;

use crate::support::{Cuts, hundred_thousand_cancelled_calls};

/// Counts forever: far more than any budget in these tests.
const ENDLESS: &str =
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";

fn endless(conn: &mut rusqlite::Connection) -> rusqlite::Result<i64> {
    conn.query_row(ENDLESS, [], |r| r.get(0))
}

fn one(conn: &mut rusqlite::Connection) -> rusqlite::Result<i64> {
    conn.query_row("SELECT 1", [], |r| r.get(0))
}

/// Takes a connection under `scope` and runs `query` on it: one call.
async fn call<T, F>(pool: &SqlitePool, scope: &Scope, query: F) -> Result<T, Error>
where
    F: FnOnce(&mut rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    T: Send + 'static,
{
    pool.acquire(scope).await?.run(query).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_interrupts_the_running_query_and_the_connection_is_reusable_at_once() {
    let pool = SqlitePool::open_in_memory(1).expect("opens");
    let scope = Scope::background().with_timeout(Duration::from_millis(200));
    let start = Instant::now();
    let err = call(&pool, &scope, endless)
        .await
        .expect_err("an endless query must be stopped");
    let stopped = start.elapsed();
    assert_eq!(err.cause(), Some(Cause::DeadlineExceeded));
    assert!(
        stopped < Duration::from_secs(2),
        "stopped near the 200 ms deadline, not when the query ends: {stopped:?}"
    );
    let stats = pool.stats();
    assert_eq!(
        (stats.idle, stats.cancels, stats.cleanups_running),
        (1, 1, 0),
        "the connection is back: {stats:?}"
    );
    let again = call(&pool, &Scope::background(), one)
        .await
        .expect("the same connection must work at once");
    assert_eq!(again, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquired_connection_serves_many_queries_and_returns_to_the_pool_when_dropped() {
    let pool = SqlitePool::open_in_memory(1).expect("opens");
    let mut conn = pool
        .acquire(&Scope::background())
        .await
        .expect("a connection");
    conn.run(|c| c.execute_batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (7)"))
        .await
        .expect("schema");
    let x = conn
        .run(|c| c.query_row("SELECT x FROM t", [], |r| r.get::<_, i64>(0)))
        .await
        .expect("the same connection sees its own table");
    assert_eq!(x, 7);
    assert_eq!(pool.stats().idle, 0, "held while the connection is");
    drop(conn);
    assert_eq!(pool.stats().idle, 1, "back in the pool once dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_query_is_interrupted_and_the_next_query_on_its_connection_runs() {
    let pool = SqlitePool::open_in_memory(1).expect("opens");
    // No deadline: only the dropped call can stop the first query.
    let mut conn = pool
        .acquire(&Scope::background())
        .await
        .expect("a connection");
    let dropped = tokio::time::timeout(Duration::from_millis(50), conn.run(endless)).await;
    assert!(dropped.is_err(), "the outer timeout must drop the call");
    let next = tokio::time::timeout(Duration::from_secs(5), conn.run(one))
        .await
        .expect("the dropped query must stop, not run on")
        .expect("the connection must work");
    assert_eq!(next, 1);
    let stats = pool.stats();
    assert_eq!(
        (stats.idle, stats.cleanups_running),
        (0, 0),
        "nothing left running, the connection still held: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_cancel_interrupts_the_query() {
    let pool = SqlitePool::open_in_memory(1).expect("opens");
    let scope = Scope::background();
    let canceller = scope.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        canceller.cancel();
    });
    let err = call(&pool, &scope, endless).await.expect_err("cancelled");
    assert_eq!(err.cause(), Some(Cause::Cancelled));
    assert_eq!(err.code(), Code::Cancelled);
    assert_eq!(pool.stats().idle, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_call_stops_the_query_and_returns_the_connection() {
    let pool = SqlitePool::open_in_memory(1).expect("opens");
    let never_ends = Scope::background();
    let dropped = call(&pool, &never_ends, endless);
    // A plain timeout drops the future; the scope itself never ends.
    let _ = tokio::time::timeout(Duration::from_millis(50), dropped).await;
    let waited = Instant::now();
    while pool.stats().idle < 1 {
        assert!(
            waited.elapsed() < Duration::from_secs(5),
            "the query must stop after its future is dropped"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        call(&pool, &Scope::background(), one)
            .await
            .expect("usable"),
        1
    );
    assert_eq!(pool.stats().cleanups_running, 0, "{:?}", pool.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_transaction_is_rolled_back_before_the_connection_is_reused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("t.db");
    let schema = SqlitePool::open(&path, 1).expect("opens");
    call(&schema, &Scope::background(), |c| {
        c.execute_batch("CREATE TABLE t (x INTEGER)")
    })
    .await
    .expect("schema");
    // A pool of its own for the test, whose admission has not learned the
    // file's (possibly slow) creation as its service time.
    let pool = SqlitePool::open(&path, 1).expect("opens");
    let scope = Scope::background().with_timeout(Duration::from_millis(100));
    let err = call(&pool, &scope, |c| {
        c.execute_batch("BEGIN; INSERT INTO t VALUES (1);")?;
        endless(c)
    })
    .await
    .expect_err("stopped mid-transaction");
    assert_eq!(err.cause(), Some(Cause::DeadlineExceeded));
    let (rows, autocommit) = call(&pool, &Scope::background(), |c| {
        let rows: i64 = c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?;
        Ok((rows, c.is_autocommit()))
    })
    .await
    .expect("usable");
    assert_eq!(
        rows, 0,
        "the stopped transaction's insert must be rolled back"
    );
    assert!(autocommit, "no transaction may be left open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_cancelled_calls_leak_no_connection_permit_or_task() {
    let pool = SqlitePool::open_in_memory(2).expect("opens");
    let cuts = Cuts {
        shortest_ms: 1,
        spread_ms: 3,
        drop_after: Duration::from_micros(500),
    };
    let stats = hundred_thousand_cancelled_calls(&pool, cuts, |pool, scope| async move {
        call(&pool, &scope, endless).await
    })
    .await;
    assert_eq!(stats.idle, 2, "both connections are back: {stats:?}");
    assert_eq!(
        call(&pool, &Scope::background(), one)
            .await
            .expect("usable"),
        1
    );
}
