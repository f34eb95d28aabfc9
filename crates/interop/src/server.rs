//! The interop server: `grpc.testing.TestService` as the official interop
//! descriptions ask, behind [`ServerDeadlineLayer`].
//!
//! Every handler runs inside the request's scope, so the deadline cases
//! (`timeout_on_sleeping_server`, `cancel_after_*`) are enforced by the layer,
//! not by the handlers: a handler that waits for the next message never looks
//! at the clock, and the client still gets `DEADLINE_EXCEEDED` on time.
//!
//! Metadata echo (`custom_metadata`) is a small HTTP layer, [`EchoMetadataLayer`]:
//! tonic handlers cannot add trailers to a unary reply, so the echo of
//! `x-grpc-test-echo-trailing-bin` is written into the response trailers on
//! the way out.
//!
//! # Example
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! println!("listening on {}", listener.local_addr()?);
//! interop::server::serve(listener, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(())
//! # }
//! ```

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;
use tonic::{Code, Status, Streaming};
use tonic_deadline::{Scope, ServerDeadlineLayer};
use tower_layer::Layer;
use tower_service::Service;

use crate::pb::test_service_server::{TestService, TestServiceServer};
use crate::pb::{
    EchoStatus, Empty, Payload, ResponseParameters, SimpleRequest, SimpleResponse,
    StreamingInputCallRequest, StreamingInputCallResponse, StreamingOutputCallRequest,
    StreamingOutputCallResponse,
};

/// The largest payload a request may ask for; the official cases stay under
/// 320 KB, and a peer must not make us allocate without bound.
pub const MAX_RESPONSE_SIZE: usize = 4 * 1024 * 1024;

/// The metadata key echoed back as initial metadata.
pub const ECHO_INITIAL: &str = "x-grpc-test-echo-initial";
/// The metadata key echoed back as trailing metadata.
pub const ECHO_TRAILING_BIN: &str = "x-grpc-test-echo-trailing-bin";
/// The response header [`BudgetReportLayer`] writes: the remaining budget
/// the handler's scope had on entry, in microseconds, or `none`.
pub const REMAINING_HEADER: &str = "x-deadline-remaining-us";

/// `grpc.testing.TestService` as the interop descriptions specify it.
#[derive(Debug, Clone, Copy, Default)]
pub struct TestServer {
    _private: (),
}

impl TestServer {
    /// The service.
    pub const fn new() -> Self {
        Self { _private: () }
    }
}

/// A stream of replies, as the streaming methods return.
pub type ReplyStream =
    Pin<Box<dyn Stream<Item = Result<StreamingOutputCallResponse, Status>> + Send>>;

/// A payload of `size` zero bytes.
fn zeros(size: i32) -> Result<Payload, Status> {
    let size = usize::try_from(size)
        .map_err(|_| Status::invalid_argument("response size must not be negative"))?;
    if size > MAX_RESPONSE_SIZE {
        return Err(Status::invalid_argument("response size is too large"));
    }
    Ok(Payload {
        r#type: 0,
        body: vec![0; size],
    })
}

/// The status a request asked to be answered with, if any.
fn requested_status(echo: Option<&EchoStatus>) -> Option<Status> {
    let echo = echo?;
    let code = Code::from_i32(echo.code);
    (code != Code::Ok).then(|| Status::new(code, echo.message.clone()))
}

/// One streamed reply, after the pause its parameters ask for.
async fn streamed_reply(params: ResponseParameters) -> Result<StreamingOutputCallResponse, Status> {
    let pause = u64::try_from(params.interval_us).unwrap_or(0);
    if pause > 0 {
        tokio::time::sleep(Duration::from_micros(pause)).await;
    }
    Ok(StreamingOutputCallResponse {
        payload: Some(zeros(params.size)?),
    })
}

/// The state of a full-duplex exchange: replies still owed for the requests
/// read so far, and the requests still to come.
struct Duplex {
    inbound: Streaming<StreamingOutputCallRequest>,
    owed: VecDeque<ResponseParameters>,
    done: bool,
}

impl Duplex {
    /// The next reply: the oldest one owed, else the first owed by the next
    /// request. Ends when the client half-closes.
    async fn next(mut self) -> Option<(Result<StreamingOutputCallResponse, Status>, Self)> {
        // Each turn either answers or reads one request; a request without
        // response parameters owes nothing, so the loop reads on.
        loop {
            if self.done {
                return None;
            }
            if let Some(params) = self.owed.pop_front() {
                let reply = streamed_reply(params).await;
                self.done = reply.is_err();
                return Some((reply, self));
            }
            match self.inbound.message().await {
                Ok(Some(request)) => {
                    if let Some(status) = requested_status(request.response_status.as_ref()) {
                        self.done = true;
                        return Some((Err(status), self));
                    }
                    self.owed.extend(request.response_parameters);
                }
                Ok(None) => return None,
                Err(status) => {
                    self.done = true;
                    return Some((Err(status), self));
                }
            }
        }
    }
}

#[tonic::async_trait]
impl TestService for TestServer {
    async fn empty_call(
        &self,
        _request: tonic::Request<Empty>,
    ) -> Result<tonic::Response<Empty>, Status> {
        Ok(tonic::Response::new(Empty {}))
    }

    async fn unary_call(
        &self,
        request: tonic::Request<SimpleRequest>,
    ) -> Result<tonic::Response<SimpleResponse>, Status> {
        let request = request.into_inner();
        if let Some(status) = requested_status(request.response_status.as_ref()) {
            return Err(status);
        }
        Ok(tonic::Response::new(SimpleResponse {
            payload: Some(zeros(request.response_size)?),
            ..SimpleResponse::default()
        }))
    }

    async fn cacheable_unary_call(
        &self,
        request: tonic::Request<SimpleRequest>,
    ) -> Result<tonic::Response<SimpleResponse>, Status> {
        self.unary_call(request).await
    }

    type StreamingOutputCallStream = ReplyStream;

    async fn streaming_output_call(
        &self,
        request: tonic::Request<StreamingOutputCallRequest>,
    ) -> Result<tonic::Response<Self::StreamingOutputCallStream>, Status> {
        let request = request.into_inner();
        let status = requested_status(request.response_status.as_ref());
        let replies = futures_util::stream::iter(request.response_parameters)
            .then(streamed_reply)
            .chain(futures_util::stream::iter(status.map(Err)));
        Ok(tonic::Response::new(Box::pin(replies)))
    }

    async fn streaming_input_call(
        &self,
        request: tonic::Request<Streaming<StreamingInputCallRequest>>,
    ) -> Result<tonic::Response<StreamingInputCallResponse>, Status> {
        let mut inbound = request.into_inner();
        let mut total: usize = 0;
        // Ends when the client half-closes; the deadline layer ends it
        // earlier if the client stalls.
        while let Some(request) = inbound.message().await? {
            let size = request.payload.map_or(0, |p| p.body.len());
            total = total.saturating_add(size);
        }
        let aggregated_payload_size = i32::try_from(total)
            .map_err(|_| Status::invalid_argument("aggregated payload exceeds i32"))?;
        Ok(tonic::Response::new(StreamingInputCallResponse {
            aggregated_payload_size,
        }))
    }

    type FullDuplexCallStream = ReplyStream;

    async fn full_duplex_call(
        &self,
        request: tonic::Request<Streaming<StreamingOutputCallRequest>>,
    ) -> Result<tonic::Response<Self::FullDuplexCallStream>, Status> {
        let duplex = Duplex {
            inbound: request.into_inner(),
            owed: VecDeque::new(),
            done: false,
        };
        Ok(tonic::Response::new(Box::pin(
            futures_util::stream::unfold(duplex, Duplex::next),
        )))
    }

    type HalfDuplexCallStream = ReplyStream;

    async fn half_duplex_call(
        &self,
        _request: tonic::Request<Streaming<StreamingOutputCallRequest>>,
    ) -> Result<tonic::Response<Self::HalfDuplexCallStream>, Status> {
        Err(Status::unimplemented(
            "HalfDuplexCall is not part of any case here",
        ))
    }

    async fn unimplemented_call(
        &self,
        _request: tonic::Request<Empty>,
    ) -> Result<tonic::Response<Empty>, Status> {
        Err(Status::unimplemented(
            "UnimplementedCall is never implemented",
        ))
    }
}

/// Serves `TestService` on `listener` until `shutdown` completes.
///
/// Layers, outermost first: [`ServerDeadlineLayer`] (decode, enforce, scope),
/// then [`EchoMetadataLayer`].
///
/// # Errors
///
/// When the server fails to run.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    Server::builder()
        .layer(ServerDeadlineLayer::new())
        .layer(EchoMetadataLayer::new())
        .add_service(TestServiceServer::new(TestServer::new()))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
}

/// Like [`serve`], and every answer says in [`REMAINING_HEADER`] how much
/// budget the handler's scope had on entry: what the hostile-header tests
/// compare against the value they sent.
///
/// # Errors
///
/// When the server fails to run.
pub async fn serve_reporting_budget(
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    Server::builder()
        .layer(ServerDeadlineLayer::new())
        .layer(BudgetReportLayer::new())
        .layer(EchoMetadataLayer::new())
        .add_service(TestServiceServer::new(TestServer::new()))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
}

/// Echoes `x-grpc-test-echo-initial` into the response headers and
/// `x-grpc-test-echo-trailing-bin` into the trailers (or into the headers of
/// a trailers-only answer).
#[derive(Debug, Clone, Copy, Default)]
pub struct EchoMetadataLayer {
    _private: (),
}

impl EchoMetadataLayer {
    /// The layer.
    pub const fn new() -> Self {
        Self { _private: () }
    }
}

impl<S> Layer<S> for EchoMetadataLayer {
    type Service = EchoMetadata<S>;

    fn layer(&self, inner: S) -> Self::Service {
        EchoMetadata { inner }
    }
}

/// The service of [`EchoMetadataLayer`].
#[derive(Debug, Clone)]
pub struct EchoMetadata<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> Service<Request<B>> for EchoMetadata<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    RB: Body<Data = Bytes>,
{
    type Response = Response<EchoBody<RB>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let initial = request.headers().get(ECHO_INITIAL).cloned();
        let trailing = request.headers().get(ECHO_TRAILING_BIN).cloned();
        let call = self.inner.call(request);
        Box::pin(async move {
            let mut response = call.await?;
            if let Some(value) = initial {
                response
                    .headers_mut()
                    .insert(HeaderName::from_static(ECHO_INITIAL), value);
            }
            let trailers_only = response.headers().contains_key("grpc-status");
            let mut trailing = trailing;
            if trailers_only && let Some(value) = trailing.take() {
                response
                    .headers_mut()
                    .insert(HeaderName::from_static(ECHO_TRAILING_BIN), value);
            }
            Ok(response.map(|inner| EchoBody { inner, trailing }))
        })
    }
}

pin_project! {
    /// A response body that adds the echoed trailing metadata to its trailers.
    pub struct EchoBody<B> {
        #[pin]
        inner: B,
        trailing: Option<HeaderValue>,
    }
}

impl<B> std::fmt::Debug for EchoBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EchoBody").finish_non_exhaustive()
    }
}

impl<B: Body<Data = Bytes>> Body for EchoBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = polled {
            let frame = match frame.into_trailers() {
                Ok(mut trailers) => {
                    if let Some(value) = this.trailing.take() {
                        trailers.insert(HeaderName::from_static(ECHO_TRAILING_BIN), value);
                    }
                    Frame::trailers(trailers)
                }
                Err(frame) => frame,
            };
            return Poll::Ready(Some(Ok(frame)));
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Writes the remaining budget the request's scope had when the handler was
/// called into [`REMAINING_HEADER`]. Must sit inside [`ServerDeadlineLayer`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BudgetReportLayer {
    _private: (),
}

impl BudgetReportLayer {
    /// The layer.
    pub const fn new() -> Self {
        Self { _private: () }
    }
}

impl<S> Layer<S> for BudgetReportLayer {
    type Service = BudgetReport<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BudgetReport { inner }
    }
}

/// The service of [`BudgetReportLayer`].
#[derive(Debug, Clone)]
pub struct BudgetReport<S> {
    inner: S,
}

impl<S, B, RB> Service<Request<B>> for BudgetReport<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let remaining = match Scope::try_current().map(|s| s.remaining()) {
            Some(Some(left)) => left.as_micros().to_string(),
            Some(None) => "none".to_owned(),
            None => "no-scope".to_owned(),
        };
        let call = self.inner.call(request);
        Box::pin(async move {
            let mut response = call.await?;
            if let Ok(value) = HeaderValue::try_from(remaining) {
                response
                    .headers_mut()
                    .insert(HeaderName::from_static(REMAINING_HEADER), value);
            }
            Ok(response)
        })
    }
}

/// The headers of a trailers-only or trailing answer carry the status; this
/// reads the code, for tools that look at raw HTTP/2 answers.
pub fn status_code(headers: &HeaderMap) -> Option<Code> {
    let value = headers.get("grpc-status")?.to_str().ok()?;
    value.parse::<i32>().ok().map(Code::from_i32)
}
