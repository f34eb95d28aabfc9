//! Shared pieces of the guard's tests: a probe service, plain tonic clients
//! on loopback, an observer that counts what the guard reports, and the
//! guard's logs captured.

// Servers, floods and storms belong to no request.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use testkit::probe_client::ProbeClient;
use testkit::probe_server::ProbeServer;
use testkit::{CallOnly, CallReply, CallRequest};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};
use tonic_deadline_guard::{Observer, ResetGuard};

/// How long a test waits for something that must happen. Generous: the
/// machines are shared and slow; a pass is usually milliseconds.
pub(crate) const PATIENCE: Duration = Duration::from_secs(10);

/// A plain tonic probe client.
pub(crate) type Client = ProbeClient<Channel>;

/// The error code of a GOAWAY that closes a connection for a flood.
pub(crate) const ENHANCE_YOUR_CALM: u32 = 11;

/// The error code of a RST_STREAM that cancels a call.
pub(crate) const CANCEL: u32 = 8;

/// The path the floods open their streams on.
pub(crate) const CALL: &str = "/probe.v1.Probe/Call";

/// Held by the tests that flood or storm a server: each takes the machine's
/// two cores for a moment, and would otherwise be measured in the other's
/// load.
pub(crate) static MACHINE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A probe that answers every `Call` at once with an empty reply.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Answerer;

#[tonic::async_trait]
impl CallOnly for Answerer {
    async fn call(&self, _: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        Ok(Response::new(CallReply::default()))
    }
}

/// What a guard reported, counted.
#[derive(Debug, Clone, Default)]
pub(crate) struct Counts(Arc<Counters>);

#[derive(Debug, Default)]
pub(crate) struct Counters {
    cut: AtomicU64,
    unguarded: AtomicU64,
    held: AtomicU64,
    refused: AtomicU64,
}

impl Counts {
    /// Connections closed for a reset flood.
    pub(crate) fn reset_floods_cut(&self) -> u64 {
        self.0.cut.load(Ordering::SeqCst)
    }

    /// Connections on probation held unread before their cut.
    pub(crate) fn connections_held(&self) -> u64 {
        self.0.held.load(Ordering::SeqCst)
    }

    /// Connections on probation cut off at once.
    pub(crate) fn connections_refused(&self) -> u64 {
        self.0.refused.load(Ordering::SeqCst)
    }
}

impl Observer for Counts {
    fn reset_flood_cut(&self) {
        self.0.cut.fetch_add(1, Ordering::SeqCst);
    }

    fn unguarded(&self) {
        self.0.unguarded.fetch_add(1, Ordering::SeqCst);
    }

    fn connection_held(&self) {
        self.0.held.fetch_add(1, Ordering::SeqCst);
    }

    fn connection_refused(&self) {
        self.0.refused.fetch_add(1, Ordering::SeqCst);
    }
}

/// A listener on a free loopback port.
pub(crate) async fn loopback() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("loopback must accept a listener");
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    (listener, addr)
}

/// A server on `listener` with `guard`, as the README serves.
pub(crate) fn serve_with(
    guard: ResetGuard,
    listener: TcpListener,
) -> impl Future<Output = Result<(), tonic::transport::Error>> + use<> {
    guard
        .builder()
        .add_service(ProbeServer::new(Answerer))
        .serve_with_incoming(guard.incoming(TcpListenerStream::new(listener)))
}

/// A server on `listener` with a guard that reports to `counts`.
pub(crate) fn serve_guarded(
    listener: TcpListener,
    counts: &Counts,
) -> impl Future<Output = Result<(), tonic::transport::Error>> + use<> {
    serve_with(ResetGuard::new().observed_by(counts.clone()), listener)
}

/// A plain tonic client connected to `addr`.
pub(crate) async fn connect(addr: SocketAddr) -> Client {
    ProbeClient::new(
        Endpoint::from_shared(format!("http://{addr}"))
            .expect("a loopback address is a valid URI")
            .connect()
            .await
            .expect("the test server must accept a connection"),
    )
}

/// One call with a 5 s budget (on the wire, and enforced here); how long
/// it took.
pub(crate) async fn timed_call(client: &mut Client) -> Duration {
    const BUDGET: Duration = Duration::from_secs(5);
    let started = Instant::now();
    let mut request = Request::new(CallRequest::default());
    request.set_timeout(BUDGET);
    tokio::time::timeout(BUDGET, client.call(request))
        .await
        .map_err(|_| Status::deadline_exceeded("5 s"))
        .and_then(|answer| answer)
        .expect("an honest call is answered");
    started.elapsed()
}
