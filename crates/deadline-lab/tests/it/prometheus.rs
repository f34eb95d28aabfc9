//! A real Prometheus scrapes `deadline-lab serve chain --metrics-listen`:
//! after real calls, its query API must return the gRPC call series and
//! ours with samples in them (R-30).
//!
//! Needs Debian's `prometheus` server, so it is only built with the
//! `prometheus-tests` feature (`scripts/test-all` installs the package and
//! enables it through `--all-features`); there a missing binary fails it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long Prometheus may take to start, scrape and answer.
const PATIENCE: Duration = Duration::from_secs(60);

/// A child process, killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The answer of `/api/v1/query` for an instant vector.
#[derive(Debug, Deserialize)]
struct Answer {
    status: String,
    data: Data,
}

#[derive(Debug, Deserialize)]
struct Data {
    result: Vec<Sample>,
}

#[derive(Debug, Deserialize)]
struct Sample {
    metric: BTreeMap<String, String>,
    /// `[unix time, "value"]`.
    value: (f64, String),
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Percent-encodes a PromQL expression for a query string.
fn encode(query: &str) -> String {
    query
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One plain HTTP/1.0 GET; the body of a 200 answer.
async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8(raw)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no HTTP head in {text:?}"))?;
    anyhow::ensure!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "{head}"
    );
    Ok(body.to_owned())
}

async fn query(prometheus: SocketAddr, promql: &str) -> anyhow::Result<Vec<Sample>> {
    let body = get(
        prometheus,
        &format!("/api/v1/query?query={}", encode(promql)),
    )
    .await?;
    let answer: Answer = serde_json::from_str(&body)?;
    anyhow::ensure!(answer.status == "success", "{body}");
    Ok(answer.data.result)
}

/// The summed value of `promql` once it is above zero, polling until
/// [`PATIENCE`] has passed.
async fn positive(prometheus: SocketAddr, promql: &str) -> f64 {
    let until = tokio::time::Instant::now() + PATIENCE;
    let mut last = String::new();
    while tokio::time::Instant::now() < until {
        match query(prometheus, promql).await {
            Ok(samples) => {
                let sum: f64 = samples
                    .iter()
                    .filter_map(|s| s.value.1.parse::<f64>().ok())
                    .sum();
                if sum > 0.0 {
                    return sum;
                }
                last = format!("{samples:?}");
            }
            Err(err) => last = err.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("Prometheus must report `{promql}` > 0 after real calls; last answer: {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_grpc_and_budget_series_after_real_calls() {
    let mut lab = Command::new(crate::common::debug_lab())
        .args([
            "serve",
            "chain",
            "--hop-ms",
            "20",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("deadline-lab must start");
    let stdout = lab.stdout.take().expect("stdout is piped");
    let lab = Running(lab);
    let mut lines = BufReader::new(stdout).lines();
    let mut line = || {
        lines
            .next()
            .expect("deadline-lab must print its lines")
            .expect("stdout must be readable")
    };
    let entry: SocketAddr = line()
        .trim()
        .parse()
        .expect("the first line must be the entry address");
    let second = line();
    let metrics: SocketAddr = second
        .strip_prefix("metrics: http://")
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("the second line must name the metrics URL: {second:?}"))
        .parse()
        .expect("the metrics URL must hold an address");

    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: lab\n    static_configs:\n      - targets: ['{metrics}']\n"
        ),
    )
    .expect("the scrape config must be written");
    let prometheus_addr: SocketAddr = format!("127.0.0.1:{}", free_port())
        .parse()
        .expect("an address");
    let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("a log file");
    let prometheus = match Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={prometheus_addr}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
    {
        Ok(child) => Running(child),
        Err(err) => panic!(
            "Debian's prometheus server is needed (apt-get install prometheus; scripts/test-all installs it): {err}"
        ),
    };

    // Real calls: some in time, some whose deadline passes mid-chain.
    let mut client = deadline_lab::kit::calls::layered_client(entry)
        .await
        .expect("the chain must accept a connection");
    for _ in 0..5 {
        tonic_deadline::Scope::background()
            .with_timeout(Duration::from_secs(5))
            .enter(client.call(testkit::CallRequest::default()))
            .await
            .expect("a call with time to spare must succeed");
    }
    for _ in 0..3 {
        let late = tonic_deadline::Scope::background()
            .with_timeout(Duration::from_millis(30))
            .enter(client.call(testkit::CallRequest::default()))
            .await;
        assert_eq!(
            late.expect_err("30 ms cannot cover three 20 ms hops")
                .code(),
            tonic::Code::DeadlineExceeded
        );
    }

    let up = positive(prometheus_addr, r#"up{job="lab"}"#).await;
    assert_eq!(up, 1.0, "Prometheus must reach the lab's /metrics");
    let started = positive(prometheus_addr, "sum(grpc_server_call_started_total)").await;
    assert!(
        started >= 8.0,
        "every call reached at least the entry hop: {started}"
    );
    let series = [
        "grpc_server_call_duration_seconds_count",
        "grpc_client_attempt_started_total",
        "grpc_client_attempt_duration_seconds_count",
        "grpc_client_call_duration_seconds_count",
        "tonic_deadline_server_budget_on_entry_seconds_count",
        "tonic_deadline_client_budget_granted_seconds_count",
        r#"tonic_deadline_scope_ended_total{cause="completed"}"#,
        r#"tonic_deadline_scope_ended_total{cause="deadline_exceeded"}"#,
        r#"grpc_server_call_duration_seconds_count{grpc_status="DEADLINE_EXCEEDED"}"#,
    ];
    for promql in series {
        positive(prometheus_addr, &format!("sum({promql})")).await;
    }
    let by_method = query(prometheus_addr, "grpc_server_call_started_total")
        .await
        .expect("the query must answer");
    assert!(
        by_method.iter().all(|s| s
            .metric
            .get("grpc_method")
            .is_some_and(|m| m == "probe.v1.Probe/Call")),
        "calls are labelled with the method, without its leading slash: {by_method:?}"
    );
    drop(prometheus);
    drop(lab);
}
