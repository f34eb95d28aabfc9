//! [`TonicInvoke`]: the `grpc` crate's calls over tonic's transport, under
//! tonic-deadline's client layer (feature `tonic-transport`).
//!
//! The crate's own transport (0.9) sends each call from a task of its own
//! and keeps the call's HTTP/2 stream there until the server's response
//! headers arrive: dropping the call's streams before then only ends the
//! request body, and the server is not told. It also opens its
//! connections with `TCP_NODELAY` off, which it does not let a caller
//! change, so a call's first message can wait for the acknowledgement of
//! its headers (about 40 ms on Linux) before it leaves.
//!
//! [`TonicInvoke`] is an [`Invoke`] of its own, so generated clients and
//! interceptors (such as [`DeadlineInterceptor`](crate::DeadlineInterceptor))
//! run over it unchanged. Each call is a tonic call through
//! `tonic::client::Grpc<ClientDeadline<ReadyChannel>>`:
//!
//! - the call belongs to the two streams it returns, with no task of its
//!   own: dropping the receiving side drops the tonic call, and the stream
//!   is reset (`RST_STREAM CANCEL`), before the response headers as after;
//! - the request is half-closed by a message sent with
//!   [`SendOptions::with_final_msg`](grpc::client::SendOptions::with_final_msg),
//!   or by a sending side dropped before that *and then* the answer read
//!   (how the crate's generated client-streaming calls finish an upload);
//!   a call whose receiving side is dropped instead is reset, so that a
//!   server never takes an abandoned request for a complete one;
//! - the connection is tonic's, with `TCP_NODELAY` on (tonic's `Endpoint`
//!   default);
//! - the client layer writes `grpc-timeout` from the current scope (and
//!   from a `CallOptions` deadline, or a `grpc-timeout` already in the
//!   metadata, whichever is earliest) and ends the call at the deadline or
//!   when the scope ends.
//!
//! # What it gives up
//!
//! The crate's channel: its name resolution (`dns:///` and friends), its
//! load balancing between addresses, its credentials, and its reconnection
//! policy. A `TonicInvoke` talks to the one endpoint its [`ReadyChannel`]
//! was built for, with tonic's options for that endpoint (TLS, keepalive,
//! windows), and reconnects as a `ReadyChannel` does. Use it where the
//! server is one address (or a proxy in front of several) and a cancel must
//! reach the server; keep the crate's channel where its balancing matters,
//! and give those calls a deadline, which is what stops their servers.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use grpc::client::interceptor::InvokeExt;
//! use grpc::client::{CallOptions, Invoke};
//! use grpc::core::RequestHeaders;
//! use grpc_deadline::Scope;
//! use grpc_deadline_grpc::{DeadlineInterceptor, TonicInvoke};
//! use tonic::transport::Endpoint;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let endpoint = Endpoint::from_static("http://127.0.0.1:50051"); // TCP_NODELAY on
//! let invoke = TonicInvoke::lazy(&endpoint);
//! // The interceptor's report of cancels the server was not told of does
//! // not apply here: this transport tells the server.
//! let calls = invoke.with_interceptor(DeadlineInterceptor::new().abandoned(grpc_deadline_grpc::Abandoned::Drop));
//! let scope = Scope::background().with_timeout(Duration::from_millis(500));
//! let headers = RequestHeaders::new().with_method_name("/probe.v1.Probe/Call");
//! // What a generated client does with `calls`: here nothing listens, so
//! // the call fails (UNAVAILABLE) rather than waiting.
//! let (_send, _recv) = scope.enter(calls.invoke(headers, CallOptions::new())).await;
//! # }
//! ```

mod call;
mod codec;
mod streams;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use grpc::client::{CallOptions, Invoke};
use grpc::core::RequestHeaders;
use grpc::{StatusCodeError, StatusError};
use grpc_deadline::timeout_header;
use http::uri::PathAndQuery;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::client::Grpc;
use tonic_deadline::ClientDeadlineLayer;
use tonic_deadline::client::{ClientDeadline, ReadyChannel};
use tower_layer::Layer as _;

use call::{Answer, Dispatch};
use codec::{Outgoing, RawCodec, RequestMessages};
pub use streams::{TonicRecvStream, TonicSendStream};

/// The header a call's budget travels in.
const GRPC_TIMEOUT: &str = "grpc-timeout";

/// How many encoded messages may wait for the connection, per call, before
/// a send waits: one, as in the crate's own transport.
const QUEUED_MESSAGES: usize = 1;

/// An [`Invoke`] that runs the `grpc` crate's calls over tonic's transport,
/// under tonic-deadline's client layer: a call dropped before the server's
/// response headers resets its stream, and messages leave with
/// `TCP_NODELAY`. See the [module docs](self) for what it gives up.
///
/// ```no_run
/// use grpc::client::interceptor::InvokeExt;
/// use grpc_deadline_grpc::{DeadlineInterceptor, TonicInvoke};
/// use tonic_deadline::ClientDeadlineLayer;
/// use tonic_deadline::client::{ReadyChannel, Unscoped};
///
/// # fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let endpoint = tonic::transport::Endpoint::from_shared("http://127.0.0.1:50051")?;
/// // The client layer configured as for any tonic client; the interceptor
/// // above reports unscoped calls already.
/// let layer = ClientDeadlineLayer::new().unscoped(Unscoped::Allow);
/// let invoke = TonicInvoke::new(layer, ReadyChannel::lazy(&endpoint));
/// let calls = invoke.with_interceptor(DeadlineInterceptor::new().abandoned(grpc_deadline_grpc::Abandoned::Drop));
/// # let _ = calls;
/// # Ok(())
/// # }
/// ```
///
/// Clones share the connection.
#[derive(Clone)]
pub struct TonicInvoke {
    grpc: Grpc<ClientDeadline<ReadyChannel>>,
}

impl fmt::Debug for TonicInvoke {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TonicInvoke").finish_non_exhaustive()
    }
}

impl TonicInvoke {
    /// Calls over `channel`, each under `layer` (tonic-deadline's client
    /// layer, configured as for any tonic client).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use grpc_deadline_grpc::TonicInvoke;
    /// use tonic_deadline::{ClientDeadlineLayer, client::ReadyChannel};
    /// let endpoint = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051");
    /// let invoke = TonicInvoke::new(ClientDeadlineLayer::new(), ReadyChannel::lazy(&endpoint));
    /// # let _ = invoke;
    /// # }
    /// ```
    pub fn new(layer: ClientDeadlineLayer, channel: ReadyChannel) -> Self {
        Self {
            grpc: Grpc::new(layer.layer(channel)),
        }
    }

    /// Calls to `endpoint` (with its options: tonic's `tcp_nodelay` is on
    /// unless the endpoint turns it off) under the default client layer;
    /// the connection is made on the first call, and counted in its budget.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let endpoint = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051");
    /// let invoke = grpc_deadline_grpc::TonicInvoke::lazy(&endpoint);
    /// # let _ = invoke;
    /// # }
    /// ```
    pub fn lazy(endpoint: &tonic::transport::Endpoint) -> Self {
        Self::new(ClientDeadlineLayer::new(), ReadyChannel::lazy(endpoint))
    }
}

impl Invoke for TonicInvoke {
    type SendStream = TonicSendStream;
    type RecvStream = TonicRecvStream;

    async fn invoke(
        &self,
        headers: RequestHeaders,
        options: CallOptions,
    ) -> (TonicSendStream, TonicRecvStream) {
        let method = headers.method_name();
        let Ok(path) = PathAndQuery::try_from(method.as_str()) else {
            return streams::failed(StatusError::new(
                StatusCodeError::Internal,
                format!(
                    "invalid method name {method:?}: a call's method is a path, /package.Service/Method"
                ),
            ));
        };
        let (tx, rx) = mpsc::channel::<Outgoing>(QUEUED_MESSAGES);
        let messages = RequestMessages::new(rx);
        let finished = messages.finished_flag();
        let mut request = tonic::Request::new(messages);
        *request.metadata_mut() = headers.metadata().clone().into();
        if let Err(status) = write_call_deadline(&mut request, &options) {
            return streams::failed(status);
        }
        // Resets the stream: what an abandoned request ends with, instead
        // of a clean end.
        let cancel = request.cancellation_handle();

        let mut grpc = self.grpc.clone();
        // Ready: connected, and a stream free on the connection (bounded by
        // the scope's deadline in the client layer).
        if let Err(error) = grpc.ready().await {
            let status = tonic::Status::from_error(error);
            return streams::failed(StatusError::new(
                StatusCodeError::Unavailable,
                format!("the channel is not ready: {}", status.message()),
            ));
        }
        let call: Pin<Box<dyn Future<Output = Answer> + Send>> =
            Box::pin(async move { grpc.streaming(request, path, RawCodec).await });
        let dispatch = Arc::new(Dispatch::new(call));
        // The first poll hands the request to the connection (the client
        // layer writes `grpc-timeout` here): from then on its headers and
        // body leave whether or not the caller waits on the answer.
        std::future::poll_fn(|cx| {
            dispatch.poll_once(cx);
            Poll::Ready(())
        })
        .await;
        streams::open(tx, finished, cancel, dispatch)
    }
}

/// Writes the call's own deadline (its `CallOptions`) as `grpc-timeout`
/// when it is earlier than one already in the metadata; the client layer
/// then takes the earlier of it and the scope's.
fn write_call_deadline<T>(
    request: &mut tonic::Request<T>,
    options: &CallOptions,
) -> Result<(), StatusError> {
    let written = match request.metadata().get(GRPC_TIMEOUT) {
        None => None,
        Some(value) => Some(
            timeout_header::decode(value.as_bytes()).map_err(|malformed| {
                StatusError::new(StatusCodeError::Internal, malformed.to_string())
            })?,
        ),
    };
    let Some(deadline) = options.deadline() else {
        return Ok(());
    };
    let budget = crate::interceptor::from_std(deadline).saturating_duration_since(Instant::now());
    if written.is_some_and(|written: Duration| written <= budget) {
        return Ok(());
    }
    let encoded = timeout_header::encode(budget);
    // Digits and a unit: always a valid value.
    if let Ok(value) = encoded.parse() {
        request.metadata_mut().insert(GRPC_TIMEOUT, value);
    }
    Ok(())
}
