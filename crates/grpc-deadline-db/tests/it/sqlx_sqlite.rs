//! The sqlx SQLite pool on real database files: cancellation reaches the
//! statement, cleanup is deterministic, queue time spends the
//! budget — and plain sqlx, for contrast, runs a dropped query on.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use grpc_deadline::admission::Admission;
use grpc_deadline::{Cause, Code, Scope};
use grpc_deadline_db::sqlx_sqlite::{SqlxSqliteConn, SqlxSqlitePool, sqlx};
use sqlx::{Connection, Executor, Row};
use tokio::time::Instant;

use crate::support::{Cuts, hundred_thousand_cancelled_calls, settle};

/// Counts forever: far more than any budget in these tests.
const ENDLESS: &str =
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";

/// Counts to 5·10⁶: about two seconds in the test build (SQLite compiled
/// without optimisation), a fraction of one in a release build.
const SECONDS: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5000000) \
                       SELECT count(*) FROM c";

async fn one(conn: &mut SqlxSqliteConn) -> i64 {
    conn.fetch_all(sqlx::query("SELECT 1"))
        .await
        .expect("SELECT 1")[0]
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_sqlx_sqlite_runs_a_dropped_query_to_its_end() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("plain.db").display()
    );
    let mut conn = sqlx::SqliteConnection::connect(&url).await.expect("open");
    let dropped = tokio::time::timeout(Duration::from_millis(100), conn.execute(SECONDS)).await;
    assert!(
        dropped.is_err(),
        "the outer timeout must drop the query future"
    );
    let next = Instant::now();
    conn.execute("SELECT 1")
        .await
        .expect("the next query works");
    assert!(
        next.elapsed() >= Duration::from_millis(300),
        "plain sqlx: the next query must wait for the abandoned one, waited {:?}",
        next.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_interrupts_the_sqlx_statement_and_the_connection_is_reusable_at_once() {
    let pool = SqlxSqlitePool::open_in_memory(1).expect("opens");
    let scope = Scope::background().with_timeout(Duration::from_millis(200));
    let mut conn = pool.acquire(&scope).await.expect("a connection");
    let start = Instant::now();
    let err = conn
        .fetch_all(sqlx::query(ENDLESS))
        .await
        .expect_err("an endless query must be stopped");
    let stopped = start.elapsed();
    assert_eq!(err.cause(), Some(Cause::DeadlineExceeded));
    assert_eq!(err.code(), Code::DeadlineExceeded);
    assert!(
        stopped < Duration::from_secs(2),
        "stopped near the 200 ms deadline, not when the query ends: {stopped:?}"
    );
    drop(conn);
    settle(&pool, 1).await;
    let stats = pool.stats();
    assert_eq!(
        (stats.idle, stats.cancels, stats.discarded),
        (1, 1, 0),
        "the connection is back: {stats:?}"
    );
    let mut again = pool.acquire(&Scope::background()).await.expect("again");
    let ready = Instant::now();
    assert_eq!(one(&mut again).await, 1, "the same connection must work");
    assert!(
        ready.elapsed() < Duration::from_millis(500),
        "and at once: {:?}",
        ready.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_scope_leaves_no_live_progress_handler_on_the_connection() {
    let pool = SqlxSqlitePool::open_in_memory(1).expect("opens");
    let scope = Scope::background();
    let mut conn = pool.acquire(&scope).await.expect("a connection");
    assert_eq!(one(&mut conn).await, 1);
    drop(conn);
    scope.cancel(); // the old handler's scope is now ended
    settle(&pool, 1).await;
    let mut next = pool.acquire(&Scope::background()).await.expect("next");
    let counted: i64 = next
        .fetch_all(sqlx::query(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000) \
             SELECT count(*) FROM c",
        ))
        .await
        .expect("a statement under a live scope must run to its end")[0]
        .get(0);
    assert_eq!(counted, 100_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_cancel_interrupts_the_statement() {
    let pool = SqlxSqlitePool::open_in_memory(1).expect("opens");
    let scope = Scope::background();
    let mut conn = pool.acquire(&scope).await.expect("a connection");
    let canceller = scope.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        canceller.cancel();
    });
    let err = conn
        .fetch_all(sqlx::query(ENDLESS))
        .await
        .expect_err("cancelled");
    assert_eq!(err.cause(), Some(Cause::Cancelled));
    assert_eq!(err.code(), Code::Cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_call_stops_the_statement_and_returns_the_connection() {
    let pool = SqlxSqlitePool::open_in_memory(1).expect("opens");
    let never_ends = Scope::background();
    let mut conn = pool.acquire(&never_ends).await.expect("a connection");
    // A plain timeout drops the future; the scope itself never ends.
    let _ = tokio::time::timeout(
        Duration::from_millis(50),
        conn.fetch_all(sqlx::query(ENDLESS)),
    )
    .await;
    drop(conn);
    settle(&pool, 1).await;
    let stats = pool.stats();
    assert_eq!(
        (stats.idle, stats.cleanups_running, stats.discarded),
        (1, 0, 0),
        "the statement must stop after its future is dropped: {stats:?}"
    );
    let mut again = pool.acquire(&Scope::background()).await.expect("again");
    assert_eq!(one(&mut again).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_transaction_is_rolled_back_before_the_connection_is_reused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("t.db");
    {
        let pool = SqlxSqlitePool::open(&path, 1).expect("opens");
        let mut conn = pool.acquire(&Scope::background()).await.expect("conn");
        conn.execute(sqlx::query("CREATE TABLE t (x INTEGER)"))
            .await
            .expect("schema");
    }
    // A pool of its own for the test: creating the file can hold the
    // connection longer than the budget below on a busy machine, and the
    // pool's admission would learn that as its service time and refuse the
    // call as one that could not finish.
    let pool = SqlxSqlitePool::open(&path, 1).expect("opens");
    let mut warm = pool.acquire(&Scope::background()).await.expect("conn");
    assert_eq!(one(&mut warm).await, 1);
    drop(warm);
    settle(&pool, 1).await;
    let scope = Scope::background().with_timeout(Duration::from_millis(100));
    let mut conn = pool.acquire(&scope).await.expect("conn");
    let err = conn
        .run(|c| {
            Box::pin(async move {
                c.execute("BEGIN").await?;
                c.execute("INSERT INTO t VALUES (1)").await?;
                c.execute(ENDLESS).await?;
                Ok(())
            })
        })
        .await
        .expect_err("stopped mid-transaction");
    assert_eq!(err.cause(), Some(Cause::DeadlineExceeded));
    drop(conn);
    settle(&pool, 1).await;
    let mut conn = pool.acquire(&Scope::background()).await.expect("conn");
    let rows: i64 = conn
        .fetch_all(sqlx::query("SELECT count(*) FROM t"))
        .await
        .expect("count")[0]
        .get(0);
    assert_eq!(
        rows, 0,
        "the stopped transaction's insert must be rolled back"
    );
    conn.execute(sqlx::query("INSERT INTO t VALUES (2)"))
        .await
        .expect("no transaction may be left open: a new write must work");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_time_for_a_connection_spends_the_budget() {
    let pool = SqlxSqlitePool::open_in_memory(1).expect("opens");
    let holder = pool.acquire(&Scope::background()).await.expect("the one");
    let scope = Scope::background().with_timeout(Duration::from_millis(100));
    let start = Instant::now();
    let err = pool
        .acquire(&scope)
        .await
        .expect_err("no connection frees up within the budget");
    assert_eq!(err.cause(), Some(Cause::DeadlineExceeded));
    assert!(start.elapsed() < Duration::from_secs(1));
    drop(holder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_cancelled_calls_leak_no_connection_permit_or_task() {
    // An admission that never learns a service time admits every caller, so
    // statements really start and are interrupted (the default one would
    // soon refuse these 1–3 ms budgets before they take a connection).
    let admission = Admission::new(2)
        .expected_service_time(Duration::ZERO)
        .smoothing(f64::MIN_POSITIVE);
    let options = sqlx::sqlite::SqlitePoolOptions::new()
        .idle_timeout(None)
        .max_lifetime(None);
    let connect = "sqlite::memory:".parse().expect("in-memory options");
    let pool = SqlxSqlitePool::builder(connect)
        .size(2)
        .pool_options(options)
        .admission(admission)
        .build()
        .expect("pool");
    {
        let mut a = pool.acquire(&Scope::background()).await.expect("a");
        let mut b = pool.acquire(&Scope::background()).await.expect("b");
        one(&mut a).await;
        one(&mut b).await;
    }
    settle(&pool, 2).await;
    let cuts = Cuts {
        shortest_ms: 1,
        spread_ms: 3,
        drop_after: Duration::from_micros(500),
    };
    let stats = hundred_thousand_cancelled_calls(&pool, cuts, |pool, scope| async move {
        let mut conn = pool.acquire(&scope).await?;
        conn.fetch_all(sqlx::query(ENDLESS)).await
    })
    .await;
    assert_eq!(stats.idle, 2, "both connections are back: {stats:?}");
    // Most calls end while queued for one of the two connections (about
    // 200 reach their statement on an idle machine, 40 on a loaded one):
    // enough must have run to be interrupted for the leak check to mean it.
    assert!(
        stats.cancels >= 10,
        "statements really ran and were interrupted: {stats:?}"
    );
    let mut conn = pool.acquire(&Scope::background()).await.expect("usable");
    assert_eq!(one(&mut conn).await, 1);
}
