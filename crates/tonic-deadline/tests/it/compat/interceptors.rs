//! Interceptors on either side of the layers: a generated client's
//! `with_interceptor`, `InterceptedService`/`InterceptorLayer` on the
//! client stack, a generated server's `with_interceptor` and
//! `InterceptorLayer` in the server's stack; what they add reaches the
//! other side, extensions they set reach the handler beside its scope, and
//! a refusal is the answer.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use testkit::CallRequest;
use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::body::Body;
use tonic::service::interceptor::{InterceptedService, InterceptorLayer};
use tonic::transport::Server;
use tonic::{Code, Status};
use tonic_deadline::client::ReadyChannel;
use tonic_deadline::{BoxError, ClientDeadlineLayer, Scope, ServerDeadlineLayer};
use tower::ServiceBuilder;

use super::{
    Answer, BUDGET, EXPIRING, PATIENCE, SLOW_MS, Seer, Sightings, Transport, endpoint, loopback,
    serve, stacks, within,
};

/// Adds a metadata entry, as tonic's interceptor examples do.
fn stamp(mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
    request
        .metadata_mut()
        .insert("x-stamp", "interceptor".parse().expect("an ASCII value"));
    Ok(request)
}

/// Says, in the metadata, whether the request already had its
/// `grpc-timeout` when the interceptor saw it.
fn note_timeout(mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
    let had = request.metadata().contains_key("grpc-timeout");
    let said = if had { "yes" } else { "no" };
    request
        .metadata_mut()
        .insert("x-had-grpc-timeout", said.parse().expect("an ASCII value"));
    Ok(request)
}

/// Refuses every call.
fn refuse(_: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
    Err(Status::permission_denied("no ticket"))
}

fn metadata_str<'a>(seen: &'a super::Seen, key: &str) -> Option<&'a str> {
    seen.metadata.get(key).and_then(|v| v.to_str().ok())
}

/// One call through a generated client of any stack, with `budget`.
async fn call<T>(
    client: &mut ProbeClient<T>,
    budget: Duration,
    request: CallRequest,
) -> Result<tonic::Response<testkit::CallReply>, Status>
where
    T: tonic::client::GrpcService<Body>,
    T::Error: Into<BoxError>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
{
    tokio::time::timeout(PATIENCE, within(budget, client.call(request)))
        .await
        .expect("the call must end within its deadline")
}

/// What every client whose interceptor stamps its calls must show.
async fn assert_stamped_call_keeps_the_budget<T>(
    client: &mut ProbeClient<T>,
    sightings: &mut Sightings,
    what: &dyn std::fmt::Display,
) where
    T: tonic::client::GrpcService<Body>,
    T::Error: Into<BoxError>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
{
    call(client, BUDGET, CallRequest::default())
        .await
        .unwrap_or_else(|status| panic!("{what}: the call must succeed, got {status:?}"));
    let seen = sightings.next().await;
    assert_eq!(
        metadata_str(&seen, "x-stamp"),
        Some("interceptor"),
        "{what}: the interceptor's metadata must reach the handler"
    );
    seen.assert_budget(BUDGET, what);
}

/// What every client whose interceptor refuses must show.
async fn assert_refusal_is_the_answer<T>(
    client: &mut ProbeClient<T>,
    sightings: &mut Sightings,
    what: &dyn std::fmt::Display,
) where
    T: tonic::client::GrpcService<Body>,
    T::Error: Into<BoxError>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
{
    let refused = call(client, BUDGET, CallRequest::default())
        .await
        .expect_err("the interceptor refuses every call");
    assert_eq!(
        (refused.code(), refused.message()),
        (Code::PermissionDenied, "no ticket"),
        "{what}: the interceptor's status must be the answer, unchanged"
    );
    sightings.assert_none(what);
}

/// What every client must show of a call that outlives its deadline.
async fn assert_expired_call_answers_deadline_exceeded<T>(
    client: &mut ProbeClient<T>,
    what: &dyn std::fmt::Display,
) where
    T: tonic::client::GrpcService<Body>,
    T::Error: Into<BoxError>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
{
    let slow = CallRequest {
        work_ms: SLOW_MS,
        ..CallRequest::default()
    };
    let status = call(client, EXPIRING, slow)
        .await
        .expect_err("the handler works far beyond the budget");
    assert_eq!(
        status.code(),
        Code::DeadlineExceeded,
        "{what}: an expired deadline must answer DEADLINE_EXCEEDED: {status:?}"
    );
}

// ---------------------------------------------------------------------------
// Client side
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_generated_clients_with_interceptor_takes_the_client_layer_over_either_transport() {
    for transport in Transport::BOTH {
        let (seer, mut sightings) = Seer::new(Answer::Echo);
        let endpoint = endpoint(serve(seer).await);
        // The stacks as users write them, unboxed: this compiles only while
        // the layer's response body (over either channel) is `Default`, as
        // `with_interceptor` asks, to answer for an interceptor that refuses.
        let layer = ClientDeadlineLayer::new();
        let what = format!("with_interceptor over the layer over a {transport}");
        match transport {
            Transport::Channel => {
                let layered = ServiceBuilder::new()
                    .layer(layer)
                    .service(endpoint.connect_lazy());
                let mut stamping = ProbeClient::with_interceptor(layered.clone(), stamp);
                let mut refusing = ProbeClient::with_interceptor(layered, refuse);
                assert_stamped_call_keeps_the_budget(&mut stamping, &mut sightings, &what).await;
                assert_refusal_is_the_answer(&mut refusing, &mut sightings, &what).await;
                assert_expired_call_answers_deadline_exceeded(&mut stamping, &what).await;
            }
            Transport::ReadyChannel => {
                let layered = ServiceBuilder::new()
                    .layer(layer)
                    .service(ReadyChannel::lazy(&endpoint));
                let mut stamping = ProbeClient::with_interceptor(layered.clone(), stamp);
                let mut refusing = ProbeClient::with_interceptor(layered, refuse);
                assert_stamped_call_keeps_the_budget(&mut stamping, &mut sightings, &what).await;
                assert_refusal_is_the_answer(&mut refusing, &mut sightings, &what).await;
                assert_expired_call_answers_deadline_exceeded(&mut stamping, &what).await;
            }
        }
    }
}

#[tokio::test]
async fn interceptor_layers_above_and_below_the_client_layer_keep_the_budget() {
    for transport in Transport::BOTH {
        let (seer, mut sightings) = Seer::new(Answer::Echo);
        let endpoint = endpoint(serve(seer).await);

        // Above the layer: the interceptor sees the call before the layer
        // has written its budget.
        let above = stacks!(transport, &endpoint, |channel| ServiceBuilder::new()
            .layer(InterceptorLayer::new(stamp))
            .layer(InterceptorLayer::new(note_timeout))
            .layer(ClientDeadlineLayer::new())
            .service(channel));
        let what = format!("InterceptorLayer above the layer, {transport}");
        let mut client = ProbeClient::new(above);
        call(&mut client, BUDGET, CallRequest::default())
            .await
            .unwrap_or_else(|status| panic!("{what}: the call must succeed, got {status:?}"));
        let seen = sightings.next().await;
        assert_eq!(
            metadata_str(&seen, "x-stamp"),
            Some("interceptor"),
            "{what}: the interceptor's metadata must reach the handler"
        );
        assert_eq!(
            metadata_str(&seen, "x-had-grpc-timeout"),
            Some("no"),
            "{what}: above the layer, the budget is not yet on the request"
        );
        seen.assert_budget(BUDGET, &what);
        assert_expired_call_answers_deadline_exceeded(&mut client, &what).await;

        // Below it: the interceptor sees the `grpc-timeout` the layer wrote.
        let (seer, mut sightings) = Seer::new(Answer::Echo);
        let endpoint = super::endpoint(serve(seer).await);
        let below = stacks!(transport, &endpoint, |channel| ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new())
            .service(InterceptedService::new(
                InterceptedService::new(channel, note_timeout),
                stamp
            )));
        let what = format!("InterceptedService below the layer, {transport}");
        let mut client = ProbeClient::new(below);
        call(&mut client, BUDGET, CallRequest::default())
            .await
            .unwrap_or_else(|status| panic!("{what}: the call must succeed, got {status:?}"));
        let seen = sightings.next().await;
        assert_eq!(
            metadata_str(&seen, "x-stamp"),
            Some("interceptor"),
            "{what}: the interceptor's metadata must reach the handler"
        );
        assert_eq!(
            metadata_str(&seen, "x-had-grpc-timeout"),
            Some("yes"),
            "{what}: below the layer, the interceptor sees the budget the layer wrote"
        );
        seen.assert_budget(BUDGET, &what);
        assert_expired_call_answers_deadline_exceeded(&mut client, &what).await;
    }
}

#[tokio::test]
async fn a_client_interceptor_that_refuses_is_the_answer_above_or_below_the_layer() {
    for transport in Transport::BOTH {
        let (seer, mut sightings) = Seer::new(Answer::Echo);
        let endpoint = endpoint(serve(seer).await);
        let above = stacks!(transport, &endpoint, |channel| ServiceBuilder::new()
            .layer(InterceptorLayer::new(refuse))
            .layer(ClientDeadlineLayer::new())
            .service(channel));
        let what = format!("a refusing InterceptorLayer above the layer, {transport}");
        assert_refusal_is_the_answer(&mut ProbeClient::new(above), &mut sightings, &what).await;

        // Below the layer, the refusal is an answer the layer receives: it
        // must hand it on as it is, not as a failure of its own.
        let below = stacks!(transport, &endpoint, |channel| ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new())
            .layer(InterceptorLayer::new(refuse))
            .service(channel));
        let what = format!("a refusing InterceptorLayer below the layer, {transport}");
        assert_refusal_is_the_answer(&mut ProbeClient::new(below), &mut sightings, &what).await;
    }
}

// ---------------------------------------------------------------------------
// Server side, and the extensions interceptors set
// ---------------------------------------------------------------------------

/// What the server's interceptor puts in the request's extensions for the
/// handler: who was admitted, and the budget the interceptor saw.
#[derive(Debug, Clone)]
struct Admitted {
    ticket: String,
    /// `Scope::try_current()`'s remaining time, in the interceptor.
    current: Option<Duration>,
    /// The remaining time of the scope in the request's extensions.
    in_extensions: Option<Duration>,
}

/// Admits calls that carry an `x-ticket`, refusing the others with
/// UNAUTHENTICATED, as tonic's authentication example does.
fn admit(mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
    let ticket = request
        .metadata()
        .get("x-ticket")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| Status::unauthenticated("no ticket"))?
        .to_owned();
    let admitted = Admitted {
        ticket,
        current: Scope::try_current().and_then(|s| s.remaining()),
        in_extensions: request
            .extensions()
            .get::<Scope>()
            .and_then(Scope::remaining),
    };
    request.extensions_mut().insert(admitted);
    Ok(request)
}

/// Where the server's interceptor stands.
#[derive(Debug, Clone, Copy)]
enum ServerInterceptor {
    /// `ProbeServer::with_interceptor`, behind the server layer.
    Generated,
    /// `Server::builder().layer(ServerDeadlineLayer).layer(InterceptorLayer)`.
    LayerInside,
    /// `Server::builder().layer(InterceptorLayer).layer(ServerDeadlineLayer)`.
    LayerOutside,
}

async fn serve_admitting(seer: Seer, at: ServerInterceptor) -> SocketAddr {
    let (listener, addr) = loopback().await;
    let incoming = TcpListenerStream::new(listener);
    match at {
        ServerInterceptor::Generated => tokio::spawn(
            Server::builder()
                .layer(ServerDeadlineLayer::new())
                .add_service(ProbeServer::with_interceptor(seer, admit))
                .serve_with_incoming(incoming),
        ),
        ServerInterceptor::LayerInside => tokio::spawn(
            Server::builder()
                .layer(ServerDeadlineLayer::new())
                .layer(InterceptorLayer::new(admit))
                .add_service(ProbeServer::new(seer))
                .serve_with_incoming(incoming),
        ),
        ServerInterceptor::LayerOutside => tokio::spawn(
            Server::builder()
                .layer(InterceptorLayer::new(admit))
                .layer(ServerDeadlineLayer::new())
                .add_service(ProbeServer::new(seer))
                .serve_with_incoming(incoming),
        ),
    };
    addr
}

fn ticketed(request: CallRequest) -> tonic::Request<CallRequest> {
    let mut request = tonic::Request::new(request);
    request
        .metadata_mut()
        .insert("x-ticket", "t-42".parse().expect("an ASCII value"));
    request
}

#[tokio::test]
async fn server_interceptors_hand_the_handler_their_extensions_beside_its_scope() {
    for at in [
        ServerInterceptor::Generated,
        ServerInterceptor::LayerInside,
        ServerInterceptor::LayerOutside,
    ] {
        for transport in Transport::BOTH {
            let (seer, mut sightings) = Seer::new(Answer::Echo);
            let endpoint = endpoint(serve_admitting(seer, at).await);
            let mut client = transport.client(&endpoint);
            let what = format!("{at:?} server interceptor, {transport}");

            within(BUDGET, client.call(ticketed(CallRequest::default())))
                .await
                .unwrap_or_else(|status| panic!("{what}: the call must succeed, got {status:?}"));
            let seen = sightings.next().await;
            seen.assert_budget(BUDGET, &what);
            let admitted = seen.extensions.get::<Admitted>().unwrap_or_else(|| {
                panic!("{what}: the interceptor's extension must reach the handler")
            });
            assert_eq!(admitted.ticket, "t-42", "{what}");
            match at {
                // Behind the layer, the interceptor runs inside the scope.
                ServerInterceptor::Generated | ServerInterceptor::LayerInside => {
                    for (how, left) in [
                        ("Scope::try_current()", admitted.current),
                        ("the request's extensions", admitted.in_extensions),
                    ] {
                        let left = left.unwrap_or_else(|| {
                            panic!("{what}: the interceptor must see the scope through {how}")
                        });
                        assert!(left <= BUDGET, "{what}: {how} has {left:?}");
                    }
                }
                // In front of it, there is no scope yet.
                ServerInterceptor::LayerOutside => assert_eq!(
                    (admitted.current, admitted.in_extensions),
                    (None, None),
                    "{what}: in front of the layer, the interceptor runs before any scope"
                ),
            }

            let slow = ticketed(CallRequest {
                work_ms: SLOW_MS,
                ..CallRequest::default()
            });
            let status = tokio::time::timeout(PATIENCE, within(EXPIRING, client.call(slow)))
                .await
                .expect("the call must end at its deadline")
                .expect_err("the handler works far beyond the budget");
            assert_eq!(status.code(), Code::DeadlineExceeded, "{what}: {status:?}");
        }
    }
}

#[tokio::test]
async fn a_server_interceptor_that_refuses_is_the_answer_the_caller_gets() {
    for at in [
        ServerInterceptor::Generated,
        ServerInterceptor::LayerInside,
        ServerInterceptor::LayerOutside,
    ] {
        for transport in Transport::BOTH {
            let (seer, mut sightings) = Seer::new(Answer::Echo);
            let endpoint = endpoint(serve_admitting(seer, at).await);
            let mut client = transport.client(&endpoint);
            let what = format!("{at:?} server interceptor, {transport}");
            let refused = within(BUDGET, client.call(CallRequest::default()))
                .await
                .expect_err("a call without a ticket is refused");
            assert_eq!(
                (refused.code(), refused.message()),
                (Code::Unauthenticated, "no ticket"),
                "{what}: the interceptor's status must be the answer, unchanged"
            );
            sightings.assert_none(&what);
        }
    }
}
