//! What ends a request's scope: held by the response future until the
//! head is out, then by the body until the answer is complete.

use http::HeaderMap;

use super::observer::Observation;
use crate::scope::{Cause, Scope};

/// Ends the request's scope when dropped: with the cause given to
/// [`finish`](EndGuard::finish), or [`Cause::Abandoned`] if it is dropped
/// unfinished (the client reset the stream or the connection closed).
///
/// A layer with an observer also hands it what observes the request
/// ([`Observation`]); one without pays for a null pointer.
#[derive(Debug)]
pub(crate) struct EndGuard {
    scope: Scope,
    done: bool,
    observed: Option<Box<dyn Observation>>,
}

impl EndGuard {
    pub(crate) fn new(scope: Scope, observed: Option<Box<dyn Observation>>) -> Self {
        Self {
            scope,
            done: false,
            observed,
        }
    }

    /// The request's scope.
    pub(crate) fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The request's span, to enter while the handler runs.
    pub(crate) fn span(&self) -> Option<&tracing::Span> {
        self.observed.as_deref().map(Observation::span)
    }

    /// Notes the `grpc-status` of response headers or trailers.
    pub(crate) fn saw_status(&mut self, headers: &HeaderMap) {
        if let Some(observed) = &mut self.observed {
            observed.saw_status(headers);
        }
    }

    /// Notes the status of a plain-HTTP answer's head.
    pub(crate) fn saw_http_status(&mut self, status: http::StatusCode) {
        if let Some(observed) = &mut self.observed {
            observed.saw_http_status(status);
        }
    }

    /// Notes a failure that carries no status (the handler's error).
    pub(crate) fn failed(&mut self) {
        if let Some(observed) = &mut self.observed {
            observed.failed();
        }
    }

    pub(crate) fn finish(mut self, cause: Cause) {
        self.done = true;
        self.end(cause);
    }

    fn end(&mut self, cause: Cause) {
        // A request whose client reset its upload ended its scope as
        // abandoned when the handler read the reset: an answer the handler
        // still made of it (the error it read) is not a completed request.
        let cause = match cause {
            Cause::Completed if self.scope.is_cancelled() => self
                .scope
                .cause()
                .filter(|c| *c == Cause::Abandoned)
                .unwrap_or(cause),
            cause => cause,
        };
        if cause != Cause::Completed {
            // An expected end, not a fault: named, at DEBUG.
            tracing::debug!(%cause, "request scope ended before its answer was complete");
        }
        self.scope.end(cause);
        if let Some(observed) = self.observed.take() {
            observed.ended(&self.scope, cause);
        }
    }
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        if !self.done {
            self.end(Cause::Abandoned);
        }
    }
}
