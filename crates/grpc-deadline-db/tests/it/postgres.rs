//! The PostgreSQL pool against a real server: cancellation reaches the
//! statement *on the server*, cleanup is deterministic.
//!
//! Built with the crate's `postgres-tests` feature, which `scripts/test-all`
//! turns on (through `--all-features`) after starting a throwaway server and
//! exporting its address as `TONIC_DEADLINE_PG_URL`.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use grpc_deadline::{Cause, Scope};
use grpc_deadline_db::postgres::{PgConn, PgPool};
use tokio::time::Instant;

use crate::pg::{self, active, monitor, url};
use crate::support::{Cuts, hundred_thousand_cancelled_calls, settle};

async fn backend_pid(conn: &mut PgConn) -> i32 {
    conn.query("SELECT pg_backend_pid()", &[])
        .await
        .expect("pid")[0]
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_stops_the_statement_on_the_server_and_the_connection_returns_healthy() {
    let pool = PgPool::connect(&url(), 1).expect("pool");
    let monitor = monitor().await;
    let scope = Scope::background().with_timeout(Duration::from_millis(200));
    let mut conn = pool.acquire(&scope).await.expect("a connection");
    let pid = backend_pid(&mut conn).await;
    let start = Instant::now();
    let err = conn
        .query("SELECT pg_sleep(5)", &[])
        .await
        .expect_err("a 5 s statement cannot finish in 200 ms");
    let stopped = start.elapsed();
    assert_eq!(err.cause(), Some(Cause::DeadlineExceeded));
    assert!(
        !active(&monitor, pid).await,
        "the statement must have stopped on the server, not only in the client"
    );
    assert!(
        stopped < Duration::from_secs(2),
        "stopped near the deadline: {stopped:?}"
    );
    drop(conn);
    let stats = pool.stats();
    assert_eq!(
        (stats.size, stats.idle),
        (1, 1),
        "the connection is back: {stats:?}"
    );
    let mut again = pool.acquire(&Scope::background()).await.expect("reusable");
    assert_eq!(
        backend_pid(&mut again).await,
        pid,
        "the same connection, healthy"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_cancel_sends_a_cancel_request() {
    pg::caller_cancel_stops_the_statement_on_the_server(PgPool::connect(&url(), 1).expect("pool"))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_from_the_budget_stops_the_server_without_a_cancel_request() {
    let pool = PgPool::builder(url().parse().expect("url"))
        .size(1)
        .cancel_requests(false)
        .build()
        .expect("pool");
    let monitor = monitor().await;
    let scope = Scope::background().with_timeout(Duration::from_millis(1500));
    let mut conn = pool.acquire(&scope).await.expect("a connection");
    let shown: String = conn
        .query("SHOW statement_timeout", &[])
        .await
        .expect("show")[0]
        .get(0);
    let ms: u64 = shown.trim_end_matches("ms").parse().unwrap_or(u64::MAX);
    let shown_ms = if shown.ends_with('s') && !shown.ends_with("ms") {
        shown
            .trim_end_matches('s')
            .parse::<u64>()
            .map_or(u64::MAX, |s| s * 1000)
    } else {
        ms
    };
    assert!(
        (1000..=1500).contains(&shown_ms),
        "statement_timeout must be the remaining budget, got {shown}"
    );
    let pid = backend_pid(&mut conn).await;
    let start = Instant::now();
    let err = conn
        .query("SELECT pg_sleep(5)", &[])
        .await
        .expect_err("stopped by the server's own timeout");
    assert_eq!(err.cause(), Some(Cause::DeadlineExceeded));
    assert!(
        !active(&monitor, pid).await,
        "the server stopped it on its own"
    );
    assert_eq!(pool.stats().cancels, 0, "no cancel request was sent");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "well before the 5 s query would end"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_call_still_stops_the_statement_on_the_server() {
    pg::dropping_the_call_stops_the_statement_on_the_server(
        PgPool::connect(&url(), 1).expect("pool"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_transaction_is_rolled_back() {
    let pool = PgPool::connect(&url(), 1).expect("pool");
    let table = format!("t_{}", std::process::id());
    // The schema is made on a connection of its own: a pool connection
    // held for it (its connect included, slow on a loaded machine) would
    // teach the pool's admission a service time above the 200 ms budget
    // below, and the call would be refused before it began.
    monitor()
        .await
        .batch_execute(&format!("CREATE TABLE IF NOT EXISTS {table} (x int)"))
        .await
        .expect("schema");
    let scope = Scope::background().with_timeout(Duration::from_millis(200));
    let mut conn = pool.acquire(&scope).await.expect("conn");
    conn.begin().await.expect("begin");
    conn.execute(&format!("INSERT INTO {table} VALUES (1)"), &[])
        .await
        .expect("insert");
    let err = conn
        .query("SELECT pg_sleep(5)", &[])
        .await
        .expect_err("stopped");
    assert_eq!(err.cause(), Some(Cause::DeadlineExceeded));
    drop(conn);
    let mut conn = pool.acquire(&Scope::background()).await.expect("conn");
    let rows: i64 = conn
        .query(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .expect("count")[0]
        .get(0);
    assert_eq!(rows, 0, "the stopped transaction must be rolled back");
    conn.batch_execute(&format!("DROP TABLE {table}"))
        .await
        .expect("drop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_cancelled_calls_leak_no_connection_permit_or_task() {
    let pool = PgPool::connect(&url(), 4).expect("pool");
    let monitor = monitor().await;
    // Open all four connections first, so their tasks count in the baseline.
    {
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(pool.acquire(&Scope::background()).await.expect("conn"));
        }
    }
    settle(&pool, 4).await;
    let cuts = Cuts {
        shortest_ms: 2,
        spread_ms: 5,
        drop_after: Duration::from_millis(1),
    };
    let stats = hundred_thousand_cancelled_calls(&pool, cuts, |pool, scope| async move {
        let mut conn = pool.acquire(&scope).await?;
        conn.query("SELECT pg_sleep(10)", &[]).await
    })
    .await;
    pg::nothing_runs_on_and_the_pool_serves(&pool, &monitor, stats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_while_its_statement_is_being_stopped_leaves_no_dirty_connection() {
    pg::a_call_dropped_mid_stop_leaves_no_dirty_connection(
        PgPool::connect(&url(), 1).expect("pool"),
    )
    .await;
}
