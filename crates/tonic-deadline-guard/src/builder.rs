//! tonic's `Server` builder as a reset guard gives it: it serves only
//! connections the guard wraps, so that hyper's raised bound never stands
//! alone.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::Stream;
use http::{Request, Response};
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::service::Routes;
use tonic::transport::server::{Connected, Router, TcpIncoming};
use tonic::transport::{Error, Server};
use tower_layer::{Identity, Layer, Stack};
use tower_service::Service;

use crate::connection::Incoming;
use crate::shared::Shared;
#[cfg(feature = "tls")]
use crate::tls::{ServerTls, TlsError, TlsIncoming};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a [`GuardedRouter`] bound to an address could not serve: the address
/// could not be bound, the certificates read, or tonic failed serving (its
/// error is the source).
#[derive(Debug)]
pub struct ServeError {
    source: BoxError,
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the guarded server could not serve: {}", self.source)
    }
}

impl std::error::Error for ServeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

impl From<std::io::Error> for ServeError {
    fn from(error: std::io::Error) -> Self {
        Self {
            source: error.into(),
        }
    }
}

impl From<Error> for ServeError {
    fn from(error: Error) -> Self {
        Self {
            source: error.into(),
        }
    }
}

#[cfg(feature = "tls")]
impl From<TlsError> for ServeError {
    fn from(error: TlsError) -> Self {
        Self {
            source: error.into(),
        }
    }
}

/// tonic's `Server` builder with hyper's guards set for a
/// [`ResetGuard`](crate::ResetGuard) (see
/// [`ResetGuard::builder`](crate::ResetGuard::builder)): it builds as
/// tonic's does (`layer`, `add_service`, and tonic's other settings through
/// [`configure`](Self::configure)), and its router serves only connections
/// the guard wraps — [`ResetGuard::incoming`](crate::ResetGuard::incoming),
/// `incoming_tls`, or an address it binds itself. A server that would serve
/// connections nothing guards, with hyper's own bound raised, cannot be
/// built.
///
/// ```no_run
/// use tonic_deadline_guard::ResetGuard;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let (_, health) = tonic_health::server::health_reporter();
/// ResetGuard::new()
///     .builder()
///     .configure(|server| server.tcp_nodelay(true)) // tonic's own `Server` settings
///     // .layer(tonic_deadline::ServerDeadlineLayer::new()) with tonic-deadline
///     .add_service(health)
///     .serve("127.0.0.1:50051".parse()?)
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct GuardedServer<L = Identity> {
    server: Server<L>,
    shared: Arc<Shared>,
}

impl<L> fmt::Debug for GuardedServer<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedServer").finish_non_exhaustive()
    }
}

impl GuardedServer {
    pub(crate) fn new(server: Server, shared: Arc<Shared>) -> Self {
        Self { server, shared }
    }
}

impl<L> GuardedServer<L> {
    /// tonic's `Server::layer`: a tower layer around every service.
    pub fn layer<NewLayer>(self, layer: NewLayer) -> GuardedServer<Stack<NewLayer, L>> {
        GuardedServer {
            server: self.server.layer(layer),
            shared: self.shared,
        }
    }

    /// tonic's other settings (timeouts, keep-alive, concurrency, frame
    /// sizes…), on the `Server` itself.
    ///
    /// ```
    /// use std::time::Duration;
    /// let builder = tonic_deadline_guard::ResetGuard::new()
    ///     .builder()
    ///     .configure(|server| server.http2_keepalive_interval(Some(Duration::from_secs(30))));
    /// # let _ = builder;
    /// ```
    ///
    /// TLS is the guard's (`ResetGuard::incoming_tls`, or
    /// [`GuardedRouter::serve_tls`]): TLS set here would hide the streams
    /// from the guard, which then refuses every TLS connection.
    pub fn configure(self, configure: impl FnOnce(Server<L>) -> Server<L>) -> Self {
        Self {
            server: configure(self.server),
            shared: self.shared,
        }
    }

    /// tonic's `Server::add_service`: a router with its first service.
    pub fn add_service<S>(mut self, service: S) -> GuardedRouter<L>
    where
        S: Service<Request<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
        L: Clone,
    {
        GuardedRouter {
            router: self.server.add_service(service),
            shared: self.shared,
        }
    }

    /// tonic's `Server::add_optional_service`.
    pub fn add_optional_service<S>(mut self, service: Option<S>) -> GuardedRouter<L>
    where
        S: Service<Request<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
        L: Clone,
    {
        GuardedRouter {
            router: self.server.add_optional_service(service),
            shared: self.shared,
        }
    }

    /// tonic's `Server::add_routes`.
    pub fn add_routes(mut self, routes: Routes) -> GuardedRouter<L>
    where
        L: Clone,
    {
        GuardedRouter {
            router: self.server.add_routes(routes),
            shared: self.shared,
        }
    }
}

/// The router of a [`GuardedServer`]: tonic's `Router`, serving only what
/// its guard wraps.
///
/// ```no_run
/// # async fn run(listener: tokio::net::TcpListener) -> Result<(), tonic::transport::Error> {
/// let (_, health) = tonic_health::server::health_reporter();
/// let guard = tonic_deadline_guard::ResetGuard::new();
/// let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
/// guard.builder().add_service(health).serve_with_incoming(guard.incoming(incoming)).await
/// # }
/// ```
///
/// Connections the guard never wrapped are not served:
///
/// ```compile_fail
/// # async fn run(listener: tokio::net::TcpListener) -> Result<(), tonic::transport::Error> {
/// let (_, health) = tonic_health::server::health_reporter();
/// let guard = tonic_deadline_guard::ResetGuard::new();
/// let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
/// guard.builder().add_service(health).serve_with_incoming(incoming).await
/// # }
/// ```
pub struct GuardedRouter<L = Identity> {
    router: Router<L>,
    shared: Arc<Shared>,
}

impl<L> fmt::Debug for GuardedRouter<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedRouter").finish_non_exhaustive()
    }
}

/// What a [`GuardedRouter`] serves: connections its guard wrapped
/// ([`ResetGuard::incoming`](crate::ResetGuard::incoming), or
/// `ResetGuard::incoming_tls`). Sealed: nothing else is.
pub trait GuardedIncoming: Stream + sealed::Sealed {}

mod sealed {
    pub trait Sealed {}
}

impl<I> sealed::Sealed for Incoming<I> {}
impl<I> GuardedIncoming for Incoming<I> where Self: Stream {}

#[cfg(feature = "tls")]
impl<I, IO> sealed::Sealed for TlsIncoming<I, IO> {}
#[cfg(feature = "tls")]
impl<I, IO> GuardedIncoming for TlsIncoming<I, IO> where Self: Stream {}

impl<L> GuardedRouter<L> {
    /// tonic's `Router::add_service`.
    pub fn add_service<S>(self, service: S) -> Self
    where
        S: Service<Request<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
    {
        Self {
            router: self.router.add_service(service),
            shared: self.shared,
        }
    }

    /// tonic's `Router::add_optional_service`.
    pub fn add_optional_service<S>(self, service: Option<S>) -> Self
    where
        S: Service<Request<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
    {
        Self {
            router: self.router.add_optional_service(service),
            shared: self.shared,
        }
    }

    /// Serves the connections `incoming` brings, each guarded.
    ///
    /// # Errors
    ///
    /// tonic's, when serving fails.
    pub async fn serve_with_incoming<G, IO, IE, ResBody>(self, incoming: G) -> Result<(), Error>
    where
        G: GuardedIncoming<Item = Result<IO, IE>>,
        IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
        IE: Into<BoxError>,
        L: Layer<Routes>,
        L::Service: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
        <L::Service as Service<Request<Body>>>::Future: Send,
        <L::Service as Service<Request<Body>>>::Error: Into<BoxError> + Send,
        ResBody: http_body::Body<Data = Bytes> + Send + 'static,
        ResBody::Error: Into<BoxError>,
    {
        self.router.serve_with_incoming(incoming).await
    }

    /// [`serve_with_incoming`](Self::serve_with_incoming), until `signal`.
    ///
    /// # Errors
    ///
    /// tonic's, when serving fails.
    pub async fn serve_with_incoming_shutdown<G, IO, IE, F, ResBody>(
        self,
        incoming: G,
        signal: F,
    ) -> Result<(), Error>
    where
        G: GuardedIncoming<Item = Result<IO, IE>>,
        IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
        IE: Into<BoxError>,
        F: Future<Output = ()>,
        L: Layer<Routes>,
        L::Service: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
        <L::Service as Service<Request<Body>>>::Future: Send,
        <L::Service as Service<Request<Body>>>::Error: Into<BoxError> + Send,
        ResBody: http_body::Body<Data = Bytes> + Send + 'static,
        ResBody::Error: Into<BoxError>,
    {
        self.router
            .serve_with_incoming_shutdown(incoming, signal)
            .await
    }

    /// Binds `addr` (TCP, no delay) and serves its connections, each
    /// guarded.
    ///
    /// # Errors
    ///
    /// When `addr` cannot be bound, or serving fails.
    pub async fn serve<ResBody>(self, addr: SocketAddr) -> Result<(), ServeError>
    where
        L: Layer<Routes>,
        L::Service: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
        <L::Service as Service<Request<Body>>>::Future: Send,
        <L::Service as Service<Request<Body>>>::Error: Into<BoxError> + Send,
        ResBody: http_body::Body<Data = Bytes> + Send + 'static,
        ResBody::Error: Into<BoxError>,
    {
        let incoming = self.bind(addr)?;
        Ok(self.router.serve_with_incoming(incoming).await?)
    }

    /// [`serve`](Self::serve), until `signal`.
    ///
    /// # Errors
    ///
    /// When `addr` cannot be bound, or serving fails.
    pub async fn serve_with_shutdown<F, ResBody>(
        self,
        addr: SocketAddr,
        signal: F,
    ) -> Result<(), ServeError>
    where
        F: Future<Output = ()>,
        L: Layer<Routes>,
        L::Service: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
        <L::Service as Service<Request<Body>>>::Future: Send,
        <L::Service as Service<Request<Body>>>::Error: Into<BoxError> + Send,
        ResBody: http_body::Body<Data = Bytes> + Send + 'static,
        ResBody::Error: Into<BoxError>,
    {
        let incoming = self.bind(addr)?;
        Ok(self
            .router
            .serve_with_incoming_shutdown(incoming, signal)
            .await?)
    }

    /// Binds `addr` (TCP, no delay) and serves its connections over TLS,
    /// which the guard terminates (see `ResetGuard::incoming_tls`).
    ///
    /// # Errors
    ///
    /// When `addr` cannot be bound, the certificates cannot be read, or
    /// serving fails.
    #[cfg(feature = "tls")]
    pub async fn serve_tls<ResBody>(
        self,
        addr: SocketAddr,
        tls: ServerTls,
    ) -> Result<(), ServeError>
    where
        L: Layer<Routes>,
        L::Service: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
        <L::Service as Service<Request<Body>>>::Future: Send,
        <L::Service as Service<Request<Body>>>::Error: Into<BoxError> + Send,
        ResBody: http_body::Body<Data = Bytes> + Send + 'static,
        ResBody::Error: Into<BoxError>,
    {
        let tcp = TcpIncoming::bind(addr)?.with_nodelay(Some(true));
        let incoming = TlsIncoming::new(tcp, &tls, self.shared.clone())?;
        Ok(self.router.serve_with_incoming(incoming).await?)
    }

    fn bind(&self, addr: SocketAddr) -> std::io::Result<Incoming<TcpIncoming>> {
        let tcp = TcpIncoming::bind(addr)?.with_nodelay(Some(true));
        Ok(Incoming::new(tcp, self.shared.clone()))
    }
}
