//! A query behind a call made through the official `grpc` crate, under
//! grpc-deadline-grpc's interceptor: the budget the interceptor sends
//! becomes the next hop's scope, and the query that hop runs under it
//! stops on the database — at that deadline, or when the caller gives up.
//! No tonic-deadline and no tonic transport in the build
//! (`the_grpc_crate_tests_build_no_tonic_of_their_own` in `tree.rs`).
//!
//! The next hop is in process: the `grpc` crate (0.9) has no public server
//! yet, and a tonic server would bring the stack these tests do without.
//! It does with a call what any stack's server layer does: its scope ends
//! at the deadline the `grpc-timeout` header gives it, or when the
//! caller's stream is dropped (a reset).

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::time::Duration;

use grpc::client::interceptor::InvokeOnceExt;
use grpc::client::{
    CallOptions, InvokeOnce, RecvStream, ResponseStreamItem, SendOptions, SendStream,
};
use grpc::core::{RecvMessage, RequestHeaders, ResponseHeaders, SendMessage, Trailers};
use grpc::{StatusCodeError, StatusError};
use grpc_deadline::{Cause, Code, Scope, timeout_header};
use grpc_deadline_db::Error;
use grpc_deadline_db::sqlite::{SqlitePool, rusqlite};
use grpc_deadline_grpc::{Abandoned, DeadlineInterceptor, code_of};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Counts forever: far more than any budget in these tests.
const ENDLESS: &str =
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";

/// The next hop: a handler that runs [`ENDLESS`] on `pool` under the
/// call's scope, and tells the test how its query ended.
struct Hop {
    pool: SqlitePool,
    ended: oneshot::Sender<Result<i64, Error>>,
}

/// The hop's side of a call: the answer its handler sends, and the scope
/// the hop made for the call, ended as a reset ends it when the caller
/// drops the stream.
struct Answers {
    answers: mpsc::UnboundedReceiver<ResponseStreamItem>,
    scope: Scope,
}

impl Drop for Answers {
    fn drop(&mut self) {
        self.scope.end(Cause::Abandoned);
    }
}

impl RecvStream for Answers {
    async fn recv(&mut self, _: &mut dyn RecvMessage) -> ResponseStreamItem {
        match self.answers.recv().await {
            Some(item) => item,
            None => ResponseStreamItem::StreamClosed,
        }
    }
}

/// The request's half: the hop reads nothing from it.
struct Request;

impl SendStream for Request {
    async fn send(&mut self, _: &dyn SendMessage, _: SendOptions) -> Result<(), ()> {
        Ok(())
    }
}

impl InvokeOnce for Hop {
    type SendStream = Request;
    type RecvStream = Answers;

    async fn invoke_once(self, headers: RequestHeaders, _: CallOptions) -> (Request, Answers) {
        // What a server layer does: the call's scope from its header.
        let budget = headers
            .metadata()
            .get("grpc-timeout")
            .map(|value| timeout_header::decode(value.as_bytes()).expect("a valid grpc-timeout"));
        let scope = Scope::root(budget.map(|budget| Instant::now() + budget));
        let (answer, answers) = mpsc::unbounded_channel();
        let handler = scope.clone();
        tokio::spawn(async move {
            let _ = answer.send(ResponseStreamItem::Headers(ResponseHeaders::new()));
            let counted = async {
                let mut conn = self.pool.acquire(&handler).await?;
                conn.run(|c| c.query_row(ENDLESS, [], |r| r.get::<_, i64>(0)))
                    .await
            }
            .await;
            // The status the hop answers, from the error's own code.
            let status = match &counted {
                Ok(_) => Ok(()),
                Err(err) => Err(StatusError::new(
                    code_of(err.code()).expect("an error is never OK"),
                    err.to_string(),
                )),
            };
            let _ = answer.send(ResponseStreamItem::Trailers(Trailers::new(status)));
            let _ = self.ended.send(counted);
        });
        (Request, Answers { answers, scope })
    }
}

struct Ignore;

impl RecvMessage for Ignore {
    fn decode(&mut self, _: &mut dyn bytes::Buf) -> Result<(), String> {
        Ok(())
    }
}

/// One call to the hop through `interceptor`, made under the current
/// scope: the status its caller reads, and how the hop's query ended.
async fn call_the_hop(
    pool: &SqlitePool,
    interceptor: DeadlineInterceptor,
) -> (
    Result<(), StatusError>,
    oneshot::Receiver<Result<i64, Error>>,
) {
    let (ended, query) = oneshot::channel();
    let hop = Hop {
        pool: pool.clone(),
        ended,
    };
    let headers = RequestHeaders::new().with_method_name("/shop.Orders/Report");
    let (mut send, mut recv) = hop
        .with_interceptor(interceptor)
        .invoke_once(headers, CallOptions::new())
        .await;
    let _ = send
        .send(&Empty, SendOptions::new().with_final_msg(true))
        .await;
    let status = loop {
        match recv.recv(&mut Ignore).await {
            ResponseStreamItem::Trailers(trailers) => break trailers.status().clone(),
            ResponseStreamItem::StreamClosed => panic!("a call must end with trailers"),
            _ => {}
        }
    };
    (status, query)
}

struct Empty;

impl SendMessage for Empty {
    fn encode(&self) -> Result<Box<dyn bytes::Buf + Send + Sync>, String> {
        Ok(Box::new(bytes::Bytes::new()))
    }
}

/// A pool of one connection on a database file.
fn pool_on_file(dir: &Path) -> SqlitePool {
    SqlitePool::open(dir.join("reports.db"), 1).expect("the database file opens")
}

/// How the hop's query ended, within `bound`.
async fn query_ended(
    query: oneshot::Receiver<Result<i64, Error>>,
    bound: Duration,
) -> Result<i64, Error> {
    tokio::time::timeout(bound, query)
        .await
        .expect("the hop's query must stop, not run on")
        .expect("the hop reports its query")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_behind_a_grpc_crate_call_stops_on_the_database_at_the_deadline_the_call_carried() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pool = pool_on_file(dir.path());
    let request = Scope::background().with_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let (status, query) = request
        .enter(call_the_hop(&pool, DeadlineInterceptor::new()))
        .await;
    assert_eq!(
        status
            .expect_err("an endless query cannot answer in time")
            .code(),
        StatusCodeError::DeadlineExceeded,
        "the caller reads DEADLINE_EXCEEDED"
    );
    let err = query_ended(query, Duration::from_secs(2))
        .await
        .expect_err("the hop's query must be stopped");
    assert_eq!(
        err.cause(),
        Some(Cause::DeadlineExceeded),
        "the hop's scope ended at the deadline the interceptor sent"
    );
    assert_eq!(err.code(), Code::DeadlineExceeded);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "stopped near the 300 ms deadline, not when the query ends: {:?}",
        started.elapsed()
    );
    let stats = pool.stats();
    assert_eq!(
        (stats.idle, stats.cancels),
        (1, 1),
        "interrupted on the database, the connection back in the pool: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_behind_a_grpc_crate_call_stops_on_the_database_when_the_caller_gives_up() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pool = pool_on_file(dir.path());
    // No deadline: only the caller's cancel can stop the hop's query. The
    // stand-in resets a dropped stream, as a transport that resets what
    // it drops does.
    let request = Scope::background();
    let canceller = request.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        canceller.cancel();
    });
    let interceptor = DeadlineInterceptor::new().abandoned(Abandoned::Drop);
    let (status, query) = request.enter(call_the_hop(&pool, interceptor)).await;
    assert_eq!(
        status.expect_err("the caller gave up").code(),
        StatusCodeError::Cancelled,
        "the caller reads CANCELLED at once"
    );
    let err = query_ended(query, Duration::from_secs(2))
        .await
        .expect_err("the hop's query must be stopped");
    assert_eq!(
        err.cause(),
        Some(Cause::Abandoned),
        "the hop's scope ended with the reset"
    );
    assert_eq!(err.code(), Code::Cancelled);
    let stats = pool.stats();
    assert_eq!(
        (stats.idle, stats.cancels),
        (1, 1),
        "interrupted on the database, the connection back in the pool: {stats:?}"
    );
    let answer = pool
        .acquire(&Scope::background())
        .await
        .expect("a connection")
        .run(|c: &mut rusqlite::Connection| c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)))
        .await
        .expect("the same connection works at once");
    assert_eq!(answer, 1);
}
