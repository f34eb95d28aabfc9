//! Cancellation reaches the database: a 5 s query under a 200 ms
//! deadline, on SQLite (the embedded default) and on PostgreSQL.
//!
//! SQLite: the query runs on a blocking thread and is interrupted at the
//! deadline; the same connection then answers at once. PostgreSQL: the
//! statement is stopped *on the server* (checked in `pg_stat_activity` from a
//! second connection), and the connection is back in the pool. The server is
//! `TONIC_DEADLINE_PG_URL` if set, otherwise a throwaway one started here
//! with `initdb` and `pg_ctl` in a temp dir (skipped only when no server
//! binaries are installed).

use std::time::Duration;

use grpc_deadline_db::postgres::{PgPool, tokio_postgres};
use grpc_deadline_db::sqlite::SqlitePool;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic_deadline::Scope;

use crate::kit::postgres::server;
use crate::report::{Outcome, ms};

const DEADLINE: Duration = Duration::from_millis(200);

/// About five seconds of counting on this machine class; stopped long before.
const SQLITE_5S: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 30000000) \
                         SELECT count(*) FROM c";

/// The query on SQLite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sqlite {
    /// When the query was stopped, after it began.
    pub query_stopped_ms: f64,
    /// Why (the scope's cause).
    pub cause: Option<String>,
    /// Whether the same connection answered the next query.
    pub conn_reusable: bool,
    /// How long that next query took.
    pub next_query_ms: f64,
    /// Idle connections in the pool afterwards.
    pub pool_idle_after: usize,
    /// Connections in the pool.
    pub pool_size: usize,
}

/// The query on PostgreSQL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Postgres {
    /// When the call returned, after the query began.
    pub query_stopped_ms: f64,
    /// Why (the scope's cause).
    pub cause: Option<String>,
    /// Whether `pg_stat_activity` shows the statement no longer active.
    pub server_side_stopped: bool,
    /// Cancel requests the pool sent.
    pub cancel_requests_sent: u64,
    /// Idle connections in the pool afterwards.
    pub pool_idle_after: usize,
    /// Connections in the pool.
    pub pool_size: usize,
    /// The pool's limit.
    pub pool_max_size: usize,
}

/// PostgreSQL's row: measured, or why not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PostgresRun {
    /// The query ran on a server.
    Ran(Postgres),
    /// No server could be had.
    Skipped {
        /// Why.
        skipped: String,
    },
}

/// The experiment's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DbCancel {
    /// SQLite.
    pub sqlite: Sqlite,
    /// PostgreSQL.
    pub postgres: PostgresRun,
}

async fn sqlite() -> anyhow::Result<Sqlite> {
    let pool = SqlitePool::open_in_memory(1)?;
    let scope = Scope::background().with_timeout(DEADLINE);
    let start = Instant::now();
    let stopped = match pool.acquire(&scope).await {
        Ok(mut conn) => {
            conn.run(|c| c.query_row(SQLITE_5S, [], |r| r.get::<_, i64>(0)))
                .await
        }
        Err(refused) => Err(refused),
    };
    let stopped_after = start.elapsed();
    let cause = stopped.as_ref().err().and_then(|e| e.cause());
    let again = Instant::now();
    let next = Scope::background().with_timeout(Duration::from_secs(1));
    let reusable = match pool.acquire(&next).await {
        Ok(mut conn) => {
            conn.run(|c| c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)))
                .await
        }
        Err(refused) => Err(refused),
    };
    Ok(Sqlite {
        query_stopped_ms: ms(stopped_after),
        cause: cause.map(|c| c.to_string()),
        conn_reusable: matches!(reusable, Ok(1)),
        next_query_ms: ms(again.elapsed()),
        pool_idle_after: pool.stats().idle,
        pool_size: pool.stats().size,
    })
}

async fn postgres() -> anyhow::Result<PostgresRun> {
    let Some((url, _server)) = server().await? else {
        return Ok(PostgresRun::Skipped {
            skipped: "no PostgreSQL server binaries (initdb, pg_ctl) installed".into(),
        });
    };
    let (monitor, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tonic_deadline::detach(connection);
    let pool = PgPool::connect(&url, 2).map_err(|e| anyhow::anyhow!("{e}"))?;
    let start = Instant::now();
    let scope = Scope::background().with_timeout(DEADLINE);
    let mut conn = pool
        .acquire(&scope)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let pid: i32 = conn
        .query("SELECT pg_backend_pid()", &[])
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?[0]
        .get(0);
    let stopped = conn.query("SELECT pg_sleep(5)", &[]).await;
    let stopped_after = start.elapsed();
    let cause = stopped.as_ref().err().and_then(|e| e.cause());
    let active: i64 = monitor
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'active'",
            &[&pid],
        )
        .await?
        .get(0);
    drop(conn);
    let stats = pool.stats();
    Ok(PostgresRun::Ran(Postgres {
        query_stopped_ms: ms(stopped_after),
        cause: cause.map(|c| c.to_string()),
        server_side_stopped: active == 0 && cause.is_some(),
        cancel_requests_sent: stats.cancels,
        pool_idle_after: stats.idle,
        pool_size: stats.size,
        pool_max_size: stats.max_size,
    }))
}

/// Runs the query on SQLite, then on PostgreSQL.
///
/// # Errors
///
/// When a pool cannot be opened or a server cannot be started.
pub async fn measure() -> anyhow::Result<DbCancel> {
    Ok(DbCancel {
        sqlite: sqlite().await?,
        postgres: postgres().await?,
    })
}

impl crate::registry::Experiment for DbCancel {
    const NAME: &'static str = "db-cancel";
    const LIGHT: bool = true;
    const ABOUT: &'static str = "A 5 s query under a 200 ms deadline, on SQLite and PostgreSQL";
    const PRINTS: &'static str =
        "a 5 s query under a 200 ms deadline, SQLite and PostgreSQL: when it stopped (on the server, for PostgreSQL) and the pool after";
    type Args = crate::registry::NoArgs;

    async fn run(_: Self::Args, _: crate::registry::Spans) -> anyhow::Result<Self> {
        measure().await
    }

    fn outcome(&self) -> Outcome {
        let sqlite = &self.sqlite;
        let mut rows = vec![vec![
            "sqlite".to_owned(),
            sqlite.query_stopped_ms.to_string(),
            "yes (interrupted)".to_owned(),
            sqlite.conn_reusable.to_string(),
            format!("{}/{}", sqlite.pool_idle_after, sqlite.pool_size),
        ]];
        rows.push(match &self.postgres {
            PostgresRun::Skipped { skipped } => vec![
                "postgres".into(),
                format!("skipped: {skipped}"),
                "-".into(),
                "-".into(),
                "-".into(),
            ],
            PostgresRun::Ran(postgres) => vec![
                "postgres".to_owned(),
                postgres.query_stopped_ms.to_string(),
                postgres.server_side_stopped.to_string(),
                "-".into(),
                format!("{}/{}", postgres.pool_idle_after, postgres.pool_size),
            ],
        });
        Outcome {
            title: "experiment db-cancel: a 5 s query under a 200 ms deadline".into(),
            json: crate::report::to_json(self),
            columns: vec!["database", "stopped after ms", "stopped on the server", "conn reusable", "pool idle/size"],
            rows,
            notes: vec![
                "postgres: checked in pg_stat_activity from a second connection after the call returned".into(),
            ],
        }
    }
}
