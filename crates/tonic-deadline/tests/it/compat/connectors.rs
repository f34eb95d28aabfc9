//! Custom connectors under the client layer: tonic's
//! `Endpoint::connect_with_connector` and `ReadyChannel::connect_with_connector`
//! dial through the user's connector, tonic's one-shot pattern included (an
//! in-memory stream handed out once, by a connector that is not `Clone`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hyper_util::rt::TokioIo;
use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use tokio::net::TcpStream;
use tonic::transport::{Endpoint, Server, Uri};
use tonic_deadline::client::ReadyChannel;
use tonic_deadline::{ClientDeadlineLayer, ServerDeadlineLayer};
use tower::ServiceBuilder;

use super::{
    Answer, Client, Seer, Transport, assert_call_keeps_the_budget,
    assert_expired_call_answers_deadline_exceeded, boxed, serve,
};

/// An address no one dials: the connector decides where calls go.
const NOWHERE: &str = "http://[::]:50051";

/// A probe client, the client layer over `$transport` connected now
/// through `$connector`: tonic's `Endpoint::connect_with_connector` or
/// `ReadyChannel::connect_with_connector`. (A macro: the two arms build
/// stacks of different types.)
macro_rules! connected_through {
    ($transport:expr, $connector:expr) => {{
        let endpoint = Endpoint::from_static(NOWHERE);
        let layer = ClientDeadlineLayer::new();
        let stack = match $transport {
            Transport::Channel => boxed(
                ServiceBuilder::new().layer(layer).service(
                    endpoint
                        .connect_with_connector($connector)
                        .await
                        .expect("the connector serves the channel"),
                ),
            ),
            Transport::ReadyChannel => boxed(
                ServiceBuilder::new().layer(layer).service(
                    ReadyChannel::connect_with_connector(&endpoint, $connector)
                        .await
                        .expect("the connector serves the channel"),
                ),
            ),
        };
        ProbeClient::new(stack)
    }};
}

#[tokio::test]
async fn a_custom_connector_dials_for_both_transports_under_the_layer() {
    let (seer, mut sightings) = Seer::new(Answer::Echo);
    let addr = serve(seer).await;
    for transport in Transport::BOTH {
        let what = format!("a custom connector, {transport}");
        let dials = Arc::new(AtomicUsize::new(0));
        let counted = dials.clone();
        let connector = tower::service_fn(move |_: Uri| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move { TcpStream::connect(addr).await.map(TokioIo::new) }
        });
        let mut client: Client = connected_through!(transport, connector);
        assert_call_keeps_the_budget(&mut client, &mut sightings, &what).await;
        assert_expired_call_answers_deadline_exceeded(&mut client, &what).await;
        assert_eq!(
            dials.load(Ordering::SeqCst),
            1,
            "{what}: one dial, through the connector, for every call"
        );
    }
}

#[tokio::test]
async fn tonics_one_shot_connector_serves_both_transports_under_the_layer() {
    for transport in Transport::BOTH {
        let what = format!("a one-shot connector, {transport}");
        let (seer, mut sightings) = Seer::new(Answer::Echo);
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(
            Server::builder()
                .layer(ServerDeadlineLayer::new())
                .add_service(ProbeServer::new(seer))
                .serve_with_incoming(tokio_stream::once(Ok::<_, std::io::Error>(server_io))),
        );
        // tonic's own pattern (its mock example): the one stream, handed out
        // once by a connector that cannot be cloned.
        let mut client_io = Some(client_io);
        let connector = tower::service_fn(move |_: Uri| {
            let io = client_io.take();
            async move {
                io.map(TokioIo::new)
                    .ok_or_else(|| std::io::Error::other("the one stream was taken"))
            }
        });
        let mut client: Client = connected_through!(transport, connector);
        assert_call_keeps_the_budget(&mut client, &mut sightings, &what).await;
        assert_expired_call_answers_deadline_exceeded(&mut client, &what).await;
        // The stream reset at the deadline leaves the one connection usable.
        assert_call_keeps_the_budget(&mut client, &mut sightings, &what).await;
    }
}
