//! A service with a database behind it (the `sqlite` feature): the query
//! runs under the request's scope, so when the deadline passes it is stopped
//! *on the database* (`sqlite3_interrupt`), not merely abandoned, and the
//! pool's only connection is back and serves the next call at once.
//!
//! ```text
//! cargo run -p tonic-deadline-examples --example database
//! ```

use std::time::Duration;

use grpc_deadline_db::sqlite::SqlitePool;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status};
use tonic_deadline::client::ReadyChannel;
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer};
use tonic_deadline_examples::store::store_client::StoreClient;
use tonic_deadline_examples::store::store_server::{Store, StoreServer};
use tonic_deadline_examples::store::{CountReply, CountRequest};
use tonic_deadline_examples::{loopback, ms};

/// Counts from 1 to ?1 (with ?1 = 0: forever, far beyond any budget).
const COUNT: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c \
                     WHERE ?1 = 0 OR x < ?1) SELECT count(*) FROM c";
/// How long `main` waits for something that must happen before failing.
const PATIENCE: Duration = Duration::from_secs(10);

/// What the database thread reports when a query returns.
#[derive(Debug)]
struct QueryReturned {
    at: Instant,
    ran_for: Duration,
    outcome: String,
}

struct Counter {
    pool: SqlitePool,
    returned: mpsc::UnboundedSender<QueryReturned>,
}

#[tonic::async_trait]
impl Store for Counter {
    async fn count(&self, request: Request<CountRequest>) -> Result<Response<CountReply>, Status> {
        let up_to = i64::try_from(request.into_inner().up_to)
            .map_err(|_| Status::invalid_argument("up_to is too large"))?;
        let returned = self.returned.clone();
        // The connection is taken under the request's scope, which the
        // server layer installed; an ended scope comes back as
        // DEADLINE_EXCEEDED or CANCELLED through `?`.
        let mut conn = self.pool.acquire(&Scope::current()).await?;
        let count = conn
            .run(move |conn| {
                let started = Instant::now();
                let out = conn.query_row(COUNT, [up_to], |row| row.get::<_, i64>(0));
                let outcome = match &out {
                    Ok(count) => format!("finished: count = {count}"),
                    Err(err) => format!("stopped by the database: {err}"),
                };
                let _ = returned.send(QueryReturned {
                    at: Instant::now(),
                    ran_for: started.elapsed(),
                    outcome,
                });
                out
            })
            .await?;
        Ok(Response::new(CountReply {
            count: u64::try_from(count).unwrap_or_default(),
        }))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // One connection, so the second call can only succeed on the connection
    // the first one was using.
    let pool = SqlitePool::open_in_memory(1)?;
    let (tx, mut returned) = mpsc::unbounded_channel();
    let (addr, incoming) = loopback().await?;
    let server = Server::builder()
        .layer(ServerDeadlineLayer::new())
        .add_service(StoreServer::new(Counter {
            pool: pool.clone(),
            returned: tx,
        }));
    // The server belongs to no request: `detach` says so.
    tonic_deadline::detach(server.serve_with_incoming(incoming));
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?;
    // Ready only once connected, so the budget on the wire counts the connect.
    let channel = ReadyChannel::connect(&endpoint).await?;
    let mut client = StoreClient::new(
        tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new())
            .service(channel),
    );

    // 1. A query that would never end, with 200 ms to answer.
    let budget = Duration::from_millis(200);
    println!(
        "a pool of one SQLite connection; a query without end, budget {}",
        ms(budget)
    );
    let started = Instant::now();
    let scope = Scope::background().with_timeout(budget);
    let answer = scope.enter(client.count(CountRequest { up_to: 0 })).await;
    let code = answer.map_or_else(|status| status.code(), |_| tonic::Code::Ok);
    println!("  client: {code:?} after {}", ms(started.elapsed()));
    if code != tonic::Code::DeadlineExceeded {
        return Err(
            format!("the endless query must end in DEADLINE_EXCEEDED, got {code:?}").into(),
        );
    }
    let report = tokio::time::timeout(PATIENCE, returned.recv())
        .await
        .map_err(|_| "the query must stop on the database, and did not")?
        .ok_or("the server is gone")?;
    println!(
        "  database: the query ran {} and {} ({} after the call began)",
        ms(report.ran_for),
        report.outcome,
        ms(report.at.duration_since(started))
    );
    let back = Instant::now() + PATIENCE;
    while pool.stats().idle < 1 {
        if Instant::now() > back {
            return Err("the interrupted connection must return to the pool".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let stats = pool.stats();
    println!(
        "  pool: {} of {} connection idle again",
        stats.idle, stats.size
    );

    // 2. The next call gets the same, only, connection and completes.
    let started = Instant::now();
    let scope = Scope::background().with_timeout(Duration::from_secs(5));
    let reply = scope
        .enter(client.count(CountRequest { up_to: 10_000 }))
        .await?
        .into_inner();
    let report = returned.recv().await.ok_or("the server is gone")?;
    println!(
        "\nthe next call on that connection: count = {} in {} ({})",
        reply.count,
        ms(started.elapsed()),
        report.outcome
    );
    if reply.count != 10_000 {
        return Err(format!("counting to 10000 must give 10000, got {}", reply.count).into());
    }
    println!(
        "\nthe deadline stopped the query on the database; its connection was reusable at once"
    );
    Ok(())
}
