use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tower_layer::Layer;

use super::core::{Core, Settings};
use super::{Retry, RetryBudget};
use crate::observe::Metrics;
use crate::service_config::{ConfigError, ServiceConfig};

/// Retries calls as the service config's `retryPolicy` says, inside the
/// caller's deadline. See the [module docs](super).
///
/// ```
/// use std::time::Duration;
/// use tonic_deadline::observe::Metrics;
/// use tonic_deadline::retry::{RetryBudget, RetryLayer};
///
/// let metrics = Metrics::new();
/// let layer = RetryLayer::from_service_config(r#"{"methodConfig": [{"name": [{}],
///     "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
///                     "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#)?
///     .budget(RetryBudget::new(0.1, 10))
///     .per_attempt_timeout(Duration::from_millis(200))
///     .metrics(&metrics);
/// # let _ = layer;
/// # Ok::<(), tonic_deadline::service_config::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct RetryLayer {
    config: Arc<ServiceConfig>,
    settings: Settings,
    /// The state every service built by this layer shares, made by the
    /// first `layer` call (each builder step starts it afresh).
    shared: Arc<OnceLock<Arc<Core>>>,
}

impl RetryLayer {
    /// The layer for a parsed service config. Warns (once, here) about
    /// `DEADLINE_EXCEEDED` or `CANCELLED` listed as retryable for methods
    /// not declared idempotent: those are not retried.
    pub fn new(config: ServiceConfig) -> Self {
        config.warn_outcome_unknown();
        Self {
            config: Arc::new(config),
            settings: Settings::default(),
            shared: Arc::default(),
        }
    }

    /// Parses `json` (a gRPC service config) and makes the layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the invalid field.
    pub fn from_service_config(json: &str) -> Result<Self, ConfigError> {
        Ok(Self::new(ServiceConfig::from_json(json)?))
    }

    /// Counts calls, attempts, retries and backoff into `metrics`.
    pub fn metrics(mut self, metrics: &Metrics) -> Self {
        self.settings.metrics = Some(metrics.clone());
        self.shared = Arc::default();
        self
    }

    /// Caps each attempt at `timeout` (never beyond the caller's deadline):
    /// an attempt that hangs gives way to the next one, if the policy
    /// retries `DEADLINE_EXCEEDED` (idempotent methods only).
    pub fn per_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.settings.per_attempt_timeout = Some(timeout);
        self.shared = Arc::default();
        self
    }

    /// The most request bytes kept for replay (default 256 KiB); a larger
    /// request is sent once.
    pub fn replay_buffer(mut self, bytes: usize) -> Self {
        self.settings.replay_buffer = bytes;
        self.shared = Arc::default();
        self
    }

    /// Limits retries by `budget` instead of the config's `retryThrottling`.
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.settings.budget = Some(budget);
        self.shared = Arc::default();
        self
    }

    /// The least time left for which another attempt is started (default
    /// 1 ms), whatever the learned latency says.
    pub fn min_attempt_time(mut self, floor: Duration) -> Self {
        self.settings.min_attempt_time = floor;
        self.shared = Arc::default();
        self
    }

    /// Which quantile of the answered attempts' latency another attempt
    /// must fit in (default 0.5, the median; 0 takes the fastest).
    pub fn attempt_time_quantile(mut self, q: f64) -> Self {
        self.settings.attempt_time_quantile = if q.is_finite() {
            q.clamp(0.0, 1.0)
        } else {
            0.5
        };
        self.shared = Arc::default();
        self
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry {
            inner,
            core: self
                .shared
                .get_or_init(|| Arc::new(Core::new((*self.config).clone(), self.settings.clone())))
                .clone(),
        }
    }
}
