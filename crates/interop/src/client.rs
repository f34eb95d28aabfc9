//! The interop client: one function per official test case.
//!
//! Each case follows gRPC's interop test descriptions. The three deadline and
//! cancellation cases use a [`Scope`]:
//!
//! - `timeout_on_sleeping_server`: the call runs in a scope with a 1 ms
//!   budget; the client layer writes `grpc-timeout` and ends the call with
//!   `DEADLINE_EXCEEDED` whether the server or our own timer notices first;
//! - `cancel_after_begin`: once the request stream has been asked for its
//!   first message (the call is on the wire), the scope is cancelled: the call
//!   ends with `CANCELLED` and the stream is reset;
//! - `cancel_after_first_response`: after the first reply of a ping-pong, the
//!   scope is cancelled: the next read ends with `CANCELLED`.
//!
//! # Example
//!
//! ```no_run
//! use interop::client::{Clients, TestCase, run};
//!
//! # async fn demo() -> anyhow::Result<()> {
//! let mut clients = Clients::connect("127.0.0.1", 10000).await?;
//! run(TestCase::CancelAfterBegin, &mut clients).await?;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::pin::Pin;
use std::str::FromStr;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail, ensure};
use futures_util::Stream;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{BinaryMetadataValue, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tonic_deadline::client::ClientDeadline;
use tonic_deadline::{ClientDeadlineLayer, Scope};
use tower_layer::Layer;

use crate::pb::test_service_client::TestServiceClient;
use crate::pb::unimplemented_service_client::UnimplementedServiceClient;
use crate::pb::{
    EchoStatus, Empty, Payload, ResponseParameters, SimpleRequest, StreamingInputCallRequest,
    StreamingOutputCallRequest,
};
use crate::server::{ECHO_INITIAL, ECHO_TRAILING_BIN};

/// The official test cases this client implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TestCase {
    /// One `EmptyCall`.
    EmptyUnary,
    /// A 271 828-byte request for a 314 159-byte reply.
    LargeUnary,
    /// Four requests streamed in, one aggregate size back.
    ClientStreaming,
    /// One request, four replies streamed out.
    ServerStreaming,
    /// Four request/reply turns on one bidi stream.
    PingPong,
    /// A bidi stream half-closed at once: no replies, status OK.
    EmptyStream,
    /// A 1 ms deadline on a stream the server never answers.
    TimeoutOnSleepingServer,
    /// A client stream cancelled as soon as it starts.
    CancelAfterBegin,
    /// A bidi stream cancelled after its first reply.
    CancelAfterFirstResponse,
    /// A requested status code and message, unary and bidi.
    StatusCodeAndMessage,
    /// A requested status message with whitespace and non-ASCII text.
    SpecialStatusMessage,
    /// Initial and trailing metadata echoed, unary and bidi.
    CustomMetadata,
    /// A method the service does not implement.
    UnimplementedMethod,
    /// A service the server does not have.
    UnimplementedService,
}

impl TestCase {
    /// Every case, in the order of the official descriptions.
    pub const ALL: [TestCase; 14] = [
        TestCase::EmptyUnary,
        TestCase::LargeUnary,
        TestCase::ClientStreaming,
        TestCase::ServerStreaming,
        TestCase::PingPong,
        TestCase::EmptyStream,
        TestCase::TimeoutOnSleepingServer,
        TestCase::CancelAfterBegin,
        TestCase::CancelAfterFirstResponse,
        TestCase::StatusCodeAndMessage,
        TestCase::SpecialStatusMessage,
        TestCase::CustomMetadata,
        TestCase::UnimplementedMethod,
        TestCase::UnimplementedService,
    ];

    /// The official name, as given to `--test_case`.
    pub const fn name(self) -> &'static str {
        match self {
            TestCase::EmptyUnary => "empty_unary",
            TestCase::LargeUnary => "large_unary",
            TestCase::ClientStreaming => "client_streaming",
            TestCase::ServerStreaming => "server_streaming",
            TestCase::PingPong => "ping_pong",
            TestCase::EmptyStream => "empty_stream",
            TestCase::TimeoutOnSleepingServer => "timeout_on_sleeping_server",
            TestCase::CancelAfterBegin => "cancel_after_begin",
            TestCase::CancelAfterFirstResponse => "cancel_after_first_response",
            TestCase::StatusCodeAndMessage => "status_code_and_message",
            TestCase::SpecialStatusMessage => "special_status_message",
            TestCase::CustomMetadata => "custom_metadata",
            TestCase::UnimplementedMethod => "unimplemented_method",
            TestCase::UnimplementedService => "unimplemented_service",
        }
    }
}

impl fmt::Display for TestCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A `--test_case` value that names no case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownCase(String);

impl fmt::Display for UnknownCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown test case {:?}", self.0)
    }
}

impl std::error::Error for UnknownCase {}

impl FromStr for TestCase {
    type Err = UnknownCase;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        TestCase::ALL
            .into_iter()
            .find(|case| case.name() == name)
            .ok_or_else(|| UnknownCase(name.to_owned()))
    }
}

/// A channel whose calls obey the current scope.
pub type DeadlineChannel = ClientDeadline<Channel>;

/// The two stubs the cases need, over one connection.
#[derive(Debug, Clone)]
pub struct Clients {
    /// `grpc.testing.TestService`.
    pub test: TestServiceClient<DeadlineChannel>,
    /// `grpc.testing.UnimplementedService`.
    pub unimplemented: UnimplementedServiceClient<DeadlineChannel>,
}

impl Clients {
    /// Both stubs over `channel`, wrapped in [`ClientDeadlineLayer`].
    pub fn new(channel: Channel) -> Self {
        let channel = ClientDeadlineLayer::new().layer(channel);
        Self {
            test: TestServiceClient::new(channel.clone()),
            unimplemented: UnimplementedServiceClient::new(channel),
        }
    }

    /// Connects to `host:port` in plaintext.
    ///
    /// # Errors
    ///
    /// When the address is invalid or the connection fails.
    pub async fn connect(host: &str, port: u16) -> anyhow::Result<Self> {
        let endpoint = Endpoint::from_shared(format!("http://{host}:{port}"))
            .context("the server address must form a URI")?
            .connect_timeout(Duration::from_secs(10));
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("connecting to {host}:{port}"))?;
        Ok(Self::new(channel))
    }
}

/// How long one case may take before it counts as hung.
pub const CASE_LIMIT: Duration = Duration::from_secs(30);

/// Runs one case; `Ok` means it passed.
///
/// # Errors
///
/// What the case found wrong, or that it did not finish within [`CASE_LIMIT`].
pub async fn run(case: TestCase, clients: &mut Clients) -> anyhow::Result<()> {
    let body = async {
        match case {
            TestCase::EmptyUnary => empty_unary(clients).await,
            TestCase::LargeUnary => large_unary(clients).await,
            TestCase::ClientStreaming => client_streaming(clients).await,
            TestCase::ServerStreaming => server_streaming(clients).await,
            TestCase::PingPong => ping_pong(clients).await,
            TestCase::EmptyStream => empty_stream(clients).await,
            TestCase::TimeoutOnSleepingServer => timeout_on_sleeping_server(clients).await,
            TestCase::CancelAfterBegin => cancel_after_begin(clients).await,
            TestCase::CancelAfterFirstResponse => cancel_after_first_response(clients).await,
            TestCase::StatusCodeAndMessage => status_code_and_message(clients).await,
            TestCase::SpecialStatusMessage => special_status_message(clients).await,
            TestCase::CustomMetadata => custom_metadata(clients).await,
            TestCase::UnimplementedMethod => unimplemented_method(clients).await,
            TestCase::UnimplementedService => unimplemented_service(clients).await,
        }
    };
    tokio::time::timeout(CASE_LIMIT, body)
        .await
        .map_err(|_| anyhow!("{case} did not finish within {CASE_LIMIT:?}"))?
}

const LARGE_REQUEST: usize = 271_828;
const LARGE_RESPONSE: i32 = 314_159;
const STREAM_REQUESTS: [usize; 4] = [27_182, 8, 1_828, 45_904];
const STREAM_RESPONSES: [i32; 4] = [31_415, 9, 2_653, 58_979];

fn zeros(size: usize) -> Option<Payload> {
    Some(Payload {
        r#type: 0,
        body: vec![0; size],
    })
}

/// Checks a reply payload: the size asked for, all zero bytes.
fn check_payload(payload: Option<&Payload>, size: i32, what: &str) -> anyhow::Result<()> {
    let payload = payload.with_context(|| format!("{what}: the reply must carry a payload"))?;
    ensure!(
        i32::try_from(payload.body.len()).ok() == Some(size),
        "{what}: the payload must be {size} bytes, got {}",
        payload.body.len()
    );
    ensure!(
        payload.body.iter().all(|&b| b == 0),
        "{what}: the payload must be zero bytes"
    );
    Ok(())
}

fn ping(request: usize, response: i32) -> StreamingOutputCallRequest {
    StreamingOutputCallRequest {
        response_parameters: vec![ResponseParameters {
            size: response,
            ..ResponseParameters::default()
        }],
        payload: zeros(request),
        ..StreamingOutputCallRequest::default()
    }
}

fn expect_code<T>(result: Result<T, Status>, code: Code, what: &str) -> anyhow::Result<Status> {
    match result {
        Ok(_) => bail!("{what}: the call must fail with {code:?}, it succeeded"),
        Err(status) if status.code() == code => Ok(status),
        Err(status) => bail!(
            "{what}: the call must fail with {code:?}, got {:?} {:?}",
            status.code(),
            status.message()
        ),
    }
}

/// `empty_unary`: `EmptyCall` answers an empty message.
pub async fn empty_unary(clients: &mut Clients) -> anyhow::Result<()> {
    let reply = clients.test.empty_call(Empty {}).await?;
    ensure!(
        reply.into_inner() == Empty {},
        "EmptyCall must answer Empty"
    );
    Ok(())
}

/// `large_unary`: a 271 828-byte request gets a 314 159-byte reply.
pub async fn large_unary(clients: &mut Clients) -> anyhow::Result<()> {
    let reply = clients
        .test
        .unary_call(SimpleRequest {
            response_size: LARGE_RESPONSE,
            payload: zeros(LARGE_REQUEST),
            ..SimpleRequest::default()
        })
        .await?
        .into_inner();
    check_payload(reply.payload.as_ref(), LARGE_RESPONSE, "UnaryCall")
}

/// `client_streaming`: four payloads in, their total size (74 922) back.
pub async fn client_streaming(clients: &mut Clients) -> anyhow::Result<()> {
    let requests = STREAM_REQUESTS.map(|size| StreamingInputCallRequest {
        payload: zeros(size),
        ..StreamingInputCallRequest::default()
    });
    let reply = clients
        .test
        .streaming_input_call(futures_util::stream::iter(requests))
        .await?
        .into_inner();
    ensure!(
        reply.aggregated_payload_size == 74_922,
        "the aggregate must be 74922, got {}",
        reply.aggregated_payload_size
    );
    Ok(())
}

/// `server_streaming`: one request, four replies of the sizes asked for.
pub async fn server_streaming(clients: &mut Clients) -> anyhow::Result<()> {
    let request = StreamingOutputCallRequest {
        response_parameters: STREAM_RESPONSES
            .iter()
            .map(|&size| ResponseParameters {
                size,
                ..ResponseParameters::default()
            })
            .collect(),
        ..StreamingOutputCallRequest::default()
    };
    let mut replies = clients
        .test
        .streaming_output_call(request)
        .await?
        .into_inner();
    let mut seen = 0;
    while let Some(reply) = replies.message().await? {
        let size = *STREAM_RESPONSES
            .get(seen)
            .context("the server must send exactly four replies")?;
        check_payload(reply.payload.as_ref(), size, "StreamingOutputCall")?;
        seen += 1;
    }
    ensure!(seen == 4, "four replies expected, got {seen}");
    Ok(())
}

/// `ping_pong`: four request/reply turns, then a clean end.
pub async fn ping_pong(clients: &mut Clients) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::channel(1);
    // The first ping goes out with the call: a server may hold its response
    // headers until it has something to answer.
    tx.send(ping(STREAM_REQUESTS[0], STREAM_RESPONSES[0]))
        .await
        .map_err(|_| anyhow!("the request stream must accept its first message"))?;
    let mut replies = clients
        .test
        .full_duplex_call(ReceiverStream::new(rx))
        .await?
        .into_inner();
    for turn in 0..STREAM_REQUESTS.len() {
        if turn > 0 {
            tx.send(ping(STREAM_REQUESTS[turn], STREAM_RESPONSES[turn]))
                .await
                .map_err(|_| anyhow!("the request stream must stay open"))?;
        }
        let reply = replies
            .message()
            .await?
            .context("each ping must get its pong")?;
        check_payload(
            reply.payload.as_ref(),
            STREAM_RESPONSES[turn],
            "FullDuplexCall",
        )?;
    }
    drop(tx);
    ensure!(
        replies.message().await?.is_none(),
        "no reply may follow the half-close"
    );
    Ok(())
}

/// `empty_stream`: a bidi stream half-closed at once ends with no replies.
pub async fn empty_stream(clients: &mut Clients) -> anyhow::Result<()> {
    let mut replies = clients
        .test
        .full_duplex_call(futures_util::stream::empty())
        .await?
        .into_inner();
    ensure!(
        replies.message().await?.is_none(),
        "an empty stream must get no reply"
    );
    Ok(())
}

/// `timeout_on_sleeping_server`: a bidi call with a 1 ms budget, whose request
/// stream stays open, ends with `DEADLINE_EXCEEDED`.
pub async fn timeout_on_sleeping_server(clients: &mut Clients) -> anyhow::Result<()> {
    let scope = Scope::background().with_timeout(Duration::from_millis(1));
    let (tx, rx) = mpsc::channel(1);
    tx.send(StreamingOutputCallRequest {
        payload: zeros(27_182),
        ..StreamingOutputCallRequest::default()
    })
    .await
    .map_err(|_| anyhow!("the request stream must accept its first message"))?;
    let mut client = clients.test.clone();
    let outcome = scope
        .enter(async move {
            let mut replies = client
                .full_duplex_call(ReceiverStream::new(rx))
                .await?
                .into_inner();
            // The server sends nothing: this read ends only by the deadline.
            replies.message().await
        })
        .await;
    drop(tx);
    expect_code(outcome, Code::DeadlineExceeded, "FullDuplexCall with 1 ms")?;
    Ok(())
}

pin_project_lite::pin_project! {
    /// A request stream that never yields, and reports the first time the
    /// transport asks it for a message: from then on the call is on the wire.
    struct Started<T> {
        started: Option<oneshot::Sender<()>>,
        _item: std::marker::PhantomData<fn() -> T>,
    }
}

impl<T> Stream for Started<T> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<T>> {
        if let Some(started) = self.project().started.take() {
            let _ = started.send(());
        }
        Poll::Pending
    }
}

/// `cancel_after_begin`: a client stream cancelled once started, before any
/// message, ends with `CANCELLED`.
pub async fn cancel_after_begin(clients: &mut Clients) -> anyhow::Result<()> {
    let scope = Scope::background().child();
    let (started_tx, started_rx) = oneshot::channel();
    let requests = Started::<StreamingInputCallRequest> {
        started: Some(started_tx),
        _item: std::marker::PhantomData,
    };
    let mut client = clients.test.clone();
    let call_scope = scope.clone();
    #[allow(clippy::disallowed_methods)] // the call enters its scope explicitly
    let call = tokio::spawn(async move {
        call_scope
            .enter(client.streaming_input_call(requests))
            .await
    });
    started_rx
        .await
        .map_err(|_| anyhow!("the call must start sending its request stream"))?;
    scope.cancel();
    let outcome = call.await.context("the call task must not panic")?;
    expect_code(outcome, Code::Cancelled, "StreamingInputCall cancelled")?;
    Ok(())
}

/// `cancel_after_first_response`: a ping-pong cancelled after its first reply
/// ends with `CANCELLED`.
pub async fn cancel_after_first_response(clients: &mut Clients) -> anyhow::Result<()> {
    let scope = Scope::background().child();
    let (tx, rx) = mpsc::channel(1);
    tx.send(ping(27_182, 31_415))
        .await
        .map_err(|_| anyhow!("the request stream must accept its first message"))?;
    let mut client = clients.test.clone();
    let mut replies = scope
        .enter(client.full_duplex_call(ReceiverStream::new(rx)))
        .await?
        .into_inner();
    let first = replies
        .message()
        .await?
        .context("the first ping must get its pong")?;
    check_payload(first.payload.as_ref(), 31_415, "FullDuplexCall")?;
    scope.cancel();
    let outcome = replies.message().await;
    drop(tx);
    expect_code(outcome, Code::Cancelled, "FullDuplexCall cancelled")?;
    Ok(())
}

/// Asks for `code` and `message`, unary and bidi, and checks both come back.
async fn echo_status(clients: &mut Clients, message: &str) -> anyhow::Result<()> {
    let status = EchoStatus {
        code: Code::Unknown as i32,
        message: message.to_owned(),
    };
    let unary = clients
        .test
        .unary_call(SimpleRequest {
            response_size: 1,
            payload: zeros(1),
            response_status: Some(status.clone()),
            ..SimpleRequest::default()
        })
        .await;
    let got = expect_code(unary, Code::Unknown, "UnaryCall with a requested status")?;
    ensure!(
        got.message() == message,
        "UnaryCall: the message must come back as sent: {:?} != {message:?}",
        got.message()
    );

    let request = StreamingOutputCallRequest {
        response_parameters: vec![ResponseParameters {
            size: 1,
            ..ResponseParameters::default()
        }],
        payload: zeros(1),
        response_status: Some(status),
        ..StreamingOutputCallRequest::default()
    };
    let outcome = async {
        let mut replies = clients
            .test
            .full_duplex_call(futures_util::stream::iter([request]))
            .await?
            .into_inner();
        while replies.message().await?.is_some() {}
        Ok::<_, Status>(())
    }
    .await;
    let got = expect_code(
        outcome,
        Code::Unknown,
        "FullDuplexCall with a requested status",
    )?;
    ensure!(
        got.message() == message,
        "FullDuplexCall: the message must come back as sent: {:?} != {message:?}",
        got.message()
    );
    Ok(())
}

/// `status_code_and_message`: a requested `UNKNOWN` with a message comes back.
pub async fn status_code_and_message(clients: &mut Clients) -> anyhow::Result<()> {
    echo_status(clients, "test status message").await
}

/// `special_status_message`: whitespace and non-ASCII survive the
/// percent-encoding of `grpc-message`.
pub async fn special_status_message(clients: &mut Clients) -> anyhow::Result<()> {
    echo_status(
        clients,
        "\t\ntest with whitespace\r\nand Unicode BMP \u{263A} and non-BMP \u{1F608}\t\n",
    )
    .await
}

const ECHO_INITIAL_VALUE: &str = "test_initial_metadata_value";
const ECHO_TRAILING_VALUE: &[u8] = &[0xab, 0xab, 0xab];

fn with_echo_metadata<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert(ECHO_INITIAL, MetadataValue::from_static(ECHO_INITIAL_VALUE));
    request.metadata_mut().insert_bin(
        ECHO_TRAILING_BIN,
        BinaryMetadataValue::from_bytes(ECHO_TRAILING_VALUE),
    );
    request
}

fn check_echo(
    initial: &tonic::metadata::MetadataMap,
    trailing: &tonic::metadata::MetadataMap,
    what: &str,
) -> anyhow::Result<()> {
    let got = initial
        .get(ECHO_INITIAL)
        .with_context(|| format!("{what}: the initial metadata must be echoed"))?;
    ensure!(
        got == ECHO_INITIAL_VALUE,
        "{what}: initial metadata {got:?} differs"
    );
    let got = trailing
        .get_bin(ECHO_TRAILING_BIN)
        .with_context(|| format!("{what}: the trailing metadata must be echoed"))?
        .to_bytes()
        .map_err(|e| anyhow!("{what}: trailing metadata is not base64: {e}"))?;
    ensure!(
        got.as_ref() == ECHO_TRAILING_VALUE,
        "{what}: trailing metadata {got:?} differs"
    );
    Ok(())
}

/// `custom_metadata`: initial and binary trailing metadata are echoed, unary
/// and bidi.
pub async fn custom_metadata(clients: &mut Clients) -> anyhow::Result<()> {
    let reply = clients
        .test
        .unary_call(with_echo_metadata(SimpleRequest {
            response_size: LARGE_RESPONSE,
            payload: zeros(LARGE_REQUEST),
            ..SimpleRequest::default()
        }))
        .await?;
    // tonic merges a unary call's trailers into its response metadata.
    check_echo(reply.metadata(), reply.metadata(), "UnaryCall")?;
    check_payload(
        reply.get_ref().payload.as_ref(),
        LARGE_RESPONSE,
        "UnaryCall",
    )?;

    let request = ping(LARGE_REQUEST, LARGE_RESPONSE);
    let response = clients
        .test
        .full_duplex_call(with_echo_metadata(futures_util::stream::iter([request])))
        .await?;
    let initial = response.metadata().clone();
    let mut replies = response.into_inner();
    while let Some(reply) = replies.message().await? {
        check_payload(reply.payload.as_ref(), LARGE_RESPONSE, "FullDuplexCall")?;
    }
    let trailing = replies
        .trailers()
        .await?
        .context("FullDuplexCall: the stream must end with trailers")?;
    check_echo(&initial, &trailing, "FullDuplexCall")
}

/// `unimplemented_method`: `TestService/UnimplementedCall` is `UNIMPLEMENTED`.
pub async fn unimplemented_method(clients: &mut Clients) -> anyhow::Result<()> {
    let outcome = clients.test.unimplemented_call(Empty {}).await;
    expect_code(outcome, Code::Unimplemented, "UnimplementedCall")?;
    Ok(())
}

/// `unimplemented_service`: a service the server lacks is `UNIMPLEMENTED`.
pub async fn unimplemented_service(clients: &mut Clients) -> anyhow::Result<()> {
    let outcome = clients.unimplemented.unimplemented_call(Empty {}).await;
    expect_code(outcome, Code::Unimplemented, "UnimplementedService")?;
    Ok(())
}
