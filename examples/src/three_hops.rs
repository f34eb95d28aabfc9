//! The quick start: three services A → B → C on loopback, each behind
//! `ServerDeadlineLayer`, each calling the next through `ClientDeadlineLayer`.
//! The client gives A one second; every hop spends 100 ms and calls on, and
//! no handler passes a deadline by hand.
//!
//! ```text
//! cargo run -p tonic-deadline-examples --example three-hops
//! ```

use std::time::Duration;

use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status};
use tonic_deadline::client::{ClientDeadline, ReadyChannel};
use tonic_deadline::{ClientDeadlineLayer, Scope, ServerDeadlineLayer};
use tonic_deadline_examples::chain::hop_client::HopClient;
use tonic_deadline_examples::chain::hop_server::{Hop, HopServer};
use tonic_deadline_examples::chain::{CallReply, CallRequest, Seen};
use tonic_deadline_examples::{loopback, ms};

const BUDGET: Duration = Duration::from_secs(1);
const WORK: Duration = Duration::from_millis(100);

/// A client whose calls carry what is left of the current scope.
type Client = HopClient<ClientDeadline<ReadyChannel>>;

struct Node {
    name: &'static str,
    next: Option<Client>,
}

#[tonic::async_trait]
impl Hop for Node {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        // The server layer installed the request's scope: its deadline came
        // from the caller's grpc-timeout.
        let remaining = Scope::current().remaining().unwrap_or(Duration::MAX);
        let grpc_timeout = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|value| value.to_str().ok())
            .unwrap_or("(none)")
            .to_owned();
        let mut seen = vec![Seen {
            hop: self.name.to_owned(),
            remaining_us: u64::try_from(remaining.as_micros()).unwrap_or(u64::MAX),
            grpc_timeout,
        }];

        tokio::time::sleep(WORK).await;

        if let Some(next) = &self.next {
            // No deadline passed here: the client layer writes what is left.
            let below = next.clone().call(CallRequest {}).await?.into_inner();
            seen.extend(below.seen);
        }
        Ok(Response::new(CallReply { seen }))
    }
}

/// Serves `node` on a free loopback port behind the server layer and returns
/// a layered client for it.
async fn start(node: Node) -> Result<Client, Box<dyn std::error::Error>> {
    let (addr, incoming) = loopback().await?;
    let server = Server::builder()
        .layer(ServerDeadlineLayer::new().max_timeout(Duration::from_secs(30)))
        .add_service(HopServer::new(node));
    // The server belongs to no request: `detach` says so.
    tonic_deadline::detach(server.serve_with_incoming(incoming));

    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?;
    // Ready only once connected, so the budget on the wire counts the connect.
    let channel = ReadyChannel::connect(&endpoint).await?;
    let channel = tower::ServiceBuilder::new()
        .layer(ClientDeadlineLayer::new())
        .service(channel);
    Ok(HopClient::new(channel))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let c = start(Node {
        name: "C",
        next: None,
    })
    .await?;
    let b = start(Node {
        name: "B",
        next: Some(c),
    })
    .await?;
    let mut a = start(Node {
        name: "A",
        next: Some(b),
    })
    .await?;

    println!(
        "client → A → B → C on 127.0.0.1, a budget of {} and {} of work per hop\n",
        ms(BUDGET),
        ms(WORK)
    );
    let scope = Scope::background().with_timeout(BUDGET);
    let reply = scope.enter(a.call(CallRequest {})).await?.into_inner();

    println!("hop  budget on entry  grpc-timeout received");
    for seen in &reply.seen {
        let remaining = Duration::from_micros(seen.remaining_us);
        println!(
            "{:<4} {:>15}  {}",
            seen.hop,
            ms(remaining),
            seen.grpc_timeout
        );
    }

    // What the quick start promises, checked: every hop got what the one
    // before it had left after its work (never more), and still had time.
    let budgets: Vec<Duration> = reply
        .seen
        .iter()
        .map(|seen| Duration::from_micros(seen.remaining_us))
        .collect();
    if budgets.len() != 3 {
        return Err(format!("expected A, B and C to answer, got {:?}", reply.seen).into());
    }
    for pair in budgets.windows(2) {
        let (before, after) = (pair[0], pair[1]);
        // One microsecond of slack: grpc-timeout is rounded up to its unit.
        if after + WORK > before + Duration::from_micros(1) || after.is_zero() {
            return Err(format!(
                "a hop must see what its caller had left after {}: {} then {}",
                ms(WORK),
                ms(before),
                ms(after)
            )
            .into());
        }
    }
    println!(
        "\neach hop saw what its caller had left after its 100 ms of work: the budget propagated"
    );
    Ok(())
}
