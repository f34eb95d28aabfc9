//! The server layer speaking plain HTTP, on real axum servers over
//! loopback: every request gets a scope from its deadline headers, the
//! default and the cap (R-13); malformed headers are refused before the
//! handler; the deadline is enforced by the layer's own timer (R-11); a
//! client that disconnects ends the scope (R-12); a gRPC call from a handler
//! carries what is left (R-16); metrics (R-30) and spans as the gRPC side
//! reports them.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use crate::common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
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
use tonic_deadline::observe::{Metrics, ScopeEnding, Stage};
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
        .route("/missing", get(|| async { StatusCode::NOT_FOUND }))
        .route("/teapot", get(|| async { StatusCode::IM_A_TEAPOT }))
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
                match client.call(testkit::CallRequest::default()).await {
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

// ---------------------------------------------------------------------------
// Metrics and spans, as the gRPC side reports them.
// ---------------------------------------------------------------------------

/// The value of the sample `series` (name and labels as written) in the
/// handle's text, once it is there: a request is counted when its scope
/// ends, which the client may see a moment before.
async fn sample(metrics: &Metrics, series: &str) -> f64 {
    for _ in 0..100 {
        let text = metrics.encode();
        if let Some(value) = text
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.split(' ').next()?.parse().ok())
        {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{series} must be exposed:\n{}", metrics.encode())
}

fn duration_count(path: &str, status: &str) -> String {
    format!(
        r#"grpc_server_call_duration_seconds_count{{grpc_method="{path}",grpc_status="{status}"}}"#
    )
}

#[tokio::test]
async fn http_requests_are_counted_under_their_path_with_the_grpc_status_of_their_answer() {
    let metrics = Metrics::new();
    let (addr, _scopes) = serve(ServerDeadlineLayer::http().metrics(&metrics)).await;
    let table = [
        ("/report", &[][..], StatusCode::OK, "OK"),
        ("/missing", &[], StatusCode::NOT_FOUND, "NOT_FOUND"),
        ("/teapot", &[], StatusCode::IM_A_TEAPOT, "UNKNOWN"),
        (
            "/report",
            &[("request-timeout", "soon")],
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            "/report",
            &[("connect-timeout-ms", "0")],
            StatusCode::GATEWAY_TIMEOUT,
            "DEADLINE_EXCEEDED",
        ),
    ];
    for (path, headers, status, label) in table {
        let (answered, _) = get_with(addr, path, headers).await;
        assert_eq!(answered, status, "{path} {headers:?}");
        assert_eq!(
            sample(&metrics, &duration_count(path, label)).await,
            1.0,
            "{path} {headers:?} answered {status} must be timed as {label}"
        );
    }
    assert_eq!(
        sample(
            &metrics,
            r#"grpc_server_call_started_total{grpc_method="/report"}"#
        )
        .await,
        3.0,
        "the path, slash and all, is the method label"
    );
    assert_eq!(
        sample(
            &metrics,
            r#"tonic_deadline_server_budget_on_entry_seconds_count{grpc_method="/report"}"#
        )
        .await,
        1.0,
        "only the expired request brought a deadline header"
    );
    assert_eq!(metrics.refused_expired(Stage::Arrival), 1);
    assert_eq!(
        metrics.scopes_ended(ScopeEnding::Completed),
        1,
        "the OK answer"
    );
    assert_eq!(
        metrics.scopes_ended(ScopeEnding::Failed),
        2,
        "the 404 and the 418"
    );
}

#[tokio::test]
async fn an_http_answer_cut_or_ended_at_the_deadline_is_counted_as_deadline_exceeded() {
    let metrics = Metrics::new();
    let (addr, mut scopes) = serve(
        ServerDeadlineLayer::http()
            .default_timeout(Duration::from_millis(300))
            .metrics(&metrics),
    )
    .await;
    let (status, _) = get_with(addr, "/stuck", &[]).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    let (status, body) = get_with(addr, "/streaming", &[("request-timeout", "0.3")]).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the head went out before the deadline"
    );
    assert!(body.starts_with("<body cut"), "{body}");
    for path in ["/stuck", "/streaming"] {
        assert_eq!(
            sample(&metrics, &duration_count(path, "DEADLINE_EXCEEDED")).await,
            1.0,
            "{path}: a 200 head does not make a cut body OK"
        );
    }
    for _ in 0..2 {
        scope_of(&mut scopes).await;
    }
    assert_eq!(
        metrics.scopes_ended(ScopeEnding::LocalCap),
        1,
        "the stuck request's deadline was the layer's default"
    );
    assert_eq!(
        metrics.scopes_ended(ScopeEnding::DeadlineExceeded),
        1,
        "the streaming request's deadline was the caller's"
    );
}

/// A span's fields, as text.
type Fields = HashMap<String, String>;

/// The spans the test's subscriber saw, by id: name and fields.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<HashMap<u64, (String, Fields)>>>);

impl Spans {
    /// The fields of the one span named `name`.
    fn only(&self, name: &str) -> Fields {
        let spans = self.0.lock().expect("not poisoned");
        let mut named = spans.values().filter(|(n, _)| n == name);
        let (_, fields) = named.next().unwrap_or_else(|| panic!("a {name} span"));
        assert!(named.next().is_none(), "one {name} span");
        fields.clone()
    }
}

struct Visitor<'a>(&'a mut Fields);

impl tracing::field::Visit for Visitor<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").replace('"', ""),
        );
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = HashMap::new();
        attrs.record(&mut Visitor(&mut fields));
        self.0
            .lock()
            .expect("not poisoned")
            .insert(id.into_u64(), (attrs.metadata().name().to_owned(), fields));
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if let Some((_, fields)) = self.0.lock().expect("not poisoned").get_mut(&id.into_u64()) {
            values.record(&mut Visitor(fields));
        }
    }
}

/// Collects the spans of this thread (the test's single-threaded runtime
/// runs the server too) until the guard drops.
fn collect_spans() -> (Spans, tracing::subscriber::DefaultGuard) {
    use tracing_subscriber::layer::SubscriberExt;
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    (spans, tracing::subscriber::set_default(subscriber))
}

/// Waits until the span has its `cause`: it is recorded as the scope ends.
async fn ended(spans: &Spans, name: &str) -> Fields {
    for _ in 0..100 {
        let fields = spans.only(name);
        if fields.contains_key("cause") {
            return fields;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the {name} span must end: {:?}", spans.only(name))
}

#[tokio::test]
async fn an_http_span_carries_the_budget_the_cap_and_the_answer() {
    let (spans, _guard) = collect_spans();
    let (addr, mut scopes) = serve(
        ServerDeadlineLayer::http()
            .max_timeout(Duration::from_millis(300))
            .trace_spans(),
    )
    .await;
    let (status, _) = get_with(
        addr,
        "/report",
        &[("x-envoy-expected-rq-timeout-ms", "400")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    scope_of(&mut scopes).await;
    let fields = ended(&spans, "http.server").await;
    let expected = [
        ("otel.kind", "server"),
        ("otel.name", "GET"),
        ("http.request.method", "GET"),
        ("url.path", "/report"),
        ("http.response.status_code", "200"),
        ("deadline_header_ms", "400.0"),
        ("budget_on_entry_ms", "300.0"),
        ("cap_applied", "max_timeout"),
        ("outcome", "OK"),
        ("cause", "request completed"),
        ("outlived_parent_deadline", "false"),
    ];
    for (field, value) in expected {
        assert_eq!(
            fields.get(field).map(String::as_str),
            Some(value),
            "{field} of {fields:?}"
        );
    }
}

#[tokio::test]
async fn an_http_span_of_a_handler_out_of_time_names_the_deadline() {
    let (spans, _guard) = collect_spans();
    let (addr, mut scopes) = serve(
        ServerDeadlineLayer::http()
            .default_timeout(Duration::from_millis(200))
            .trace_spans(),
    )
    .await;
    let (status, _) = get_with(addr, "/stuck", &[]).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    scope_of(&mut scopes).await;
    let fields = ended(&spans, "http.server").await;
    let expected = [
        ("http.response.status_code", "504"),
        ("budget_on_entry_ms", "200.0"),
        ("cap_applied", "default_timeout"),
        ("outcome", "DEADLINE_EXCEEDED"),
        ("cause", "deadline exceeded"),
    ];
    for (field, value) in expected {
        assert_eq!(
            fields.get(field).map(String::as_str),
            Some(value),
            "{field} of {fields:?}"
        );
    }
    assert!(
        !fields.contains_key("deadline_header_ms"),
        "no deadline header arrived: {fields:?}"
    );
}
