//! The interceptor over a stand-in channel, on a paused clock: what it
//! writes, when it ends a call, and what it reports.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use grpc::client::interceptor::InvokeOnceExt;
use grpc::client::{
    CallOptions, InvokeOnce, RecvStream, ResponseStreamItem, SendOptions, SendStream,
};
use grpc::core::{RecvMessage, RequestHeaders, ResponseHeaders, SendMessage, Trailers};
use grpc::metadata::{MetadataMap, MetadataValue};
use grpc::{StatusCodeError, StatusError};
use grpc_deadline::Scope;
use grpc_deadline_grpc::{DeadlineInterceptor, Unscoped};
use tokio::sync::mpsc;
use tokio::time::{Instant, advance};

/// What the stand-in server saw and does.
#[derive(Clone, Default)]
struct Server {
    /// The `grpc-timeout` of each call it was sent.
    sent: Arc<Mutex<Vec<Option<String>>>>,
    /// How long the channel takes to hand a call over (a connect).
    connect: Duration,
    /// Whether the call's stream was dropped (the crate resets it then).
    dropped: Arc<Mutex<bool>>,
    /// Whether the call's send half was dropped (the crate's transport then
    /// ends the request stream normally).
    send_dropped: Arc<Mutex<bool>>,
}

struct Streams {
    answers: mpsc::UnboundedReceiver<ResponseStreamItem>,
    dropped: Arc<Mutex<bool>>,
}

impl Drop for Streams {
    fn drop(&mut self) {
        *self.dropped.lock().expect("not poisoned") = true;
    }
}

struct Sink(Arc<Mutex<bool>>);

impl Drop for Sink {
    fn drop(&mut self) {
        *self.0.lock().expect("not poisoned") = true;
    }
}

/// One call to the stand-in server, answered from `answers`.
struct Channel(Server, mpsc::UnboundedReceiver<ResponseStreamItem>);

impl InvokeOnce for Channel {
    type SendStream = Sink;
    type RecvStream = Streams;

    async fn invoke_once(self, headers: RequestHeaders, _: CallOptions) -> (Sink, Streams) {
        let Channel(server, answers) = self;
        tokio::time::sleep(server.connect).await;
        let header = headers
            .metadata()
            .get("grpc-timeout")
            .map(|v| v.to_str().to_owned());
        server.sent.lock().expect("not poisoned").push(header);
        (
            Sink(server.send_dropped.clone()),
            Streams {
                answers,
                dropped: server.dropped.clone(),
            },
        )
    }
}

impl SendStream for Sink {
    async fn send(&mut self, _: &dyn SendMessage, _: SendOptions) -> Result<(), ()> {
        Ok(())
    }
}

impl RecvStream for Streams {
    async fn recv(&mut self, _: &mut dyn RecvMessage) -> ResponseStreamItem {
        match self.answers.recv().await {
            Some(item) => item,
            None => std::future::pending().await,
        }
    }
}

struct Ignore;

impl RecvMessage for Ignore {
    fn decode(&mut self, _: &mut dyn bytes::Buf) -> Result<(), String> {
        Ok(())
    }
}

/// A call through `interceptor` to `server`, which answers what is sent on
/// the returned sender.
async fn call(
    interceptor: &DeadlineInterceptor,
    server: &Server,
    options: CallOptions,
) -> (
    impl SendStream,
    impl RecvStream,
    mpsc::UnboundedSender<ResponseStreamItem>,
) {
    let (answer, answers) = mpsc::unbounded_channel();
    let headers = RequestHeaders::new().with_method_name("/probe.Probe/Call");
    let (send, recv) = Channel(server.clone(), answers)
        .with_interceptor(interceptor.clone())
        .invoke_once(headers, options)
        .await;
    (send, recv, answer)
}

/// The status of the trailers `recv` reads next.
async fn status(recv: &mut impl RecvStream) -> Result<(), StatusError> {
    loop {
        match recv.recv(&mut Ignore).await {
            ResponseStreamItem::Trailers(t) => return t.status().clone(),
            ResponseStreamItem::StreamClosed => panic!("a call must end with trailers"),
            _ => {}
        }
    }
}

fn code(status: Result<(), StatusError>) -> StatusCodeError {
    status.expect_err("the call must fail").code()
}

#[allow(clippy::disallowed_types, reason = "CallOptions take std's Instant")]
fn options_in(timeout: Duration) -> CallOptions {
    let mut options = CallOptions::new();
    options.set_deadline((Instant::now() + timeout).into_std());
    options
}

#[tokio::test(start_paused = true)]
async fn the_header_is_the_earlier_of_the_scope_and_the_call_options() {
    let interceptor = DeadlineInterceptor::new();
    let server = Server::default();
    let scope = Scope::background().with_timeout(Duration::from_millis(800));
    scope
        .enter(call(
            &interceptor,
            &server,
            options_in(Duration::from_millis(500)),
        ))
        .await;
    scope
        .enter(call(
            &interceptor,
            &server,
            options_in(Duration::from_secs(5)),
        ))
        .await;
    scope
        .enter(call(&interceptor, &server, CallOptions::new()))
        .await;
    let sent = server.sent.lock().expect("not poisoned").clone();
    assert_eq!(
        sent,
        [
            Some("500000u".to_owned()),
            Some("800000u".to_owned()),
            Some("800000u".to_owned())
        ],
        "the tighter deadline must be the one on the wire"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_options_deadline_alone_is_written_and_kept() {
    let interceptor = DeadlineInterceptor::new().unscoped(Unscoped::Allow);
    let server = Server::default();
    let started = Instant::now();
    let (_send, mut recv, _answer) = call(
        &interceptor,
        &server,
        options_in(Duration::from_millis(500)),
    )
    .await;
    let sent = server.sent.lock().expect("not poisoned").clone();
    assert_eq!(sent, [Some("500000u".to_owned())]);
    assert_eq!(
        code(status(&mut recv).await),
        StatusCodeError::DeadlineExceeded
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(500),
        "at the deadline, not later"
    );
    assert_eq!(
        recv.recv(&mut Ignore).await.to_string_lossy(),
        "closed",
        "nothing after the trailers"
    );
    drop(_send);
    tokio::task::yield_now().await;
    assert!(
        !dropped(&server.dropped) && !dropped(&server.send_dropped),
        "an upload cut at its deadline is held, not ended: the server ends it at the deadline it \
         was sent"
    );
    tokio::time::sleep(Duration::from_millis(1001)).await;
    assert!(
        dropped(&server.dropped) && dropped(&server.send_dropped),
        "a second past the deadline the call's streams are let go"
    );
}

fn dropped(flag: &Arc<Mutex<bool>>) -> bool {
    *flag.lock().expect("not poisoned")
}

#[tokio::test(start_paused = true)]
async fn an_expired_call_sends_nothing() {
    let interceptor = DeadlineInterceptor::new();
    let server = Server::default();
    let scope = Scope::background().with_timeout(Duration::from_millis(5));
    advance(Duration::from_millis(5)).await;
    let (mut send, mut recv, _answer) = scope
        .enter(call(&interceptor, &server, CallOptions::new()))
        .await;
    assert!(
        server.sent.lock().expect("not poisoned").is_empty(),
        "nothing must be sent"
    );
    assert_eq!(
        code(status(&mut recv).await),
        StatusCodeError::DeadlineExceeded
    );
    assert!(send.send(&Empty, SendOptions::new()).await.is_err());
    assert_eq!(interceptor.stats().refused_expired(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_scope_sends_nothing_and_answers_cancelled() {
    let interceptor = DeadlineInterceptor::new();
    let server = Server::default();
    let scope = Scope::background();
    scope.cancel();
    let (_send, mut recv, _answer) = scope
        .enter(call(&interceptor, &server, CallOptions::new()))
        .await;
    assert!(server.sent.lock().expect("not poisoned").is_empty());
    assert_eq!(code(status(&mut recv).await), StatusCodeError::Cancelled);
    assert_eq!(interceptor.stats().refused_cancelled(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_that_passes_while_connecting_sends_nothing() {
    let interceptor = DeadlineInterceptor::new();
    let server = Server {
        connect: Duration::from_secs(1),
        ..Server::default()
    };
    let scope = Scope::background().with_timeout(Duration::from_millis(300));
    let (_send, mut recv, _answer) = scope
        .enter(call(&interceptor, &server, CallOptions::new()))
        .await;
    assert!(server.sent.lock().expect("not poisoned").is_empty());
    assert_eq!(
        code(status(&mut recv).await),
        StatusCodeError::DeadlineExceeded
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_connect_is_reported_as_a_late_departure() {
    let interceptor = DeadlineInterceptor::new();
    let server = Server {
        connect: Duration::from_millis(100),
        ..Server::default()
    };
    let scope = Scope::background().with_timeout(Duration::from_secs(1));
    scope
        .enter(call(&interceptor, &server, CallOptions::new()))
        .await;
    assert_eq!(
        interceptor.stats().left_late(),
        1,
        "100 ms after its header must be named"
    );
}

#[tokio::test(start_paused = true)]
async fn a_scope_that_ends_cancels_the_call_at_once() {
    let interceptor = DeadlineInterceptor::new();
    let server = Server::default();
    let scope = Scope::background().with_timeout(Duration::from_secs(10));
    let (_send, mut recv, answer) = scope
        .enter(call(&interceptor, &server, CallOptions::new()))
        .await;
    answer
        .send(ResponseStreamItem::Headers(ResponseHeaders::new()))
        .expect("the call is open");
    assert!(matches!(
        recv.recv(&mut Ignore).await,
        ResponseStreamItem::Headers(_)
    ));
    let canceller = scope.clone();
    grpc_deadline::detach(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        canceller.cancel();
    });
    let started = Instant::now();
    assert_eq!(code(status(&mut recv).await), StatusCodeError::Cancelled);
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(300),
        "at the cancel"
    );
    assert!(
        !dropped(&server.dropped),
        "with its request stream open, the call is held, not ended normally"
    );
    assert_eq!(
        interceptor.stats().cancels_not_reset(),
        1,
        "a held call is not reset: counted"
    );
}

#[tokio::test(start_paused = true)]
async fn a_scope_that_ends_after_the_last_message_drops_the_call_at_once() {
    let interceptor = DeadlineInterceptor::new();
    let server = Server::default();
    let scope = Scope::background().with_timeout(Duration::from_secs(10));
    let (mut send, mut recv, answer) = scope
        .enter(call(&interceptor, &server, CallOptions::new()))
        .await;
    send.send(&Empty, SendOptions::new().with_final_msg(true))
        .await
        .expect("the call takes its message");
    answer
        .send(ResponseStreamItem::Headers(ResponseHeaders::new()))
        .expect("the call is open");
    assert!(matches!(
        recv.recv(&mut Ignore).await,
        ResponseStreamItem::Headers(_)
    ));
    scope.cancel();
    assert_eq!(code(status(&mut recv).await), StatusCodeError::Cancelled);
    assert!(
        dropped(&server.dropped),
        "after the response headers and the last message, dropping the stream resets it"
    );
    assert_eq!(interceptor.stats().cancels_not_reset(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_send_half_dropped_before_its_last_message_ends_the_upload_when_the_answer_is_read() {
    let interceptor = DeadlineInterceptor::new();
    let server = Server::default();
    let scope = Scope::background().with_timeout(Duration::from_secs(10));
    let (send, mut recv, answer) = scope
        .enter(call(&interceptor, &server, CallOptions::new()))
        .await;
    // As the crate's generated client-streaming calls finish an upload.
    drop(send);
    assert!(
        !dropped(&server.send_dropped),
        "the drop alone does not end the request stream: the caller may be going away"
    );
    answer
        .send(ResponseStreamItem::Trailers(Trailers::new(Ok(()))))
        .expect("the call is open");
    assert!(status(&mut recv).await.is_ok());
    assert!(
        dropped(&server.send_dropped),
        "reading the answer ends the upload"
    );
    assert_eq!(interceptor.stats().cancels_not_reset(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_send_half_dropped_while_a_read_waits_ends_the_upload() {
    let interceptor = DeadlineInterceptor::new();
    let server = Server::default();
    let scope = Scope::background().with_timeout(Duration::from_secs(10));
    let (send, mut recv, _answer) = scope
        .enter(call(&interceptor, &server, CallOptions::new()))
        .await;
    let flag = server.send_dropped.clone();
    let reading = async { recv.recv(&mut Ignore).await };
    let dropping = async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        drop(send);
        tokio::time::sleep(Duration::from_millis(5)).await;
        dropped(&flag)
    };
    tokio::select! {
        _ = reading => panic!("the server never answers"),
        ended = dropping => assert!(ended, "a read under way lets the dropped send half go"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_its_caller_drops_mid_upload_is_held_and_counted() {
    let interceptor = DeadlineInterceptor::new();
    let server = Server::default();
    let scope = Scope::background().with_timeout(Duration::from_secs(2));
    let (send, recv, _answer) = scope
        .enter(call(&interceptor, &server, CallOptions::new()))
        .await;
    // A `select!` or a `timeout` drops the call; the scope lives on.
    drop((send, recv));
    tokio::task::yield_now().await;
    assert!(
        !dropped(&server.dropped) && !dropped(&server.send_dropped),
        "an upload its caller dropped is not ended normally"
    );
    assert_eq!(
        interceptor.stats().cancels_not_reset(),
        1,
        "a dropped call the server cannot be told of is counted, scope or no scope"
    );
    tokio::time::sleep(Duration::from_millis(3001)).await;
    assert!(dropped(&server.dropped) && dropped(&server.send_dropped));
    assert_eq!(interceptor.stats().held_then_ended(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_upload_without_a_deadline_is_let_go_after_a_hold_and_reported() {
    let interceptor = DeadlineInterceptor::new().unscoped(Unscoped::Allow);
    let server = Server::default();
    let (send, recv, _answer) = call(&interceptor, &server, CallOptions::new()).await;
    drop((send, recv));
    tokio::time::sleep(Duration::from_millis(9_999)).await;
    assert!(!dropped(&server.send_dropped), "held for 10 s");
    tokio::time::sleep(Duration::from_millis(2)).await;
    assert!(dropped(&server.send_dropped));
    assert_eq!(
        interceptor.stats().held_then_ended(),
        1,
        "let go without a deadline: the server may read it as complete, so it is counted"
    );
}

#[tokio::test(start_paused = true)]
async fn over_a_resetting_transport_an_abandoned_call_is_dropped_at_once() {
    let interceptor = DeadlineInterceptor::new().abandoned(grpc_deadline_grpc::Abandoned::Drop);
    let server = Server::default();
    let scope = Scope::background().with_timeout(Duration::from_secs(2));
    let (send, recv, _answer) = scope
        .enter(call(&interceptor, &server, CallOptions::new()))
        .await;
    drop((send, recv));
    assert!(dropped(&server.dropped) && dropped(&server.send_dropped));
    assert_eq!(interceptor.stats().cancels_not_reset(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_before_the_response_headers_is_counted_as_not_reset() {
    let interceptor = DeadlineInterceptor::new();
    let server = Server::default();
    let scope = Scope::background();
    let (_send, mut recv, _answer) = scope
        .enter(call(&interceptor, &server, CallOptions::new()))
        .await;
    scope.cancel();
    assert_eq!(code(status(&mut recv).await), StatusCodeError::Cancelled);
    assert_eq!(
        interceptor.stats().cancels_not_reset(),
        1,
        "a cancel the server cannot be told of must be counted"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_because_its_scope_ended_is_counted_as_not_reset() {
    let interceptor = DeadlineInterceptor::new();
    let server = Server::default();
    let scope = Scope::background();
    let (send, recv, _answer) = scope
        .enter(call(&interceptor, &server, CallOptions::new()))
        .await;
    // The handler that made the call is dropped as its caller goes away:
    // the server layer ends the scope first.
    scope.end(grpc_deadline::Cause::Abandoned);
    drop((send, recv));
    assert_eq!(interceptor.stats().cancels_not_reset(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_server_cancelled_after_the_deadline_reads_as_deadline_exceeded() {
    let interceptor = DeadlineInterceptor::new();
    let server = Server::default();
    let scope = Scope::background();
    let (_send, mut recv, answer) = scope
        .enter(call(
            &interceptor,
            &server,
            options_in(Duration::from_millis(100)),
        ))
        .await;
    // The server's own timer, started on arrival, fires with ours: its
    // CANCELLED is already there when the call reads.
    advance(Duration::from_millis(100)).await;
    answer
        .send(ResponseStreamItem::Trailers(Trailers::new(Err(
            StatusError::new(StatusCodeError::Cancelled, "Timeout expired"),
        ))))
        .expect("the call is open");
    assert_eq!(
        code(status(&mut recv).await),
        StatusCodeError::DeadlineExceeded
    );
}

#[tokio::test(start_paused = true)]
async fn spent_retries_below_mark_the_request_scope() {
    let interceptor = DeadlineInterceptor::new();
    let server = Server::default();
    // A request's root, as a server layer makes it; the call runs in a
    // child of it, as a handler's cap would make.
    let request = Scope::root(Some(Instant::now() + Duration::from_secs(1)));
    let (_send, mut recv, answer) = request
        .with_timeout(Duration::from_millis(500))
        .enter(call(&interceptor, &server, CallOptions::new()))
        .await;
    let mut metadata = MetadataMap::new();
    metadata.insert("grpc-retry-pushback-ms", MetadataValue::from_static("-1"));
    answer
        .send(ResponseStreamItem::Trailers(
            Trailers::new(Err(StatusError::new(
                StatusCodeError::Unavailable,
                "C is down",
            )))
            .with_metadata(metadata),
        ))
        .expect("the call is open");
    assert_eq!(code(status(&mut recv).await), StatusCodeError::Unavailable);
    assert!(
        request.retries_spent(),
        "the request's root must know its call's retries were spent below"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unscoped_call_is_counted_and_under_deny_refused() {
    let server = Server::default();
    let warn = DeadlineInterceptor::new();
    call(&warn, &server, CallOptions::new()).await;
    assert_eq!(warn.stats().unscoped(), 1);
    assert_eq!(
        server.sent.lock().expect("not poisoned").len(),
        1,
        "sent, and reported"
    );

    let deny = DeadlineInterceptor::new().unscoped(Unscoped::Deny);
    let (_send, mut recv, _answer) = call(&deny, &server, CallOptions::new()).await;
    let refused = status(&mut recv).await.expect_err("refused");
    assert_eq!(refused.code(), StatusCodeError::FailedPrecondition);
    assert!(
        refused.message().contains("grpc_deadline::spawn"),
        "the message names the fix"
    );
    assert_eq!(
        server.sent.lock().expect("not poisoned").len(),
        1,
        "nothing more sent"
    );

    let allow = DeadlineInterceptor::new().unscoped(Unscoped::Allow);
    call(&allow, &server, CallOptions::new()).await;
    assert_eq!(allow.stats().unscoped(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_malformed_hand_written_header_is_internal_before_sending() {
    let interceptor = DeadlineInterceptor::new();
    let server = Server::default();
    let (answer, answers) = mpsc::unbounded_channel::<ResponseStreamItem>();
    drop(answer);
    let mut metadata = MetadataMap::new();
    metadata.insert("grpc-timeout", MetadataValue::from_static("1a"));
    let headers = RequestHeaders::new().with_metadata(metadata);
    let (_send, mut recv) = Scope::background()
        .enter(
            Channel(server.clone(), answers)
                .with_interceptor(interceptor)
                .invoke_once(headers, CallOptions::new()),
        )
        .await;
    assert_eq!(code(status(&mut recv).await), StatusCodeError::Internal);
    assert!(server.sent.lock().expect("not poisoned").is_empty());
}

struct Empty;

impl SendMessage for Empty {
    fn encode(&self) -> Result<Box<dyn bytes::Buf + Send + Sync>, String> {
        Ok(Box::new(bytes::Bytes::new()))
    }
}

trait Lossy {
    fn to_string_lossy(&self) -> &'static str;
}

impl Lossy for ResponseStreamItem {
    fn to_string_lossy(&self) -> &'static str {
        match self {
            ResponseStreamItem::Headers(_) => "headers",
            ResponseStreamItem::Message => "message",
            ResponseStreamItem::Trailers(_) => "trailers",
            ResponseStreamItem::StreamClosed => "closed",
        }
    }
}

#[cfg(feature = "ledger")]
#[tokio::test(start_paused = true)]
async fn a_call_cut_by_the_deadline_is_in_the_request_ledger() {
    use grpc_deadline::ledger::{self, Ledger, Reply};
    let interceptor = DeadlineInterceptor::new();
    let server = Server::default();
    let arrived = Instant::now();
    // A request's root, as the server layer makes it.
    let request = Scope::root(Some(arrived + Duration::from_millis(300)));
    let (_send, mut recv, _answer) = request
        .enter(call(&interceptor, &server, CallOptions::new()))
        .await;
    assert_eq!(
        code(status(&mut recv).await),
        StatusCodeError::DeadlineExceeded
    );
    // The server layer of the request answers DEADLINE_EXCEEDED with its line.
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("4"));
    ledger::answer(
        &mut trailers,
        &request,
        "/probe.Probe/Outer",
        arrived,
        Some(Duration::from_millis(300)),
    );
    let ledger = Ledger::from_headers(&trailers).expect("the answer carries a ledger");
    let hop = &ledger.hops()[0];
    assert_eq!(
        hop.calls.len(),
        1,
        "the call made through the grpc crate is noted"
    );
    let noted = &hop.calls[0];
    assert_eq!(noted.method, "/probe.Probe/Call");
    assert_eq!(noted.code, grpc_deadline::Code::DeadlineExceeded);
    assert_eq!(noted.granted, Some(Duration::from_millis(300)));
    assert_eq!(
        noted.reply,
        Reply::Unanswered,
        "cut here, before any answer"
    );
}

#[cfg(feature = "ledger")]
#[tokio::test(start_paused = true)]
async fn the_ledger_of_the_hop_below_is_read_from_the_crates_trailers() {
    use base64::Engine as _;
    use grpc_deadline::ledger::{self, Ledger, Reply};
    // The hop below answered DEADLINE_EXCEEDED with its own line.
    let below_scope = Scope::root(Some(Instant::now() + Duration::from_millis(200)));
    let mut below = http::HeaderMap::new();
    below.insert("grpc-status", http::HeaderValue::from_static("4"));
    ledger::answer(
        &mut below,
        &below_scope,
        "/probe.Probe/Call",
        Instant::now(),
        None,
    );
    let details = below
        .get("grpc-status-details-bin")
        .expect("the hop below wrote its ledger");
    // gRPC's base64, padded or not.
    let lenient = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let raw = lenient
        .decode(details.as_bytes())
        .expect("the details are base64");

    let interceptor = DeadlineInterceptor::new();
    let server = Server::default();
    let arrived = Instant::now();
    let request = Scope::root(Some(arrived + Duration::from_millis(300)));
    let (_send, mut recv, answer) = request
        .enter(call(&interceptor, &server, CallOptions::new()))
        .await;
    let mut metadata = MetadataMap::new();
    metadata.insert_bin("grpc-status-details-bin", MetadataValue::from_bytes(&raw));
    answer
        .send(ResponseStreamItem::Trailers(
            Trailers::new(Err(StatusError::new(StatusCodeError::DeadlineExceeded, "")))
                .with_metadata(metadata),
        ))
        .expect("the call is open");
    assert_eq!(
        code(status(&mut recv).await),
        StatusCodeError::DeadlineExceeded
    );

    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("4"));
    ledger::answer(&mut trailers, &request, "/probe.Probe/Outer", arrived, None);
    let ledger = Ledger::from_headers(&trailers).expect("the answer carries a ledger");
    let methods: Vec<&str> = ledger.hops().iter().map(|h| h.method.as_str()).collect();
    assert_eq!(
        methods,
        ["/probe.Probe/Outer", "/probe.Probe/Call"],
        "the line below follows ours"
    );
    assert_eq!(ledger.hops()[0].calls[0].reply, Reply::Ledger);
}
