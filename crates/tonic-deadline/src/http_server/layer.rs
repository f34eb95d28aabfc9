use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::{Config, HttpDeadline};
use crate::deadline_headers::DeadlineHeader;

/// Gives every HTTP request a deadline scope.
///
/// By default every [`DeadlineHeader`] is accepted, and neither a default
/// nor a maximum budget is set: a request without a deadline header runs
/// without a deadline.
///
/// ```
/// use std::time::Duration;
/// use tonic_deadline::deadline_headers::DeadlineHeader;
/// use tonic_deadline::http_server::HttpDeadlineLayer;
///
/// let layer = HttpDeadlineLayer::new()
///     .default_timeout(Duration::from_millis(900))
///     .max_timeout(Duration::from_secs(30))
///     .accept(&[DeadlineHeader::EnvoyExpectedTimeoutMs, DeadlineHeader::GrpcTimeout])
///     .forward_header("x-request-id");
/// # let _ = layer;
/// ```
#[derive(Debug, Clone)]
pub struct HttpDeadlineLayer {
    config: Config,
}

impl Default for HttpDeadlineLayer {
    fn default() -> Self {
        Self {
            config: Config {
                limits: crate::server::Config::default(),
                accepted: DeadlineHeader::ALL.to_vec(),
            },
        }
    }
}

impl HttpDeadlineLayer {
    /// A layer accepting every deadline header, with no default and no
    /// maximum, forwarding nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The budget given to requests that carry no accepted deadline header.
    pub fn default_timeout(mut self, timeout: Duration) -> Self {
        self.config.limits.default_timeout = Some(timeout);
        self
    }

    /// The largest budget accepted; longer ones are cut to it, and requests
    /// without a deadline get it too.
    pub fn max_timeout(mut self, timeout: Duration) -> Self {
        self.config.limits.max_timeout = Some(timeout);
        self
    }

    /// The deadline headers read (and so trusted); others are ignored. An
    /// empty list gives every request the default budget.
    pub fn accept(mut self, headers: &[DeadlineHeader]) -> Self {
        self.config.accepted = headers.to_vec();
        self
    }

    /// Copies the incoming header `key` to every outbound gRPC call made
    /// under the request's scope (a request or trace id). Only listed keys
    /// travel; `grpc-*` keys are reserved and ignored.
    ///
    /// # Panics
    ///
    /// If `key` is not a valid lowercase header name.
    pub fn forward_header(mut self, key: &str) -> Self {
        self.config.limits.forward(key);
        self
    }
}

impl<S> Layer<S> for HttpDeadlineLayer {
    type Service = HttpDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HttpDeadline {
            inner,
            config: Arc::new(self.config.clone()),
        }
    }
}
