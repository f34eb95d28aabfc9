//! The server layer on its own, around mock handlers, on a paused clock.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body::{Body as _, Frame};
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tower::{Layer, Service, ServiceExt, service_fn};

use super::ServerDeadlineLayer;
use super::protocol::{Grpc, sealed::Sealed};
use crate::scope::{Cause, Scope};
use crate::wire::timeout_header;

const MS: Duration = Duration::from_millis(1);

/// How early the gRPC layer's timer fires.
const TONIC_TIMER_LEAD: Duration = <Grpc as Sealed>::TIMER_LEAD;

/// What a handler behind the gRPC layer receives.
type Handed = super::RequestBody<Empty<Bytes>>;

type Mock = tower_test::mock::Mock<Request<Handed>, Response<Full<Bytes>>>;
type MockHandle = tower_test::mock::Handle<Request<Handed>, Response<Full<Bytes>>>;

/// The layer keeping nothing for the answer's way back: the budgets these
/// tests read are the header's exactly (see
/// `the_default_reserve_keeps_a_twentieth_up_to_10_ms_for_the_ledger`).
fn exact() -> ServerDeadlineLayer {
    ServerDeadlineLayer::new().reply_reserve(Duration::ZERO)
}

fn request(timeout: Option<&'static str>) -> Request<Empty<Bytes>> {
    let mut request = Request::new(Empty::new());
    if let Some(timeout) = timeout {
        request
            .headers_mut()
            .insert("grpc-timeout", HeaderValue::from_static(timeout));
    }
    request
}

fn mock() -> (Mock, MockHandle) {
    tower_test::mock::pair()
}

fn reply() -> Response<Full<Bytes>> {
    Response::new(Full::new(Bytes::from_static(b"reply")))
}

/// The gRPC status a response carries in its head (a trailers-only answer).
fn head_status<B>(response: &Response<B>) -> tonic::Status {
    tonic::Status::from_header_map(response.headers())
        .expect("a trailers-only answer must carry grpc-status in its head")
}

/// A handler that reports the scope it sees and then never answers.
fn hanging_handler(
    seen: mpsc::UnboundedSender<Scope>,
) -> impl Service<
    Request<Handed>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Full<Bytes>>, Infallible>>,
> + Clone {
    service_fn(move |_request: Request<Handed>| {
        let seen = seen.clone();
        async move {
            seen.send(Scope::current())
                .expect("the test keeps the receiver");
            std::future::pending::<Result<Response<Full<Bytes>>, Infallible>>().await
        }
    })
}

/// A handler that reports its scope and answers at once with `body`.
fn answering_handler<B>(
    seen: mpsc::UnboundedSender<Scope>,
    body: impl Fn() -> B + Clone,
) -> impl Service<
    Request<Handed>,
    Response = Response<B>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<B>, Infallible>>,
> + Clone {
    service_fn(move |_request: Request<Handed>| {
        let seen = seen.clone();
        let body = body.clone();
        async move {
            seen.send(Scope::current())
                .expect("the test keeps the receiver");
            Ok(Response::new(body()))
        }
    })
}

#[tokio::test(start_paused = true)]
async fn malformed_timeout_is_internal_trailers_only_before_the_handler() {
    let malformed: &[&[u8]] = &[
        b"1a",
        b"+1S",
        b"123456789S",
        b"",
        b" 1S",
        b"1.5S",
        b"1\xe9S",
    ];
    for &value in malformed {
        let (inner, mut handle) = mock();
        let mut service = exact().layer(inner);
        let mut request = request(None);
        request.headers_mut().insert(
            "grpc-timeout",
            HeaderValue::from_bytes(value).expect("a valid header value, malformed timeout"),
        );
        let response = service
            .ready()
            .await
            .expect("the mock is ready")
            .call(request)
            .await
            .expect("a refusal is a gRPC answer, not a transport error");

        let shown = String::from_utf8_lossy(value);
        let status = head_status(&response);
        assert_eq!(
            status.code(),
            tonic::Code::Internal,
            "{shown:?} must be INTERNAL"
        );
        assert!(
            status.message().contains("grpc-timeout"),
            "the message must name the header: {:?}",
            status.message()
        );
        assert!(
            response.body().is_end_stream(),
            "{shown:?}: the answer must be trailers-only"
        );
        drop(service);
        assert!(
            handle.next_request().await.is_none(),
            "{shown:?}: the handler must never be called"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn duplicated_timeout_is_internal_before_the_handler() {
    let (inner, mut handle) = mock();
    let mut service = exact().layer(inner);
    let mut request = request(Some("1S"));
    request
        .headers_mut()
        .append("grpc-timeout", HeaderValue::from_static("2S"));
    let response = service
        .ready()
        .await
        .expect("ready")
        .call(request)
        .await
        .expect("an answer");
    assert_eq!(head_status(&response).code(), tonic::Code::Internal);
    drop(service);
    assert!(
        handle.next_request().await.is_none(),
        "the handler must never be called"
    );
}

#[tokio::test(start_paused = true)]
async fn zero_timeout_is_deadline_exceeded_without_the_handler() {
    for value in ["0n", "0u", "0m", "0S", "0M", "0H", "00000000S"] {
        let (inner, mut handle) = mock();
        let mut service = exact().default_timeout(Duration::from_secs(1)).layer(inner);
        let response = service
            .ready()
            .await
            .expect("ready")
            .call(request(Some(value)))
            .await
            .expect("an answer");
        assert_eq!(
            head_status(&response).code(),
            tonic::Code::DeadlineExceeded,
            "{value}: a zero budget is already expired, whatever the default"
        );
        assert!(response.body().is_end_stream(), "{value}: trailers-only");
        drop(service);
        assert!(
            handle.next_request().await.is_none(),
            "{value}: expired work must not reach the handler"
        );
    }
}

/// The budget the handler sees for a request carrying `timeout`.
async fn budget_seen(
    layer: &ServerDeadlineLayer,
    timeout: Option<&'static str>,
) -> Option<Duration> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let service = layer.layer(answering_handler(tx, || Full::new(Bytes::new())));
    let _response = service.oneshot(request(timeout)).await.expect("an answer");
    let scope = rx.try_recv().expect("the handler must run");
    scope.remaining()
}

#[tokio::test(start_paused = true)]
async fn no_limits_and_no_header_mean_no_deadline() {
    let layer = exact();
    assert_eq!(
        budget_seen(&layer, None).await,
        None,
        "no header must mean no deadline"
    );
    assert_eq!(
        budget_seen(&layer, Some("2S")).await,
        Some(Duration::from_secs(2)),
        "the header's budget must start from the server's own now"
    );
    assert_eq!(
        budget_seen(&layer, Some("99999999H")).await,
        Some(timeout_header::MAX_DECODED),
        "without a maximum any budget must be accepted"
    );
}

#[tokio::test(start_paused = true)]
async fn default_timeout_applies_only_to_requests_without_one() {
    let default = 500 * MS;
    let layer = exact().default_timeout(default);
    assert_eq!(
        budget_seen(&layer, None).await,
        Some(default),
        "a request without a deadline must get the default"
    );
    assert_eq!(
        budget_seen(&layer, Some("2S")).await,
        Some(Duration::from_secs(2)),
        "the default must not cut a deadline the caller sent"
    );
    assert_eq!(budget_seen(&layer, Some("100m")).await, Some(100 * MS));
}

#[tokio::test(start_paused = true)]
async fn max_timeout_caps_every_budget() {
    let max = Duration::from_secs(1);
    let layer = exact().max_timeout(max);
    assert_eq!(
        budget_seen(&layer, Some("100H")).await,
        Some(max),
        "a caller must not pin the server for 100 hours"
    );
    assert_eq!(
        budget_seen(&layer, None).await,
        Some(max),
        "a request without a deadline must get the maximum"
    );
    assert_eq!(
        budget_seen(&layer, Some("200m")).await,
        Some(200 * MS),
        "smaller budgets stay"
    );

    let both = exact()
        .default_timeout(Duration::from_secs(5))
        .max_timeout(max);
    assert_eq!(
        budget_seen(&both, None).await,
        Some(max),
        "a default larger than the maximum must be capped too"
    );
}

#[tokio::test(start_paused = true)]
async fn scope_is_in_extensions_and_current_during_the_handler() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let handler = service_fn(move |request: Request<Handed>| {
        let tx = tx.clone();
        let extension = request
            .extensions()
            .get::<Scope>()
            .cloned()
            .expect("the scope must be a request extension");
        let at_call = Scope::try_current().expect("the scope must be current in call()");
        async move {
            let in_future = Scope::try_current().expect("the scope must be current in the handler");
            tx.send((extension, at_call, in_future))
                .expect("receiver alive");
            // The body is polled later, by the server; it must see the scope too.
            let frames = tokio_stream::StreamExt::map(tokio_stream::iter([()]), |()| {
                let scope = Scope::try_current().expect("the scope must be current in the body");
                let remaining = format!("{:?}", scope.remaining());
                Ok::<_, Infallible>(Frame::data(Bytes::from(remaining)))
            });
            Ok::<_, Infallible>(Response::new(StreamBody::new(frames)))
        }
    });
    let service = exact().layer(handler);
    let response = service
        .oneshot(request(Some("3S")))
        .await
        .expect("an answer");
    let (extension, at_call, in_future) = rx.try_recv().expect("the handler must run");
    for (where_, scope) in [("call", &at_call), ("future", &in_future)] {
        assert_eq!(
            scope.deadline(),
            extension.deadline(),
            "{where_}: the current scope must be the request's scope"
        );
    }
    assert_eq!(extension.remaining(), Some(Duration::from_secs(3)));

    let body = response
        .into_body()
        .collect()
        .await
        .expect("the body completes")
        .to_bytes();
    assert_eq!(
        body,
        format!("{:?}", Some(Duration::from_secs(3))),
        "the body must be produced inside the request's scope"
    );
    assert_eq!(
        (extension.cause(), at_call.cause(), in_future.cause()),
        (
            Some(Cause::Completed),
            Some(Cause::Completed),
            Some(Cause::Completed)
        ),
        "the extension and the current scope must be one node, ended by the answer"
    );
}

#[tokio::test(start_paused = true)]
async fn server_timer_answers_deadline_exceeded_and_cancels_the_scope() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let budget = 100 * MS;
    let service = exact().layer(hanging_handler(tx));
    let start = Instant::now();
    let response = service
        .oneshot(request(Some("100m")))
        .await
        .expect("the timer must answer for a handler that never does");
    let elapsed = Instant::now() - start;

    assert_eq!(head_status(&response).code(), tonic::Code::DeadlineExceeded);
    assert!(response.body().is_end_stream(), "trailers-only");
    assert!(
        elapsed <= budget && elapsed >= budget - TONIC_TIMER_LEAD,
        "the answer must come at the deadline, took {elapsed:?}"
    );
    let scope = rx.try_recv().expect("the handler must have run");
    assert_eq!(
        scope.cause(),
        Some(Cause::DeadlineExceeded),
        "the handler's scope must be cancelled by the timer, as a deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn server_timer_applies_the_default_to_a_handler_ignoring_it() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let service = exact().default_timeout(500 * MS).layer(hanging_handler(tx));
    let start = Instant::now();
    let response = service.oneshot(request(None)).await.expect("an answer");
    assert_eq!(head_status(&response).code(), tonic::Code::DeadlineExceeded);
    assert!(
        Instant::now() - start <= 500 * MS,
        "the default must be enforced"
    );
    let scope = rx.try_recv().expect("the handler ran");
    assert_eq!(scope.cause(), Some(Cause::DeadlineExceeded));
}

#[tokio::test(start_paused = true)]
async fn dropping_the_response_future_cancels_the_scope_as_caller_cancelled() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (task_tx, mut task_rx) = mpsc::unbounded_channel();
    let handler = service_fn(move |_request: Request<Handed>| {
        let tx = tx.clone();
        let task_tx = task_tx.clone();
        async move {
            tx.send(Scope::current()).expect("receiver alive");
            task_tx
                .send(crate::spawn(std::future::pending::<()>()))
                .expect("receiver alive");
            std::future::pending::<Result<Response<Full<Bytes>>, Infallible>>().await
        }
    });
    let service = exact().layer(handler);
    let mut call = Box::pin(service.oneshot(request(Some("10S"))));
    tokio::time::timeout(10 * MS, &mut call)
        .await
        .expect_err("the handler hangs");
    let scope = rx.try_recv().expect("the handler must have started");
    let task = task_rx
        .try_recv()
        .expect("the handler must have spawned its task");
    assert_eq!(
        scope.cause(),
        None,
        "the scope lives while the call is in flight"
    );

    // What hyper does when the client resets the stream.
    drop(call);
    assert_eq!(scope.cause(), Some(Cause::Abandoned));
    let ended = task
        .await
        .expect("no panic")
        .expect_err("a task spawned by the handler must stop with it");
    assert_eq!(ended.cause(), Cause::Abandoned, "with the caller's cause");
}

#[tokio::test(start_paused = true)]
async fn dropping_the_body_mid_stream_cancels_the_scope_as_caller_cancelled() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (frames, frames_rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    let frames_rx = Arc::new(std::sync::Mutex::new(Some(frames_rx)));
    let handler = answering_handler(tx, move || {
        let stream = frames_rx
            .lock()
            .expect("not poisoned")
            .take()
            .expect("one call");
        StreamBody::new(ReceiverStream::new(stream))
    });
    let service = exact().layer(handler);
    let response = service
        .oneshot(request(Some("10S")))
        .await
        .expect("an answer");
    let scope = rx.try_recv().expect("the handler ran");
    frames
        .send(Ok(Frame::data(Bytes::from_static(b"first"))))
        .await
        .expect("the body is alive");
    let mut body = response.into_body();
    let first = body.frame().await.expect("a frame").expect("no error");
    assert_eq!(first.into_data().ok(), Some(Bytes::from_static(b"first")));
    assert_eq!(scope.cause(), None, "the scope lives while the stream does");

    drop(body);
    assert_eq!(
        scope.cause(),
        Some(Cause::Abandoned),
        "a stream dropped unfinished means the caller went away"
    );
}

#[tokio::test(start_paused = true)]
async fn completing_the_body_ends_the_scope_as_completed() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (task_tx, mut task_rx) = mpsc::unbounded_channel();
    let handler = service_fn(move |_request: Request<Handed>| {
        let tx = tx.clone();
        let task_tx = task_tx.clone();
        async move {
            tx.send(Scope::current()).expect("receiver alive");
            task_tx
                .send(crate::spawn(std::future::pending::<()>()))
                .expect("receiver alive");
            Ok::<_, Infallible>(reply())
        }
    });
    let service = exact().layer(handler);
    let response = service
        .oneshot(request(Some("10S")))
        .await
        .expect("an answer");
    let scope = rx.try_recv().expect("the handler ran");
    assert_eq!(
        scope.cause(),
        None,
        "the scope must live until the response body is done"
    );

    let body = response
        .into_body()
        .collect()
        .await
        .expect("the body completes");
    assert_eq!(body.to_bytes(), Bytes::from_static(b"reply"));
    assert_eq!(scope.cause(), Some(Cause::Completed));
    let task = task_rx.try_recv().expect("the handler spawned a task");
    let ended = task
        .await
        .expect("no panic")
        .expect_err("work tied to an answered request must stop");
    assert_eq!(ended.cause(), Cause::Completed);
}

#[tokio::test(start_paused = true)]
async fn body_that_ends_with_its_last_data_frame_completes_the_scope() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let service = exact().layer(answering_handler(tx, || {
        Full::new(Bytes::from_static(b"reply"))
    }));
    let response = service
        .oneshot(request(Some("10S")))
        .await
        .expect("an answer");
    let scope = rx.try_recv().expect("the handler ran");

    // hyper stops polling a body as soon as it reports its end, without
    // waiting for a final `None`; then it drops the body.
    let mut body = response.into_body();
    while !body.is_end_stream() {
        body.frame().await.expect("a frame").expect("no error");
    }
    drop(body);
    assert_eq!(
        scope.cause(),
        Some(Cause::Completed),
        "a body sent in full must end the scope as completed, not as a caller cancel"
    );
}

#[tokio::test(start_paused = true)]
async fn handler_errors_and_trailers_only_answers_complete_the_scope() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let service = exact().layer(answering_handler(tx, Empty::<Bytes>::new));
    let response = service
        .oneshot(request(Some("10S")))
        .await
        .expect("an answer");
    assert!(response.body().is_end_stream());
    let scope = rx.try_recv().expect("the handler ran");
    assert_eq!(
        scope.cause(),
        Some(Cause::Completed),
        "a trailers-only answer is complete when the head is"
    );

    let (tx, mut rx) = mpsc::unbounded_channel();
    let failing = service_fn(move |_request: Request<Handed>| {
        let tx = tx.clone();
        async move {
            tx.send(Scope::current()).expect("receiver alive");
            Err::<Response<Full<Bytes>>, _>(std::io::Error::other("handler failed"))
        }
    });
    let service = exact().layer(failing);
    let error = service
        .oneshot(request(Some("10S")))
        .await
        .expect_err("the handler's error must pass through");
    assert_eq!(error.to_string(), "handler failed");
    let scope = rx.try_recv().expect("the handler ran");
    assert_eq!(scope.cause(), Some(Cause::Completed));
}

#[tokio::test(start_paused = true)]
async fn streaming_body_gets_deadline_exceeded_trailers_at_the_deadline() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (frames, frames_rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    let frames_rx = Arc::new(std::sync::Mutex::new(Some(frames_rx)));
    let handler = answering_handler(tx, move || {
        let stream = frames_rx
            .lock()
            .expect("not poisoned")
            .take()
            .expect("one call");
        StreamBody::new(ReceiverStream::new(stream))
    });
    let budget = 300 * MS;
    let service = exact().layer(handler);
    let start = Instant::now();
    let response = service
        .oneshot(request(Some("300m")))
        .await
        .expect("an answer");
    assert_eq!(
        response.headers().get("grpc-status"),
        None,
        "a stream, not trailers-only"
    );
    let scope = rx.try_recv().expect("the handler ran");

    frames
        .send(Ok(Frame::data(Bytes::from_static(b"tick"))))
        .await
        .expect("the body is alive");
    let mut body = response.into_body();
    let tick = body.frame().await.expect("a frame").expect("no error");
    assert!(tick.is_data(), "messages before the deadline must pass");

    // The handler keeps the stream open past the deadline.
    let last = body
        .frame()
        .await
        .expect("a final frame")
        .expect("no error");
    let elapsed = Instant::now() - start;
    let trailers = last
        .into_trailers()
        .expect("the stream must be cut with trailers");
    let status = tonic::Status::from_header_map(&trailers).expect("trailers carry grpc-status");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    assert!(
        elapsed <= budget && elapsed >= budget - TONIC_TIMER_LEAD,
        "the stream must be cut at the deadline, took {elapsed:?}"
    );
    assert!(
        body.frame().await.is_none(),
        "nothing may follow the trailers"
    );
    assert!(body.is_end_stream());
    assert_eq!(scope.cause(), Some(Cause::DeadlineExceeded));
    assert!(
        frames.send(Ok(Frame::data(Bytes::new()))).await.is_err(),
        "the layer dropped the handler's stream when it cut it"
    );
}

#[tokio::test(start_paused = true)]
async fn forward_metadata_copies_only_the_allow_list() {
    let outbound = Arc::new(std::sync::Mutex::new(Vec::<http::HeaderMap>::new()));
    let recorded = outbound.clone();
    let downstream = crate::client::ClientDeadline::new(service_fn(
        move |request: Request<tonic::body::Body>| {
            recorded
                .lock()
                .expect("not poisoned")
                .push(request.headers().clone());
            async { Ok::<_, Infallible>(reply()) }
        },
    ));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let handler = service_fn(move |_request: Request<Handed>| {
        let downstream = downstream.clone();
        let tx = tx.clone();
        async move {
            tx.send(Scope::current()).expect("receiver alive");
            let mut call = Request::new(Empty::<Bytes>::new());
            call.headers_mut()
                .insert("x-own", HeaderValue::from_static("set-by-handler"));
            let _ = downstream
                .oneshot(call)
                .await
                .expect("the downstream answers");
            Ok::<_, Infallible>(reply())
        }
    });
    let service = exact()
        .forward_metadata("x-trace-id")
        .forward_metadata("x-flags")
        .forward_metadata("grpc-timeout")
        .layer(handler);

    let mut incoming = request(Some("2S"));
    let headers = incoming.headers_mut();
    headers.append("x-trace-id", HeaderValue::from_static("trace-1"));
    headers.append("x-trace-id", HeaderValue::from_static("trace-2"));
    headers.insert("authorization", HeaderValue::from_static("Bearer secret"));
    headers.insert("x-other", HeaderValue::from_static("not listed"));
    let response = service.oneshot(incoming).await.expect("an answer");
    let _ = response
        .into_body()
        .collect()
        .await
        .expect("the body completes");

    let scope = rx.try_recv().expect("the handler ran");
    let forwarded = scope
        .attached::<crate::forwarded::Attached>()
        .and_then(crate::forwarded::Attached::forwarded)
        .expect("listed keys were present");
    assert!(
        !forwarded.contains_key("grpc-timeout"),
        "grpc-* keys must never be forwarded as metadata"
    );
    let outbound = outbound.lock().expect("not poisoned");
    let sent = outbound
        .first()
        .expect("the handler made one outbound call");
    let trace: Vec<_> = sent.get_all("x-trace-id").iter().collect();
    assert_eq!(
        trace,
        ["trace-1", "trace-2"],
        "listed keys must travel with every value"
    );
    assert!(
        sent.get("authorization").is_none(),
        "auth must never leak downstream"
    );
    assert!(
        sent.get("x-other").is_none(),
        "unlisted keys must not travel"
    );
    assert!(
        sent.get("x-flags").is_none(),
        "absent keys must not be invented"
    );
    assert_eq!(
        sent.get("x-own").map(HeaderValue::as_bytes),
        Some(&b"set-by-handler"[..])
    );
    let wire = sent.get("grpc-timeout").expect("the deadline must travel");
    assert_eq!(
        timeout_header::decode(wire.as_bytes()),
        Ok(Duration::from_secs(2)),
        "the deadline travels as the remaining budget, never as copied metadata"
    );
}

/// The same layer speaking plain HTTP.
#[cfg(feature = "http")]
mod plain_http;

/// A gRPC-Web answer (the server layer in front of `GrpcWebLayer` sees the
/// translated one) carries its trailers in the body: a stream cut at its
/// deadline ends with the trailer frame, binary or in base64, never with
/// HTTP trailers that HTTP/1.1 would drop.
#[tokio::test(start_paused = true)]
async fn a_grpc_web_stream_cut_at_its_deadline_ends_with_a_trailer_frame() {
    use base64::Engine as _;
    for (content_type, text) in [
        ("application/grpc-web+proto", false),
        ("application/grpc-web-text+proto", true),
    ] {
        let (_frames, frames_rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
        let frames_rx = Arc::new(std::sync::Mutex::new(Some(frames_rx)));
        let handler = service_fn(move |_request: Request<Handed>| {
            let stream = frames_rx
                .lock()
                .expect("not poisoned")
                .take()
                .expect("one call");
            async move {
                let mut response = Response::new(StreamBody::new(ReceiverStream::new(stream)));
                response
                    .headers_mut()
                    .insert("content-type", HeaderValue::from_static(content_type));
                Ok::<_, Infallible>(response)
            }
        });
        let response = exact()
            .layer(handler)
            .oneshot(request(Some("100m")))
            .await
            .expect("an answer");
        let mut body = response.into_body();
        let last = body
            .frame()
            .await
            .expect("a final frame")
            .expect("no error")
            .into_data()
            .unwrap_or_else(|_| panic!("{content_type}: the trailers must travel as data"));
        assert!(body.is_end_stream(), "{content_type}: the body ends there");
        let frame = if text {
            base64::engine::general_purpose::STANDARD
                .decode(&last)
                .expect("grpc-web-text is base64")
        } else {
            last.to_vec()
        };
        assert_eq!(frame[0], 0x80, "{content_type}: a trailer frame");
        let length = u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]) as usize;
        assert_eq!(length, frame.len() - 5, "{content_type}: its length");
        let lines = std::str::from_utf8(&frame[5..]).expect("header lines");
        assert!(
            lines.starts_with("grpc-status:4\r\n") && lines.contains("grpc-message:"),
            "{content_type}: DEADLINE_EXCEEDED: {lines:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_default_reserve_keeps_a_twentieth_up_to_10_ms_for_the_ledger() {
    let layer = ServerDeadlineLayer::new();
    // (header, the handler's budget with the ledger)
    let cases = [
        ("1S", 990 * MS),    // 10 ms at most
        ("100m", 95 * MS),   // a twentieth
        ("20m", 19 * MS),    // a twentieth
        ("10S", 9_990 * MS), // 10 ms at most
    ];
    for (header, with_ledger) in cases {
        let whole = timeout_header::decode(header.as_bytes()).expect("valid");
        let expected = if cfg!(feature = "ledger") {
            with_ledger
        } else {
            whole
        };
        assert_eq!(
            budget_seen(&layer, Some(header)).await,
            Some(expected),
            "{header}"
        );
    }
    assert_eq!(
        budget_seen(&exact(), Some("1S")).await,
        Some(1_000 * MS),
        "a reserve set to zero gives the handler the whole budget"
    );
    assert_eq!(
        budget_seen(
            &ServerDeadlineLayer::new().reply_reserve(100 * MS),
            Some("1S")
        )
        .await,
        Some(950 * MS),
        "a reserve set is kept, at most a twentieth"
    );
}

/// Polls `future` once (std alone: the crate builds its tests without
/// futures' macros).
async fn poll_once<F: Future + Unpin>(future: &mut F) -> std::task::Poll<F::Output> {
    std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut *future).poll(cx)))
        .await
}

/// What a test feeds a request body with.
type Fed = Result<Frame<Bytes>, tonic::Status>;

/// A body the test feeds frame by frame (dropping the sender ends it).
type FedStream = StreamBody<ReceiverStream<Fed>>;

/// A request whose body the test feeds frame by frame.
fn fed_request(timeout: &'static str) -> (Request<FedStream>, mpsc::Sender<Fed>) {
    let (tx, rx) = mpsc::channel(4);
    let mut request = Request::new(StreamBody::new(ReceiverStream::new(rx)));
    request
        .headers_mut()
        .insert("grpc-timeout", HeaderValue::from_static(timeout));
    (request, tx)
}

type FedBody = super::RequestBody<FedStream>;

/// A handler that hands the test its request body and never answers.
fn body_taking_handler(
    bodies: mpsc::UnboundedSender<(FedBody, Scope)>,
) -> impl Service<
    Request<FedBody>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Full<Bytes>>, Infallible>>,
> + Clone {
    service_fn(move |request: Request<FedBody>| {
        let bodies = bodies.clone();
        async move {
            let scope = Scope::current();
            bodies
                .send((request.into_body(), scope))
                .expect("receiver alive");
            std::future::pending().await
        }
    })
}

/// What tonic's decoder hands a handler for a body error: the status found
/// in the error, as `tonic::body::Body` finds it.
fn status_read(err: crate::BoxError) -> tonic::Status {
    tonic::Status::from_error(err)
}

#[tokio::test(start_paused = true)]
async fn a_reset_request_stream_ends_the_scope_first_and_reads_aborted_not_its_end() {
    let (bodies, mut taken) = mpsc::unbounded_channel();
    let (request, feed) = fed_request("10S");
    let mut call = Box::pin(exact().layer(body_taking_handler(bodies)).oneshot(request));
    assert!(poll_once(&mut call).await.is_pending());
    let (mut body, scope) = taken.try_recv().expect("the handler must run");

    feed.send(Ok(Frame::data(Bytes::from_static(b"one"))))
        .await
        .expect("body alive");
    let frame = body.frame().await.expect("a frame").expect("data");
    assert!(frame.is_data(), "data passes untouched");
    assert!(!scope.is_ended());

    // What tonic makes of an h2 RST_STREAM(CANCEL) on the request stream.
    feed.send(Err(tonic::Status::cancelled(
        "h2 protocol error: stream reset",
    )))
    .await
    .expect("body alive");
    let err = body
        .frame()
        .await
        .expect("the reset must not read as the end")
        .expect_err("the reset must read as an error");
    assert_eq!(
        scope.cause(),
        Some(Cause::Abandoned),
        "the scope must have ended, as abandoned, before the handler reads the error"
    );
    let truncated = err
        .downcast_ref::<super::Truncated>()
        .expect("the error must be Truncated");
    assert_eq!(truncated.cause(), Cause::Abandoned);
    let status = status_read(err);
    assert_eq!(
        status.code(),
        tonic::Code::Aborted,
        "tonic reads CANCELLED from a request body as its end: the handler must read another code"
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_stream_ending_after_its_deadline_reads_deadline_exceeded_not_its_end() {
    let (bodies, mut taken) = mpsc::unbounded_channel();
    let (request, feed) = fed_request("100m");
    let layer = exact().layer(body_taking_handler(bodies));
    let mut call = Box::pin(layer.oneshot(request));
    assert!(poll_once(&mut call).await.is_pending());
    let (mut body, scope) = taken.try_recv().expect("the handler must run");
    // The server's timer answers DEADLINE_EXCEEDED and ends the scope; a
    // reader of the body that outlived the handler (a task it spawned)
    // then sees the input end.
    let response = call.await.expect("an answer");
    assert_eq!(head_status(&response).code(), tonic::Code::DeadlineExceeded);
    assert_eq!(scope.cause(), Some(Cause::DeadlineExceeded));
    drop(feed);
    let err = body
        .frame()
        .await
        .expect("an input that ended after its scope must not read as its end")
        .expect_err("it reads as an error");
    assert_eq!(status_read(err).code(), tonic::Code::DeadlineExceeded);
}

#[tokio::test(start_paused = true)]
async fn other_request_body_errors_and_a_timely_end_pass_unchanged() {
    let (bodies, mut taken) = mpsc::unbounded_channel();
    let (request, feed) = fed_request("10S");
    let mut call = Box::pin(
        exact()
            .layer(body_taking_handler(bodies.clone()))
            .oneshot(request),
    );
    assert!(poll_once(&mut call).await.is_pending());
    let (mut body, scope) = taken.try_recv().expect("the handler must run");
    feed.send(Err(tonic::Status::internal(
        "h2 protocol error: flow control",
    )))
    .await
    .expect("body alive");
    let err = body.frame().await.expect("an item").expect_err("an error");
    assert_eq!(
        status_read(err).code(),
        tonic::Code::Internal,
        "passes as it came"
    );
    assert!(
        !scope.is_ended(),
        "only a reset with CANCEL ends the scope here"
    );

    let (request, feed) = fed_request("10S");
    let mut call = Box::pin(exact().layer(body_taking_handler(bodies)).oneshot(request));
    assert!(poll_once(&mut call).await.is_pending());
    let (mut body, _scope) = taken.try_recv().expect("the handler must run");
    drop(feed);
    assert!(
        body.frame().await.is_none(),
        "an input the client ended, under a live scope, ends"
    );
}
