//! Outbound HTTP under the current scope: a [`reqwest_middleware`]
//! middleware that bounds every request by the deadline and the
//! cancellation of the request it is made for.
//!
//! What it adds to the core ([`grpc_deadline`]): the scope reaches reqwest.
//! It stands on the core alone, so it works under any stack's server layer
//! that installs a scope (tonic-deadline's `ServerDeadlineLayer`, gRPC or
//! plain HTTP), or under [`Scope::enter`].
//!
//! For each request made under a scope the middleware
//! 1. fails at once, sending nothing, when the scope has already ended;
//! 2. sets reqwest's own timeout to `min(its timeout, remaining budget)`;
//! 3. optionally writes the remaining budget into a header for the
//!    downstream ([`DeadlineMiddleware::propagate_as`]), computed as the
//!    request leaves;
//! 4. races the response head *and its body* against the scope: when the
//!    scope ends the request is dropped (hyper closes or resets it) and the
//!    call fails with [`Ended`] — `Cause::DeadlineExceeded` at the
//!    deadline, a cancel cause on cancellation — recognisable with
//!    [`ended`].
//!
//! Without a current scope requests pass through untouched.
//!
//! How it differs from reqwest's `timeout`: that one is a fixed duration
//! per request and fails with a timeout error; this one follows the request
//! that caused the call, ends with it on cancellation too, and says which.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use grpc_deadline::Scope;
//! use grpc_deadline::deadline_headers::DeadlineHeader;
//! use grpc_deadline_reqwest::{DeadlineMiddleware, ended};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(DeadlineMiddleware::new().propagate_as(DeadlineHeader::GrpcTimeout))
//!     .build();
//! let scope = Scope::background().with_timeout(Duration::from_millis(300));
//! match scope.enter(client.get("http://127.0.0.1:8080/slow").send()).await {
//!     Ok(response) => println!("{}", response.status()),
//!     Err(err) if ended(&err).is_some() => println!("gave up: {err}"),
//!     Err(err) => return Err(err.into()),
//! }
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Extensions;
use http_body::{Body, Frame, SizeHint};
use reqwest::ResponseBuilderExt;
use reqwest_middleware::{Middleware, Next};

use grpc_deadline::deadline_headers::DeadlineHeader;
use grpc_deadline::{Cause, Ended, Scope};

/// The error type that crosses service boundaries (as in tower and tonic).
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `err` and then each error in its source chain.
fn chain<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(err), |&err| err.source())
}

/// Bounds every outbound request by the current scope. See the
/// [module docs](self).
///
/// ```
/// use grpc_deadline::deadline_headers::DeadlineHeader;
/// use grpc_deadline_reqwest::DeadlineMiddleware;
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(DeadlineMiddleware::new().propagate_as(DeadlineHeader::RequestTimeout))
///     .build();
/// # let _ = client;
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct DeadlineMiddleware {
    header: Option<DeadlineHeader>,
}

impl DeadlineMiddleware {
    /// A middleware that writes no header.
    pub const fn new() -> Self {
        Self { header: None }
    }

    /// Also writes the remaining budget into `header` (replacing a value
    /// the caller set), so the downstream can enforce it too. Nothing is
    /// written for a scope without a deadline.
    pub const fn propagate_as(mut self, header: DeadlineHeader) -> Self {
        self.header = Some(header);
        self
    }
}

/// The [`Ended`] behind an error of a request made through
/// [`DeadlineMiddleware`]: the scope ended before the head or while the body
/// was read. `None` for every other failure.
///
/// ```
/// use grpc_deadline_reqwest::ended;
/// let err = reqwest_middleware::Error::middleware(std::io::Error::other("refused"));
/// assert!(ended(&err).is_none());
/// ```
pub fn ended(err: &reqwest_middleware::Error) -> Option<Ended> {
    match err {
        reqwest_middleware::Error::Middleware(err) => err.downcast_ref::<Ended>().copied(),
        reqwest_middleware::Error::Reqwest(err) => ended_in(err),
    }
}

/// The [`Ended`] in the source chain of `err` (reqwest wraps body errors).
pub fn ended_in(err: &(dyn std::error::Error + 'static)) -> Option<Ended> {
    chain(err).find_map(|err| err.downcast_ref::<Ended>().copied())
}

fn fail(cause: Cause) -> reqwest_middleware::Error {
    reqwest_middleware::Error::middleware(Ended::new(cause))
}

#[async_trait::async_trait]
impl Middleware for DeadlineMiddleware {
    async fn handle(
        &self,
        mut request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let Some(scope) = Scope::try_current() else {
            return next.run(request, extensions).await;
        };
        if let Some(cause) = scope.cause() {
            return Err(fail(cause));
        }
        if let Some(left) = scope.remaining() {
            let timeout = request.timeout_mut();
            *timeout = Some(timeout.map_or(left, |t| t.min(left)));
            if let Some(header) = self.header {
                request
                    .headers_mut()
                    .insert(header.name(), header.encode(left));
            }
        }
        let response = tokio::select! {
            biased;
            cause = scope.ended() => return Err(fail(cause)),
            response = next.run(request, extensions) => response?,
        };
        Ok(bound_body(response, scope))
    }
}

/// The same response, its body read under `scope`.
fn bound_body(response: reqwest::Response, scope: Scope) -> reqwest::Response {
    let url = response.url().clone();
    let (parts, body) = http::Response::<reqwest::Body>::from(response).into_parts();
    let mut builder = http::Response::builder()
        .status(parts.status)
        .version(parts.version)
        .url(url);
    if let Some(headers) = builder.headers_mut() {
        *headers = parts.headers;
    }
    if let Some(extensions) = builder.extensions_mut() {
        extensions.extend(parts.extensions);
    }
    let bounded = reqwest::Body::wrap(ScopedBody {
        inner: body,
        ended: Mutex::new(Box::pin(async move { scope.ended().await })),
        done: false,
    });
    reqwest::Response::from(
        builder
            .body(bounded)
            .expect("a response rebuilt from its own valid parts is valid"),
    )
}

type EndedFuture = Pin<Box<dyn Future<Output = Cause> + Send>>;

/// A response body that fails with [`Ended`] once its scope ends.
struct ScopedBody {
    inner: reqwest::Body,
    /// Behind a mutex only to be `Sync`, as reqwest asks of a body; only
    /// ever reached through `&mut`, so never locked.
    ended: Mutex<EndedFuture>,
    done: bool,
}

impl Body for ScopedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let ended = this.ended.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Poll::Ready(cause) = ended.as_mut().poll(cx) {
            this.done = true;
            return Poll::Ready(Some(Err(Box::new(Ended::new(cause)))));
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            this.done = true; // complete: a later end of the scope changes nothing
        }
        polled.map(|frame| frame.map(|frame| frame.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
