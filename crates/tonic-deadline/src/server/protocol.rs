//! What a server layer speaks: where a request's deadline comes from and
//! how the layer answers for a handler. Everything else — the caps, the
//! timer, the scope, the metrics and spans — is the same for both.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Response};

use crate::scope::{Cause, Scope};
use crate::status::status_for;
use crate::wire::timeout_header::{self, MalformedTimeout};
#[cfg(feature = "http")]
use {
    crate::deadline_headers::{self, DeadlineHeader, MalformedDeadline},
    crate::status::code_for_http,
    http::StatusCode,
};

/// The protocol a [`ServerDeadlineLayer`](super::ServerDeadlineLayer)
/// speaks: [`Grpc`] (the layer of [`ServerDeadlineLayer::new`](super::ServerDeadlineLayer::new))
/// or `Http` (the layer of `ServerDeadlineLayer::http`, with the `http`
/// feature).
///
/// Sealed: the two are the layer's whole repertoire. It is a type, not a
/// field, so a gRPC server pays for no branch on it and keeps its body's
/// own error type.
///
/// ```
/// use tonic_deadline::server::{Grpc, Protocol, ServerDeadlineLayer};
///
/// fn speaks<P: Protocol>(_: &ServerDeadlineLayer<P>) {}
/// speaks::<Grpc>(&ServerDeadlineLayer::new());
/// ```
pub trait Protocol: sealed::Sealed {
    /// The request body the handler's service receives: for [`Grpc`], a
    /// [`RequestBody`](super::RequestBody) (an input its caller abandoned
    /// never reads as complete); for `Http`, the body as it came (hyper
    /// already reports a reset or a lost connection as an error).
    type RequestBody<B>;
}

/// gRPC: the deadline is `grpc-timeout`, decoded strictly; the layer
/// answers for a handler with a trailers-only status, or in the trailers of
/// a stream already under way.
///
/// ```
/// use tonic_deadline::server::{Grpc, ServerDeadlineLayer};
///
/// let layer: ServerDeadlineLayer<Grpc> = ServerDeadlineLayer::new();
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Grpc;

impl Protocol for Grpc {
    type RequestBody<B> = super::RequestBody<B>;
}

/// Plain HTTP: the deadline is the tightest of the deadline headers the
/// layer accepts; it answers for a handler with `504 Gateway Timeout`, and
/// ends a response already under way with an error.
///
/// The metrics of a plain-HTTP layer label a request with its path as
/// `grpc_method` (`/orders/7`: at most 200 distinct paths per handle, the
/// rest are `other`), and its answer with the gRPC status of the
/// HTTP status, as `google.rpc.Code` documents the pairs, so the series of
/// an HTTP edge and of the gRPC services behind it read alike:
///
/// | HTTP status | `grpc_status` |
/// |---|---|
/// | 1xx, 2xx, 3xx | `OK` |
/// | 400 | `INVALID_ARGUMENT` |
/// | 401 | `UNAUTHENTICATED` |
/// | 403 | `PERMISSION_DENIED` |
/// | 404 | `NOT_FOUND` |
/// | 409 | `ABORTED` |
/// | 429 | `RESOURCE_EXHAUSTED` |
/// | 499 | `CANCELLED` |
/// | 500 | `INTERNAL` |
/// | 501 | `UNIMPLEMENTED` |
/// | 503 | `UNAVAILABLE` |
/// | 504 | `DEADLINE_EXCEEDED` |
/// | any other | `UNKNOWN` |
///
/// The status is the head's unless the body fails (`UNKNOWN`), is cut at
/// the deadline (`DEADLINE_EXCEEDED`) or is abandoned by the client
/// (`CANCELLED`).
///
/// ```
/// use tonic_deadline::server::{Http, ServerDeadlineLayer};
///
/// let layer: ServerDeadlineLayer<Http> = ServerDeadlineLayer::http();
/// # let _ = layer;
/// ```
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
#[derive(Debug, Clone)]
pub struct Http {
    accepted: Vec<DeadlineHeader>,
}

#[cfg(feature = "http")]
impl Default for Http {
    fn default() -> Self {
        Self {
            accepted: DeadlineHeader::ALL.to_vec(),
        }
    }
}

#[cfg(feature = "http")]
impl Http {
    pub(super) fn accept(&mut self, headers: &[DeadlineHeader]) {
        self.accepted = headers.to_vec();
    }
}

#[cfg(feature = "http")]
impl Protocol for Http {
    type RequestBody<B> = B;
}

/// An answer the layer gives itself: the head, and a short text for the
/// body (none for gRPC, whose answers are trailers-only).
pub(crate) type Answer = Response<Option<Bytes>>;

pub(crate) mod sealed {
    use super::*;

    /// What differs between the protocols, decided at compile time.
    pub trait Sealed: Clone + fmt::Debug + Send + Sync + 'static {
        /// How early the timer fires before the deadline.
        const TIMER_LEAD: Duration;

        /// Whether an answer's status is its HTTP status (plain HTTP), not
        /// the `grpc-status` of its head or trailers (gRPC).
        const HTTP_STATUS: bool;

        /// Why a request's deadline could not be read.
        type Malformed: fmt::Display;

        /// The budget the request asks for.
        fn requested(&self, headers: &HeaderMap) -> Result<Option<Duration>, Self::Malformed>;

        /// The answer to a request whose deadline could not be read, and
        /// the status the metrics record for it.
        fn malformed(malformed: Self::Malformed) -> (Answer, tonic::Code);

        /// The answer for a handler out of time.
        fn deadline_exceeded() -> Answer;

        /// The request body the handler reads, under the request's scope.
        fn request_body<B>(body: B, scope: &Scope) -> <Self as Protocol>::RequestBody<B>
        where
            Self: Protocol;
    }
}

impl sealed::Sealed for Grpc {
    /// tonic's `Server` wraps every layer in its own `grpc-timeout` timer,
    /// which answers `CANCELLED`. It reads the same header a few
    /// microseconds before we do, so with equal budgets it could win a
    /// millisecond tick and report the wrong code. Firing one tick early
    /// makes ours always first; the client's own timer, not ours, decides
    /// when it gives up.
    const TIMER_LEAD: Duration = Duration::from_millis(1);

    type Malformed = MalformedTimeout;

    #[inline]
    fn requested(&self, headers: &HeaderMap) -> Result<Option<Duration>, MalformedTimeout> {
        timeout_header::from_headers(headers)
    }

    fn malformed(malformed: MalformedTimeout) -> (Answer, tonic::Code) {
        let status = tonic::Status::from(malformed);
        let code = status.code();
        (status.into_http(), code)
    }

    fn deadline_exceeded() -> Answer {
        status_for(Cause::DeadlineExceeded).into_http()
    }

    #[inline]
    fn request_body<B>(body: B, scope: &Scope) -> super::RequestBody<B> {
        super::RequestBody::new(body, scope.clone())
    }

    const HTTP_STATUS: bool = false;
}

#[cfg(feature = "http")]
impl sealed::Sealed for Http {
    /// Nothing else in front of the handler times it: the deadline itself.
    const TIMER_LEAD: Duration = Duration::ZERO;

    type Malformed = MalformedDeadline;

    fn requested(&self, headers: &HeaderMap) -> Result<Option<Duration>, MalformedDeadline> {
        deadline_headers::read(headers, &self.accepted)
    }

    fn malformed(malformed: MalformedDeadline) -> (Answer, tonic::Code) {
        let status = StatusCode::BAD_REQUEST;
        (plain(status, malformed.to_string()), code_for_http(status))
    }

    fn deadline_exceeded() -> Answer {
        plain(
            StatusCode::GATEWAY_TIMEOUT,
            Cause::DeadlineExceeded.to_string(),
        )
    }

    #[inline]
    fn request_body<B>(body: B, _: &Scope) -> B {
        body
    }

    const HTTP_STATUS: bool = true;
}

/// A plain-text answer.
#[cfg(feature = "http")]
fn plain(status: StatusCode, text: String) -> Answer {
    let mut response = Response::new(Some(Bytes::from(text)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
