//! HTTP/2 keep-alive on both ends — the server's
//! `http2_keepalive_interval`/`http2_keepalive_timeout`, the client
//! endpoint's `http2_keep_alive_interval`, `keep_alive_timeout` and
//! `keep_alive_while_idle` — with both layers: PINGs cross the connection
//! both ways while calls, streams and idle spells go on, and the calls keep
//! working, on the one connection, with their budget.

use std::time::Duration;

use testkit::CallRequest;
use testkit::probe_server::ProbeServer;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;
use tonic_deadline::ServerDeadlineLayer;
use tonic_deadline_guard::frames::PING;

use crate::common::frame_counting_proxy;

use super::{
    Answer, BUDGET, Seer, Transport, assert_call_keeps_the_budget,
    assert_expired_call_answers_deadline_exceeded, endpoint, loopback, within,
};

/// How often each end pings: several times in each test's few hundred ms.
const INTERVAL: Duration = Duration::from_millis(40);

/// The PING frame's ACK flag (RFC 9113, section 6.7).
const ACK: u8 = 0x1;

#[tokio::test]
async fn calls_keep_working_across_keep_alive_pings_both_ways() {
    let (seer, mut sightings) = Seer::new(Answer::Echo);
    let (listener, addr) = loopback().await;
    tokio::spawn(
        Server::builder()
            .http2_keepalive_interval(Some(INTERVAL))
            .http2_keepalive_timeout(Some(Duration::from_secs(2)))
            .layer(ServerDeadlineLayer::new())
            .add_service(ProbeServer::new(seer))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    // Through a proxy that logs what the client sends: its own PINGs, and
    // its acknowledgements of the server's.
    let (proxy, log) = frame_counting_proxy(addr).await;
    let endpoint = endpoint(proxy)
        .http2_keep_alive_interval(INTERVAL)
        .keep_alive_timeout(Duration::from_secs(2))
        .keep_alive_while_idle(true);
    for transport in Transport::BOTH {
        let what = format!("keep-alive, {transport}");
        let mut client = transport.client(&endpoint);
        assert_call_keeps_the_budget(&mut client, &mut sightings, &what).await;

        // A stream open across several pings.
        let watch = CallRequest {
            count: 5,
            interval_ms: INTERVAL.as_millis() as u64,
            ..CallRequest::default()
        };
        let replies: Vec<_> = within(BUDGET, async {
            let replies = client.watch(watch).await?.into_inner();
            Ok::<_, tonic::Status>(replies.collect::<Vec<_>>().await)
        })
        .await
        .unwrap_or_else(|status| panic!("{what}: the stream must open, got {status:?}"));
        assert!(
            replies.len() == 5 && replies.iter().all(Result::is_ok),
            "{what}: every reply must arrive across the pings: {replies:?}"
        );
        sightings.next().await.assert_budget(BUDGET, &what);

        // Idle for a few intervals: only pings cross.
        tokio::time::sleep(4 * INTERVAL).await;
        assert_call_keeps_the_budget(&mut client, &mut sightings, &what).await;
        assert_expired_call_answers_deadline_exceeded(&mut client, &what).await;
    }

    let pings: Vec<u8> = log
        .frames()
        .into_iter()
        .filter(|f| f.header.kind == PING)
        .map(|f| f.header.flags)
        .collect();
    assert!(
        pings.iter().any(|flags| flags & ACK == 0),
        "the clients must have pinged the server: {pings:?}"
    );
    assert!(
        pings.iter().any(|flags| flags & ACK != 0),
        "the server must have pinged the clients, who answered: {pings:?}"
    );
    assert_eq!(
        log.connections(),
        Transport::BOTH.len(),
        "each client must have kept its one connection throughout"
    );
}
