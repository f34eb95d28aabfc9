//! Transit compensation from a measured round trip, on real sockets: a
//! proxy delays both directions by 40 ms; the channel measures the round
//! trip with HTTP/2 PINGs, and the server is told what the client really
//! has on arrival.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{Events, Node, loopback, serve};
use testkit::CallRequest;
use testkit::probe_client::ProbeClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::Endpoint;
use tonic_deadline::client::{ClientDeadline, ReadyChannel};
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer};
use tower::Layer;

const ONE_WAY: Duration = Duration::from_millis(40);

/// Forwards bytes from `from` to `to`, each chunk `delay` after it arrived.
async fn delayed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
    });
    let mut buf = vec![0; 16 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0
            || tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
        {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// A TCP proxy to `upstream` delaying both directions by `delay`.
async fn delaying_proxy(upstream: SocketAddr, delay: Duration) -> SocketAddr {
    let (listener, addr) = loopback().await;
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(upstream).await else {
                continue;
            };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::spawn(delayed(client_read, server_write, delay));
            tokio::spawn(delayed(server_read, client_write, delay));
        }
    });
    addr
}

/// How much later than the client's the server's deadline was, for one
/// call with a 1 s budget.
async fn excess(
    client: &mut ProbeClient<ClientDeadline<ReadyChannel>>,
    events: &mut Events,
) -> Duration {
    let scope = Scope::background().with_timeout(Duration::from_secs(1));
    let client_deadline = scope.deadline().expect("a budget is a deadline");
    scope
        .enter(client.call(CallRequest::default()))
        .await
        .expect("a 1 s budget covers two 40 ms trips");
    let node = events.entered("B").await;
    let deadline = node.deadline().expect("the node must get a deadline");
    if deadline >= client_deadline {
        deadline - client_deadline
    } else {
        Duration::ZERO
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measured_round_trip_compensates_the_transit_the_header_cannot_see() {
    let (mut events, tx) = Events::new();
    let node = serve(
        ServerDeadlineLayer::new().reply_reserve(Duration::ZERO),
        Node::new("B", &tx),
    )
    .await;
    let proxy = delaying_proxy(node, ONE_WAY).await;
    let endpoint = Endpoint::from_shared(format!("http://{proxy}"))
        .expect("uri")
        .tcp_nodelay(true);

    // PINGs every 25 ms: the estimate is the least of the last eight
    // samples, which leaves out the queueing a busy core adds to some.
    let channel = ReadyChannel::builder(&endpoint)
        .measure_round_trip(Duration::from_millis(25))
        .connect()
        .await
        .expect("the proxy must accept a connection");
    let round_trip = channel.round_trip().expect("the channel measures");
    let mut compensated = ProbeClient::new(
        ClientDeadlineLayer::new()
            .transit_from(round_trip.clone())
            .layer(channel),
    );
    let mut plain = ProbeClient::new(
        ClientDeadlineLayer::new().layer(ReadyChannel::connect(&endpoint).await.expect("connect")),
    );

    // Warm both connections, and let a window of PINGs come back: a PING
    // goes out between the connection's own frames, so calls carry them
    // (bounded: a few calls on an idle machine).
    let _ = excess(&mut plain, &mut events).await;
    let waited = Instant::now();
    while round_trip.samples() < 8 && waited.elapsed() < Duration::from_secs(10) {
        let _ = excess(&mut compensated, &mut events).await;
    }
    assert!(
        round_trip.samples() >= 8,
        "a window of PINGs must come back within 10 s of calls ({} did)",
        round_trip.samples()
    );
    let measured = round_trip.estimate().expect("PINGs came back");
    assert!(
        measured >= 2 * ONE_WAY && measured < 2 * ONE_WAY + Duration::from_millis(30),
        "the PING round trip must be the path's: {measured:?} (the least of eight)"
    );

    // Each side's median of five calls: one call's transit can wait for a
    // busy core; the server's belief is what the median shows.
    let mut without = Vec::new();
    let mut with = Vec::new();
    for _ in 0..5 {
        without.push(excess(&mut plain, &mut events).await);
        with.push(excess(&mut compensated, &mut events).await);
    }
    without.sort();
    with.sort();
    let (without, with) = (without[2], with[2]);
    assert!(
        without >= ONE_WAY - Duration::from_millis(2),
        "uncompensated, the server believes it has the transit more ({without:?})"
    );
    assert!(
        with < Duration::from_millis(10),
        "compensated, the server's deadline must be the client's (+{with:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measuring_round_trips_does_not_disturb_long_calls_and_streams() {
    // Many PINGs (every 5 ms) between the frames of calls in flight: every
    // call must still succeed and h2 must see no stray PING ACK.
    let (mut events, tx) = Events::new();
    let node = serve(
        ServerDeadlineLayer::new().reply_reserve(Duration::ZERO),
        Node::new("B", &tx),
    )
    .await;
    let endpoint = Endpoint::from_shared(format!("http://{node}")).expect("uri");
    let channel = ReadyChannel::builder(&endpoint)
        .measure_round_trip(Duration::from_millis(5))
        .connect()
        .await
        .expect("connect");
    let round_trip = channel.round_trip().expect("the channel measures");
    let client = ProbeClient::new(ClientDeadlineLayer::new().layer(channel));
    let payload = "x".repeat(200_000);
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let mut client = client.clone();
        let payload = payload.clone();
        calls.spawn(async move {
            Scope::background()
                .with_timeout(Duration::from_secs(10))
                .enter(client.call(CallRequest {
                    work_ms: 20,
                    payload,
                    ..CallRequest::default()
                }))
                .await
                .map(|r| r.into_inner().payload.len())
        });
    }
    while let Some(done) = calls.join_next().await {
        let len = done
            .expect("no panic")
            .expect("every call must succeed with PINGs between its frames");
        assert_eq!(len, 200_000, "and its 200 kB reply must arrive whole");
    }
    let _ = events.received();
    assert!(round_trip.samples() >= 1, "and PINGs came back meanwhile");
}
