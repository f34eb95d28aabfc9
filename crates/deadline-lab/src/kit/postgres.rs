//! A PostgreSQL server for an experiment: the one `TONIC_DEADLINE_PG_URL`
//! names, or a throwaway one of its own.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A PostgreSQL server started for an experiment and stopped on drop.
#[derive(Debug)]
pub struct Throwaway {
    dir: PathBuf,
    bindir: PathBuf,
    as_postgres: bool,
    /// Its URL: `postgresql://postgres@127.0.0.1:PORT/postgres`.
    pub url: String,
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
    fn bindir() -> Option<PathBuf> {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|p| p.join("initdb").exists() && p.join("pg_ctl").exists())
            .collect();
        dirs.sort();
        dirs.pop()
    }

    fn start(bindir: PathBuf) -> anyhow::Result<Self> {
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
