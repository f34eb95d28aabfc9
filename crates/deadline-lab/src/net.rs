//! Serving and connecting on loopback.

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::Routes;
use tonic::transport::{Channel, Endpoint, Server};
use tonic_deadline::client::ClientDeadline;
use tonic_deadline::{ClientDeadlineLayer, ServerDeadlineLayer};

/// A channel whose calls carry and obey the current scope.
pub type Layered = ClientDeadline<Channel>;

/// Binds `addr` (port 0 picks a free one) and serves `routes` there in the
/// background, behind `layer` when given (plain tonic otherwise).
pub async fn serve(
    addr: &str,
    routes: Routes,
    layer: Option<ServerDeadlineLayer>,
) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let incoming = TcpListenerStream::new(listener).map(|conn| {
        conn.inspect(|stream| {
            let _ = stream.set_nodelay(true);
        })
    });
    match layer {
        Some(layer) => {
            let server = Server::builder().layer(layer).add_routes(routes);
            tokio::spawn(server.serve_with_incoming(incoming));
        }
        None => {
            let server = Server::builder().add_routes(routes);
            tokio::spawn(server.serve_with_incoming(incoming));
        }
    }
    Ok(bound)
}

/// An open channel to `addr` (the connection is made before returning).
pub async fn connect(addr: SocketAddr) -> anyhow::Result<Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect()
        .await?;
    Ok(channel)
}

/// A channel to `addr` that connects on first use.
pub fn connect_lazy(addr: SocketAddr) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect_lazy())
}

/// Wraps a channel in our client layer.
pub fn layered(channel: Channel) -> Layered {
    tower::ServiceBuilder::new()
        .layer(ClientDeadlineLayer::new())
        .service(channel)
}
