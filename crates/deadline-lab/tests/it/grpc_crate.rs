//! `experiment grpc-crate`: the official grpc crate alone keeps no
//! deadline; under our interceptor it sends the budget, stops the server's
//! work at the deadline, and carries the chain's budget as tonic does —
//! and says so where the crate's transport keeps it from carrying a
//! cancel, which over tonic's transport (`TonicInvoke`) it carries.

use std::time::Duration;

use deadline_lab::experiments::grpc_crate::{self, CASES, CLIENTS, GrpcCrate, Row};
use tonic_deadline::timeout_header::decode;

use crate::common::alone_async;

fn row<'a>(result: &'a GrpcCrate, client: &str, case: usize) -> &'a Row {
    result
        .rows
        .iter()
        .find(|r| r.client == client && r.case == CASES[case])
        .unwrap_or_else(|| panic!("a row for {client} in {:?} must be there", CASES[case]))
}

/// The clients under our deadlines: the crate under the interceptor over
/// its own transport and over tonic's, and tonic with our layers.
const OURS: [&str; 3] = [
    "grpc + ours",
    "grpc + ours (tonic transport)",
    "tonic + ours",
];

fn budgets(row: &Row) -> Vec<Option<f64>> {
    row.remaining_ms_on_entry
        .clone()
        .expect("a chain row must give the budgets on entry")
}

#[tokio::test]
async fn the_interceptor_sends_the_budget_stops_the_work_and_keeps_the_chain() {
    let _alone = alone_async().await;
    let result = grpc_crate::measure()
        .await
        .expect("the experiment must run");

    // The crate alone: nothing on the wire, the call outlives its deadline
    // by the server's whole work, which runs to its end.
    let alone = row(&result, "grpc", 0);
    assert_eq!(
        alone.grpc_timeout_on_wire, None,
        "grpc 0.9 sends no grpc-timeout"
    );
    assert_eq!(alone.status, "OK");
    assert!(
        alone.elapsed_ms >= 2000.0,
        "it waits for the server: {alone:?}"
    );
    assert!(!alone.server_work_stopped);

    // Under the interceptor, over either transport, as tonic with our
    // layers.
    for client in OURS {
        let ours = row(&result, client, 0);
        let header = ours
            .grpc_timeout_on_wire
            .as_deref()
            .unwrap_or_else(|| panic!("{client} must send grpc-timeout"));
        let sent = decode(header.as_bytes()).expect("the header must be valid");
        assert!(
            sent <= Duration::from_millis(500) && sent > Duration::from_millis(300),
            "{client}: the header is what is left of 500 ms: {header}"
        );
        assert_eq!(ours.status, "DEADLINE_EXCEEDED", "{client}");
        // The server's layer answers its reply reserve before the
        // deadline (with the ledger), so its answer may come first.
        let reserve = tonic_deadline::server::default_reply_reserve(Duration::from_millis(500));
        assert!(
            ours.elapsed_ms >= 500.0 - reserve.as_secs_f64() * 1e3 && ours.elapsed_ms < 1500.0,
            "{client}: the call ends at the deadline, not with the server: {ours:?}"
        );
        assert!(
            ours.server_work_stopped,
            "{client}: the server's work must stop"
        );
    }

    // The chain: the budget decreases by about each hop's 100 ms through
    // calls made by the crate under the interceptor, as through tonic's.
    for client in OURS {
        let chain = row(&result, client, 1);
        assert_eq!(chain.status, "OK", "{client}");
        let hops: Vec<f64> = budgets(chain)
            .into_iter()
            .map(|b| b.unwrap_or_else(|| panic!("{client}: every hop must have a budget")))
            .collect();
        assert!(hops[0] <= 1000.0 && hops[0] > 800.0, "{client}: A {hops:?}");
        for pair in hops.windows(2) {
            let spent = pair[0] - pair[1];
            assert!(
                (100.0..400.0).contains(&spent),
                "{client}: each hop spends its 100 ms and little more: {hops:?}"
            );
        }
        assert!(
            chain.grpc_timeout_on_wire.is_some(),
            "{client}: C got a header"
        );
    }
    // Over the crate's own transport (no TCP_NODELAY) each hop's first
    // DATA waits for the server's delayed ACK of its HEADERS (40 ms on
    // Linux) on a connection that answered quickly before: C is handed
    // less than over tonic's transport, by about 40 ms a hop.
    let on_entry_at_c = |client: &str| {
        budgets(row(&result, client, 1))[2]
            .unwrap_or_else(|| panic!("{client}: C must have a budget"))
    };
    let (crates, tonics) = (
        on_entry_at_c("grpc + ours"),
        on_entry_at_c("grpc + ours (tonic transport)"),
    );
    assert!(
        crates + 40.0 < tonics,
        "the crate's transport must lose its delayed ACKs on the way to C: {crates} ms \
         there, {tonics} ms over tonic's transport"
    );
    let broken = budgets(row(&result, "grpc", 1));
    assert!(broken[0].is_some(), "A is called by tonic with our layer");
    assert_eq!(
        broken[1..],
        [None, None],
        "the crate alone carries no budget on"
    );

    // A cancel at the root stops C through tonic's calls at once, and
    // through the crate's calls over tonic's transport. Through the
    // crate's own transport it cannot (grpc 0.9 resets a call's stream
    // only once the server's response headers came): C runs on, and the
    // interceptor says so rather than nothing.
    for client in ["grpc + ours (tonic transport)", "tonic + ours"] {
        let stopped = row(&result, client, 2);
        assert!(stopped.server_work_stopped, "{client}: C must stop");
        assert!(
            stopped
                .stopped_after_cancel_ms
                .is_some_and(|ms| ms < 1000.0),
            "{client}: C stops soon after the cancel: {stopped:?}"
        );
    }
    for client in ["grpc", "grpc + ours", "grpc + ours (tonic transport)"] {
        assert_eq!(row(&result, client, 2).status, "CANCELLED", "{client}");
    }
    if !row(&result, "grpc + ours", 2).server_work_stopped {
        assert!(
            result.cancels_not_reset >= 1,
            "a cancel the server was not told of must be counted"
        );
    }
}

#[test]
fn the_json_rows_keep_their_contract() {
    let row = Row {
        client: CLIENTS[1].to_owned(),
        case: CASES[1].to_owned(),
        grpc_timeout_on_wire: Some("797031u".to_owned()),
        status: "OK".to_owned(),
        elapsed_ms: 317.0,
        server_work_stopped: false,
        remaining_ms_on_entry: Some(vec![Some(999.8), Some(897.7), None]),
        stopped_after_cancel_ms: None,
    };
    let json = serde_json::to_value(GrpcCrate {
        rows: vec![row],
        cancels_not_reset: 0,
    })
    .expect("the result serialises");
    let row = &json["rows"][0];
    for key in [
        "client",
        "case",
        "grpc_timeout_on_wire",
        "status",
        "elapsed_ms",
        "server_work_stopped",
        "remaining_ms_on_entry",
    ] {
        assert!(row.get(key).is_some(), "every row must have {key}");
    }
    assert_eq!(row["remaining_ms_on_entry"][2], serde_json::Value::Null);
    assert_eq!(
        CLIENTS,
        [
            "grpc",
            "grpc + ours",
            "grpc + ours (tonic transport)",
            "tonic + ours"
        ]
    );
    assert_eq!(
        CASES,
        [
            "server works 2 s, deadline 500 ms",
            "chain A → B → C",
            "cancel at the root"
        ]
    );
}

/// What the client sent to reset a stream, seen through the capture proxy.
fn client_resets(capture: &deadline_lab::capture::Capture) -> usize {
    use deadline_lab::capture::Direction;
    capture
        .records()
        .iter()
        .filter(|r| {
            r.direction == Direction::ClientToServer
                && r.frame.kind == tonic_deadline_guard::frames::RST_STREAM
        })
        .count()
}

/// Which transport the crate's calls go over.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Transport {
    /// The crate's own channel.
    Crates,
    /// tonic's, through `TonicInvoke`.
    Tonic,
}

/// One call of the grpc crate under the interceptor over `transport`,
/// cancelled by its scope once `wait_for` items came back; then how many
/// RST_STREAM the client sent within 300 ms.
async fn cancelled_call(
    transport: Transport,
    method: &str,
    request: testkit::CallRequest,
    wait_for: usize,
) -> (usize, u64) {
    use grpc::client::interceptor::InvokeExt;
    use grpc::client::{
        CallOptions, Channel, ChannelOptions, DynInvoke, RecvStream, SendOptions, SendStream,
    };
    use grpc::core::{RecvMessage, RequestHeaders, SendMessage};
    use prost::Message as _;

    struct Encoded(bytes::Bytes);
    impl SendMessage for Encoded {
        fn encode(&self) -> Result<Box<dyn bytes::Buf + Send + Sync>, String> {
            Ok(Box::new(self.0.clone()))
        }
    }
    struct Ignore;
    impl RecvMessage for Ignore {
        fn decode(&mut self, _: &mut dyn bytes::Buf) -> Result<(), String> {
            Ok(())
        }
    }

    let (server, _) = deadline_lab::systems::chain::start_hop(
        "C",
        "127.0.0.1:0",
        deadline_lab::systems::chain::Plan {
            work: Duration::from_secs(2),
            ..Default::default()
        },
        None,
        deadline_lab::net::Transit::Ignored,
        false,
        deadline_lab::systems::chain::EXACT,
    )
    .await
    .expect("the server starts");
    let capture = deadline_lab::capture::Capture::start(server)
        .await
        .expect("the capture proxy starts");
    let interceptor = match transport {
        Transport::Crates => grpc_deadline_grpc::DeadlineInterceptor::new(),
        Transport::Tonic => grpc_deadline_grpc::DeadlineInterceptor::new()
            .abandoned(grpc_deadline_grpc::Abandoned::Drop),
    };
    let scope = tonic_deadline::Scope::background().child();
    let headers = RequestHeaders::new().with_method_name(method);
    // Kept to the end: dropping the crate's channel ends its calls.
    let invoke: Box<dyn DynInvoke> = match transport {
        Transport::Crates => Box::new(
            Channel::new(
                format!("dns:///{}", capture.addr()),
                std::sync::Arc::new(grpc::credentials::LocalChannelCredentials::new()),
                ChannelOptions::default(),
            )
            .with_interceptor(interceptor.clone()),
        ),
        Transport::Tonic => {
            let endpoint =
                tonic::transport::Endpoint::from_shared(format!("http://{}", capture.addr()))
                    .expect("a valid endpoint");
            Box::new(
                grpc_deadline_grpc::TonicInvoke::lazy(&endpoint)
                    .with_interceptor(interceptor.clone()),
            )
        }
    };
    let (mut send, mut recv) = scope
        .enter(invoke.dyn_invoke(headers, CallOptions::new()))
        .await;
    let message = Encoded(bytes::Bytes::from(request.encode_to_vec()));
    send.send(&message, SendOptions::new().with_final_msg(true))
        .await
        .expect("the request is sent");
    for _ in 0..wait_for {
        recv.recv(&mut Ignore).await;
    }
    // The server is working (or streaming): the root gives up.
    tokio::time::sleep(Duration::from_millis(100)).await;
    scope.cancel();
    let end = recv.recv(&mut Ignore).await;
    let grpc::client::ResponseStreamItem::Trailers(trailers) = end else {
        panic!("a cancelled call must end with trailers: {end:?}");
    };
    assert_eq!(
        trailers.status().as_ref().map_err(|e| e.code()),
        Err(grpc::StatusCodeError::Cancelled),
        "the caller gets CANCELLED at once"
    );
    drop((send, recv));
    tokio::time::sleep(Duration::from_millis(300)).await;
    (
        client_resets(&capture),
        interceptor.stats().cancels_not_reset(),
    )
}

#[tokio::test]
async fn the_crate_resets_a_cancelled_call_only_after_the_response_headers() {
    // A unary call: the server answers only when its 2 s of work are done.
    let (resets, not_reset) = cancelled_call(
        Transport::Crates,
        "/probe.v1.Probe/Call",
        testkit::CallRequest::default(),
        0,
    )
    .await;
    assert_eq!(
        resets, 0,
        "grpc 0.9 holds the stream until the response headers: no reset"
    );
    assert_eq!(not_reset, 1, "and the interceptor says so");
    // A server stream: its headers and first reply came before the cancel.
    let watch = testkit::CallRequest {
        count: 100,
        interval_ms: 20,
        ..testkit::CallRequest::default()
    };
    let (resets, not_reset) =
        cancelled_call(Transport::Crates, "/probe.v1.Probe/Watch", watch, 2).await;
    assert_eq!(
        resets, 1,
        "after the headers, dropping the call resets its stream"
    );
    assert_eq!(not_reset, 0, "nothing to report then");
}

#[tokio::test]
async fn over_tonics_transport_a_cancelled_call_is_reset_before_the_response_headers() {
    let (resets, not_reset) = cancelled_call(
        Transport::Tonic,
        "/probe.v1.Probe/Call",
        testkit::CallRequest::default(),
        0,
    )
    .await;
    assert_eq!(
        resets, 1,
        "TonicInvoke resets the dropped call's stream although no response headers came"
    );
    assert_eq!(
        not_reset, 0,
        "the interceptor, told the transport resets early, reports no cancel as not reset"
    );
}

mod abandoned_upload {
    //! An upload abandoned through the `grpc` crate under our interceptor
    //! never leaves with a normal END_STREAM: a plain tonic server, which
    //! commits at the end of its input, commits nothing.

    #![allow(clippy::disallowed_methods)]

    use std::net::SocketAddr;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::{Buf, Bytes};
    use deadline_lab::capture::{Capture, Direction};
    use grpc::client::interceptor::InvokeExt;
    use grpc::client::{Channel, ChannelOptions, Invoke, RecvStream, SendOptions, SendStream};
    use grpc::core::{RecvMessage, RequestHeaders, SendMessage};
    use grpc::credentials::LocalChannelCredentials;
    use grpc_deadline_grpc::DeadlineInterceptor;
    use prost::Message;
    use testkit::probe_server::{Probe, ProbeServer};
    use testkit::{CallReply, CallRequest};
    use tokio::sync::mpsc;
    use tokio_stream::Stream;
    use tonic::{Request, Response, Status, Streaming};
    use tonic_deadline::Scope;
    use tonic_deadline_guard::frames::{DATA, END_STREAM, HEADERS};

    /// What the upload handler did.
    #[derive(Debug, PartialEq, Eq)]
    enum Seen {
        Received,
        Committed(usize),
        Failed,
    }

    #[derive(Clone)]
    struct Uploads(mpsc::UnboundedSender<Seen>);

    type Replies = Pin<Box<dyn Stream<Item = Result<CallReply, Status>> + Send>>;

    #[tonic::async_trait]
    impl Probe for Uploads {
        async fn call(&self, _: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
            Err(Status::unimplemented("uploads only"))
        }
        type WatchStream = Replies;
        async fn watch(&self, _: Request<CallRequest>) -> Result<Response<Replies>, Status> {
            Err(Status::unimplemented("uploads only"))
        }
        type ChatStream = Replies;
        /// Reads until the end of the input, then commits.
        async fn chat(
            &self,
            request: Request<Streaming<CallRequest>>,
        ) -> Result<Response<Replies>, Status> {
            let mut input = request.into_inner();
            let mut messages = 0;
            loop {
                match input.message().await {
                    Ok(Some(_)) => {
                        messages += 1;
                        let _ = self.0.send(Seen::Received);
                    }
                    Ok(None) => {
                        let _ = self.0.send(Seen::Committed(messages));
                        return Ok(Response::new(Box::pin(tokio_stream::empty())));
                    }
                    Err(status) => {
                        let _ = self.0.send(Seen::Failed);
                        return Err(status);
                    }
                }
            }
        }
    }

    /// Plain tonic: the server a careful user runs, which honours
    /// `grpc-timeout` and reads a normal END_STREAM as the end of input.
    async fn serve_plain() -> (SocketAddr, mpsc::UnboundedReceiver<Seen>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("loopback");
        let addr = listener.local_addr().expect("bound");
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ProbeServer::new(Uploads(tx)))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        (addr, rx)
    }

    struct Encoded(Bytes);

    impl SendMessage for Encoded {
        fn encode(&self) -> Result<Box<dyn Buf + Send + Sync>, String> {
            Ok(Box::new(self.0.clone()))
        }
    }

    struct Ignore;

    impl RecvMessage for Ignore {
        fn decode(&mut self, _: &mut dyn Buf) -> Result<(), String> {
            Ok(())
        }
    }

    /// How the caller goes away after two of its messages.
    #[derive(Debug, Clone, Copy)]
    enum Leave {
        /// Its scope ends, and it reads the call's end.
        Cancel,
        /// It drops the call (a `select!`, a `timeout` around it).
        Drop,
    }

    async fn abandon(leave: Leave) {
        let (server, mut seen) = serve_plain().await;
        let capture = Capture::start(server)
            .await
            .expect("the capture proxy starts");
        let channel = Channel::new(
            format!("dns:///{}", capture.addr()),
            Arc::new(LocalChannelCredentials::new()),
            ChannelOptions::default(),
        );
        let interceptor = DeadlineInterceptor::new();
        let calls = channel.with_interceptor(interceptor.clone());
        // The server ends the call at the deadline it is sent.
        let scope = Scope::background().with_timeout(Duration::from_millis(800));
        let headers = RequestHeaders::new().with_method_name("/probe.v1.Probe/Chat");
        let (mut send, mut recv) = scope
            .enter(calls.invoke(headers, grpc::client::CallOptions::new()))
            .await;
        let message = Encoded(Bytes::from(CallRequest::default().encode_to_vec()));
        for _ in 0..2 {
            send.send(&message, SendOptions::new())
                .await
                .expect("the call takes its messages");
        }
        for _ in 0..2 {
            let got = tokio::time::timeout(Duration::from_secs(10), seen.recv())
                .await
                .expect("the server receives the messages");
            assert_eq!(got, Some(Seen::Received));
        }
        match leave {
            Leave::Cancel => {
                scope.cancel();
                let _ = recv.recv(&mut Ignore).await;
                drop((send, recv));
            }
            Leave::Drop => drop((send, recv)),
        }
        let end = tokio::time::timeout(Duration::from_secs(3), seen.recv()).await;
        // A handler still waiting when the server's timer drops it reports
        // nothing; one that read the end of its input reports a commit.
        let outcome = end.ok().flatten();
        assert_ne!(
            outcome.as_ref().map(|s| matches!(s, Seen::Committed(_))),
            Some(true),
            "{leave:?}: the server must never read the abandoned upload as complete: {outcome:?}"
        );
        // What the client sent on the call's stream: never a normal end.
        let frames = capture.records();
        let ours: Vec<_> = frames
            .iter()
            .filter(|r| r.direction == Direction::ClientToServer && r.frame.stream != 0)
            .collect();
        assert!(
            ours.iter().any(|r| r.frame.kind == HEADERS),
            "the call's HEADERS are on the wire"
        );
        let ended = ours.iter().find(|r| {
            (r.frame.kind == DATA || r.frame.kind == HEADERS) && r.frame.flags & END_STREAM != 0
        });
        assert!(
            ended.is_none(),
            "{leave:?}: no END_STREAM from the client on an abandoned call: {}",
            ended.map(|r| r.line()).unwrap_or_default()
        );
        println!(
            "{leave:?}: client frames on the call's stream: {:?}; server handler: {outcome:?}; \
             cancels_not_reset {}",
            ours.iter().map(|r| r.frame.kind_name()).collect::<Vec<_>>(),
            interceptor.stats().cancels_not_reset()
        );
        assert_eq!(
            interceptor.stats().cancels_not_reset(),
            1,
            "a call the crate could not reset is counted"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_upload_cancelled_through_the_grpc_crate_never_ends_normally_on_the_wire() {
        abandon(Leave::Cancel).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_upload_dropped_through_the_grpc_crate_never_ends_normally_on_the_wire() {
        abandon(Leave::Drop).await;
    }
}
