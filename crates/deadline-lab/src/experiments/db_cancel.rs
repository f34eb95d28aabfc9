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

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use grpc_deadline_db::postgres::{PgPool, tokio_postgres};
use grpc_deadline_db::sqlite::SqlitePool;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic_deadline::Scope;

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

/// A PostgreSQL server started for an experiment and stopped on drop.
#[derive(Debug)]
pub struct Throwaway {
    dir: PathBuf,
    bindir: PathBuf,
    as_postgres: bool,
    pub(crate) url: String,
}

fn run_as(as_postgres: bool, program: &Path, args: &[&str]) -> anyhow::Result<()> {
    let status = if as_postgres {
        Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(program)
            .args(args)
            .output()?
    } else {
        Command::new(program).args(args).output()?
    };
    anyhow::ensure!(
        status.status.success(),
        "{} failed: {}",
        program.display(),
        String::from_utf8_lossy(&status.stderr)
    );
    Ok(())
}

impl Throwaway {
    pub(crate) fn bindir() -> Option<PathBuf> {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|p| p.join("initdb").exists() && p.join("pg_ctl").exists())
            .collect();
        dirs.sort();
        dirs.pop()
    }

    pub(crate) fn start(bindir: PathBuf) -> anyhow::Result<Self> {
        let as_postgres = Command::new("id")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
            .unwrap_or(false);
        // One per start: two experiments of one process must not share it.
        static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("deadline-lab-pg-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        if as_postgres {
            let owned = Command::new("chown").arg("postgres").arg(&dir).status()?;
            anyhow::ensure!(
                owned.success(),
                "chown postgres failed (is there a postgres user?)"
            );
        }
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let data = dir.join("data");
        let data_s = data.to_string_lossy().into_owned();
        let dir_s = dir.to_string_lossy().into_owned();
        let this = Self {
            url: format!("postgresql://postgres@127.0.0.1:{port}/postgres"),
            dir,
            bindir,
            as_postgres,
        };
        run_as(
            as_postgres,
            &this.bindir.join("initdb"),
            &["-D", &data_s, "-U", "postgres", "--auth=trust"],
        )?;
        let options = format!("-p {port} -k {dir_s} -c listen_addresses=127.0.0.1");
        let log = format!("{dir_s}/server.log");
        run_as(
            as_postgres,
            &this.bindir.join("pg_ctl"),
            &["-D", &data_s, "-l", &log, "-w", "-o", &options, "start"],
        )?;
        Ok(this)
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        let data = self.dir.join("data").to_string_lossy().into_owned();
        let _ = run_as(
            self.as_postgres,
            &self.bindir.join("pg_ctl"),
            &["-D", &data, "-m", "immediate", "-w", "stop"],
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A PostgreSQL server for an experiment: `TONIC_DEADLINE_PG_URL` if set,
/// otherwise a throwaway one started with `initdb` and `pg_ctl` in a temp
/// dir and stopped when the returned guard is dropped. `None` when neither
/// is available (no server binaries installed).
///
/// # Errors
///
/// The throwaway server could not be started.
pub async fn server() -> anyhow::Result<Option<(String, Option<Throwaway>)>> {
    Ok(match std::env::var("TONIC_DEADLINE_PG_URL") {
        Ok(url) => Some((url, None)),
        Err(_) => match Throwaway::bindir() {
            None => None,
            Some(bindir) => {
                #[allow(clippy::disallowed_methods)] // starting the server, before any request
                let server =
                    tokio::task::spawn_blocking(move || Throwaway::start(bindir)).await??;
                Some((server.url.clone(), Some(server)))
            }
        },
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
