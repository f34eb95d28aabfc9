//! gRPC service config: each `methodConfig`'s `timeout`, `waitForReady`,
//! `retryPolicy` and `hedgingPolicy`, and the channel's `retryThrottling`,
//! parsed and validated once.
//!
//! The JSON is the one every gRPC stack reads (grpc-java, grpc-go, the
//! `grpc.service_config` channel argument), and a config written for one
//! of them parses unchanged and means what it means there: a list of
//! `methodConfig`, each naming the methods it applies to and carrying at
//! most one of a retry policy and a hedging policy, plus an optional
//! `retryThrottling` for the whole channel. Field names match without
//! regard to case, as grpc-go's decoder matches them (its examples write
//! `"MaxAttempts"`), and durations read as grpc-go reads them (`".01s"`).
//! Fields this crate does not use (load balancing, message sizes) are
//! accepted and ignored.
//!
//! What the fields do, through [`ResilienceLayer`](crate::resilience::ResilienceLayer):
//! - `timeout` caps the call's deadline: the call ends at the earlier of the
//!   caller's [`Scope`](crate::Scope) deadline and `timeout` after the call,
//!   retries and hedges included, and the server is told that budget;
//! - `waitForReady: true` makes the call wait for the channel to connect —
//!   bounded by the deadline, `DEADLINE_EXCEEDED` if it never does — where
//!   the default fails fast with `UNAVAILABLE`; it takes a
//!   [`ReadyChannel`](crate::client::ReadyChannel) below the client layer
//!   (a plain tonic `Channel` always fails fast);
//! - `retryPolicy` and `hedgingPolicy` as gRPC's retry design (A6) says.

//! ```
//! use std::time::Duration;
//! use tonic_deadline::service_config::{Policy, ServiceConfig};
//!
//! let config = ServiceConfig::from_json(r#"{
//!   "methodConfig": [{
//!     "name": [{ "service": "shop.v1.Inventory" }],
//!     "idempotent": true,
//!     "retryPolicy": {
//!       "maxAttempts": 3,
//!       "initialBackoff": "0.05s",
//!       "maxBackoff": "1s",
//!       "backoffMultiplier": 2,
//!       "retryableStatusCodes": ["UNAVAILABLE", 4]
//!     }
//!   }],
//!   "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 }
//! }"#)?;
//! let method = config.method("/shop.v1.Inventory/Reserve").expect("the whole service is named");
//! assert!(method.idempotent);
//! let Some(Policy::Retry(retry)) = &method.policy else { unreachable!() };
//! assert_eq!(retry.initial_backoff, Duration::from_millis(50));
//! assert!(retry.retryable.contains(tonic::Code::DeadlineExceeded));
//! assert!(config.method("/other.v1.Svc/Get").is_none());
//! # Ok::<(), tonic_deadline::service_config::ConfigError>(())
//! ```
//!
//! # Validation
//!
//! As gRPC's retry design asks: `maxAttempts` must be at least 2 and is
//! capped at 5; backoffs must be positive, the multiplier positive, the
//! retryable codes non-empty; a `methodConfig` holds a retry or a hedging
//! policy, not both; `maxTokens` lies in (0, 1000] and `tokenRatio` is
//! positive (kept to three decimals). An invalid config is a
//! [`ConfigError`] naming the field — never a panic, never a policy
//! silently dropped.
//!
//! # Our extension: `idempotent`
//!
//! `DEADLINE_EXCEEDED` and `CANCELLED` mean *outcome unknown*: the server may
//! have done the work. A `methodConfig` may say `"idempotent": true` (other
//! gRPC stacks ignore the field); only then are those codes retried. Listing
//! them as retryable for a method not declared idempotent is accepted with
//! a warning, and they are not retried. A `hedgingPolicy` needs no such
//! declaration: as in every gRPC stack, configuring hedging for a method is
//! the statement that sending it more than once is harmless.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use serde_json::Value;
use tonic::Code;

use crate::wire::{code_from_name, code_name};

/// The most attempts a policy may ask for; larger values are treated as
/// this (gRPC's default channel limit).
pub(crate) const MAX_ATTEMPTS_LIMIT: u32 = 5;

/// A parsed and validated service config.
///
/// ```
/// use tonic_deadline::service_config::ServiceConfig;
/// let config = ServiceConfig::from_json(r#"{
///   "methodConfig": [
///     {"name": [{"service": "shop.v1.Pricing"}], "timeout": "0.2s",
///      "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
///                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}},
///     {"name": [{"service": "shop.v1.Stock", "method": "Get"}], "waitForReady": true,
///      "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.05s"}}
///   ],
///   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
/// }"#)?;
/// let config = config.idempotent("shop.v1.Stock/Get")?;
/// assert_eq!(config.methods.len(), 2);
/// assert!(config.throttling.is_some());
/// # Ok::<(), tonic_deadline::service_config::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct ServiceConfig {
    /// The method configs, in the order given.
    pub methods: Vec<MethodConfig>,
    /// Channel-wide retry throttling, if configured.
    pub throttling: Option<Throttling>,
    /// Methods declared idempotent in code ([`ServiceConfig::idempotent`]),
    /// beside the `"idempotent": true` of their `methodConfig`.
    pub idempotent_methods: Vec<MethodName>,
}

/// What applies to one method: its policy, its timeout, whether it waits
/// for the channel, and whether it is idempotent.
///
/// ```
/// use std::time::Duration;
/// use tonic_deadline::service_config::ServiceConfig;
/// let config = ServiceConfig::from_json(r#"{
///   "methodConfig": [
///     {"name": [{"service": "shop.v1.Pricing"}], "timeout": "0.2s",
///      "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
///                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}},
///     {"name": [{"service": "shop.v1.Stock", "method": "Get"}], "waitForReady": true,
///      "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.05s"}}
///   ],
///   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
/// }"#)?;
/// let quote = config.resolve("/shop.v1.Pricing/Quote");
/// assert_eq!(quote.timeout, Some(Duration::from_millis(200)));
/// assert!(quote.policy.is_some() && !quote.wait_for_ready && !quote.idempotent);
/// # Ok::<(), tonic_deadline::service_config::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Resolved<'a> {
    /// The policy of the most specific `methodConfig` naming the method.
    pub policy: Option<&'a Policy>,
    /// Its `timeout`: a cap on the call's deadline.
    pub timeout: Option<Duration>,
    /// Its `waitForReady`: wait for the channel to connect, bounded by the
    /// deadline, instead of failing at once with `UNAVAILABLE`.
    pub wait_for_ready: bool,
    /// Declared idempotent, in the JSON or in code.
    pub idempotent: bool,
}

/// One `methodConfig` entry.
///
/// ```
/// use tonic_deadline::service_config::{MethodName, ServiceConfig};
/// let config = ServiceConfig::from_json(r#"{
///   "methodConfig": [
///     {"name": [{"service": "shop.v1.Pricing"}], "timeout": "0.2s",
///      "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
///                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}},
///     {"name": [{"service": "shop.v1.Stock", "method": "Get"}], "waitForReady": true,
///      "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.05s"}}
///   ],
///   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
/// }"#)?;
/// let stock = config.method("/shop.v1.Stock/Get").expect("named");
/// assert_eq!(stock.names, [MethodName::Method("shop.v1.Stock".into(), "Get".into())]);
/// assert_eq!(stock.wait_for_ready, Some(true));
/// # Ok::<(), tonic_deadline::service_config::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct MethodConfig {
    /// The methods it applies to.
    pub names: Vec<MethodName>,
    /// Its retry or hedging policy, if any.
    pub policy: Option<Policy>,
    /// Our extension: the methods may be repeated without harm, so
    /// outcome-unknown codes may be retried.
    pub idempotent: bool,
    /// `timeout`: the call's deadline is the smaller of the caller's and
    /// this long from the call (retries and hedges included).
    pub timeout: Option<Duration>,
    /// `waitForReady`: `Some(true)` waits for the channel to connect,
    /// bounded by the deadline; unset or `false` fails fast.
    pub wait_for_ready: Option<bool>,
}

/// Which methods a [`MethodConfig`] names.
///
/// ```
/// use tonic_deadline::service_config::{MethodName, ServiceConfig};
/// let config = ServiceConfig::from_json(r#"{
///   "methodConfig": [
///     {"name": [{"service": "shop.v1.Pricing"}], "timeout": "0.2s",
///      "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
///                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}},
///     {"name": [{"service": "shop.v1.Stock", "method": "Get"}], "waitForReady": true,
///      "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.05s"}}
///   ],
///   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
/// }"#)?;
/// assert_eq!(config.methods[0].names, [MethodName::Service("shop.v1.Pricing".into())]);
/// # Ok::<(), tonic_deadline::service_config::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MethodName {
    /// Every method of every service: the channel's default.
    Default,
    /// Every method of one service (`package.Service`).
    Service(String),
    /// One method: service and method name.
    Method(String, String),
}

impl MethodName {
    /// How specific the name is: a method beats a service beats the default.
    fn rank(&self) -> u8 {
        match self {
            MethodName::Method(..) => 2,
            MethodName::Service(_) => 1,
            MethodName::Default => 0,
        }
    }

    fn matches(&self, service: &str, method: &str) -> bool {
        match self {
            MethodName::Default => true,
            MethodName::Service(s) => s == service,
            MethodName::Method(s, m) => s == service && m == method,
        }
    }
}

/// The policy of a method: retry after failures, or hedge.
///
/// ```
/// use tonic_deadline::service_config::{Policy, ServiceConfig};
/// let config = ServiceConfig::from_json(r#"{
///   "methodConfig": [
///     {"name": [{"service": "shop.v1.Pricing"}], "timeout": "0.2s",
///      "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
///                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}},
///     {"name": [{"service": "shop.v1.Stock", "method": "Get"}], "waitForReady": true,
///      "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.05s"}}
///   ],
///   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
/// }"#)?;
/// let attempts = |path| match config.resolve(path).policy {
///     Some(Policy::Retry(retry)) => retry.max_attempts,
///     Some(Policy::Hedge(hedge)) => hedge.max_attempts,
///     None => 1,
/// };
/// assert_eq!(attempts("/shop.v1.Pricing/Quote"), 3);
/// assert_eq!(attempts("/shop.v1.Stock/Get"), 2);
/// assert_eq!(attempts("/shop.v1.Cart/Add"), 1);
/// # Ok::<(), tonic_deadline::service_config::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Policy {
    /// `retryPolicy`.
    Retry(RetryPolicy),
    /// `hedgingPolicy`.
    Hedge(HedgingPolicy),
}

/// `retryPolicy`: attempts one after another, with exponential backoff.
///
/// ```
/// use std::time::Duration;
/// use tonic_deadline::service_config::{Policy, ServiceConfig};
/// let config = ServiceConfig::from_json(r#"{
///   "methodConfig": [
///     {"name": [{"service": "shop.v1.Pricing"}], "timeout": "0.2s",
///      "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
///                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}},
///     {"name": [{"service": "shop.v1.Stock", "method": "Get"}], "waitForReady": true,
///      "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.05s"}}
///   ],
///   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
/// }"#)?;
/// let Some(Policy::Retry(retry)) = &config.methods[0].policy else { unreachable!() };
/// assert_eq!(retry.max_attempts, 3);
/// assert_eq!(retry.initial_backoff, Duration::from_millis(10));
/// assert!(retry.retryable.contains(tonic::Code::Unavailable));
/// # Ok::<(), tonic_deadline::service_config::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Attempts in all, the first included (2..=5).
    pub max_attempts: u32,
    /// The backoff bound before the first retry.
    pub initial_backoff: Duration,
    /// The largest backoff bound.
    pub max_backoff: Duration,
    /// How the backoff bound grows from one retry to the next.
    pub backoff_multiplier: f64,
    /// The codes that lead to another attempt.
    pub retryable: Codes,
}

/// `hedgingPolicy`: further attempts started while earlier ones still run.
///
/// ```
/// use std::time::Duration;
/// use tonic_deadline::service_config::{Policy, ServiceConfig};
/// let config = ServiceConfig::from_json(r#"{
///   "methodConfig": [
///     {"name": [{"service": "shop.v1.Pricing"}], "timeout": "0.2s",
///      "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
///                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}},
///     {"name": [{"service": "shop.v1.Stock", "method": "Get"}], "waitForReady": true,
///      "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.05s"}}
///   ],
///   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
/// }"#)?;
/// let Some(Policy::Hedge(hedge)) = &config.methods[1].policy else { unreachable!() };
/// assert_eq!(hedge.hedging_delay, Duration::from_millis(50));
/// # Ok::<(), tonic_deadline::service_config::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct HedgingPolicy {
    /// Attempts in all, the first included (2..=5).
    pub max_attempts: u32,
    /// How long to wait before sending the next attempt (0: all at once).
    pub hedging_delay: Duration,
    /// Codes after which the other attempts go on (and the next one is sent
    /// at once); any other code ends the call.
    pub non_fatal: Codes,
}

/// `retryThrottling`: a token bucket per server that stops retries and
/// hedges while too many calls fail.
///
/// ```
/// use tonic_deadline::service_config::ServiceConfig;
/// let config = ServiceConfig::from_json(r#"{
///   "methodConfig": [
///     {"name": [{"service": "shop.v1.Pricing"}], "timeout": "0.2s",
///      "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
///                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}},
///     {"name": [{"service": "shop.v1.Stock", "method": "Get"}], "waitForReady": true,
///      "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.05s"}}
///   ],
///   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
/// }"#)?;
/// let throttling = config.throttling.expect("configured");
/// assert_eq!((throttling.max_tokens, throttling.token_ratio_milli), (10, 100));
/// # Ok::<(), tonic_deadline::service_config::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Throttling {
    /// Tokens when full, in (0, 1000].
    pub max_tokens: u32,
    /// Tokens given back by each success, in thousandths (0.1 is 100).
    pub token_ratio_milli: u32,
}

/// A set of gRPC status codes.
///
/// ```
/// use tonic::Code;
/// use tonic_deadline::service_config::Codes;
/// let codes = Codes::empty().with(Code::Unavailable);
/// assert!(codes.contains(Code::Unavailable) && !codes.contains(Code::Internal));
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Codes(u32);

impl Codes {
    /// No code.
    pub const fn empty() -> Self {
        Codes(0)
    }

    /// Adds `code`.
    pub fn with(self, code: Code) -> Self {
        Codes(self.0 | 1 << (code as i32 as u32))
    }

    /// Whether `code` is in the set.
    pub fn contains(self, code: Code) -> bool {
        self.0 & (1 << (code as i32 as u32)) != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    fn iter(self) -> impl Iterator<Item = Code> {
        (0..17)
            .filter(move |i| self.0 & (1 << i) != 0)
            .map(Code::from_i32)
    }
}

impl fmt::Debug for Codes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter().map(code_name)).finish()
    }
}

/// An invalid service config: which field, and what is wrong with it.
///
/// ```
/// use tonic_deadline::service_config::ServiceConfig;
/// let json = r#"{"retryThrottling": {"maxTokens": 0, "tokenRatio": 0.1}}"#;
/// let err = ServiceConfig::from_json(json).unwrap_err();
/// assert_eq!(err.field(), "retryThrottling.maxTokens");
/// println!("{err}: {}", err.problem());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: String,
    problem: String,
}

impl ConfigError {
    fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The JSON path of the offending field, e.g.
    /// `methodConfig[0].retryPolicy.maxAttempts`.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong with it.
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid service config: {}: {}",
            self.field, self.problem
        )
    }
}

/// A config error is the service's own mistake, found when a layer is
/// built, not the answer to a request: it names no status, and boxed it is
/// `UNKNOWN` like any other error.
impl std::error::Error for ConfigError {}

impl ServiceConfig {
    /// Parses and validates a service config.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first invalid field.
    ///
    /// ```
    /// use tonic_deadline::service_config::ServiceConfig;
    /// let err = ServiceConfig::from_json(r#"{"methodConfig":[{"name":[{}],
    ///   "retryPolicy":{"maxAttempts":1,"initialBackoff":"1s","maxBackoff":"1s",
    ///   "backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]}"#).unwrap_err();
    /// assert_eq!(err.field(), "methodConfig[0].retryPolicy.maxAttempts");
    /// ```
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        let value: Value = serde_json::from_str(json)
            .map_err(|e| ConfigError::new("(document)", format!("not JSON: {e}")))?;
        Self::from_value(&value)
    }

    /// Like [`from_json`](Self::from_json), from a parsed JSON value.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first invalid field.
    pub fn from_value(value: &Value) -> Result<Self, ConfigError> {
        let document = object(value, "(document)")?;
        let mut methods = Vec::new();
        let mut seen = HashSet::new();
        let entries = match field(document, "methodConfig") {
            None => &[][..],
            Some(list) => list
                .as_array()
                .ok_or_else(|| ConfigError::new("methodConfig", "must be a list"))?,
        };
        for (i, entry) in entries.iter().enumerate() {
            let at = format!("methodConfig[{i}]");
            let method = parse_method(entry, &at)?;
            for (j, name) in method.names.iter().enumerate() {
                if !seen.insert(name.clone()) {
                    return Err(ConfigError::new(
                        format!("{at}.name[{j}]"),
                        "names a method an earlier methodConfig already names",
                    ));
                }
            }
            methods.push(method);
        }
        let throttling = field(document, "retryThrottling")
            .map(parse_throttling)
            .transpose()?;
        Ok(Self {
            methods,
            throttling,
            idempotent_methods: Vec::new(),
        })
    }

    /// Declares methods idempotent in code, as `"idempotent": true` does in
    /// the JSON: `"package.Service"` for a whole service,
    /// `"package.Service/Method"` for one method, `""` for every method.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when `name` is none of these forms.
    ///
    /// ```
    /// use tonic_deadline::service_config::ServiceConfig;
    /// let config = ServiceConfig::from_json(r#"{"methodConfig":[{"name":[{"service":"kv.Store"}],
    ///   "hedgingPolicy":{"maxAttempts":2,"hedgingDelay":"0.01s"}}]}"#)?
    ///     .idempotent("kv.Store/Get")?;
    /// assert!(config.resolve("/kv.Store/Get").idempotent);
    /// assert!(!config.resolve("/kv.Store/Put").idempotent);
    /// # Ok::<(), tonic_deadline::service_config::ConfigError>(())
    /// ```
    pub fn idempotent(mut self, name: &str) -> Result<Self, ConfigError> {
        let parsed = match name.split_once('/') {
            None if name.is_empty() => MethodName::Default,
            None => MethodName::Service(name.to_owned()),
            Some((s, m)) if !s.is_empty() && !m.is_empty() && !m.contains('/') => {
                MethodName::Method(s.to_owned(), m.to_owned())
            }
            Some(_) => {
                return Err(ConfigError::new(
                    "idempotent",
                    format!("{name:?} is not \"package.Service\" or \"package.Service/Method\""),
                ));
            }
        };
        self.idempotent_methods.push(parsed);
        Ok(self)
    }

    /// The config that applies to a call of `path` (`/package.Service/Method`):
    /// the one naming the method, else the one naming its service, else the
    /// default, else none.
    pub fn method(&self, path: &str) -> Option<&MethodConfig> {
        let (service, method) = split_path(path)?;
        self.methods
            .iter()
            .flat_map(|m| m.names.iter().map(move |n| (n, m)))
            .filter(|(n, _)| n.matches(service, method))
            .max_by_key(|(n, _)| n.rank())
            .map(|(_, m)| m)
    }
}

impl ServiceConfig {
    /// What applies to a call of `path` (`/package.Service/Method`).
    pub fn resolve(&self, path: &str) -> Resolved<'_> {
        let method = self.method(path);
        let in_code = split_path(path).is_some_and(|(service, m)| {
            self.idempotent_methods
                .iter()
                .any(|n| n.matches(service, m))
        });
        Resolved {
            policy: method.and_then(|m| m.policy.as_ref()),
            timeout: method.and_then(|m| m.timeout),
            wait_for_ready: method.and_then(|m| m.wait_for_ready) == Some(true),
            idempotent: in_code || method.is_some_and(|m| m.idempotent),
        }
    }

    /// Whether every method `name` covers is declared idempotent.
    fn covers_idempotent(&self, config: &MethodConfig, name: &MethodName) -> bool {
        config.idempotent
            || self.idempotent_methods.iter().any(|n| match (n, name) {
                (MethodName::Default, _) => true,
                (MethodName::Service(a), MethodName::Service(b)) => a == b,
                (MethodName::Service(a), MethodName::Method(b, _)) => a == b,
                (MethodName::Method(a, x), MethodName::Method(b, y)) => a == b && x == y,
                _ => false,
            })
    }

    /// Warns, once per `methodConfig`, about outcome-unknown codes listed as
    /// retryable for methods not declared idempotent: they are not retried.
    pub(crate) fn warn_outcome_unknown(&self) {
        for (i, config) in self.methods.iter().enumerate() {
            let Some(Policy::Retry(retry)) = &config.policy else {
                continue;
            };
            let unknown: Vec<&str> = [Code::DeadlineExceeded, Code::Cancelled]
                .into_iter()
                .filter(|c| retry.retryable.contains(*c))
                .map(code_name)
                .collect();
            let all_idempotent = config
                .names
                .iter()
                .all(|n| self.covers_idempotent(config, n));
            if !unknown.is_empty() && !all_idempotent {
                tracing::warn!(
                    "methodConfig[{i}].retryPolicy.retryableStatusCodes lists {} for methods not \
                     declared idempotent: the server may have done the work, so they are not \
                     retried there (declare \"idempotent\": true if repeating the call is harmless)",
                    unknown.join(" and "),
                );
            }
        }
    }
}

/// `/package.Service/Method` → (`package.Service`, `Method`).
pub(crate) fn split_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix('/')?;
    let (service, method) = rest.split_once('/')?;
    (!service.is_empty() && !method.is_empty() && !method.contains('/'))
        .then_some((service, method))
}

fn parse_method(value: &Value, at: &str) -> Result<MethodConfig, ConfigError> {
    let fields = object(value, at)?;
    let mut names = Vec::new();
    let listed = match field(fields, "name") {
        None => &[][..],
        Some(list) => list
            .as_array()
            .ok_or_else(|| ConfigError::new(format!("{at}.name"), "must be a list"))?,
    };
    for (j, name) in listed.iter().enumerate() {
        let name_at = format!("{at}.name[{j}]");
        let name = object(name, &name_at)?;
        let text = |key: &str| -> Result<Option<String>, ConfigError> {
            match field(name, key) {
                None => Ok(None),
                Some(Value::String(s)) if s.is_empty() => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(ConfigError::new(
                    format!("{name_at}.{key}"),
                    "must be a string",
                )),
            }
        };
        names.push(match (text("service")?, text("method")?) {
            (None, None) => MethodName::Default,
            (Some(s), None) => MethodName::Service(s),
            (Some(s), Some(m)) => MethodName::Method(s, m),
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    format!("{name_at}.service"),
                    "a method needs its service",
                ));
            }
        });
    }
    let flag = |key: &str| -> Result<Option<bool>, ConfigError> {
        match field(fields, key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ConfigError::new(
                format!("{at}.{key}"),
                "must be true or false",
            )),
        }
    };
    let idempotent = flag("idempotent")?.unwrap_or(false);
    let wait_for_ready = flag("waitForReady")?;
    let timeout = field(fields, "timeout")
        .map(|v| positive_duration(v, &format!("{at}.timeout")))
        .transpose()?;
    let policy = match (field(fields, "retryPolicy"), field(fields, "hedgingPolicy")) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                format!("{at}.hedgingPolicy"),
                "a methodConfig may have a retryPolicy or a hedgingPolicy, not both",
            ));
        }
        (Some(retry), None) => Some(Policy::Retry(parse_retry(
            retry,
            &format!("{at}.retryPolicy"),
        )?)),
        (None, Some(hedge)) => Some(Policy::Hedge(parse_hedge(
            hedge,
            &format!("{at}.hedgingPolicy"),
        )?)),
        (None, None) => None,
    };
    Ok(MethodConfig {
        names,
        policy,
        idempotent,
        timeout,
        wait_for_ready,
    })
}

/// The value of `name` in `fields`, matched without regard to case as
/// grpc-go's JSON decoder matches it (its examples write `"MaxAttempts"`);
/// a JSON `null` is no value.
fn field<'a>(fields: &'a serde_json::Map<String, Value>, name: &str) -> Option<&'a Value> {
    fields
        .get(name)
        .or_else(|| {
            fields
                .iter()
                .find(|(key, _)| key.eq_ignore_ascii_case(name))
                .map(|(_, value)| value)
        })
        .filter(|v| !v.is_null())
}

fn object<'a>(
    value: &'a Value,
    at: &str,
) -> Result<&'a serde_json::Map<String, Value>, ConfigError> {
    value
        .as_object()
        .ok_or_else(|| ConfigError::new(at, "must be an object"))
}

fn required<'a>(
    fields: &'a serde_json::Map<String, Value>,
    at: &str,
    name: &str,
) -> Result<&'a Value, ConfigError> {
    field(fields, name).ok_or_else(|| ConfigError::new(format!("{at}.{name}"), "is required"))
}

fn max_attempts(value: &Value, at: &str) -> Result<u32, ConfigError> {
    let n = value
        .as_u64()
        .or_else(|| {
            value
                .as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                .map(|f| f as u64)
        })
        .ok_or_else(|| ConfigError::new(at, "must be a whole number"))?;
    if n < 2 {
        return Err(ConfigError::new(
            at,
            "must be at least 2 (the first attempt counts)",
        ));
    }
    Ok(n.min(u64::from(MAX_ATTEMPTS_LIMIT)) as u32)
}

fn positive_duration(value: &Value, at: &str) -> Result<Duration, ConfigError> {
    let d = duration(value, at)?;
    if d.is_zero() {
        return Err(ConfigError::new(at, "must be greater than zero"));
    }
    Ok(d)
}

/// A protobuf JSON duration: decimal seconds with an `s` suffix, up to nine
/// fractional digits ("0.1s", "3s", "1.000000001s", and ".01s" as grpc-go
/// reads it).
fn duration(value: &Value, at: &str) -> Result<Duration, ConfigError> {
    let text = value
        .as_str()
        .ok_or_else(|| ConfigError::new(at, "must be a duration string such as \"0.1s\""))?;
    parse_duration(text).ok_or_else(|| {
        ConfigError::new(
            at,
            format!(
                "{text:?} is not a duration: decimal seconds ending in \"s\", such as \"0.1s\""
            ),
        )
    })
}

fn parse_duration(text: &str) -> Option<Duration> {
    let number = text.strip_suffix('s')?;
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    // Either part may be empty, not both: grpc-go reads ".01s" and "1.s".
    if (whole.is_empty() && fraction.is_empty())
        || !digits(whole)
        || !digits(fraction)
        || fraction.len() > 9
    {
        return None;
    }
    let secs: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let nanos: u32 = if fraction.is_empty() {
        0
    } else {
        format!("{fraction:0<9}").parse().ok()?
    };
    // protobuf's Duration stops at 315 576 000 000 s (10 000 years).
    (secs <= 315_576_000_000).then(|| Duration::new(secs, nanos))
}

fn positive_number(value: &Value, at: &str) -> Result<f64, ConfigError> {
    let x = value
        .as_f64()
        .ok_or_else(|| ConfigError::new(at, "must be a number"))?;
    if !(x.is_finite() && x > 0.0) {
        return Err(ConfigError::new(at, "must be greater than zero"));
    }
    Ok(x)
}

fn codes(value: &Value, at: &str, allow_empty: bool) -> Result<Codes, ConfigError> {
    let list = value
        .as_array()
        .ok_or_else(|| ConfigError::new(at, "must be a list of status codes"))?;
    let mut set = Codes::empty();
    for (i, item) in list.iter().enumerate() {
        let code = match item {
            Value::String(name) => code_from_name(name),
            Value::Number(n) => n
                .as_u64()
                .filter(|n| *n <= 16)
                .map(|n| Code::from_i32(n as i32)),
            _ => None,
        }
        .ok_or_else(|| {
            ConfigError::new(
                format!("{at}[{i}]"),
                format!("{item} is not a status code (a name such as \"UNAVAILABLE\", or 1..16)"),
            )
        })?;
        if code == Code::Ok {
            return Err(ConfigError::new(
                format!("{at}[{i}]"),
                "OK is not a failure",
            ));
        }
        set = set.with(code);
    }
    if set.is_empty() && !allow_empty {
        return Err(ConfigError::new(at, "must list at least one status code"));
    }
    Ok(set)
}

fn parse_retry(value: &Value, at: &str) -> Result<RetryPolicy, ConfigError> {
    let fields = object(value, at)?;
    let path = |name: &str| format!("{at}.{name}");
    let max_attempts = max_attempts(required(fields, at, "maxAttempts")?, &path("maxAttempts"))?;
    let initial_backoff = positive_duration(
        required(fields, at, "initialBackoff")?,
        &path("initialBackoff"),
    )?;
    let max_backoff = positive_duration(required(fields, at, "maxBackoff")?, &path("maxBackoff"))?;
    let backoff_multiplier = positive_number(
        required(fields, at, "backoffMultiplier")?,
        &path("backoffMultiplier"),
    )?;
    let retryable = codes(
        required(fields, at, "retryableStatusCodes")?,
        &path("retryableStatusCodes"),
        false,
    )?;
    Ok(RetryPolicy {
        max_attempts,
        initial_backoff,
        max_backoff,
        backoff_multiplier,
        retryable,
    })
}

fn parse_hedge(value: &Value, at: &str) -> Result<HedgingPolicy, ConfigError> {
    let fields = object(value, at)?;
    let path = |name: &str| format!("{at}.{name}");
    let max_attempts = max_attempts(required(fields, at, "maxAttempts")?, &path("maxAttempts"))?;
    let hedging_delay = match field(fields, "hedgingDelay") {
        Some(v) => duration(v, &path("hedgingDelay"))?,
        None => Duration::ZERO,
    };
    let non_fatal = match field(fields, "nonFatalStatusCodes") {
        Some(v) => codes(v, &path("nonFatalStatusCodes"), true)?,
        None => Codes::empty(),
    };
    Ok(HedgingPolicy {
        max_attempts,
        hedging_delay,
        non_fatal,
    })
}

fn parse_throttling(value: &Value) -> Result<Throttling, ConfigError> {
    let at = "retryThrottling";
    let fields = object(value, at)?;
    let max_tokens_at = format!("{at}.maxTokens");
    let max_tokens = required(fields, at, "maxTokens")?
        .as_f64()
        .ok_or_else(|| ConfigError::new(&max_tokens_at, "must be a number"))?;
    if !(max_tokens > 0.0 && max_tokens <= 1000.0) || max_tokens.fract() != 0.0 {
        return Err(ConfigError::new(
            max_tokens_at,
            "must be a whole number in (0, 1000]",
        ));
    }
    let ratio_at = format!("{at}.tokenRatio");
    let ratio = positive_number(required(fields, at, "tokenRatio")?, &ratio_at)?;
    // Three decimals are kept, as gRPC does; a ratio that rounds to zero
    // would never give a token back.
    let token_ratio_milli = (ratio * 1000.0).round();
    if token_ratio_milli < 1.0 || token_ratio_milli > f64::from(u32::MAX) {
        return Err(ConfigError::new(ratio_at, "must be at least 0.001"));
    }
    Ok(Throttling {
        max_tokens: max_tokens as u32,
        token_ratio_milli: token_ratio_milli as u32,
    })
}

#[cfg(test)]
mod tests;
