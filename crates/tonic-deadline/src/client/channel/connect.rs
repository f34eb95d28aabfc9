//! What a channel dials with: TCP as tonic's `Endpoint` sets it, or a Unix
//! socket.

use super::*;

/// What [`ReadyChannelBuilder::lazy`] and [`ReadyChannelBuilder::connect`]
/// dial with.
pub(super) enum Transport {
    Tcp(HttpConnector),
    #[cfg(unix)]
    Unix(UnixConnector),
    UnixPathUnknown(UnixPathUnknown),
}

/// What a channel whose endpoint came from a `unix:` address, with no path
/// given, says: at build time, and as the error of every dial.
pub(super) const UNIX_PATH_UNKNOWN: &str = "ReadyChannel: this tonic Endpoint was made from a `unix:` \
     address, whose socket path tonic keeps to itself (its uri() is the placeholder \
     http://tonic); give the path with ReadyChannelBuilder::unix_socket(path). (A TCP server \
     named `tonic` on port 80: write the port, http://tonic:80.)";

/// Whether `uri` is what tonic's `Endpoint::uri()` answers for an endpoint
/// made from a `unix:` address: `http://tonic`, with no port.
pub(super) fn is_unix_placeholder(uri: &Uri) -> bool {
    uri.scheme_str() == Some("http") && uri.authority().is_some_and(|a| a.as_str() == "tonic")
}

/// Refuses every dial: the socket's path is unknown. Dialling `tonic:80`
/// over TCP instead would fail on DNS, or reach whatever answers there.
#[derive(Debug, Clone, Copy)]
pub(super) struct UnixPathUnknown;

impl Service<Uri> for UnixPathUnknown {
    type Response = hyper_util::rt::TokioIo<tokio::net::TcpStream>;
    type Error = io::Error;
    type Future = std::future::Ready<io::Result<Self::Response>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        std::future::ready(Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            UNIX_PATH_UNKNOWN,
        )))
    }
}

/// Dials a Unix socket.
#[cfg(unix)]
#[derive(Debug, Clone)]
pub(super) struct UnixConnector(pub(super) Arc<std::path::Path>);

#[cfg(unix)]
impl Service<Uri> for UnixConnector {
    type Response = hyper_util::rt::TokioIo<tokio::net::UnixStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move {
            let stream = tokio::net::UnixStream::connect(&*path).await?;
            Ok(hyper_util::rt::TokioIo::new(stream))
        })
    }
}

pub(super) fn tcp_connector(endpoint: &Endpoint) -> HttpConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(endpoint.get_tcp_nodelay());
    http.set_keepalive(endpoint.get_tcp_keepalive());
    http.set_keepalive_interval(endpoint.get_tcp_keepalive_interval());
    http.set_keepalive_retries(endpoint.get_tcp_keepalive_retries());
    http.set_connect_timeout(endpoint.get_connect_timeout());
    http
}
