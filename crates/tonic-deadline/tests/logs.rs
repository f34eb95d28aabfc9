//! Logs of real tonic services: an expected expiry is logged
//! as what it is, naming its cause, never as an error.
//!
//! Alone in its own test binary: `tracing` caches per call site whether
//! anyone listens, and tests on other threads of the same process (with no
//! subscriber) would race this one's thread-local subscriber for it. The
//! `it` binary is such a process: its tests run on many threads, and its
//! `seams` module installs a global subscriber of its own.

#[path = "it/common/mod.rs"]
mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Client, Events, Node, PATIENCE, channel, code, serve};
use testkit::CallRequest;
use testkit::probe_client::ProbeClient;
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer};

async fn client(addr: std::net::SocketAddr) -> Client {
    ProbeClient::new(
        tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new())
            .service(channel(addr).await),
    )
}

fn work(ms: u64) -> CallRequest {
    CallRequest {
        work_ms: ms,
        ..CallRequest::default()
    }
}

/// Every line written by `fmt`, kept for the test to read.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("the log buffer is never poisoned")
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().expect("never poisoned").clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

#[tokio::test]
async fn an_expected_expiry_is_never_logged_as_an_error_and_names_its_cause() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // This test's thread only: the servers below run on it (current-thread
    // runtime), and no other test sees the subscriber.
    let _default = tracing::subscriber::set_default(subscriber);

    let (_events, tx) = Events::new();
    // The server's own cap expires the handler: its timer, not the
    // client's, ends the call, so the server sees the deadline pass.
    let addr = serve(
        ServerDeadlineLayer::new().max_timeout(Duration::from_millis(100)),
        Node::new("A", &tx),
    )
    .await;
    let mut client = client(addr).await;
    let outcome = Scope::background()
        .with_timeout(PATIENCE)
        .enter(client.call(work(1_000)))
        .await;
    assert_eq!(code(&outcome), tonic::Code::DeadlineExceeded);
    // And one whose caller's deadline passes (on this one thread the
    // client's timer may fire first, and the server then sees a reset).
    let outcome = Scope::background()
        .with_timeout(Duration::from_millis(50))
        .enter(client.call(work(1_000)))
        .await;
    assert_eq!(code(&outcome), tonic::Code::DeadlineExceeded);
    let refused = Scope::background()
        .with_timeout(Duration::from_millis(1))
        .enter(async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            client.call(work(0)).await
        })
        .await;
    assert_eq!(code(&refused), tonic::Code::DeadlineExceeded);
    // The server's scope ends at its own timer, just before the client's.
    let mut lines = captured.lines();
    for _ in 0..100 {
        if lines
            .iter()
            .filter(|l| l.contains("request scope ended"))
            .count()
            >= 2
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        lines = captured.lines();
    }

    let ours: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("tonic_deadline"))
        .collect();
    assert!(
        !ours.is_empty(),
        "the expiry must be logged at all:\n{}",
        lines.join("\n")
    );
    for line in &lines {
        assert!(
            !line.contains(" ERROR "),
            "an expected expiry must not be logged at ERROR, by us or by the stack: {line}"
        );
    }
    // h2 traces its own reset codes (INTERNAL_ERROR on a stream already
    // closed); what we say about the request must not call it internal.
    for line in &ours {
        assert!(
            !line.to_ascii_lowercase().contains("internal"),
            "an expected expiry must not be called internal: {line}"
        );
    }
    let ended: Vec<&&String> = ours
        .iter()
        .filter(|l| l.contains("request scope ended"))
        .collect();
    assert!(
        !ended.is_empty(),
        "the server must log its scope's end:\n{}",
        lines.join("\n")
    );
    assert!(
        ended.iter().any(|l| l.contains("cause=deadline exceeded")),
        "the handler's expiry must be logged as such:\n{}",
        lines.join("\n")
    );
    for line in ended {
        assert!(
            line.contains("cause="),
            "the line must name the cause: {line}"
        );
        assert!(
            line.contains(" DEBUG "),
            "an expected expiry is a DEBUG line, not a warning: {line}"
        );
    }
}
