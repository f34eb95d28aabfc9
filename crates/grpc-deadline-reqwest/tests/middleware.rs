//! The reqwest middleware against real HTTP servers over loopback: an
//! expired scope sends nothing, the deadline and a cancel end the
//! request with a recognisable error and abort it on the server (R-6, R-7,
//! R-12), the remaining budget travels in the configured header.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use bytes::Bytes;
use grpc_deadline::deadline_headers::DeadlineHeader;
use grpc_deadline::{Cause, Code, Scope};
use grpc_deadline_reqwest::{DeadlineMiddleware, ended, ended_in};
use http::HeaderMap;
use tokio::sync::mpsc;
use tonic_deadline::ServerDeadlineLayer;

const PATIENCE: Duration = Duration::from_secs(10);

#[derive(Clone)]
struct Server {
    requests: Arc<AtomicUsize>,
    /// `true` when a handler ran to its end, `false` when it was dropped.
    finished: mpsc::UnboundedSender<bool>,
}

struct Exit(mpsc::UnboundedSender<bool>, bool);

impl Drop for Exit {
    fn drop(&mut self) {
        let _ = self.0.send(self.1);
    }
}

async fn headers(State(server): State<Server>, headers: HeaderMap) -> String {
    server.requests.fetch_add(1, Ordering::SeqCst);
    let seen: Vec<String> = DeadlineHeader::ALL
        .iter()
        .filter_map(|h| {
            headers
                .get(h.as_str())
                .map(|v| format!("{h}={}", v.to_str().unwrap_or("?")))
        })
        .collect();
    seen.join(",")
}

async fn slow(State(server): State<Server>) -> &'static str {
    server.requests.fetch_add(1, Ordering::SeqCst);
    let mut exit = Exit(server.finished.clone(), false);
    tokio::time::sleep(Duration::from_secs(5)).await;
    exit.1 = true;
    "finished"
}

async fn slow_body(State(server): State<Server>) -> axum::body::Body {
    server.requests.fetch_add(1, Ordering::SeqCst);
    let ticks = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::IntervalStream::new(tokio::time::interval(Duration::from_millis(
            50,
        ))),
        |_| Ok::<_, std::io::Error>(Bytes::from_static(b"tick\n")),
    );
    axum::body::Body::from_stream(tokio_stream::StreamExt::take(ticks, 100))
}

async fn serve() -> (SocketAddr, Arc<AtomicUsize>, mpsc::UnboundedReceiver<bool>) {
    let (finished, exits) = mpsc::unbounded_channel();
    let requests = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/headers", get(headers))
        .route("/slow", get(slow))
        .route("/slow-body", get(slow_body))
        .with_state(Server {
            requests: requests.clone(),
            finished,
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("loopback listener");
    let addr = listener.local_addr().expect("bound");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, requests, exits)
}

/// Sees the request after our middleware, as reqwest will.
struct Spy(mpsc::UnboundedSender<Option<Duration>>);

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Spy {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let _ = self.0.send(request.timeout().copied());
        next.run(request, extensions).await
    }
}

fn client(middleware: DeadlineMiddleware) -> reqwest_middleware::ClientWithMiddleware {
    reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(middleware)
        .build()
}

#[tokio::test]
async fn expired_scope_sends_no_request() {
    let (addr, requests, _) = serve().await;
    let client = client(DeadlineMiddleware::new());
    let scope = Scope::background().with_timeout(Duration::ZERO);
    let err = scope
        .enter(client.get(format!("http://{addr}/headers")).send())
        .await
        .expect_err("an expired scope must fail locally");
    assert_eq!(
        ended(&err).map(|e| e.cause()),
        Some(Cause::DeadlineExceeded)
    );
    assert_eq!(
        requests.load(Ordering::SeqCst),
        0,
        "nothing reached the server"
    );
}

#[tokio::test]
async fn deadline_mid_request_fails_as_deadline_exceeded_and_aborts_it_on_the_server() {
    let (addr, _, mut exits) = serve().await;
    let client = client(DeadlineMiddleware::new());
    let scope = Scope::background().with_timeout(Duration::from_millis(200));
    let start = tokio::time::Instant::now();
    let err = scope
        .enter(client.get(format!("http://{addr}/slow")).send())
        .await
        .expect_err("a 5 s answer cannot come in 200 ms");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "failed at the deadline: {:?}",
        start.elapsed()
    );
    let ended = ended(&err).expect("the error must say the scope ended");
    assert_eq!(ended.cause(), Cause::DeadlineExceeded);
    assert_eq!(ended.cause().code(), Code::DeadlineExceeded);
    let finished = tokio::time::timeout(PATIENCE, exits.recv())
        .await
        .expect("the server's handler must end soon")
        .expect("sender kept");
    assert!(
        !finished,
        "the request was aborted: the server dropped its handler"
    );
}

#[tokio::test]
async fn cancel_fails_as_cancelled_and_aborts_the_request() {
    let (addr, _, mut exits) = serve().await;
    let client = client(DeadlineMiddleware::new());
    let scope = Scope::background();
    let canceller = scope.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        canceller.cancel();
    });
    let err = scope
        .enter(client.get(format!("http://{addr}/slow")).send())
        .await
        .expect_err("cancelled");
    assert_eq!(ended(&err).map(|e| e.cause()), Some(Cause::Cancelled));
    let finished = tokio::time::timeout(PATIENCE, exits.recv())
        .await
        .expect("the server's handler must end soon")
        .expect("sender kept");
    assert!(!finished);
}

#[tokio::test]
async fn a_body_still_streaming_at_the_deadline_fails_as_deadline_exceeded() {
    let (addr, _, _) = serve().await;
    let client = client(DeadlineMiddleware::new());
    let scope = Scope::background().with_timeout(Duration::from_millis(300));
    let read = scope
        .enter(async {
            let response = client
                .get(format!("http://{addr}/slow-body"))
                .send()
                .await
                .expect("the head comes at once");
            response.bytes().await
        })
        .await;
    let err = read.expect_err("a 5 s body cannot be read in 300 ms");
    assert_eq!(
        ended_in(&err).map(|e| e.cause()),
        Some(Cause::DeadlineExceeded),
        "the body error must carry the deadline: {err:?}"
    );
}

#[tokio::test]
async fn remaining_budget_is_written_into_the_configured_header() {
    let (addr, _, _) = serve().await;
    for header in DeadlineHeader::ALL {
        let client = client(DeadlineMiddleware::new().propagate_as(header));
        let scope = Scope::background().with_timeout(Duration::from_millis(500));
        let seen = scope
            .enter(async {
                client
                    .get(format!("http://{addr}/headers"))
                    .header(header.as_str(), "999999")
                    .send()
                    .await
                    .expect("sent")
                    .text()
                    .await
                    .expect("read")
            })
            .await;
        let value = seen
            .strip_prefix(&format!("{header}="))
            .unwrap_or_else(|| panic!("{header} must be sent alone: {seen}"));
        let budget = header
            .decode(&http::HeaderValue::from_str(value).expect("ascii"))
            .expect("our own encoding decodes");
        assert!(
            budget > Duration::from_millis(300) && budget <= Duration::from_millis(500),
            "{header} must carry the remaining budget, not the caller's value: {value}"
        );
    }
}

#[tokio::test]
async fn without_a_scope_requests_pass_untouched() {
    let (addr, _, _) = serve().await;
    let client = client(DeadlineMiddleware::new().propagate_as(DeadlineHeader::GrpcTimeout));
    let seen = client
        .get(format!("http://{addr}/headers"))
        .send()
        .await
        .expect("sent")
        .text()
        .await
        .expect("read");
    assert_eq!(seen, "", "no deadline, no header");
}

#[tokio::test]
async fn reqwest_timeout_becomes_the_remaining_budget() {
    let (addr, _, _) = serve().await;
    let (seen, mut timeouts) = mpsc::unbounded_channel();
    let spy = Spy(seen);
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(DeadlineMiddleware::new())
        .with(spy)
        .build();
    let scope = Scope::background().with_timeout(Duration::from_millis(700));
    scope
        .enter(
            client
                .get(format!("http://{addr}/headers"))
                .timeout(Duration::from_secs(30))
                .send(),
        )
        .await
        .expect("answered");
    let timeout = timeouts
        .recv()
        .await
        .flatten()
        .expect("reqwest got a timeout");
    assert!(
        timeout <= Duration::from_millis(700) && timeout > Duration::from_millis(500),
        "min(30 s asked, 700 ms left): {timeout:?}"
    );
}

#[tokio::test]
async fn an_http_edge_passes_what_is_left_to_the_next_http_service() {
    let (downstream, _, _) = serve().await;
    let outbound = client(DeadlineMiddleware::new().propagate_as(DeadlineHeader::GrpcTimeout));
    let app = Router::new()
        .route(
            "/edge",
            get(move || {
                let outbound = outbound.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    outbound
                        .get(format!("http://{downstream}/headers"))
                        .send()
                        .await
                        .expect("downstream answers")
                        .text()
                        .await
                        .expect("read")
                }
            }),
        )
        .layer(ServerDeadlineLayer::http().default_timeout(Duration::from_millis(900)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("loopback listener");
    let edge = listener.local_addr().expect("bound");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let seen = reqwest::get(format!("http://{edge}/edge"))
        .await
        .expect("edge answers")
        .text()
        .await
        .expect("read");
    let value = seen.strip_prefix("grpc-timeout=").expect("sent");
    let left = DeadlineHeader::GrpcTimeout
        .decode(&http::HeaderValue::from_str(value).expect("ascii"))
        .expect("decodes");
    assert!(
        left > Duration::from_millis(600) && left <= Duration::from_millis(800),
        "900 ms less the edge's 100 ms: {value}"
    );
}

#[test]
fn an_error_of_an_ended_scope_answers_its_cause_through_tonic() {
    for cause in Cause::ALL {
        let code = tonic::Code::from(cause.code());
        let make = || reqwest_middleware::Error::middleware(grpc_deadline::Ended::new(cause));
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(make());
        assert_eq!(
            tonic::Status::from_error(boxed).code(),
            code,
            "{cause}: boxed by `?`, tonic's Status::from_error must find it"
        );
        assert_eq!(
            tonic_deadline::status::from_error(&make()).code(),
            code,
            "{cause}: tonic-deadline's walk must find it"
        );
    }
}
