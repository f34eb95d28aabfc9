//! What the tests of both PostgreSQL pools share: the server's address, a
//! connection of their own that watches the server, and the test bodies
//! that hold for both pools (with the polls they make).

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use grpc_deadline::{Cause, Scope};
use grpc_deadline_db::postgres::tokio_postgres;
use grpc_deadline_db::{Error, PoolStats};
use tokio::time::Instant;

use crate::support::{Pool, settle};

/// The address of the test server (`scripts/postgres` starts one and
/// exports it); without one the test fails, saying so.
pub(crate) fn url() -> String {
    std::env::var("TONIC_DEADLINE_PG_URL").expect(
        "TONIC_DEADLINE_PG_URL must name a live PostgreSQL server: run scripts/test-all, \
         or source scripts/postgres first (these tests are built by the feature postgres-tests)",
    )
}

/// A connection of the test's own that watches the server.
pub(crate) async fn monitor() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .expect("the test server must accept connections");
    tokio::spawn(connection);
    client
}

/// Whether backend `pid` is running a statement right now.
pub(crate) async fn active(monitor: &tokio_postgres::Client, pid: i32) -> bool {
    let row = monitor
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'active'",
            &[&pid],
        )
        .await
        .expect("pg_stat_activity is readable");
    row.get::<_, i64>(0) > 0
}

/// A statement's future, borrowing its connection.
pub(crate) type Statement<'c, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'c>>;

/// What the shared test bodies do with a PostgreSQL pool's connection.
pub(crate) trait PgPool: Pool {
    type Conn: Send;
    /// Takes a connection under `scope`.
    fn take<'a>(&'a self, scope: &'a Scope) -> Statement<'a, Self::Conn>;
    /// Runs `sql` on `conn`; the rows it returned.
    fn run<'c>(conn: &'c mut Self::Conn, sql: &'static str) -> Statement<'c, usize>;
    /// The connection's backend process id.
    fn backend_pid(conn: &mut Self::Conn) -> Statement<'_, i32>;
}

impl PgPool for grpc_deadline_db::postgres::PgPool {
    type Conn = grpc_deadline_db::postgres::PgConn;
    fn take<'a>(&'a self, scope: &'a Scope) -> Statement<'a, Self::Conn> {
        Box::pin(self.acquire(scope))
    }
    fn run<'c>(conn: &'c mut Self::Conn, sql: &'static str) -> Statement<'c, usize> {
        Box::pin(async move { conn.query(sql, &[]).await.map(|rows| rows.len()) })
    }
    fn backend_pid(conn: &mut Self::Conn) -> Statement<'_, i32> {
        Box::pin(async move { Ok(conn.query("SELECT pg_backend_pid()", &[]).await?[0].get(0)) })
    }
}

impl PgPool for grpc_deadline_db::sqlx_postgres::SqlxPgPool {
    type Conn = grpc_deadline_db::sqlx_postgres::SqlxPgConn;
    fn take<'a>(&'a self, scope: &'a Scope) -> Statement<'a, Self::Conn> {
        Box::pin(self.acquire(scope))
    }
    fn run<'c>(conn: &'c mut Self::Conn, sql: &'static str) -> Statement<'c, usize> {
        use grpc_deadline_db::sqlx_postgres::sqlx;
        Box::pin(async move {
            conn.fetch_all(sqlx::query(sql))
                .await
                .map(|rows| rows.len())
        })
    }
    fn backend_pid(conn: &mut Self::Conn) -> Statement<'_, i32> {
        use grpc_deadline_db::sqlx_postgres::sqlx::{self, Row};
        Box::pin(async move {
            Ok(conn
                .fetch_all(sqlx::query("SELECT pg_backend_pid()"))
                .await?[0]
                .get(0))
        })
    }
}

/// A caller with no deadline cancels its scope mid-statement: the call
/// ends `CANCELLED` at once, the statement stops on the server, and one
/// cancel request did it.
pub(crate) async fn caller_cancel_stops_the_statement_on_the_server<P: PgPool>(pool: P) {
    let monitor = monitor().await;
    let scope = Scope::background();
    let mut conn = pool.take(&scope).await.expect("a connection");
    let pid = P::backend_pid(&mut conn).await.expect("pid");
    let canceller = scope.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        canceller.cancel();
    });
    let start = Instant::now();
    let err = P::run(&mut conn, "SELECT pg_sleep(5)")
        .await
        .expect_err("cancelled");
    assert_eq!(err.cause(), Some(Cause::Cancelled));
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "no deadline here: only the cancel request can have stopped it"
    );
    assert!(!active(&monitor, pid).await, "stopped on the server");
    assert_eq!(
        pool.stats().cancels,
        1,
        "stopped by one cancel request: {:?}",
        pool.stats()
    );
}

/// A call with no deadline is dropped mid-statement (an outer timeout):
/// the statement runs on until its connection is dropped, then the pool
/// stops it on the server and takes the connection back, clean.
pub(crate) async fn dropping_the_call_stops_the_statement_on_the_server<P: PgPool>(pool: P) {
    let monitor = monitor().await;
    // No deadline: only the clean-up after the drop can stop it.
    let mut conn = pool.take(&Scope::background()).await.expect("a connection");
    let pid = P::backend_pid(&mut conn).await.expect("pid");
    let _ = tokio::time::timeout(
        Duration::from_millis(100),
        P::run(&mut conn, "SELECT pg_sleep(5)"),
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
    settle(&pool, 1).await;
    let stats = pool.stats();
    assert_eq!(
        (stats.idle, stats.cleanups_running, stats.discarded),
        (1, 0, 0),
        "{stats:?}"
    );
}

/// After the leak test's calls (`SELECT pg_sleep(10)` each): no statement
/// runs on in the server once they have had 2 s to stop, and the pool
/// serves again. A backend sends its error before it reports itself idle:
/// on a busy machine the report can lag the client by a few milliseconds;
/// a statement left running would show for its 10 s.
pub(crate) async fn nothing_runs_on_and_the_pool_serves<P: PgPool>(
    pool: &P,
    monitor: &tokio_postgres::Client,
    stats: PoolStats,
) {
    let waited = Instant::now();
    let running = loop {
        let running: i64 = monitor
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
                 AND query LIKE '%pg_sleep(10)%' AND pid <> pg_backend_pid()",
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
    let mut conn = pool.take(&Scope::background()).await.expect("usable");
    let pid = P::backend_pid(&mut conn).await.expect("pid");
    assert!(pid > 0, "the pool serves again");
}

/// The scope ends, the pool is stopping the statement (a cancel request,
/// then a check that waits for the server), and the caller drops the call
/// in the middle of that, 80 times. The connection must not go back to the
/// pool before the stop is done: the next caller would get a backend
/// still running the old statement, or the old statement's cancel.
pub(crate) async fn a_call_dropped_mid_stop_leaves_no_dirty_connection<P: PgPool>(pool: P) {
    let monitor = monitor().await;
    let pid = {
        let mut conn = pool.take(&Scope::background()).await.expect("conn");
        P::backend_pid(&mut conn).await.expect("pid")
    };
    let (mut dropped, mut dirty) = (0, Vec::new());
    for attempt in 0..80u64 {
        let scope = Scope::background().with_timeout(Duration::from_secs(10));
        let mut conn = pool.take(&scope).await.expect("conn");
        let mut call = P::run(&mut conn, "SELECT pg_sleep(10)");
        poll_until_running(call.as_mut(), async || active(&monitor, pid).await).await;
        scope.cancel();
        // Drop the call 0–2 ms after the cancel, in steps of 25 µs: before,
        // during and after the stop, which takes about a millisecond on
        // loopback.
        let drop_at = Instant::now() + Duration::from_micros(25 * attempt);
        let finished = finishes_by(call.as_mut(), drop_at).await;
        drop(call);
        drop(conn);
        if !finished {
            dropped += 1;
        }
        // A statement left running would hold the next one for its 10 s.
        let asked = Instant::now();
        let mut next = pool.take(&Scope::background()).await.expect("conn");
        let waited = asked.elapsed();
        let busy = active(&monitor, pid).await;
        let answer = tokio::time::timeout(
            Duration::from_secs(2),
            P::run(&mut next, "SELECT pg_backend_pid()"),
        )
        .await;
        if busy || !matches!(answer, Ok(Ok(_))) || waited > Duration::from_secs(2) {
            dirty.push(format!(
                "attempt {attempt}: dropped={} waited={waited:?} busy={busy} answer={answer:?}",
                !finished,
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

/// Polls `future` once.
async fn poll_once<F: Future + ?Sized>(mut future: Pin<&mut F>) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await
}

/// Polls `call` until `running()` says its statement runs on the server
/// (at most 5 s); panics if the call ends first.
async fn poll_until_running<F: Future + ?Sized>(
    mut call: Pin<&mut F>,
    mut running: impl AsyncFnMut() -> bool,
) {
    let waited = Instant::now();
    loop {
        assert!(
            poll_once(call.as_mut()).await.is_pending(),
            "the statement ended early"
        );
        if running().await {
            return;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(5),
            "the statement never ran"
        );
    }
}

/// Polls `call` until it finishes or `at` passes, yielding in between: finer
/// than the timer's millisecond. Whether it finished.
async fn finishes_by<F: Future + ?Sized>(mut call: Pin<&mut F>, at: Instant) -> bool {
    loop {
        if poll_once(call.as_mut()).await.is_ready() {
            return true;
        }
        if Instant::now() >= at {
            return false;
        }
        tokio::task::yield_now().await;
    }
}
