//! One budget across an axum HTTP edge, a tonic service and a sqlx query.
//!
//! ```sh
//! TONIC_DEADLINE_PG_URL=postgresql://postgres@127.0.0.1:5432/postgres \
//!   cargo run -p tonic-deadline-examples --example beyond_tonic
//! ```
//!
//! The edge gives every request 900 ms (or what the caller's deadline
//! header says, if less); the tonic service it calls sees what is left and
//! runs its query with it; when the budget runs out the edge answers 504 and
//! the query is stopped on the PostgreSQL server.

use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use grpc_deadline_db::sqlx_postgres::SqlxPgPool;
use grpc_deadline_db::sqlx_postgres::sqlx::{self, Row};
use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use testkit::{CallReply, CallRequest, Hop};
use tonic::transport::Server;
use tonic::{Request, Response, Status};
use tonic_deadline::client::{ClientDeadline, ReadyChannel};
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer};

/// The tonic service: a query that takes `work_ms`, under the request's scope.
struct Orders {
    pool: SqlxPgPool,
}

#[tonic::async_trait]
impl testkit::CallOnly for Orders {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        let scope = Scope::current(); // installed by ServerDeadlineLayer
        let entry = scope.remaining();
        let seconds = request.into_inner().work_ms as f64 / 1000.0;
        let mut conn = self.pool.acquire(&scope).await?; // queue time spends the budget
        let rows = conn
            .fetch_all(sqlx::query("SELECT pg_sleep($1)::text").bind(seconds))
            .await?; // stopped on the server when the scope ends
        let _ = rows.first().map(|r| r.try_get::<String, _>(0));
        Ok(Response::new(CallReply {
            hops: vec![Hop {
                service: "orders".into(),
                remaining_us: entry.map_or(-1, |d| d.as_micros() as i64),
                header: String::new(),
                ..Hop::default()
            }],
            payload: String::new(),
        }))
    }
}

type OrdersClient = ProbeClient<ClientDeadline<ReadyChannel>>;

/// The HTTP edge: its scope comes from the layer; the gRPC call carries
/// what is left of it.
async fn order(
    State(mut orders): State<OrdersClient>,
    Path(work_ms): Path<u64>,
) -> Result<String, (StatusCode, String)> {
    let edge = Scope::current().remaining();
    match orders
        .call(CallRequest {
            work_ms,
            ..Default::default()
        })
        .await
    {
        Ok(reply) => Ok(format!(
            "edge had {edge:?}; orders had {} µs on entry",
            reply.into_inner().hops[0].remaining_us
        )),
        // Out of time below is out of time here: a 504, as the layer's own
        // timer answers (orders keeps a little of its budget for its
        // answer, so it usually arrives first). Anything else failed below.
        Err(status) if status.code() == tonic::Code::DeadlineExceeded => Err((
            StatusCode::GATEWAY_TIMEOUT,
            format!("orders: {}", status.message()),
        )),
        Err(status) => Err((
            StatusCode::BAD_GATEWAY,
            format!("orders: {}", status.message()),
        )),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("TONIC_DEADLINE_PG_URL").map_err(
        |_| "set TONIC_DEADLINE_PG_URL to a PostgreSQL server (scripts/postgres starts one)",
    )?;
    let pool = SqlxPgPool::connect(&url, 4)?;

    // The tonic service, behind the gRPC server layer.
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let grpc_addr = grpc.local_addr()?;
    let orders = ProbeServer::new(Orders { pool: pool.clone() });
    // The servers belong to no request.
    tonic_deadline::detach(
        Server::builder()
            .layer(ServerDeadlineLayer::new())
            .add_service(orders)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(grpc)),
    );

    // The axum edge, behind the HTTP server layer; its gRPC client carries
    // the budget.
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{grpc_addr}"))?;
    let channel = ReadyChannel::connect(&endpoint).await?;
    let client = ProbeClient::new(
        tower::ServiceBuilder::new()
            .layer(ClientDeadlineLayer::new())
            .service(channel),
    );
    let app = Router::new()
        .route("/order/{work_ms}", get(order))
        .with_state(client)
        .layer(ServerDeadlineLayer::http().default_timeout(Duration::from_millis(900)));
    let edge = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let edge_addr = edge.local_addr()?;
    tonic_deadline::detach(async move { axum::serve(edge, app).await });

    let http = reqwest::Client::new();
    // 1. A 100 ms query inside Envoy's 500 ms: answered, with what was left.
    let fast = http
        .get(format!("http://{edge_addr}/order/100"))
        .header("x-envoy-expected-rq-timeout-ms", "500")
        .send()
        .await?;
    println!("fast: {} {}", fast.status(), fast.text().await?);

    // 2. A 5 s query: the edge answers 504 at 900 ms, and the query stops on
    //    the server.
    let started = tokio::time::Instant::now();
    let slow = http
        .get(format!("http://{edge_addr}/order/5000"))
        .send()
        .await?;
    let (status, took) = (slow.status(), started.elapsed());
    println!("slow: {status} after {took:?}: {}", slow.text().await?);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut monitor = <sqlx::PgConnection as sqlx::Connection>::connect(&url).await?;
    let active: i64 = sqlx::query(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE 'SELECT pg_sleep($1)%'",
    )
    .fetch_one(&mut monitor)
    .await?
    .try_get(0)?;
    println!(
        "queries still running on the server: {active}; pool: {:?}",
        pool.stats()
    );
    if status != reqwest::StatusCode::GATEWAY_TIMEOUT
        || took > Duration::from_secs(2)
        || active != 0
    {
        return Err(
            "the edge must answer 504 at its deadline and the query stop on the server".into(),
        );
    }
    Ok(())
}
