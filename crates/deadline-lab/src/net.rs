//! Serving and connecting on loopback.

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_stream::Stream;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::Routes;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Server};
use tonic_deadline::client::{ClientDeadline, REMEMBERED_RESETS, ReadyChannel};
use tonic_deadline::server::{LOCAL_ERROR_RESETS, PENDING_ACCEPT_RESETS, ResetGuard};
use tonic_deadline::{ClientDeadlineLayer, ServerDeadlineLayer};

/// A channel whose calls carry and obey the current scope, and whose budget
/// on the wire counts the time spent connecting.
pub type Layered = ClientDeadline<ReadyChannel>;

/// Binds `addr` (port 0 picks a free one) and serves `routes` there in the
/// background, behind `layer` when given (plain tonic otherwise).
///
/// Both have HTTP/2's reset guards set for deadlines: ours with the
/// library's guard (`tonic_deadline::server::ResetGuard`: its builder and
/// its incoming connections), plain tonic with hyper's bound raised by
/// hand to the guard's backstop, as the guide tells a plain tonic user to. Otherwise every load that gives up on calls
/// at a deadline would see the plain server close its connections
/// (`GOAWAY ENHANCE_YOUR_CALM`), and the comparisons would measure h2's
/// guard instead of what they are about.
pub async fn serve(
    addr: &str,
    routes: Routes,
    layer: Option<ServerDeadlineLayer>,
) -> anyhow::Result<SocketAddr> {
    serve_with(addr, routes, layer, Guard::Reset).await
}

/// What guards our server against reset floods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// The library's `ResetGuard`, as the README recommends.
    Reset,
    /// None of ours: hyper's own, raised to the `ResetGuard`'s backstop as
    /// plain tonic's is here. What the benchmarks of the layers' cost
    /// measure, so that the guard's cost (measured on its own) is not
    /// charged to them.
    LayerOnly,
}

/// [`serve`], with our server guarded as `guard` says.
pub async fn serve_with(
    addr: &str,
    routes: Routes,
    layer: Option<ServerDeadlineLayer>,
    guard: Guard,
) -> anyhow::Result<SocketAddr> {
    let (incoming, bound) = bind(addr).await?;
    match (layer.map(crate::metrics::server_layer), guard) {
        (Some(layer), Guard::Reset) => {
            let guard = ResetGuard::new();
            let server = guard.builder().layer(layer).add_routes(routes);
            tonic_deadline::detach(server.serve_with_incoming(guard.incoming(incoming)));
        }
        (Some(layer), Guard::LayerOnly) => {
            let server = Server::builder()
                .http2_max_pending_accept_reset_streams(Some(PENDING_ACCEPT_RESETS))
                .http2_max_local_error_reset_streams(Some(LOCAL_ERROR_RESETS))
                .layer(layer)
                .add_routes(routes);
            tonic_deadline::detach(server.serve_with_incoming(incoming));
        }
        (None, _) => {
            let server = Server::builder()
                .http2_max_pending_accept_reset_streams(Some(PENDING_ACCEPT_RESETS))
                .http2_max_local_error_reset_streams(Some(LOCAL_ERROR_RESETS))
                .add_routes(routes);
            tonic_deadline::detach(server.serve_with_incoming(incoming));
        }
    }
    Ok(bound)
}

/// The connections a lab server accepts, each with `TCP_NODELAY` set (so a
/// reply's latency is the server's, not Nagle's).
///
/// Every server of the lab takes its connections as this one type, and
/// those that stop on a signal stop on [`Stopped`]: tonic's accept loop and
/// its connections' futures are then compiled once for each stack of layers
/// (plain tonic, the layer alone, ours with the reset guard), not once more
/// for each experiment's own closure; each copy is a few thousand lines of
/// machine code the release build optimises.
#[derive(Debug)]
pub struct Incoming(TcpListenerStream);

impl Incoming {
    /// The connections `listener` accepts.
    pub fn new(listener: TcpListener) -> Self {
        Self(TcpListenerStream::new(listener))
    }
}

impl Stream for Incoming {
    type Item = std::io::Result<TcpStream>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.0).poll_next(cx).map(|conn| {
            conn.map(|conn| {
                conn.inspect(|stream| {
                    let _ = stream.set_nodelay(true);
                })
            })
        })
    }
}

/// Binds `addr` (port 0 picks a free one): its connections, and the
/// address bound.
///
/// # Errors
///
/// When `addr` cannot be bound.
pub async fn bind(addr: &str) -> anyhow::Result<(Incoming, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    Ok((Incoming::new(listener), bound))
}

/// The signal a stoppable lab server stops on: fires when its [`Stop`] is
/// used or dropped.
#[derive(Debug)]
pub struct Stopped(oneshot::Receiver<()>);

/// Stops the server whose [`Stopped`] it was made with.
#[derive(Debug)]
pub struct Stop(oneshot::Sender<()>);

impl Stop {
    /// A stop and the signal it fires.
    pub fn new() -> (Self, Stopped) {
        let (stop, stopped) = oneshot::channel();
        (Self(stop), Stopped(stopped))
    }

    /// Fires the signal.
    pub fn stop(self) {
        let _ = self.0.send(());
    }
}

impl Future for Stopped {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx).map(drop)
    }
}

/// The endpoint the lab's clients use for `addr`.
///
/// # Errors
///
/// Never for a socket address; the signature is tonic's.
pub fn endpoint(addr: SocketAddr) -> anyhow::Result<Endpoint> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?.tcp_nodelay(true))
}

/// An open plain tonic channel to `addr` (the connection is made before
/// returning): the baseline the benchmarks compare against.
///
/// It remembers as many reset streams as a `ReadyChannel` does, and lifts
/// h2's bound on answering late frames, set by hand as the guide tells a
/// plain tonic user to: a load generator that gives up on calls at their
/// deadline would otherwise close its own connections (h2:
/// "locally-reset streams reached limit").
pub async fn connect(addr: SocketAddr) -> anyhow::Result<Channel> {
    Ok(endpoint(addr)?
        .http2_max_concurrent_reset_streams(REMEMBERED_RESETS)
        .http2_max_local_error_reset_streams(None)
        .connect()
        .await?)
}

/// A client channel to `addr` through our layer, connected before returning.
pub async fn connect_layered(addr: SocketAddr) -> anyhow::Result<Layered> {
    connect_layered_over(addr, None).await
}

/// [`connect_layered`], over TLS trusting the authority `ca_pem` when
/// given (the server's name: `localhost`).
pub async fn connect_layered_over(
    addr: SocketAddr,
    ca_pem: Option<&str>,
) -> anyhow::Result<Layered> {
    let endpoint = match ca_pem {
        None => endpoint(addr)?,
        Some(ca) => Endpoint::from_shared(format!("https://{addr}"))?
            .http2_max_concurrent_reset_streams(REMEMBERED_RESETS)
            .tls_config(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(ca))
                    .domain_name(testkit::tls::SERVER_NAME),
            )?,
    };
    Ok(layered(ReadyChannel::connect(&endpoint).await?))
}

/// A client channel to `addr` through our layer that connects on first use.
pub fn lazy_layered(addr: SocketAddr) -> anyhow::Result<Layered> {
    Ok(layered(ready_lazy(addr)?))
}

/// A channel to `addr`, ready once connected, that connects on first use.
pub fn ready_lazy(addr: SocketAddr) -> anyhow::Result<ReadyChannel> {
    Ok(ReadyChannel::lazy(&endpoint(addr)?))
}

/// Wraps a channel in our client layer.
pub fn layered(channel: ReadyChannel) -> Layered {
    layered_with(channel, Transit::Ignored)
}

/// How a client channel pays for the trip its requests are about to make.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Transit {
    /// Not at all, as in gRPC: the server starts counting on arrival.
    #[default]
    Ignored,
    /// A fixed allowance deducted from the budget on the wire
    /// ([`ClientDeadlineLayer::transit_allowance`]).
    Allowance(std::time::Duration),
    /// Half the connection's round trip, measured with HTTP/2 PINGs
    /// ([`ClientDeadlineLayer::transit_from`]).
    RoundTrip,
}

/// How often a measuring channel sends its PING.
pub(crate) const PING_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

impl Transit {
    /// The `deadline-lab serve` flags that give a role process this transit
    /// compensation.
    pub fn args(self) -> Vec<String> {
        match self {
            Transit::Ignored => Vec::new(),
            Transit::Allowance(allowance) => vec![
                "--transit-allowance-ms".to_owned(),
                allowance.as_millis().to_string(),
            ],
            Transit::RoundTrip => vec!["--transit-from-round-trip".to_owned()],
        }
    }

    /// From the `serve` flags (no allowance and no round trip: ignored).
    pub fn from_flags(allowance_ms: u64, round_trip: bool) -> Self {
        if round_trip {
            Transit::RoundTrip
        } else if allowance_ms == 0 {
            Transit::Ignored
        } else {
            Transit::Allowance(std::time::Duration::from_millis(allowance_ms))
        }
    }

    /// A channel builder for `endpoint` that measures the round trip when
    /// this compensation needs it.
    pub fn builder(self, endpoint: &Endpoint) -> tonic_deadline::client::ReadyChannelBuilder {
        let builder = ReadyChannel::builder(endpoint);
        match self {
            Transit::RoundTrip => builder.measure_round_trip(PING_EVERY),
            _ => builder,
        }
    }

    fn layer(self, channel: &ReadyChannel) -> ClientDeadlineLayer {
        crate::metrics::client_layer(self.plain_layer(channel))
    }

    fn plain_layer(self, channel: &ReadyChannel) -> ClientDeadlineLayer {
        match (self, channel.round_trip()) {
            (Transit::Allowance(allowance), _) => {
                ClientDeadlineLayer::new().transit_allowance(allowance)
            }
            (Transit::RoundTrip, Some(round_trip)) => {
                ClientDeadlineLayer::new().transit_from(round_trip)
            }
            _ => ClientDeadlineLayer::new(),
        }
    }
}

/// A lazily connecting channel to `addr` with `transit` compensation.
///
/// # Errors
///
/// Never for a socket address; the signature is tonic's.
pub fn lazy_with(addr: SocketAddr, transit: Transit) -> anyhow::Result<Layered> {
    Ok(layered_with(
        transit.builder(&endpoint(addr)?).lazy(),
        transit,
    ))
}

/// A lazily connecting channel to `addr` whose calls open `grpc.client`
/// spans and carry their `traceparent` (the IM system's, for its traces).
///
/// # Errors
///
/// Never for a socket address; the signature is tonic's.
pub fn lazy_traced(addr: SocketAddr, transit: Transit) -> anyhow::Result<Layered> {
    let channel = transit.builder(&endpoint(addr)?).lazy();
    Ok(tower::ServiceBuilder::new()
        .layer(transit.layer(&channel).trace_spans())
        .service(channel))
}

/// A connected channel to `addr` whose calls open `grpc.client` spans.
///
/// # Errors
///
/// When the connection cannot be made.
pub async fn connect_traced(addr: SocketAddr) -> anyhow::Result<Layered> {
    let channel = ReadyChannel::connect(&endpoint(addr)?).await?;
    Ok(tower::ServiceBuilder::new()
        .layer(ClientDeadlineLayer::new().trace_spans())
        .service(channel))
}

/// Wraps a channel in our client layer, with `transit` compensation.
///
/// A [`Transit::RoundTrip`] needs a channel built to measure (see
/// [`Transit::builder`]); over one that does not, nothing is deducted.
pub fn layered_with(channel: ReadyChannel, transit: Transit) -> Layered {
    tower::ServiceBuilder::new()
        .layer(transit.layer(&channel))
        .service(channel)
}
