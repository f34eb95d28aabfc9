//! What a server layer attaches to each request's root scope, for the
//! calls made under it: the incoming metadata they forward, and who is told
//! of work that outlives the request. The server layer makes it; the
//! client layer reads the metadata. Its own module, so that neither layer
//! imports the other.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;

use crate::scope::{Attachment, Scope};

/// The attachment of a request's root scope: see the module docs.
#[derive(Debug)]
pub(crate) struct Attached {
    forwarded: Option<HeaderMap>,
    reports: Option<Arc<dyn Attachment>>,
}

impl Attached {
    /// An attachment forwarding `forwarded` to outbound calls and telling
    /// `reports` of work that outlives the request.
    pub(crate) fn new(forwarded: Option<HeaderMap>, reports: Option<Arc<dyn Attachment>>) -> Self {
        Self { forwarded, reports }
    }

    /// Incoming metadata the server layer was told to forward.
    pub(crate) fn forwarded(&self) -> Option<&HeaderMap> {
        self.forwarded.as_ref()
    }

    /// The metadata forwarded to calls made under `scope`, if its root
    /// carries any.
    pub(crate) fn of(scope: &Scope) -> Option<&HeaderMap> {
        scope.attached::<Attached>().and_then(Attached::forwarded)
    }
}

impl Attachment for Attached {
    fn outlived(&self, what: &'static str, by: Option<Duration>) {
        if let Some(reports) = &self.reports {
            reports.outlived(what, by);
        }
    }

    fn blocking_span(&self) -> Option<tracing::Span> {
        self.reports.as_ref()?.blocking_span()
    }

    fn blocking_returned(&self, span: &tracing::Span, scope: &Scope) {
        if let Some(reports) = &self.reports {
            reports.blocking_returned(span, scope);
        }
    }
}
