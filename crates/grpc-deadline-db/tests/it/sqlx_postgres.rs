//! The sqlx PostgreSQL pool against a real server: cancellation reaches the
//! statement *on the server*, cleanup is deterministic, queue time spends
//! the budget — and plain sqlx, for contrast, does none of it.
//!
//! Built with the crate's `postgres-tests` feature, which `scripts/test-all`
//! turns on (through `--all-features`) after starting a throwaway server and
//! exporting its address as `TONIC_DEADLINE_PG_URL`.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use grpc_deadline::admission::Admission;
use grpc_deadline::{Cause, Code, Scope};
use grpc_deadline_db::sqlx_postgres::{SqlxPgConn, SqlxPgPool, sqlx};
use sqlx::{Connection, Executor, Row};
use tokio::time::Instant;

use crate::pg::{self, active, monitor, url};
use crate::support::{Cuts, hundred_thousand_cancelled_calls, settle};

async fn backend_pid(conn: &mut SqlxPgConn) -> i32 {
    conn.fetch_all(sqlx::query("SELECT pg_backend_pid()"))
        .await
        .expect("pid")[0]
        .get(0)
}

/// The server's `statement_timeout` on `conn`, read by a statement of its
/// own (which, in the scheme under test, may or may not refresh it first).
async fn statement_timeout(conn: &mut SqlxPgConn) -> Duration {
    let shown: String = conn
        .fetch_all(sqlx::query(
            "SELECT current_setting('statement_timeout')::interval::text",
        ))
        .await
        .expect("show")[0]
        .get(0);
    // An interval such as 00:00:01.498
    let seconds: f64 = shown
        .rsplit(':')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("an interval: {shown}"));
    Duration::from_secs_f64(seconds)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_sqlx_leaves_a_dropped_query_running_on_the_server() {
    let monitor = monitor().await;
    let mut conn = sqlx::PgConnection::connect(&url()).await.expect("connect");
    let pid: i32 = conn
        .fetch_one("SELECT pg_backend_pid()")
        .await
        .expect("pid")
        .get(0);
    let dropped = tokio::time::timeout(
        Duration::from_millis(200),
        conn.execute("SELECT pg_sleep(2)"),
    )
    .await;
    assert!(
        dropped.is_err(),
        "the outer timeout must drop the query future"
    );
    assert!(
        active(&monitor, pid).await,
        "plain sqlx: the dropped query must still run on the server"
    );
    let next = Instant::now();
    conn.execute("SELECT 1")
        .await
        .expect("the next query works");
    assert!(
        next.elapsed() >= Duration::from_millis(1000),
        "plain sqlx: the next query must wait behind the abandoned one, waited {:?}",
        next.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_stops_the_sqlx_statement_on_the_server_and_the_connection_returns_healthy() {
    let pool = SqlxPgPool::connect(&url(), 1).expect("pool");
    let monitor = monitor().await;
    let scope = Scope::background().with_timeout(Duration::from_millis(300));
    let mut conn = pool.acquire(&scope).await.expect("a connection");
    let pid = backend_pid(&mut conn).await;
    assert_eq!(conn.backend_pid(), Some(pid), "the pool read the same pid");
    let start = Instant::now();
    let err = conn
        .fetch_all(sqlx::query("SELECT pg_sleep(5)"))
        .await
        .expect_err("a 5 s statement cannot finish in 300 ms");
    let stopped = start.elapsed();
    assert_eq!(err.cause(), Some(Cause::DeadlineExceeded));
    assert_eq!(err.code(), Code::DeadlineExceeded);
    assert!(
        !active(&monitor, pid).await,
        "the statement must have stopped on the server, not only in the client"
    );
    assert!(
        stopped < Duration::from_secs(2),
        "stopped near the deadline: {stopped:?}"
    );
    drop(conn);
    settle(&pool, 1).await;
    let stats = pool.stats();
    assert_eq!(
        (stats.size, stats.idle, stats.discarded),
        (1, 1, 0),
        "the connection is back: {stats:?}"
    );
    let mut again = pool.acquire(&Scope::background()).await.expect("reusable");
    let ready = Instant::now();
    assert_eq!(
        backend_pid(&mut again).await,
        pid,
        "the same connection, healthy"
    );
    assert!(
        ready.elapsed() < Duration::from_secs(1),
        "the next statement must not wait behind the stopped one: {:?}",
        ready.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_cancel_sends_pg_cancel_backend() {
    pg::caller_cancel_stops_the_statement_on_the_server(
        SqlxPgPool::connect(&url(), 1).expect("pool"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_from_the_budget_stops_the_server_without_a_cancel() {
    let connect = url().parse().expect("url");
    let pool = SqlxPgPool::builder(connect)
        .size(1)
        .cancel_requests(false)
        .build()
        .expect("pool");
    let monitor = monitor().await;
    let scope = Scope::background().with_timeout(Duration::from_millis(1500));
    let mut conn = pool.acquire(&scope).await.expect("a connection");
    let timeout = statement_timeout(&mut conn).await;
    assert!(
        (Duration::from_secs(1)..=Duration::from_millis(1500)).contains(&timeout),
        "statement_timeout must be the remaining budget, got {timeout:?}"
    );
    let pid = backend_pid(&mut conn).await;
    let start = Instant::now();
    let err = conn
        .fetch_all(sqlx::query("SELECT pg_sleep(5)"))
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

/// A statement that starts after most of its connection's budget is spent.
struct Late {
    /// The server's `statement_timeout` when it started.
    timeout: Duration,
    /// How long it ran before its call returned.
    ran: Duration,
    err: grpc_deadline_db::Error,
    /// Whether its backend was still running it afterwards.
    still_active: bool,
}

/// Takes a connection of `pool` under a 1.5 s budget, spends `spend_s`
/// seconds of it in a statement, and starts a 10 s statement.
async fn late_statement(pool: &SqlxPgPool, spend_s: f64) -> Late {
    let monitor = monitor().await;
    let scope = Scope::background().with_timeout(Duration::from_millis(1500));
    let mut conn = pool.acquire(&scope).await.expect("a connection");
    let pid = backend_pid(&mut conn).await;
    conn.execute(sqlx::query("SELECT pg_sleep($1)").bind(spend_s))
        .await
        .expect("the first statements fit the 1.5 s budget");
    let timeout = statement_timeout(&mut conn).await;
    let started = Instant::now();
    let err = conn
        .fetch_all(sqlx::query("SELECT pg_sleep(10)"))
        .await
        .expect_err("a 10 s statement cannot finish in what is left");
    let ran = started.elapsed();
    Late {
        timeout,
        ran,
        err,
        still_active: active(&monitor, pid).await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_statement_is_stopped_at_the_deadline_by_the_cancel_not_by_its_older_timeout() {
    let pool = SqlxPgPool::connect(&url(), 1).expect("pool");
    // The first statement sets the server's timeout to the whole budget;
    // the second spends 1 s of it.
    let late = late_statement(&pool, 1.0).await;
    assert!(
        late.timeout >= Duration::from_millis(1000),
        "set once for the connection, not refreshed before every statement: {:?}",
        late.timeout
    );
    assert_eq!(late.err.cause(), Some(Cause::DeadlineExceeded));
    assert!(
        !late.still_active,
        "the statement must have stopped on the server"
    );
    assert_eq!(
        pool.stats().cancels,
        1,
        "stopped by the cancel request: {:?}",
        pool.stats()
    );
    assert!(
        late.ran < late.timeout,
        "stopped at the deadline, {:?} after it started, before its own {:?} timeout",
        late.ran,
        late.timeout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cancel_requests_the_timeout_is_refreshed_before_every_statement() {
    let pool = SqlxPgPool::builder(url().parse().expect("url"))
        .size(1)
        .cancel_requests(false)
        .build()
        .expect("pool");
    let late = late_statement(&pool, 0.8).await;
    assert!(
        late.timeout <= Duration::from_millis(700),
        "the timeout is all that stops a statement here: it must be what is left, not {:?}",
        late.timeout
    );
    assert_eq!(late.err.cause(), Some(Cause::DeadlineExceeded));
    assert!(!late.still_active, "stopped on the server");
    assert_eq!(pool.stats().cancels, 0, "no cancel request was sent");
    assert!(
        late.ran < Duration::from_secs(3),
        "near the deadline, not after the 10 s statement: {:?}",
        late.ran
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_call_still_stops_the_statement_on_the_server() {
    pg::dropping_the_call_stops_the_statement_on_the_server(
        SqlxPgPool::connect(&url(), 1).expect("pool"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_transaction_is_rolled_back() {
    let pool = SqlxPgPool::connect(&url(), 1).expect("pool");
    let table = format!("sqlx_t_{}", std::process::id());
    {
        let mut conn = pool.acquire(&Scope::background()).await.expect("conn");
        conn.execute(sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS {table} (x int)"
        ))))
        .await
        .expect("schema");
    }
    settle(&pool, 1).await;
    let scope = Scope::background().with_timeout(Duration::from_millis(300));
    let mut conn = pool.acquire(&scope).await.expect("conn");
    let insert = format!("INSERT INTO {table} VALUES (1)");
    let err = conn
        .run(move |c| {
            Box::pin(async move {
                c.execute("BEGIN").await?;
                c.execute(sqlx::AssertSqlSafe(insert)).await?;
                c.execute("SELECT pg_sleep(5)").await?;
                c.execute("COMMIT").await?;
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
        .fetch_all(sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table}"
        ))))
        .await
        .expect("count")[0]
        .get(0);
    assert_eq!(rows, 0, "the stopped transaction must be rolled back");
    conn.execute(sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP TABLE {table}"
    ))))
    .await
    .expect("drop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_time_for_a_connection_spends_the_budget() {
    let pool = SqlxPgPool::connect(&url(), 1).expect("pool");
    let holder = pool
        .acquire(&Scope::background())
        .await
        .expect("the one connection");
    let scope = Scope::background().with_timeout(Duration::from_millis(200));
    let start = Instant::now();
    let err = pool
        .acquire(&scope)
        .await
        .expect_err("no connection frees up within the budget");
    assert_eq!(err.cause(), Some(Cause::DeadlineExceeded));
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "refused at the deadline, not after: {:?}",
        start.elapsed()
    );
    drop(holder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_cancelled_calls_leak_no_connection_permit_or_task() {
    // An admission that never learns a service time admits every caller, so
    // statements really start and are stopped on the server (the default
    // one would soon refuse these 2–6 ms budgets before they take a
    // connection).
    let admission = Admission::new(4)
        .expected_service_time(Duration::ZERO)
        .smoothing(f64::MIN_POSITIVE);
    let pool = SqlxPgPool::builder(url().parse().expect("url"))
        .size(4)
        .admission(admission)
        .build()
        .expect("pool");
    let monitor = monitor().await;
    // Open all four connections first, and the side pool with one
    // cancelled statement, so their tasks count in the baseline.
    {
        let mut held = Vec::new();
        for _ in 0..4 {
            let mut conn = pool.acquire(&Scope::background()).await.expect("conn");
            backend_pid(&mut conn).await;
            held.push(conn);
        }
    }
    settle(&pool, 4).await;
    {
        let scope = Scope::background();
        let mut conn = pool.acquire(&scope).await.expect("conn");
        let canceller = scope.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            canceller.cancel();
        });
        let _ = conn.fetch_all(sqlx::query("SELECT pg_sleep(1)")).await;
    }
    settle(&pool, 4).await;
    let cuts = Cuts {
        shortest_ms: 2,
        spread_ms: 5,
        drop_after: Duration::from_millis(1),
    };
    let stats = hundred_thousand_cancelled_calls(&pool, cuts, |pool, scope| async move {
        let mut conn = pool.acquire(&scope).await?;
        conn.fetch_all(sqlx::query("SELECT pg_sleep(10)")).await
    })
    .await;
    assert!(
        stats.cancels >= 100,
        "statements really started and were stopped on the server: {stats:?}"
    );
    pg::nothing_runs_on_and_the_pool_serves(&pool, &monitor, stats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_while_its_statement_is_being_stopped_leaves_no_dirty_connection() {
    pg::a_call_dropped_mid_stop_leaves_no_dirty_connection(
        SqlxPgPool::connect(&url(), 1).expect("pool"),
    )
    .await;
}
