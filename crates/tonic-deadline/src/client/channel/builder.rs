//! How a channel is made: the builder, its shortcuts on `ReadyChannel`,
//! and the parts a channel is made of.

use super::*;

/// Builds a [`ReadyChannel`] with options; the shortcuts on `ReadyChannel`
/// build one with none.
///
/// ```no_run
/// use std::time::Duration;
/// use tonic::transport::Endpoint;
/// use tonic_deadline::{ClientDeadlineLayer, client::ReadyChannel};
///
/// # fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let endpoint = Endpoint::from_shared("http://10.0.0.7:50051")?;
/// let channel = ReadyChannel::builder(&endpoint)
///     .measure_round_trip(Duration::from_secs(1))
///     .lazy();
/// // Tell the server half the measured round trip less than what is left.
/// let layer = ClientDeadlineLayer::new().transit_from(channel.round_trip().expect("measured"));
/// # let _ = (layer, channel);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ReadyChannelBuilder {
    pub(super) endpoint: Endpoint,
    pub(super) ping_every: Option<Duration>,
    pub(super) wait_for_ready: bool,
    pub(super) remembered_resets: usize,
    #[cfg(unix)]
    pub(super) unix_socket: Option<std::path::PathBuf>,
}

impl ReadyChannelBuilder {
    /// How many streams it reset each connection remembers, for h2's 1 s;
    /// none ([`REMEMBERED_RESETS`]) by default. It replaces the endpoint's
    /// `http2_max_concurrent_reset_streams`; the channel also replaces the
    /// endpoint's `http2_max_local_error_reset_streams` with no bound.
    ///
    /// Every call that ends before its answer — at its deadline, cancelled —
    /// resets its stream, and the server's answer may still arrive. On a
    /// remembered stream h2 ignores it, but charges each small DATA frame to
    /// the connection's budget for them, for good: under deadline storms a
    /// connection that remembers resets is closed in the end
    /// (`UNAVAILABLE`, naming "too_many_data_frames"). On a forgotten
    /// stream h2 answers with a reset, one small frame back. Remember
    /// streams only for a server that must not see those answers.
    ///
    /// ```no_run
    /// use tonic::transport::Endpoint;
    /// use tonic_deadline::client::ReadyChannel;
    /// let endpoint = Endpoint::from_static("http://127.0.0.1:50051");
    /// // h2's own default.
    /// let channel = ReadyChannel::builder(&endpoint).remembered_resets(50).lazy();
    /// # let _ = channel;
    /// ```
    pub fn remembered_resets(mut self, streams: usize) -> Self {
        self.remembered_resets = streams;
        self
    }

    /// Measures the connection's round trip with an HTTP/2 PING right after
    /// each connect and then every `every`, into the channel's
    /// [`RoundTrip`]. Off by default.
    pub fn measure_round_trip(mut self, every: Duration) -> Self {
        self.ping_every = Some(every);
        self
    }

    /// Every call waits for the channel to connect, bounded by its
    /// deadline, instead of failing at once with `UNAVAILABLE` when a dial
    /// fails: gRPC's wait-for-ready, for code without a service config.
    /// Off by default (fail fast), as in every gRPC stack.
    ///
    /// ```no_run
    /// use tonic::transport::Endpoint;
    /// use tonic_deadline::client::ReadyChannel;
    /// let endpoint = Endpoint::from_static("http://127.0.0.1:50051");
    /// // A server that is still starting: calls wait for it, until their deadline.
    /// let channel = ReadyChannel::builder(&endpoint).wait_for_ready().lazy();
    /// # let _ = channel;
    /// ```
    pub fn wait_for_ready(mut self) -> Self {
        self.wait_for_ready = true;
        self
    }

    /// Connects to the Unix socket at `path` instead of the endpoint's
    /// address; the endpoint's other settings still apply.
    ///
    /// tonic's `Endpoint` made from a `unix:` address keeps the socket's
    /// path to itself (its `uri()` answers the placeholder `http://tonic`),
    /// so the channel must be told the path. A channel given such an
    /// endpoint without it dials nothing: every call fails with
    /// `UNAVAILABLE`, naming this method.
    ///
    /// ```no_run
    /// use tonic::transport::Endpoint;
    /// use tonic_deadline::client::ReadyChannel;
    ///
    /// # fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let endpoint = Endpoint::from_static("unix:/run/app/grpc.sock");
    /// let channel = ReadyChannel::builder(&endpoint)
    ///     .unix_socket("/run/app/grpc.sock")
    ///     .lazy();
    /// # let _ = channel;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(unix)]
    pub fn unix_socket(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.unix_socket = Some(path.into());
        self
    }

    /// The channel, over TCP (or the Unix socket given to
    /// [`unix_socket`](Self::unix_socket)), connecting on first use.
    pub fn lazy(self) -> ReadyChannel {
        match self.transport() {
            Transport::Tcp(tcp) => self.lazy_with_connector(tcp),
            #[cfg(unix)]
            Transport::Unix(unix) => self.lazy_with_connector(unix),
            Transport::UnixPathUnknown(refused) => self.lazy_with_connector(refused),
        }
    }

    /// The channel, over TCP (or the Unix socket given to
    /// [`unix_socket`](Self::unix_socket)), connected before it is
    /// returned.
    ///
    /// # Errors
    ///
    /// When the connection cannot be made.
    pub async fn connect(self) -> Result<ReadyChannel, tonic::transport::Error> {
        match self.transport() {
            Transport::Tcp(tcp) => self.connect_with_connector(tcp).await,
            #[cfg(unix)]
            Transport::Unix(unix) => self.connect_with_connector(unix).await,
            Transport::UnixPathUnknown(refused) => self.connect_with_connector(refused).await,
        }
    }

    /// How [`lazy`](Self::lazy) and [`connect`](Self::connect) reach the
    /// server.
    pub(super) fn transport(&self) -> Transport {
        #[cfg(unix)]
        if let Some(path) = &self.unix_socket {
            return Transport::Unix(UnixConnector(Arc::from(path.as_path())));
        }
        if is_unix_placeholder(self.endpoint.uri()) {
            tracing::warn!("{UNIX_PATH_UNKNOWN}");
            return Transport::UnixPathUnknown(UnixPathUnknown);
        }
        Transport::Tcp(tcp_connector(&self.endpoint))
    }

    /// The channel, through `connector`, connecting on first use.
    pub fn lazy_with_connector<C>(self, connector: C) -> ReadyChannel
    where
        C: Service<Uri> + Send + 'static,
        C::Response: Read + Write + Unpin + Send + 'static,
        C::Future: Send + 'static,
        C::Error: Into<BoxError>,
    {
        let (parts, linked) = self.parts(connector);
        parts.with(self.endpoint().connect_with_connector_lazy(linked))
    }

    /// The channel, through `connector`, connected before it is returned.
    ///
    /// # Errors
    ///
    /// When the connection cannot be made.
    pub async fn connect_with_connector<C>(
        self,
        connector: C,
    ) -> Result<ReadyChannel, tonic::transport::Error>
    where
        C: Service<Uri> + Send + 'static,
        C::Response: Read + Write + Unpin + Send + 'static,
        C::Future: Send + 'static,
        C::Error: Into<BoxError>,
    {
        let (parts, linked) = self.parts(connector);
        Ok(parts.with(self.endpoint().connect_with_connector(linked).await?))
    }

    /// The endpoint as tonic is given it.
    pub(super) fn endpoint(&self) -> Endpoint {
        self.endpoint
            .clone()
            .http2_max_concurrent_reset_streams(self.remembered_resets)
            .http2_max_local_error_reset_streams(None)
    }

    pub(super) fn parts<C>(&self, connector: C) -> (Parts, Linked<C>)
    where
        C: Service<Uri> + Send + 'static,
        C::Response: Read + Write + Unpin + Send + 'static,
        C::Future: Send + 'static,
        C::Error: Into<BoxError>,
    {
        let link = Arc::new(Link::default());
        let streams = Arc::new(Streams::default());
        let round_trip = self.ping_every.map(|every| (RoundTrip::new(), every));
        let dialer = Arc::new(Dialer {
            uri: self.endpoint.uri().clone(),
            connector: Mutex::new(connector),
            link: link.clone(),
            stash: Mutex::new(None),
            round_trip: round_trip.clone(),
            streams: streams.clone(),
        });
        let linked = Linked {
            dialer: dialer.clone(),
        };
        let parts = Parts {
            link,
            dial: dialer,
            round_trip: round_trip.map(|(r, _)| r),
            wait_for_ready: self.wait_for_ready,
            streams,
        };
        (parts, linked)
    }
}

pub(super) struct Parts {
    pub(super) link: Arc<Link>,
    pub(super) dial: Arc<dyn Dial>,
    pub(super) round_trip: Option<RoundTrip>,
    pub(super) wait_for_ready: bool,
    pub(super) streams: Arc<Streams>,
}

impl Parts {
    pub(super) fn with(self, channel: Channel) -> ReadyChannel {
        ReadyChannel {
            channel,
            link: self.link,
            dial: self.dial,
            round_trip: self.round_trip,
            wait_for_ready: self.wait_for_ready,
            streams: self.streams,
            slot: None,
            waiting: None,
        }
    }
}

impl ReadyChannel {
    /// A builder for a channel to `endpoint` with options.
    pub fn builder(endpoint: &Endpoint) -> ReadyChannelBuilder {
        ReadyChannelBuilder {
            endpoint: endpoint.clone(),
            ping_every: None,
            wait_for_ready: false,
            remembered_resets: REMEMBERED_RESETS,
            #[cfg(unix)]
            unix_socket: None,
        }
    }

    /// The connection's measured round trip, when the channel was built to
    /// measure it ([`ReadyChannelBuilder::measure_round_trip`]).
    pub fn round_trip(&self) -> Option<RoundTrip> {
        self.round_trip.clone()
    }

    /// A channel to `endpoint` over TCP (with the endpoint's `tcp_nodelay`,
    /// keepalive and connect timeout) that connects on first use.
    pub fn lazy(endpoint: &Endpoint) -> Self {
        Self::builder(endpoint).lazy()
    }

    /// A channel to `endpoint` over TCP, connected before it is returned.
    ///
    /// # Errors
    ///
    /// When the connection cannot be made.
    pub async fn connect(endpoint: &Endpoint) -> Result<Self, tonic::transport::Error> {
        Self::builder(endpoint).connect().await
    }

    /// A channel that connects through `connector` (a `Service<Uri>` giving
    /// a connected stream, as for tonic's `Endpoint::connect_with_connector`)
    /// on first use. The connector is called once per dial and need not be
    /// `Clone`: tonic's one-shot connectors (a stream made in advance,
    /// handed out once) work as they do with tonic.
    pub fn lazy_with_connector<C>(endpoint: &Endpoint, connector: C) -> Self
    where
        C: Service<Uri> + Send + 'static,
        C::Response: Read + Write + Unpin + Send + 'static,
        C::Future: Send + 'static,
        C::Error: Into<BoxError>,
    {
        Self::builder(endpoint).lazy_with_connector(connector)
    }

    /// A channel that connects through `connector`, connected before it is
    /// returned.
    ///
    /// # Errors
    ///
    /// When the connection cannot be made.
    pub async fn connect_with_connector<C>(
        endpoint: &Endpoint,
        connector: C,
    ) -> Result<Self, tonic::transport::Error>
    where
        C: Service<Uri> + Send + 'static,
        C::Response: Read + Write + Unpin + Send + 'static,
        C::Future: Send + 'static,
        C::Error: Into<BoxError>,
    {
        Self::builder(endpoint)
            .connect_with_connector(connector)
            .await
    }

    /// Whether the channel has a connection now (or one waiting to be used).
    pub fn is_connected(&self) -> bool {
        self.link.ready.load(Ordering::Acquire)
    }

    /// Ready once a connection is in use or a dial has ended (its stream
    /// or its error stashed); starts the dial when none runs.
    pub(super) fn poll_dialled(&self, cx: &mut Context<'_>) -> Poll<()> {
        match self.link.poll_connected(cx) {
            Connected::Yes => Poll::Ready(()),
            Connected::Waiting => Poll::Pending,
            Connected::DialNow => {
                self.dial.clone().start();
                Poll::Pending
            }
        }
    }
}
