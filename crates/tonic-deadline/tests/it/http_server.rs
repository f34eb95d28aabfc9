//! The plain-HTTP server layer on real axum servers over loopback: every
//! request gets a scope from its deadline headers, the default and the cap
//! malformed headers are refused before the handler; the deadline is
//! enforced by the layer's own timer; a client that disconnects ends
//! the scope; a gRPC call from a handler carries what is left.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tonic_deadline::deadline_headers::DeadlineHeader;
use tonic_deadline::server::Http;
use tonic_deadline::{Cause, Scope, ServerDeadlineLayer};

use common::{Events, Node, PATIENCE};

/// What the handlers report: the scope they ran in.
type Seen = mpsc::UnboundedSender<Scope>;

async fn report(State(seen): State<Seen>) -> String {
    let scope = Scope::current();
    let remaining = scope.remaining();
    let _ = seen.send(scope);
    format!("{remaining:?}")
}

/// Ignores its scope and works for 5 s: only the layer can stop it.
async fn stuck(State(seen): State<Seen>) -> &'static str {
    let _ = seen.send(Scope::current());
    tokio::time::sleep(Duration::from_secs(5)).await;
    "finished"
}

/// Starts answering at once, then streams for 5 s.
async fn streaming(State(seen): State<Seen>) -> axum::body::Body {
    let _ = seen.send(Scope::current());
    let ticks = futures_ticks(Duration::from_millis(20), 250);
    axum::body::Body::from_stream(ticks)
}

fn futures_ticks(
    every: Duration,
    count: usize,
) -> impl tokio_stream::Stream<Item = Result<Bytes, std::io::Error>> {
    let interval = tokio::time::interval(every);
    tokio_stream::StreamExt::take(
        tokio_stream::StreamExt::map(
            tokio_stream::wrappers::IntervalStream::new(interval),
            |_| Ok(Bytes::from_static(b"tick\n")),
        ),
        count,
    )
}

async fn serve(layer: ServerDeadlineLayer<Http>) -> (SocketAddr, mpsc::UnboundedReceiver<Scope>) {
    let (seen, scopes) = mpsc::unbounded_channel();
    let app = Router::new()
        .route("/report", get(report))
        .route("/stuck", get(stuck))
        .route("/streaming", get(streaming))
        .with_state(seen)
        .layer(layer);
    let (listener, addr) = common::loopback().await;
    tokio::spawn(async move {
        axum::serve(listener, app)
            .await
            .expect("the test server must keep serving");
    });
    (addr, scopes)
}

/// One HTTP/1.1 GET with `headers`, answered in full.
async fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (StatusCode, String) {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("the test server must accept a connection");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/1.1 handshake");
    tokio::spawn(connection);
    let mut request = Request::get(format!("http://{addr}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = sender
        .send_request(
            request
                .body(Empty::<Bytes>::new())
                .expect("a valid request"),
        )
        .await
        .expect("the server must answer");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_else(|err| format!("<body cut: {err}>"));
    (status, body)
}

async fn scope_of(scopes: &mut mpsc::UnboundedReceiver<Scope>) -> Scope {
    tokio::time::timeout(PATIENCE, scopes.recv())
        .await
        .expect("the handler must run")
        .expect("the server keeps its sender")
}

fn millis(scope: &Scope) -> u128 {
    scope
        .remaining()
        .expect("the scope must have a deadline")
        .as_millis()
}

#[tokio::test]
async fn http_request_without_a_deadline_header_gets_the_default_budget() {
    let (addr, mut scopes) =
        serve(ServerDeadlineLayer::http().default_timeout(Duration::from_millis(900))).await;
    let (status, _) = get_with(addr, "/report", &[]).await;
    assert_eq!(status, StatusCode::OK);
    let scope = scope_of(&mut scopes).await;
    assert!(
        (700..=900).contains(&millis(&scope)),
        "the handler must see the 900 ms default: {scope:?}"
    );
}

#[tokio::test]
async fn each_accepted_header_sets_the_budget() {
    let (addr, mut scopes) =
        serve(ServerDeadlineLayer::http().default_timeout(Duration::from_secs(60))).await;
    let table = [
        ("grpc-timeout", "300m"),
        ("connect-timeout-ms", "300"),
        ("x-envoy-expected-rq-timeout-ms", "300"),
        ("request-timeout", "0.3"),
    ];
    for (name, value) in table {
        let (status, _) = get_with(addr, "/report", &[(name, value)]).await;
        assert_eq!(status, StatusCode::OK, "{name}: {value}");
        let scope = scope_of(&mut scopes).await;
        assert!(
            (100..=300).contains(&millis(&scope)),
            "{name}: {value} must give the handler 300 ms, not the default: {scope:?}"
        );
    }
}

#[tokio::test]
async fn the_tightest_deadline_header_wins() {
    let (addr, mut scopes) = serve(ServerDeadlineLayer::http()).await;
    let (status, _) = get_with(
        addr,
        "/report",
        &[
            ("grpc-timeout", "5S"),
            ("x-envoy-expected-rq-timeout-ms", "400"),
            ("request-timeout", "2"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let scope = scope_of(&mut scopes).await;
    assert!(
        (200..=400).contains(&millis(&scope)),
        "Envoy's 400 ms is the tightest: {scope:?}"
    );
}

#[tokio::test]
async fn max_timeout_caps_an_incoming_deadline() {
    let (addr, mut scopes) =
        serve(ServerDeadlineLayer::http().max_timeout(Duration::from_secs(2))).await;
    let (status, _) = get_with(addr, "/report", &[("grpc-timeout", "100H")]).await;
    assert_eq!(status, StatusCode::OK);
    let scope = scope_of(&mut scopes).await;
    assert!(
        millis(&scope) <= 2000,
        "a caller cannot pin 100 hours: {scope:?}"
    );
}

#[tokio::test]
async fn headers_not_accepted_are_ignored() {
    let (addr, mut scopes) = serve(
        ServerDeadlineLayer::http()
            .accept(&[DeadlineHeader::EnvoyExpectedTimeoutMs])
            .default_timeout(Duration::from_secs(60)),
    )
    .await;
    let (status, _) = get_with(addr, "/report", &[("request-timeout", "nonsense")]).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an ignored header cannot be malformed"
    );
    let scope = scope_of(&mut scopes).await;
    assert!(millis(&scope) > 50_000, "the default applies: {scope:?}");
}

#[tokio::test]
async fn malformed_deadline_header_is_a_400_naming_it_before_the_handler() {
    let (addr, mut scopes) = serve(ServerDeadlineLayer::http()).await;
    let table = [
        ("grpc-timeout", "1a"),
        ("connect-timeout-ms", "1.5"),
        ("x-envoy-expected-rq-timeout-ms", "-1"),
        ("request-timeout", "1s"),
    ];
    for (name, value) in table {
        let (status, body) = get_with(addr, "/report", &[(name, value)]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {value}");
        assert!(
            body.contains(name),
            "the answer must name the malformed header {name}: {body}"
        );
    }
    // The same connection of a new request still works, and no handler ran.
    let (status, _) = get_with(addr, "/report", &[]).await;
    assert_eq!(status, StatusCode::OK);
    let scope = scope_of(&mut scopes).await;
    assert!(
        scope.deadline().is_none(),
        "only the last request reached the handler"
    );
    assert!(
        scopes.try_recv().is_err(),
        "no malformed request reached the handler"
    );
}

#[tokio::test]
async fn an_expired_deadline_is_a_504_before_the_handler() {
    let (addr, mut scopes) = serve(ServerDeadlineLayer::http()).await;
    let (status, body) = get_with(addr, "/report", &[("connect-timeout-ms", "0")]).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(body, "deadline exceeded");
    assert!(scopes.try_recv().is_err(), "the handler must not run");
}

#[tokio::test]
async fn server_timer_answers_504_at_the_deadline_and_ends_the_scope() {
    let (addr, mut scopes) =
        serve(ServerDeadlineLayer::http().default_timeout(Duration::from_millis(200))).await;
    let start = tokio::time::Instant::now();
    let (status, body) = get_with(addr, "/stuck", &[]).await;
    let took = start.elapsed();
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(body, "deadline exceeded");
    assert!(
        took < Duration::from_secs(2),
        "answered at the deadline, not when the handler ends: {took:?}"
    );
    let scope = scope_of(&mut scopes).await;
    assert_eq!(
        scope.cause(),
        Some(Cause::DeadlineExceeded),
        "the handler's scope must end with the deadline"
    );
}

#[tokio::test]
async fn a_streaming_response_is_cut_at_the_deadline() {
    let (addr, mut scopes) =
        serve(ServerDeadlineLayer::http().default_timeout(Duration::from_millis(300))).await;
    let start = tokio::time::Instant::now();
    let (status, body) = get_with(addr, "/streaming", &[]).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the head went out before the deadline"
    );
    assert!(
        body.starts_with("<body cut"),
        "the client must see the body cut, not a complete answer: {body}"
    );
    assert!(start.elapsed() < Duration::from_secs(3));
    let scope = scope_of(&mut scopes).await;
    assert_eq!(scope.cause(), Some(Cause::DeadlineExceeded));
}

#[tokio::test]
async fn a_complete_response_ends_the_scope_as_completed() {
    let (addr, mut scopes) = serve(ServerDeadlineLayer::http()).await;
    let (status, _) = get_with(addr, "/report", &[]).await;
    assert_eq!(status, StatusCode::OK);
    let scope = scope_of(&mut scopes).await;
    let cause = tokio::time::timeout(PATIENCE, scope.ended())
        .await
        .expect("the scope must end once the answer is sent");
    assert_eq!(cause, Cause::Completed);
}

#[tokio::test]
async fn client_disconnect_ends_the_handlers_scope() {
    let (addr, mut scopes) = serve(ServerDeadlineLayer::http()).await;
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("the test server must accept a connection");
    stream
        .write_all(b"GET /stuck HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .expect("request written");
    let scope = scope_of(&mut scopes).await;
    assert!(
        scope.cause().is_none(),
        "still running while the client waits"
    );
    drop(stream);
    let cause = tokio::time::timeout(PATIENCE, scope.ended())
        .await
        .expect("the scope must end soon after the client disconnects");
    assert_eq!(cause, Cause::Abandoned);
}

#[tokio::test]
async fn a_reset_http2_stream_ends_the_handlers_scope() {
    let (addr, mut scopes) = serve(ServerDeadlineLayer::http()).await;
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("the test server must accept a connection");
    let (mut client, connection) = h2::client::handshake(stream).await.expect("h2 handshake");
    tokio::spawn(connection);
    let request = Request::get(format!("http://{addr}/stuck"))
        .body(())
        .expect("a valid request");
    let (response, _send) = client.send_request(request, true).expect("stream opened");
    let scope = scope_of(&mut scopes).await;
    drop(response); // h2 resets a stream whose response is no longer wanted
    drop(_send);
    let cause = tokio::time::timeout(PATIENCE, scope.ended())
        .await
        .expect("the scope must end soon after the stream is reset");
    assert_eq!(cause, Cause::Abandoned);
}

#[tokio::test]
async fn a_grpc_call_from_an_axum_handler_carries_what_is_left() {
    let (events, tx) = Events::new();
    drop(events);
    let grpc = common::serve(ServerDeadlineLayer::new(), Node::new("grpc", &tx)).await;
    let client = common::connect(grpc).await;
    let app = Router::new()
        .route(
            "/edge",
            get(|State(mut client): State<common::Client>| async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                match client.call(probe::CallRequest::default()).await {
                    Ok(reply) => reply.into_inner().hops[0].remaining_us.to_string(),
                    Err(status) => format!("error {status}"),
                }
            }),
        )
        .with_state(client)
        .layer(ServerDeadlineLayer::http().default_timeout(Duration::from_millis(900)));
    let (listener, addr) = common::loopback().await;
    tokio::spawn(async move { axum::serve(listener, app).await });
    let (status, body) = get_with(addr, "/edge", &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let remaining_us: i64 = body.parse().expect("the gRPC hop's remaining budget");
    assert!(
        (600_000..=800_000).contains(&remaining_us),
        "900 ms at the edge less its 100 ms of work must reach the gRPC service: {remaining_us} µs"
    );
}

#[tokio::test]
async fn a_raw_garbage_request_gets_an_http_error_not_a_hang() {
    let (addr, _scopes) = serve(ServerDeadlineLayer::http()).await;
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET /report HTTP/1.1\r\nhost: t\r\nrequest-timeout: \xff\xfe\r\n\r\n")
        .await
        .expect("written");
    let mut answer = vec![0u8; 512];
    let read = tokio::time::timeout(PATIENCE, stream.read(&mut answer))
        .await
        .expect("the server must answer, not hang")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(
        answer.starts_with("HTTP/1.1 400"),
        "a non-ASCII deadline header must be refused: {answer}"
    );
}
