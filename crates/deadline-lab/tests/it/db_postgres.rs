//! The PostgreSQL pool against a real server: cancellation reaches the
//! statement *on the server* (R-22), cleanup is deterministic.
//!
//! Built only with the lab's `postgres-tests` feature, which `scripts/test-all`
//! turns on (through `--all-features`) after starting a throwaway server and
//! exporting its address as `TONIC_DEADLINE_PG_URL`.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use grpc_deadline_db::postgres::{PgPool, tokio_postgres};
use tokio::time::Instant;
use tonic_deadline::{Cause, Scope};

fn url() -> String {
    std::env::var("TONIC_DEADLINE_PG_URL").expect(
        "TONIC_DEADLINE_PG_URL must name a live PostgreSQL server: run scripts/test-all, \
         or source scripts/postgres first (these tests are built by the lab's postgres-tests feature)",
    )
}

/// A separate connection that watches the server.
async fn monitor() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .expect("the test server must accept connections");
    tokio::spawn(connection);
    client
}

/// Whether backend `pid` is running a statement right now.
async fn active(monitor: &tokio_postgres::Client, pid: i32) -> bool {
    let row = monitor
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'active'",
            &[&pid],
        )
        .await
        .expect("pg_stat_activity is readable");
    row.get::<_, i64>(0) > 0
}

async fn backend_pid(conn: &mut grpc_deadline_db::postgres::PgConn) -> i32 {
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
    let pool = PgPool::connect(&url(), 1).expect("pool");
    let monitor = monitor().await;
    let scope = Scope::background();
    let mut conn = pool.acquire(&scope).await.expect("a connection");
    let pid = backend_pid(&mut conn).await;
    let canceller = scope.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        canceller.cancel();
    });
    let err = conn
        .query("SELECT pg_sleep(5)", &[])
        .await
        .expect_err("cancelled");
    assert_eq!(err.cause(), Some(Cause::Cancelled));
    assert!(!active(&monitor, pid).await, "stopped on the server");
    assert_eq!(
        pool.stats().cancels,
        1,
        "stopped by a cancel request (no deadline here)"
    );
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
    let pool = PgPool::connect(&url(), 1).expect("pool");
    let monitor = monitor().await;
    // No deadline: only the cancel on drop can stop it.
    let scope = Scope::background();
    let mut conn = pool.acquire(&scope).await.expect("a connection");
    let pid = backend_pid(&mut conn).await;
    let _ = tokio::time::timeout(
        Duration::from_millis(100),
        conn.query("SELECT pg_sleep(5)", &[]),
    )
    .await;
    assert!(
        active(&monitor, pid).await,
        "dropping the future alone leaves it running"
    );
    drop(conn);
    let start = Instant::now();
    while active(&monitor, pid).await {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "the dropped connection's statement must be cancelled on the server"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let waited = Instant::now();
    while pool.stats().idle < 1 && waited.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = pool.stats();
    assert_eq!(
        (stats.idle, stats.cleanups_running, stats.discarded),
        (1, 0, 0),
        "{stats:?}"
    );
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
    let metrics = tokio::runtime::Handle::current().metrics();
    // Open all four connections first, so their tasks count in the baseline.
    {
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(pool.acquire(&Scope::background()).await.expect("conn"));
        }
    }
    let tasks_before = metrics.num_alive_tasks();
    let mut stopped = 0u64;
    for round in 0..100u64 {
        let mut calls = tokio::task::JoinSet::new();
        let mut scopes = Vec::new();
        for i in 0..1000u64 {
            let scope =
                Scope::background().with_timeout(Duration::from_millis(2 + (i + round) % 5));
            scopes.push(scope.clone());
            let pool = pool.clone();
            calls.spawn(async move {
                let call = async {
                    let mut conn = pool.acquire(&scope).await?;
                    conn.query("SELECT pg_sleep(10)", &[]).await
                };
                match i % 4 {
                    // Dropped mid-wait or mid-statement by an outer timeout.
                    3 => tokio::time::timeout(Duration::from_millis(1), call)
                        .await
                        .map_or(true, |r| r.is_err()),
                    _ => call.await.is_err(),
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
    let waited = Instant::now();
    while (pool.stats().cleanups_running > 0 || pool.stats().idle < pool.stats().size)
        && waited.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = pool.stats();
    assert_eq!(stats.idle, stats.size, "no connection leaked: {stats:?}");
    assert!(stats.size <= 4);
    assert_eq!(stats.queued, 0, "no caller left queued");
    assert_eq!(pool.admission().stats().in_use, 0, "no permit leaked");
    // A backend sends its error before it reports itself idle: on a busy
    // machine the report can lag the client by a few milliseconds. A
    // statement left running would show for its 10 s.
    let waited = Instant::now();
    let running = loop {
        let running: i64 = monitor
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%pg_sleep(10)%' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .expect("pg_stat_activity")
            .get(0);
        if running == 0 || waited.elapsed() > Duration::from_secs(2) {
            break running;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        running, 0,
        "no statement may run on in the server (2 s after the calls): {stats:?}"
    );
    // Reconnections after a discard open new connection tasks; allow for them.
    assert!(
        metrics.num_alive_tasks() <= tasks_before + stats.discarded as usize,
        "no task leaked: {} alive, {} before",
        metrics.num_alive_tasks(),
        tasks_before
    );
    let mut conn = pool.acquire(&Scope::background()).await.expect("usable");
    assert!(backend_pid(&mut conn).await > 0, "the pool serves again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_while_its_statement_is_being_stopped_leaves_no_dirty_connection() {
    // The scope ends, the pool is stopping the statement (a cancel request,
    // then a check that waits for the server), and the caller drops the call
    // in the middle of that. The connection must not go back to the pool
    // before the stop is done: the next caller would get a backend still
    // running the old statement, or the old statement's cancel.
    let pool = PgPool::connect(&url(), 1).expect("pool");
    let monitor = monitor().await;
    let pid = backend_pid(&mut pool.acquire(&Scope::background()).await.expect("conn")).await;
    let (mut dropped, mut dirty) = (0, Vec::new());
    for attempt in 0..80u64 {
        let scope = Scope::background().with_timeout(Duration::from_secs(10));
        let mut conn = pool.acquire(&scope).await.expect("conn");
        let mut call = Box::pin(conn.query("SELECT pg_sleep(10)", &[]));
        crate::common::poll_until_running(call.as_mut(), async || active(&monitor, pid).await)
            .await;
        scope.cancel();
        // Drop the call 0–2 ms after the cancel, in steps of 25 µs: before,
        // during and after the stop, which takes about a millisecond on
        // loopback.
        let drop_at = Instant::now() + Duration::from_micros(25 * attempt);
        let finished = crate::common::finishes_by(call.as_mut(), drop_at).await;
        drop(call);
        drop(conn);
        if !finished {
            dropped += 1;
        }
        // A statement left running would hold the next one for its 10 s.
        let asked = Instant::now();
        let mut next = pool.acquire(&Scope::background()).await.expect("conn");
        let waited = asked.elapsed();
        let busy = active(&monitor, pid).await;
        let answer = tokio::time::timeout(
            Duration::from_secs(2),
            next.query("SELECT pg_backend_pid()", &[]),
        )
        .await;
        if busy || !matches!(answer, Ok(Ok(_))) || waited > Duration::from_secs(2) {
            dirty.push(format!(
                "attempt {attempt}: dropped={} waited={waited:?} busy={busy} answer={:?}",
                !finished,
                answer.map(|out| out.map(|rows| rows.len()))
            ));
        }
    }
    assert!(
        dropped >= 10,
        "only {dropped} of 80 calls were dropped before the stop finished: the test missed its window"
    );
    assert!(
        dirty.is_empty(),
        "the next caller got a connection that was not clean ({} of 80):\n{}",
        dirty.len(),
        dirty.join("\n")
    );
}
