use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tower_layer::Layer;

use super::observer::Observer;
use super::shared::{Core, Settings};
use super::{Resilience, RetryBudget};
use crate::service_config::{ConfigError, ServiceConfig};

/// Retries or hedges each call as its method's policy in the service
/// config says, inside the caller's deadline. See the [module docs](super).
///
/// The layer is its own builder: configure it, then hand it to a
/// `ServiceBuilder`. Every service it builds — one per connection to the
/// channel's server, and their clones — shares one throttle (or budget) and
/// one record of how long attempts take: use one layer per channel.
///
/// ```
/// use std::time::Duration;
/// use tonic_deadline::resilience::{ResilienceLayer, RetryBudget};
///
/// // `Get` is hedged, every other method of the service is retried.
/// let layer = ResilienceLayer::from_service_config(r#"{"methodConfig": [
///     {"name": [{"service": "kv.v1.Store"}],
///      "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
///                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}},
///     {"name": [{"service": "kv.v1.Store", "method": "Get"}],
///      "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.02s"}}]}"#)?
///     .budget(RetryBudget::new(0.1, 10))
///     .per_attempt_timeout(Duration::from_millis(200))
///     .adaptive_hedging_delay(0.95);
/// # let _ = layer;
/// # Ok::<(), tonic_deadline::service_config::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ResilienceLayer {
    config: Arc<ServiceConfig>,
    settings: Settings,
    /// The state every service built by this layer shares, made by the
    /// first `layer` call (each builder step starts it afresh).
    shared: Arc<OnceLock<Arc<Core>>>,
}

impl ResilienceLayer {
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

    /// Applies one builder step; the shared state is made afresh for it.
    fn with(mut self, set: impl FnOnce(&mut Settings)) -> Self {
        set(&mut self.settings);
        self.shared = Arc::default();
        self
    }

    /// The layer with `observer` observing its calls, in place of any it
    /// had (`observe` builds it: see `metrics`).
    #[cfg_attr(
        not(feature = "metrics"),
        allow(dead_code, reason = "only `observe::Metrics` observes this layer")
    )]
    pub(crate) fn observed_by(self, observer: Arc<dyn Observer>) -> Self {
        self.with(|s| s.observer = Some(observer))
    }

    /// Caps each attempt at `timeout` (never beyond the caller's deadline):
    /// a retried attempt that hangs gives way to the next one if the policy
    /// retries `DEADLINE_EXCEEDED` (idempotent methods only).
    pub fn per_attempt_timeout(self, timeout: Duration) -> Self {
        self.with(|s| s.per_attempt_timeout = Some(timeout))
    }

    /// The most request bytes kept for replay (default 256 KiB); a larger
    /// request is sent once, neither retried nor hedged.
    pub fn replay_buffer(self, bytes: usize) -> Self {
        self.with(|s| s.replay_buffer = bytes)
    }

    /// Limits retries and hedges by `budget` instead of the config's
    /// `retryThrottling`.
    pub fn budget(self, budget: RetryBudget) -> Self {
        self.with(|s| s.budget = Some(budget))
    }

    /// The least time an attempt needs (default 1 ms): no retry or hedge
    /// starts with less left, whatever the learned latency says.
    pub fn min_attempt_time(self, floor: Duration) -> Self {
        self.with(|s| s.min_attempt_time = floor)
    }

    /// Which quantile of the answered attempts' latency another attempt
    /// must fit in (default 0.5, the median; 0 takes the fastest). A value
    /// that is not a number keeps the median.
    pub fn attempt_time_quantile(self, q: f64) -> Self {
        let q = if q.is_finite() {
            q.clamp(0.0, 1.0)
        } else {
            0.5
        };
        self.with(|s| s.attempt_time_quantile = q)
    }

    /// Whether a call this layer stops retrying tells its caller not to
    /// retry either (default: it does). A failure the policy would retry,
    /// once every attempt the layer would send was sent (`maxAttempts`, a
    /// pushback, the throttle or budget, no time left), is answered with
    /// `grpc-retry-pushback-ms: -1`, gRPC's "do not retry": a handler that
    /// returns the status it got answers its own caller so, and the hop
    /// above does not try again. With the same policy on every hop of a
    /// chain, a failing hop then sees at most `maxAttempts` attempts per
    /// call made at the root, not `maxAttempts` to the power of the hops.
    /// Any caller that honours gRPC's pushback (grpc-go, grpc-java, this
    /// layer) stops there; `false` retries at every hop.
    ///
    /// ```
    /// # fn run() -> Result<(), tonic_deadline::service_config::ConfigError> {
    /// let per_hop = tonic_deadline::resilience::ResilienceLayer::from_service_config("{}")?
    ///     .chain_budget(false);
    /// # let _ = per_hop;
    /// # Ok(())
    /// # }
    /// ```
    pub fn chain_budget(self, on: bool) -> Self {
        self.with(|s| s.chain_budget = on)
    }

    /// How long a replica whose attempt failed (with a status the policy
    /// retries) is left out while another is at hand (default 1 s): the
    /// first attempts of calls go to the others, and a retry goes to none
    /// of them. A replica rests again with each failure, and is tried again
    /// once its rest is over, or at once when every replica rests.
    /// `Duration::ZERO` leaves out only the replica a retry's own failure
    /// came from.
    ///
    /// It needs a balancer that says which replica answered (see
    /// [`Replica`](crate::client::Replica)); and it is part of the chain
    /// budget: with [`chain_budget(false)`](Self::chain_budget) retries go
    /// wherever the balancer sends them.
    ///
    /// ```
    /// # fn run() -> Result<(), tonic_deadline::service_config::ConfigError> {
    /// use std::time::Duration;
    /// let layer = tonic_deadline::resilience::ResilienceLayer::from_service_config("{}")?
    ///     .replica_rest(Duration::from_secs(5));
    /// # let _ = layer;
    /// # Ok(())
    /// # }
    /// ```
    pub fn replica_rest(self, rest: Duration) -> Self {
        self.with(|s| s.replica_rest = rest)
    }

    /// Hedges after the `q`-quantile (e.g. 0.95) of the method's recent
    /// answer latency instead of the fixed `hedgingDelay`, which holds
    /// until eight answered attempts were seen. A value that is not a
    /// number keeps `hedgingDelay`.
    pub fn adaptive_hedging_delay(self, q: f64) -> Self {
        let q = q.is_finite().then(|| q.clamp(0.0, 1.0));
        self.with(|s| s.adaptive_hedging_delay = q)
    }
}

impl<S> Layer<S> for ResilienceLayer {
    type Service = Resilience<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Resilience {
            inner,
            core: self
                .shared
                .get_or_init(|| Arc::new(Core::new((*self.config).clone(), self.settings.clone())))
                .clone(),
        }
    }
}
