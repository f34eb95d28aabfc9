use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tower_layer::Layer;

use super::Hedge;
use crate::observe::Metrics;
use crate::retry::RetryBudget;
use crate::retry::core::{Core, Settings};
use crate::service_config::{ConfigError, ServiceConfig};

/// Hedges calls as the service config's `hedgingPolicy` says, inside the
/// caller's deadline. See the [module docs](super).
///
/// Every service the layer builds shares its throttle (or budget) and its
/// learned latencies: use one layer per target server.
///
/// ```
/// use tonic_deadline::hedge::HedgeLayer;
/// // grpc-java's hedging example, unchanged.
/// let layer = HedgeLayer::from_service_config(r#"{"methodConfig": [{
///     "name": [{"service": "helloworld.Greeter", "method": "SayHello"}],
///     "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "1s"}}],
///   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#)?
///     .adaptive_delay(0.95);
/// # let _ = layer;
/// # Ok::<(), tonic_deadline::service_config::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct HedgeLayer {
    config: Arc<ServiceConfig>,
    settings: Settings,
    /// The state every service built by this layer shares, made by the
    /// first `layer` call (each builder step starts it afresh).
    shared: Arc<OnceLock<Arc<Core>>>,
    adaptive: Option<f64>,
}

impl HedgeLayer {
    /// The layer for a parsed service config.
    pub fn new(config: ServiceConfig) -> Self {
        Self {
            config: Arc::new(config),
            settings: Settings::default(),
            shared: Arc::default(),
            adaptive: None,
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

    /// Counts calls, attempts, hedges and cancelled losers into `metrics`.
    pub fn metrics(mut self, metrics: &Metrics) -> Self {
        self.settings.metrics = Some(metrics.clone());
        self.shared = Arc::default();
        self
    }

    /// Caps each attempt at `timeout` (never beyond the caller's deadline).
    pub fn per_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.settings.per_attempt_timeout = Some(timeout);
        self.shared = Arc::default();
        self
    }

    /// The most request bytes kept for replay (default 256 KiB); a larger
    /// request is sent once, unhedged.
    pub fn replay_buffer(mut self, bytes: usize) -> Self {
        self.settings.replay_buffer = bytes;
        self.shared = Arc::default();
        self
    }

    /// Limits hedges by `budget` instead of the config's `retryThrottling`.
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.settings.budget = Some(budget);
        self.shared = Arc::default();
        self
    }

    /// The least time left for which a hedge is sent (default 1 ms).
    pub fn min_attempt_time(mut self, floor: Duration) -> Self {
        self.settings.min_attempt_time = floor;
        self.shared = Arc::default();
        self
    }

    /// Waits for the `q`-quantile (e.g. 0.95) of the method's recent answer
    /// latency before hedging, instead of the fixed `hedgingDelay` (used
    /// until enough answers were seen).
    pub fn adaptive_delay(mut self, q: f64) -> Self {
        self.adaptive = q.is_finite().then(|| q.clamp(0.0, 1.0));
        self.shared = Arc::default();
        self
    }
}

impl<S> Layer<S> for HedgeLayer {
    type Service = Hedge<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Hedge {
            inner,
            core: self
                .shared
                .get_or_init(|| Arc::new(Core::new((*self.config).clone(), self.settings.clone())))
                .clone(),
            adaptive: self.adaptive,
        }
    }
}
