//! The client layer on its own, around mock channels, on a paused clock.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use tokio::sync::mpsc;
use tokio::time::{Instant, advance};
use tokio_stream::wrappers::ReceiverStream;
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceExt, service_fn};

use super::ClientDeadline;
use super::deadline_race::Race;
use crate::BoxError;
use crate::scope::{Cause, Scope};
use crate::wire::timeout_header;

const MS: Duration = Duration::from_millis(1);

type Recorded = Arc<Mutex<Vec<HeaderMap>>>;

/// What the wrapped channel receives: tonic's body type.
type Inner = tonic::body::Body;

/// A mock channel answering with `R` bodies, behind the layer.
type TestChannel<R> = ClientDeadline<BoxCloneService<Request<Inner>, Response<R>, Infallible>>;

/// A response body the test feeds frame by frame.
type FedBody = StreamBody<ReceiverStream<Result<Frame<Bytes>, Infallible>>>;

/// The test's end of a [`FedBody`].
type Feed = mpsc::Sender<Result<Frame<Bytes>, Infallible>>;

fn test_channel<R, F, Fut>(handler: F) -> TestChannel<R>
where
    F: FnMut(Request<Inner>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Response<R>, Infallible>> + Send + 'static,
{
    ClientDeadline::new(BoxCloneService::new(service_fn(handler)))
}

/// A channel that records the headers of every request it receives and
/// answers at once.
fn recording_channel() -> (TestChannel<Full<Bytes>>, Recorded) {
    let recorded = Recorded::default();
    let log = recorded.clone();
    let inner = service_fn(move |request: Request<Inner>| {
        log.lock()
            .expect("not poisoned")
            .push(request.headers().clone());
        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"reply")))) }
    });
    (ClientDeadline::new(BoxCloneService::new(inner)), recorded)
}

/// The headers of the one request the channel received.
fn only_request(recorded: &Recorded) -> HeaderMap {
    let recorded = recorded.lock().expect("not poisoned");
    assert_eq!(
        recorded.len(),
        1,
        "exactly one request must reach the channel"
    );
    recorded[0].clone()
}

fn sent_timeout(headers: &HeaderMap) -> Option<Duration> {
    headers.get("grpc-timeout").map(|value| {
        timeout_header::decode(value.as_bytes()).expect("the layer must write a valid grpc-timeout")
    })
}

fn with_timeout_header(timeout: Duration) -> Request<Empty<Bytes>> {
    let mut request = Request::new(Empty::new());
    let value = HeaderValue::try_from(timeout_header::encode(timeout)).expect("ASCII");
    request.headers_mut().insert("grpc-timeout", value);
    request
}

/// The status the layer failed with; it must be a `tonic::Status`, so tonic
/// keeps its code.
fn status(error: BoxError) -> tonic::Status {
    match error.downcast::<tonic::Status>() {
        Ok(status) => *status,
        Err(other) => panic!("the layer must fail with a tonic::Status, got {other}"),
    }
}

/// Sets its flag when dropped: shows that the in-flight call was abandoned
/// (which makes h2 reset the stream).
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A channel whose calls never answer; the flag tells whether the call was
/// dropped.
fn hanging_channel() -> (TestChannel<Full<Bytes>>, Arc<AtomicBool>) {
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = dropped.clone();
    let inner = service_fn(move |_request: Request<Inner>| {
        let guard = DropFlag(flag.clone());
        async move {
            let _guard = guard;
            std::future::pending::<Result<Response<Full<Bytes>>, Infallible>>().await
        }
    });
    (ClientDeadline::new(BoxCloneService::new(inner)), dropped)
}

type Mock = tower_test::mock::Mock<Request<Inner>, Response<Full<Bytes>>>;
type MockHandle = tower_test::mock::Handle<Request<Inner>, Response<Full<Bytes>>>;

fn mock_channel() -> (ClientDeadline<Mock>, MockHandle) {
    let (mock, handle) = tower_test::mock::pair();
    (ClientDeadline::new(mock), handle)
}

/// Readiness for the request type the tests send.
async fn ready(channel: &mut ClientDeadline<Mock>) -> Result<&mut ClientDeadline<Mock>, BoxError> {
    ServiceExt::<Request<Empty<Bytes>>>::ready(channel).await
}

#[tokio::test(start_paused = true)]
async fn header_is_the_remaining_budget_at_call_time() {
    let (channel, recorded) = recording_channel();
    let scope = Scope::background().with_timeout(Duration::from_secs(1));
    let request = Request::new(Empty::new());
    advance(300 * MS).await;

    scope
        .enter(channel.oneshot(request))
        .await
        .expect("the call succeeds");
    let sent = only_request(&recorded);
    assert_eq!(
        sent_timeout(&sent),
        Some(700 * MS),
        "the header must carry what is left when the call is made, not the original budget"
    );
    assert_eq!(
        sent.get("grpc-timeout").map(HeaderValue::as_bytes),
        Some(timeout_header::encode(700 * MS).as_bytes()),
        "the header must be written with the shared codec"
    );
}

#[tokio::test(start_paused = true)]
async fn budget_is_min_of_scope_and_per_request_timeout() {
    let cases = [
        (
            "request tighter",
            Some(Duration::from_secs(1)),
            200 * MS,
            200 * MS,
        ),
        (
            "scope tighter",
            Some(100 * MS),
            Duration::from_secs(5),
            100 * MS,
        ),
        ("no scope deadline", None, 250 * MS, 250 * MS),
    ];
    for (case, scope_budget, per_request, expected) in cases {
        let (channel, recorded) = recording_channel();
        let scope = match scope_budget {
            Some(budget) => Scope::background().with_timeout(budget),
            None => Scope::background(),
        };
        scope
            .enter(channel.oneshot(with_timeout_header(per_request)))
            .await
            .expect("the call succeeds");
        assert_eq!(
            sent_timeout(&only_request(&recorded)),
            Some(expected),
            "{case}"
        );
    }

    let (channel, recorded) = recording_channel();
    channel
        .oneshot(with_timeout_header(3 * MS))
        .await
        .expect("the call succeeds");
    assert_eq!(
        sent_timeout(&only_request(&recorded)),
        Some(3 * MS),
        "outside any scope the per-request timeout alone must apply"
    );
}

#[tokio::test(start_paused = true)]
async fn no_deadline_means_no_header() {
    let (channel, recorded) = recording_channel();
    channel
        .oneshot(Request::new(Empty::new()))
        .await
        .expect("the call succeeds");
    assert!(
        only_request(&recorded).get("grpc-timeout").is_none(),
        "no scope, no per-request timeout: no header"
    );

    let (channel, recorded) = recording_channel();
    Scope::background()
        .enter(channel.oneshot(Request::new(Empty::new())))
        .await
        .expect("the call succeeds");
    assert!(
        only_request(&recorded).get("grpc-timeout").is_none(),
        "a scope without a deadline must not invent one"
    );
}

#[tokio::test(start_paused = true)]
async fn ended_scope_fails_locally_without_calling_the_channel() {
    let expired = Scope::background().with_timeout(100 * MS);
    let cancelled = Scope::background().with_timeout(Duration::from_secs(10));
    cancelled.cancel();
    let caller_gone = Scope::background().with_timeout(Duration::from_secs(10));
    caller_gone.end(Cause::Abandoned);
    let inherited = Scope::background().with_timeout(50 * MS).child();
    advance(100 * MS).await;

    let cases = [
        ("expired", expired, tonic::Code::DeadlineExceeded),
        ("cancelled", cancelled, tonic::Code::Cancelled),
        ("caller cancelled", caller_gone, tonic::Code::Cancelled),
        ("parent expired", inherited, tonic::Code::DeadlineExceeded),
    ];
    for (case, scope, code) in cases {
        let (mut channel, mut handle) = mock_channel();
        // A channel that is never ready: an ended scope must not wait for it.
        handle.allow(0);
        let error = scope
            .enter(async {
                ready(&mut channel)
                    .await
                    .expect("readiness for an ended scope is immediate")
                    .call(Request::new(Empty::new()))
                    .await
            })
            .await
            .expect_err("an ended scope must fail the call");
        assert_eq!(status(error).code(), code, "{case}");
        drop(channel);
        assert!(
            handle.next_request().await.is_none(),
            "{case}: no request may reach the channel"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn expired_per_request_timeout_fails_locally() {
    let (mut channel, mut handle) = mock_channel();
    let error = ready(&mut channel)
        .await
        .expect("ready")
        .call(with_timeout_header(Duration::ZERO))
        .await
        .expect_err("a zero budget must fail");
    assert_eq!(status(error).code(), tonic::Code::DeadlineExceeded);
    drop(channel);
    assert!(handle.next_request().await.is_none(), "nothing may be sent");
}

#[tokio::test(start_paused = true)]
async fn malformed_per_request_timeout_fails_locally_as_internal() {
    let (mut channel, mut handle) = mock_channel();
    let mut request = Request::new(Empty::new());
    request
        .headers_mut()
        .insert("grpc-timeout", HeaderValue::from_static("1a"));
    let error = ready(&mut channel)
        .await
        .expect("ready")
        .call(request)
        .await
        .expect_err("a malformed timeout must not be sent");
    let status = status(error);
    assert_eq!(status.code(), tonic::Code::Internal);
    assert!(
        status.message().contains("grpc-timeout"),
        "{}",
        status.message()
    );
    drop(channel);
    assert!(handle.next_request().await.is_none(), "nothing may be sent");
}

#[tokio::test(start_paused = true)]
async fn waiting_for_readiness_is_bounded_by_the_deadline() {
    let (mut channel, mut handle) = mock_channel();
    handle.allow(0);
    let scope = Scope::background().with_timeout(100 * MS);
    let start = Instant::now();
    let error = scope
        .enter(async {
            ready(&mut channel)
                .await
                .expect("readiness must give up at the deadline")
                .call(Request::new(Empty::new()))
                .await
        })
        .await
        .expect_err("the call must fail at the deadline");
    assert_eq!(status(error).code(), tonic::Code::DeadlineExceeded);
    assert_eq!(
        Instant::now() - start,
        100 * MS,
        "waited exactly the budget"
    );
    drop(channel);
    assert!(handle.next_request().await.is_none(), "nothing may be sent");

    let (mut unbounded, mut handle) = mock_channel();
    handle.allow(0);
    let waiting = tokio::time::timeout(Duration::from_secs(3600), ready(&mut unbounded)).await;
    assert!(
        waiting.is_err(),
        "without a deadline readiness waits as long as it takes"
    );
}

#[tokio::test(start_paused = true)]
async fn deadline_mid_call_is_deadline_exceeded_and_abandons_the_call() {
    let (channel, dropped) = hanging_channel();
    let scope = Scope::background().with_timeout(100 * MS);
    let start = Instant::now();
    let error = scope
        .enter(channel.oneshot(Request::new(Empty::new())))
        .await
        .expect_err("a call that never answers must fail at the deadline");
    let status = status(error);
    assert_eq!(
        status.code(),
        tonic::Code::DeadlineExceeded,
        "never CANCELLED or UNKNOWN"
    );
    assert_eq!(Instant::now() - start, 100 * MS, "exactly at the deadline");
    assert!(
        dropped.load(Ordering::SeqCst),
        "the in-flight call must be dropped"
    );
}

#[tokio::test(start_paused = true)]
async fn scope_ended_by_the_server_timer_is_deadline_exceeded_mid_call() {
    // The server layer ends a handler's scope as `DeadlineExceeded` slightly
    // before its deadline; outbound calls under it must report a deadline.
    let (channel, dropped) = hanging_channel();
    let handler = Scope::root(Some(Instant::now() + Duration::from_secs(1)));
    let server_timer = handler.clone();
    tokio::spawn(async move {
        tokio::time::sleep(40 * MS).await;
        server_timer.end(Cause::DeadlineExceeded);
    });
    let error = handler
        .with_timeout(Duration::from_secs(1))
        .enter(channel.oneshot(Request::new(Empty::new())))
        .await
        .expect_err("the call must stop with its scope");
    assert_eq!(status(error).code(), tonic::Code::DeadlineExceeded);
    assert!(
        dropped.load(Ordering::SeqCst),
        "the in-flight call must be dropped"
    );
}

#[tokio::test(start_paused = true)]
async fn explicit_cancel_mid_call_is_cancelled_and_abandons_the_call() {
    let (channel, dropped) = hanging_channel();
    let scope = Scope::background().with_timeout(Duration::from_secs(10));
    let canceller = scope.clone();
    tokio::spawn(async move {
        tokio::time::sleep(30 * MS).await;
        canceller.cancel();
    });
    let start = Instant::now();
    let error = scope
        .enter(channel.oneshot(Request::new(Empty::new())))
        .await
        .expect_err("a cancelled call must fail");
    assert_eq!(status(error).code(), tonic::Code::Cancelled);
    assert_eq!(
        Instant::now() - start,
        30 * MS,
        "at the cancel, not at the deadline"
    );
    assert!(
        dropped.load(Ordering::SeqCst),
        "the in-flight call must be dropped"
    );
}

/// A channel that answers trailers-only with `code` after `delay`.
fn answering_status_after(delay: Duration, code: tonic::Code) -> TestChannel<Empty<Bytes>> {
    test_channel(move |_request: Request<Inner>| async move {
        tokio::time::sleep(delay).await;
        Ok::<_, Infallible>(tonic::Status::new(code, "from the server").into_http())
    })
}

#[tokio::test(start_paused = true)]
async fn server_cancelled_after_our_deadline_is_deadline_exceeded() {
    let scope = Scope::background().with_timeout(100 * MS);
    let channel = answering_status_after(100 * MS, tonic::Code::Cancelled);
    let outcome = scope
        .enter(channel.oneshot(Request::new(Empty::new())))
        .await;
    let code = match outcome {
        Err(error) => status(error).code(),
        Ok(response) => tonic::Status::from_header_map(response.headers())
            .expect("a trailers-only answer")
            .code(),
    };
    assert_eq!(
        code,
        tonic::Code::DeadlineExceeded,
        "a CANCELLED at our deadline is our deadline expiring"
    );

    let scope = Scope::background().with_timeout(100 * MS);
    let channel = answering_status_after(50 * MS, tonic::Code::Cancelled);
    let response = scope
        .enter(channel.oneshot(Request::new(Empty::new())))
        .await
        .expect("an answer before the deadline passes through");
    assert_eq!(
        tonic::Status::from_header_map(response.headers()).map(|s| s.code()),
        Some(tonic::Code::Cancelled),
        "a CANCELLED before our deadline must stay CANCELLED"
    );
}

#[tokio::test(start_paused = true)]
async fn late_cancel_is_rewritten_only_past_the_deadline() {
    let mut race = std::pin::pin!(Race::new(
        Some(Instant::now() + 100 * MS),
        None,
        None,
        None,
        None,
        None,
    ));
    let cancelled = || {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-status", HeaderValue::from_static("1"));
        headers
    };

    let mut early = cancelled();
    race.as_mut().settle_answer(&mut early);
    assert_eq!(
        early.get("grpc-status").map(HeaderValue::as_bytes),
        Some(&b"1"[..])
    );

    advance(100 * MS).await;
    let mut late = cancelled();
    race.as_mut().settle_answer(&mut late);
    let status = tonic::Status::from_header_map(&late).expect("grpc-status present");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded);

    let mut ok = HeaderMap::new();
    ok.insert("grpc-status", HeaderValue::from_static("0"));
    race.as_mut().settle_answer(&mut ok);
    assert_eq!(
        ok.get("grpc-status").map(HeaderValue::as_bytes),
        Some(&b"0"[..]),
        "only CANCELLED is rewritten"
    );
}

#[tokio::test(start_paused = true)]
async fn transport_errors_pass_through_before_the_deadline() {
    let channel = ClientDeadline::new(service_fn(|_request: Request<Inner>| async {
        Err::<Response<Empty<Bytes>>, _>(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ))
    }));
    let error = Scope::background()
        .with_timeout(Duration::from_secs(10))
        .enter(channel.oneshot(Request::new(Empty::new())))
        .await
        .expect_err("the transport error must surface");
    let io = error
        .downcast_ref::<std::io::Error>()
        .expect("the transport error must pass through unchanged, for tonic to classify");
    assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
}

/// A channel answering at once with a streaming body fed by the test.
fn streaming_channel() -> (TestChannel<FedBody>, Feed) {
    let (frames, stream) = mpsc::channel(4);
    let stream = Arc::new(Mutex::new(Some(stream)));
    let channel = test_channel(move |_request: Request<Inner>| {
        let stream = stream
            .lock()
            .expect("not poisoned")
            .take()
            .expect("one call");
        async move { Ok::<_, Infallible>(Response::new(StreamBody::new(ReceiverStream::new(stream)))) }
    });
    (channel, frames)
}

#[tokio::test(start_paused = true)]
async fn deadline_covers_the_whole_response_stream() {
    let (channel, frames) = streaming_channel();
    let scope = Scope::background().with_timeout(300 * MS);
    let start = Instant::now();
    let response = scope
        .enter(channel.oneshot(Request::new(Empty::new())))
        .await
        .expect("the head arrives in time");
    frames
        .send(Ok(Frame::data(Bytes::from_static(b"one"))))
        .await
        .expect("the body is alive");
    let mut body = std::pin::pin!(response.into_body());
    let first = body.frame().await.expect("a frame").expect("in time");
    assert!(first.is_data());

    let error = body
        .frame()
        .await
        .expect("the body must report the deadline")
        .expect_err("the deadline must end the stream with an error");
    assert_eq!(status(error).code(), tonic::Code::DeadlineExceeded);
    assert_eq!(
        Instant::now() - start,
        300 * MS,
        "the deadline covers the stream, not the head"
    );
    assert!(
        body.frame().await.is_none(),
        "nothing may follow the deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn cancel_ends_the_response_stream_as_cancelled() {
    let (channel, _frames) = streaming_channel();
    let scope = Scope::background().with_timeout(Duration::from_secs(10));
    let response = scope
        .enter(channel.oneshot(Request::new(Empty::new())))
        .await
        .expect("the head arrives");
    scope.cancel();
    let error = std::pin::pin!(response.into_body())
        .frame()
        .await
        .expect("the body must report the cancel")
        .expect_err("the cancel must end the stream with an error");
    assert_eq!(status(error).code(), tonic::Code::Cancelled);
}

#[tokio::test(start_paused = true)]
async fn trailers_with_late_cancel_are_deadline_exceeded() {
    let (channel, frames) = streaming_channel();
    let scope = Scope::background().with_timeout(100 * MS);
    let response = scope
        .enter(channel.oneshot(Request::new(Empty::new())))
        .await
        .expect("the head arrives");
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("1"));
    tokio::time::sleep(100 * MS).await;
    frames
        .send(Ok(Frame::trailers(trailers)))
        .await
        .expect("the body is alive");
    let mut body = std::pin::pin!(response.into_body());
    let code = match body.frame().await.expect("a final frame") {
        Err(error) => status(error).code(),
        Ok(frame) => {
            let trailers = frame.into_trailers().expect("trailers");
            tonic::Status::from_header_map(&trailers)
                .expect("grpc-status")
                .code()
        }
    };
    assert_eq!(
        code,
        tonic::Code::DeadlineExceeded,
        "never CANCELLED after our deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn forwarded_metadata_is_copied_to_outbound_calls() {
    let mut incoming = HeaderMap::new();
    incoming.append("x-trace-id", HeaderValue::from_static("trace-1"));
    incoming.append("x-trace-id", HeaderValue::from_static("trace-2"));
    incoming.insert("x-flags", HeaderValue::from_static("canary"));
    let request_scope = Scope::root_attached(
        Some(Instant::now() + Duration::from_secs(1)),
        Some(Arc::new(crate::forwarded::Attached::new(
            Some(incoming),
            None,
        ))),
    );
    let downstream = request_scope.with_timeout(200 * MS);

    let (channel, recorded) = recording_channel();
    let mut request = Request::new(Empty::new());
    request
        .headers_mut()
        .insert("x-flags", HeaderValue::from_static("set-by-caller"));
    downstream
        .enter(channel.oneshot(request))
        .await
        .expect("the call succeeds");
    let sent = only_request(&recorded);
    let trace: Vec<_> = sent.get_all("x-trace-id").iter().collect();
    assert_eq!(
        trace,
        ["trace-1", "trace-2"],
        "every value must travel, through child scopes"
    );
    let flags: Vec<_> = sent.get_all("x-flags").iter().collect();
    assert_eq!(
        flags,
        ["set-by-caller"],
        "metadata set on the call must win over forwarded"
    );

    let (channel, recorded) = recording_channel();
    let detached =
        request_scope.enter_sync(|| crate::detach(channel.oneshot(Request::new(Empty::new()))));
    detached
        .await
        .expect("no panic")
        .expect("the call succeeds");
    let sent = only_request(&recorded);
    assert!(
        sent.get("x-trace-id").is_none(),
        "detached work starts from nothing"
    );
    assert!(
        sent.get("grpc-timeout").is_none(),
        "detached work carries no deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn body_of_a_successful_call_reads_through() {
    let (channel, _recorded) = recording_channel();
    let response = Scope::background()
        .with_timeout(Duration::from_secs(1))
        .enter(channel.oneshot(Request::new(Empty::new())))
        .await
        .expect("the call succeeds");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("in time")
        .to_bytes();
    assert_eq!(
        body,
        Bytes::from_static(b"reply"),
        "the layer must not alter the body"
    );
}

/// A channel that hands the request body it receives to the test and
/// answers with a streaming body fed by the test.
fn body_capturing_channel() -> (TestChannel<FedBody>, mpsc::UnboundedReceiver<Inner>, Feed) {
    let (bodies_tx, bodies) = mpsc::unbounded_channel();
    let (frames, stream) = mpsc::channel(4);
    let stream = Arc::new(Mutex::new(Some(stream)));
    let channel = test_channel(move |request: Request<Inner>| {
        bodies_tx
            .send(request.into_body())
            .expect("the test keeps the receiver");
        let stream = stream
            .lock()
            .expect("not poisoned")
            .take()
            .expect("one call");
        async move { Ok::<_, Infallible>(Response::new(StreamBody::new(ReceiverStream::new(stream)))) }
    });
    (channel, bodies, frames)
}

/// The reason of the HTTP/2 reset a request body error asks hyper for.
fn reset_reason(error: &tonic::Status) -> Option<h2::Reason> {
    let mut source = std::error::Error::source(error);
    while let Some(err) = source {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return h2.reason();
        }
        source = err.source();
    }
    None
}

/// The next frame of a request body, or `None` if it does not come at once.
async fn request_body_end(body: &mut Inner) -> Option<Result<Frame<Bytes>, tonic::Status>> {
    tokio::time::timeout(Duration::from_secs(1), body.frame())
        .await
        .expect("the request body must end at once, not wait for the caller")
}

/// A request stream the caller keeps open, as in a bidi call.
fn open_request_stream() -> (Feed, Request<FedBody>) {
    let (outbound, stream) = mpsc::channel(4);
    (
        outbound,
        Request::new(StreamBody::new(ReceiverStream::new(stream))),
    )
}

#[tokio::test(start_paused = true)]
async fn cancel_ends_an_open_request_stream_with_a_cancel_reset() {
    let (channel, mut bodies, _frames) = body_capturing_channel();
    let (outbound, request) = open_request_stream();
    let scope = Scope::background().with_timeout(Duration::from_secs(10));
    let response = scope
        .enter(channel.oneshot(request))
        .await
        .expect("the head arrives");
    let mut sent = bodies.try_recv().expect("the channel received the call");

    outbound
        .send(Ok(Frame::data(Bytes::from_static(b"message"))))
        .await
        .expect("the caller's stream is open");
    let first = sent
        .frame()
        .await
        .expect("a frame")
        .expect("no error before the cancel");
    assert_eq!(first.into_data().ok(), Some(Bytes::from_static(b"message")));

    scope.cancel();
    let mut body = std::pin::pin!(response.into_body());
    let error = body
        .frame()
        .await
        .expect("a frame")
        .expect_err("the cancel ends the call");
    assert_eq!(status(error).code(), tonic::Code::Cancelled);

    // The caller still holds its request stream; the call must not.
    let reset = request_body_end(&mut sent)
        .await
        .expect("the request body must end")
        .expect_err("with an error that makes hyper reset the stream");
    assert_eq!(reset_reason(&reset), Some(h2::Reason::CANCEL), "{reset:?}");
    assert!(
        !outbound.is_closed(),
        "the caller's own stream is untouched"
    );
}

#[tokio::test(start_paused = true)]
async fn deadline_mid_stream_lets_go_of_both_directions() {
    let (channel, mut bodies, frames) = body_capturing_channel();
    let (_outbound, request) = open_request_stream();
    let scope = Scope::background().with_timeout(100 * MS);
    let response = scope
        .enter(channel.oneshot(request))
        .await
        .expect("the head arrives");
    let mut sent = bodies.try_recv().expect("the channel received the call");
    let mut body = std::pin::pin!(response.into_body());

    let error = body
        .frame()
        .await
        .expect("a frame")
        .expect_err("the deadline ends the call");
    assert_eq!(status(error).code(), tonic::Code::DeadlineExceeded);
    assert!(
        frames.is_closed(),
        "the response stream must be released at the deadline, not when the caller drops it"
    );
    let reset = request_body_end(&mut sent)
        .await
        .expect("the request body must end")
        .expect_err("with a reset");
    assert_eq!(reset_reason(&reset), Some(h2::Reason::CANCEL));
}

#[tokio::test(start_paused = true)]
async fn dropping_the_response_abandons_an_open_request_stream() {
    let (channel, mut bodies, _frames) = body_capturing_channel();
    let (_outbound, request) = open_request_stream();
    let response = Scope::background()
        .enter(channel.oneshot(request))
        .await
        .expect("the head arrives");
    let mut sent = bodies.try_recv().expect("the channel received the call");
    drop(response);
    let reset = request_body_end(&mut sent)
        .await
        .expect("the request body must end")
        .expect_err("with a reset");
    assert_eq!(
        reset_reason(&reset),
        Some(h2::Reason::CANCEL),
        "a caller that dropped the replies has given the call up"
    );
}

#[tokio::test(start_paused = true)]
async fn finished_request_body_is_not_disturbed() {
    let (channel, mut bodies, frames) = body_capturing_channel();
    let response = Scope::background()
        .with_timeout(Duration::from_secs(1))
        .enter(channel.oneshot(Request::new(Full::new(Bytes::from_static(b"whole")))))
        .await
        .expect("the head arrives");
    let mut sent = bodies.try_recv().expect("the channel received the call");
    let whole = sent.frame().await.expect("a frame").expect("no error");
    assert_eq!(whole.into_data().ok(), Some(Bytes::from_static(b"whole")));
    assert!(
        http_body::Body::is_end_stream(&sent),
        "a unary request is done after its message: nothing is left to reset"
    );
    drop(frames);
    let mut body = std::pin::pin!(response.into_body());
    assert!(body.frame().await.is_none(), "the response ends normally");
}

#[tokio::test(start_paused = true)]
async fn transit_allowance_is_deducted_from_the_wire_budget_only() {
    let (channel, recorded) = recording_channel();
    let mut channel = crate::ClientDeadlineLayer::new()
        .transit_allowance(100 * MS)
        .layer(channel.into_inner());
    let scope = Scope::background().with_timeout(Duration::from_secs(1));
    scope
        .enter(async {
            ServiceExt::<Request<Empty<Bytes>>>::ready(&mut channel)
                .await
                .expect("ready")
                .call(Request::new(Empty::new()))
                .await
                .expect("the call must go out")
        })
        .await;
    assert_eq!(
        sent_timeout(&only_request(&recorded)),
        Some(900 * MS),
        "the server must be told the budget less the allowance"
    );

    let short = Scope::background().with_timeout(100 * MS);
    let (channel, recorded) = recording_channel();
    let mut channel = crate::ClientDeadlineLayer::new()
        .transit_allowance(100 * MS)
        .layer(channel.into_inner());
    let err = short
        .enter(async {
            ServiceExt::<Request<Empty<Bytes>>>::ready(&mut channel)
                .await
                .expect("ready")
                .call(Request::new(Empty::new()))
                .await
                .expect_err("a call that cannot arrive in time must fail locally")
        })
        .await;
    assert_eq!(status(err).code(), tonic::Code::DeadlineExceeded);
    assert!(
        recorded.lock().expect("not poisoned").is_empty(),
        "nothing may be sent"
    );
}
