//! Debian's nginx as a gRPC proxy hop, started by the lab with a config of
//! its own on a free loopback port: no system service, no files outside its
//! temporary prefix.
//!
//! The binary is `nginx` on `PATH` (or in `/usr/sbin`), or the one named by
//! `DEADLINE_LAB_NGINX`. Without it the lab fails with a message that says
//! how to install it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tokio::time::Instant;

use crate::process::{Spawned, find_program};

/// The environment variable that names the nginx binary to use.
pub const NGINX_ENV: &str = "DEADLINE_LAB_NGINX";

/// How long nginx may take to listen.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// What the proxying part of the config says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// Extra directives for the proxying location (`grpc_read_timeout 500ms;`).
    pub location: String,
    /// Keep this many idle connections to the upstream open (an `upstream`
    /// block with `keepalive`); `None`: a new connection for every request,
    /// nginx's default.
    pub keepalive: Option<u32>,
}

/// A running nginx; stopped and its prefix removed when dropped.
#[derive(Debug)]
pub struct Nginx {
    addr: SocketAddr,
    version: String,
    // Field order: the process stops before its directory goes.
    process: Spawned,
    dir: tempfile::TempDir,
}

/// The nginx binary.
///
/// # Errors
///
/// When nginx is not installed (or `DEADLINE_LAB_NGINX` names no file).
pub fn binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(NGINX_ENV) {
        let path = PathBuf::from(path);
        anyhow::ensure!(
            path.is_file(),
            "{NGINX_ENV}={} is not a file: point it at an nginx binary, or unset it to use Debian's (apt-get install nginx)",
            path.display()
        );
        return Ok(path);
    }
    find_program("nginx").ok_or_else(|| {
        anyhow::anyhow!(
            "nginx is not installed: apt-get install nginx (scripts/test-all installs it), or set {NGINX_ENV}"
        )
    })
}

/// `nginx/1.22.1`, as `nginx -v` reports it.
///
/// # Errors
///
/// When nginx cannot run.
pub async fn version(binary: &std::path::Path) -> anyhow::Result<String> {
    let out = tokio::process::Command::new(binary)
        .arg("-v")
        .output()
        .await
        .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", binary.display()))?;
    // nginx prints its version on stderr.
    let text = String::from_utf8_lossy(&out.stderr);
    Ok(text
        .trim()
        .strip_prefix("nginx version: ")
        .unwrap_or(text.trim())
        .to_owned())
}

impl Nginx {
    /// Starts nginx proxying gRPC (`grpc_pass`) from a free loopback port to
    /// `upstream`, configured as `config` says.
    ///
    /// # Errors
    ///
    /// When nginx is missing, rejects the config, or does not listen in time.
    pub async fn grpc_proxy(upstream: SocketAddr, config: &Config) -> anyhow::Result<Nginx> {
        let binary = binary()?;
        let version = version(&binary).await?;
        let mut last = None;
        // A free port is picked, released and handed to nginx: another
        // process may take it in between, so a few tries.
        for _ in 0..3 {
            match Self::try_start(&binary, upstream, config, &version).await {
                Ok(nginx) => return Ok(nginx),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("nginx did not start")))
    }

    async fn try_start(
        binary: &std::path::Path,
        upstream: SocketAddr,
        config: &Config,
        version: &str,
    ) -> anyhow::Result<Nginx> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let dir = tempfile::Builder::new()
            .prefix("deadline-lab-nginx-")
            .tempdir()?;
        let prefix = dir.path();
        std::fs::create_dir_all(prefix.join("logs"))?;
        let conf = prefix.join("nginx.conf");
        std::fs::write(&conf, config_text(prefix, addr, upstream, config))?;
        let mut command = Command::new(binary);
        command
            .arg("-p")
            .arg(prefix)
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(prefix.join("logs/error.log"));
        let mut process = Spawned::spawn(format!("{version} on {addr}"), command)?;
        let until = Instant::now() + READY_WITHIN;
        loop {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                break;
            }
            if process.has_exited() || Instant::now() >= until {
                let log =
                    std::fs::read_to_string(prefix.join("logs/error.log")).unwrap_or_default();
                anyhow::bail!(
                    "{version} did not listen on {addr}: {} {}",
                    process.stderr_text(),
                    log.trim()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(Nginx {
            addr,
            version: version.to_owned(),
            process,
            dir,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `nginx/1.22.1`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Its error log so far.
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("logs/error.log")).unwrap_or_default()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// The config: one process in the foreground (no master and workers, so
/// killing it leaves nothing behind), every path inside `prefix`, one
/// HTTP/2 cleartext server that passes everything to `upstream`.
fn config_text(
    prefix: &std::path::Path,
    listen: SocketAddr,
    upstream: SocketAddr,
    config: &Config,
) -> String {
    let p = prefix.display();
    let (upstream_block, target) = match config.keepalive {
        Some(idle) => (
            format!("upstream backend {{ server {upstream}; keepalive {idle}; }}"),
            "backend".to_owned(),
        ),
        None => (String::new(), upstream.to_string()),
    };
    let location = &config.location;
    format!(
        r"daemon off;
master_process off;
worker_processes 1;
pid {p}/nginx.pid;
error_log {p}/logs/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {p}/client_body;
    proxy_temp_path {p}/proxy;
    fastcgi_temp_path {p}/fastcgi;
    uwsgi_temp_path {p}/uwsgi;
    scgi_temp_path {p}/scgi;
    {upstream_block}
    server {{
        listen {listen} http2;
        location / {{
            grpc_pass grpc://{target};
            {location}
        }}
    }}
}}
"
    )
}
