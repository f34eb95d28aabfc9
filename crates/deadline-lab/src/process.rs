//! Processes the lab starts for its experiments: its own `serve` roles and
//! `capture` proxies, nginx. Each is killed and reaped when dropped.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::process::{Pid, Signal};
use tokio::sync::oneshot;

/// How long a started process may take to print its address.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// What a process wrote to stderr is kept up to this many bytes, for errors.
const STDERR_KEPT: usize = 8 * 1024;

/// The `deadline-lab` binary that role processes run: this one.
///
/// # Errors
///
/// When the running executable cannot be found.
pub fn lab_exe() -> anyhow::Result<PathBuf> {
    Ok(std::env::current_exe()?)
}

/// A running child process, killed (and reaped) when dropped.
#[derive(Debug)]
pub struct Spawned {
    name: String,
    child: Child,
    first_line: Option<oneshot::Receiver<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Spawned {
    /// Starts `command` with stdout and stderr piped. The first line on
    /// stdout is kept for [`first_line`](Self::first_line); later lines are
    /// read and dropped, so the child never blocks on a full pipe.
    ///
    /// # Errors
    ///
    /// When the process cannot be started.
    pub fn spawn(name: impl Into<String>, mut command: Command) -> anyhow::Result<Self> {
        let name = name.into();
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| anyhow::anyhow!("{name}: cannot start {command:?}: {e}"))?;
        let (tx, first_line) = oneshot::channel();
        if let Some(stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                let mut lines = BufReader::new(stdout).lines();
                if let Some(Ok(line)) = lines.next() {
                    let _ = tx.send(line);
                }
                for _ in lines {}
            });
        }
        let stderr = Arc::new(Mutex::new(String::new()));
        if let Some(mut pipe) = child.stderr.take() {
            let kept = stderr.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut kept) = kept.lock()
                        && kept.len() < STDERR_KEPT
                    {
                        kept.push_str(&String::from_utf8_lossy(&buf[..n]));
                    }
                }
            });
        }
        Ok(Self {
            name,
            child,
            first_line: Some(first_line),
            stderr,
        })
    }

    /// The first line the process printed (waits up to `within`).
    ///
    /// # Errors
    ///
    /// When the process exits or stays silent, with what it wrote to stderr.
    pub async fn first_line(&mut self, within: Duration) -> anyhow::Result<String> {
        let Some(rx) = self.first_line.take() else {
            anyhow::bail!("{}: the first line was already read", self.name);
        };
        match tokio::time::timeout(within, rx).await {
            Ok(Ok(line)) => Ok(line),
            Ok(Err(_)) => anyhow::bail!(
                "{} exited without printing its address: {}",
                self.name,
                self.stderr_text()
            ),
            Err(_) => anyhow::bail!(
                "{} printed nothing within {within:?}: {}",
                self.name,
                self.stderr_text()
            ),
        }
    }

    /// The address the process printed first (a `serve` or `capture`).
    ///
    /// # Errors
    ///
    /// As [`first_line`](Self::first_line), or when the line is no address.
    pub async fn addr(&mut self) -> anyhow::Result<SocketAddr> {
        let line = self.first_line(START_TIMEOUT).await?;
        line.trim().parse().map_err(|e| {
            anyhow::anyhow!(
                "{}: the first line must be an address, got {line:?} ({e})",
                self.name
            )
        })
    }

    /// What the process wrote to stderr so far (the first few KB).
    pub fn stderr_text(&self) -> String {
        self.stderr
            .lock()
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the process.
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent (the process is gone).
    pub fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        let pid = i32::try_from(self.child.id())
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| anyhow::anyhow!("{}: no valid pid", self.name))?;
        rustix::process::kill_process(pid, signal)
            .map_err(|e| anyhow::anyhow!("{}: cannot send {signal:?}: {e}", self.name))
    }

    /// Whether the process has exited.
    pub fn has_exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        // A stopped process still dies of SIGKILL; SIGCONT first anyway so a
        // process stopped by an experiment never lingers in the stopped state.
        let _ = self.signal(Signal::CONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The path of `program` on `PATH`, or in `/usr/sbin` and `/sbin` (where
/// Debian puts `ip` and `nginx`, often not on a user's `PATH`).
pub fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// Runs `program args…` to completion.
///
/// # Errors
///
/// When it cannot start or exits with failure; the message has its stderr.
pub async fn run(program: &Path, args: &[&str]) -> anyhow::Result<String> {
    Ok(run_logged(program, args).await?.0)
}

/// Runs `program args…` to completion: what it printed on stdout, then on
/// stderr.
///
/// # Errors
///
/// As [`run`].
pub async fn run_logged(program: &Path, args: &[&str]) -> anyhow::Result<(String, String)> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", program.display()))?;
    let logged = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        anyhow::bail!(
            "`{} {}` failed ({}): {}",
            program.display(),
            args.join(" "),
            out.status,
            logged.trim()
        );
    }
    Ok((String::from_utf8_lossy(&out.stdout).into_owned(), logged))
}
