//! What retried and hedged calls share: the frozen configuration, the
//! channel's one limiter, the learned attempt latencies and the planner that
//! reads them, the replay buffer and the reading of an attempt's outcome.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tonic::Code;

use super::limiter::Limiter;
use super::observer::Observer;
use crate::BoxError;
use crate::client::{Avoid, Replica, WaitForReady};
use crate::scope::Scope;
use crate::service_config::{Codes, HedgingPolicy, Resolved, ServiceConfig};
use crate::wire::timeout_header::{self, GRPC_TIMEOUT};

/// The header a server sets to ask for a pause before the next attempt.
pub(crate) use crate::wire::PUSHBACK;
/// The header every attempt after the first carries.
pub(crate) const PREVIOUS_ATTEMPTS: &str = "grpc-previous-rpc-attempts";

/// gRPC's default replay buffer per call (grpc-go's figure).
pub(crate) const DEFAULT_REPLAY_BUFFER: usize = 256 * 1024;
/// Recent attempt latencies kept per method.
const WINDOW: usize = 128;
/// Samples needed before the adaptive hedging delay replaces `hedgingDelay`.
/// Whether an attempt fits needs only one: from the first answered attempt
/// on, a doomed attempt is not sent.
pub(crate) const HEDGING_DELAY_SAMPLES: usize = 8;

/// How long a replica that failed rests unless set otherwise.
pub(crate) const DEFAULT_REPLICA_REST: Duration = Duration::from_secs(1);

/// What the layer's builder collects.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Who observes the calls (metrics); none by default.
    pub(crate) observer: Option<Arc<dyn Observer>>,
    pub(crate) per_attempt_timeout: Option<Duration>,
    pub(crate) replay_buffer: usize,
    pub(crate) budget: Option<super::RetryBudget>,
    pub(crate) min_attempt_time: Duration,
    pub(crate) attempt_time_quantile: f64,
    /// The quantile of the answered attempts' latency a hedge waits for,
    /// instead of `hedgingDelay`.
    pub(crate) adaptive_hedging_delay: Option<f64>,
    /// A failure this layer stopped retrying answers its caller with
    /// `grpc-retry-pushback-ms: -1`: the chain's one retry budget.
    pub(crate) chain_budget: bool,
    /// How long a replica that failed is left out of attempts while
    /// another is at hand.
    pub(crate) replica_rest: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            observer: None,
            per_attempt_timeout: None,
            replay_buffer: DEFAULT_REPLAY_BUFFER,
            budget: None,
            min_attempt_time: Duration::from_millis(1),
            attempt_time_quantile: 0.5,
            adaptive_hedging_delay: None,
            chain_budget: true,
            replica_rest: DEFAULT_REPLICA_REST,
        }
    }
}

/// The state every service one layer builds (one channel) and all their
/// clones share.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) config: ServiceConfig,
    pub(crate) settings: Settings,
    pub(crate) limiter: Limiter,
    latencies: Mutex<HashMap<String, Latencies>>,
    rng: AtomicU64,
    /// What the balancer below said of its replicas.
    replicas: Replicas,
}

/// The replicas of the balanced channel below, as its answers told them:
/// how many it holds (0 until one answer named its replica) and when each
/// one that failed last did.
#[derive(Debug, Default)]
struct Replicas {
    count: AtomicUsize,
    failed: Mutex<HashMap<u64, Instant>>,
}

impl Core {
    pub(crate) fn new(config: ServiceConfig, settings: Settings) -> Self {
        let limiter = match (&settings.budget, config.throttling) {
            (Some(budget), _) => Limiter::budget(budget),
            (None, Some(throttling)) => Limiter::throttle(throttling),
            (None, None) => Limiter::Unlimited,
        };
        Self {
            config,
            settings,
            limiter,
            latencies: Mutex::new(HashMap::new()),
            rng: AtomicU64::new(RandomState::new().hash_one(0x5eed_u64) | 1),
            replicas: Replicas::default(),
        }
    }

    pub(crate) fn observer(&self) -> Option<&dyn Observer> {
        self.settings.observer.as_deref()
    }

    /// A uniform random number in [0, 1) (splitmix64 over a shared state).
    pub(crate) fn random(&self) -> f64 {
        let mut z = self
            .rng
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Records how long an answered attempt of `path` took.
    pub(crate) fn record_latency(&self, path: &str, took: Duration) {
        if let Ok(mut map) = self.latencies.lock() {
            match map.get_mut(path) {
                Some(window) => window.push(took),
                None => {
                    let mut window = Latencies::default();
                    window.push(took);
                    map.insert(path.to_owned(), window);
                }
            }
        }
    }

    /// How long a hedged call of `path` waits before its next attempt: the
    /// adaptive quantile of the method's answered attempts once
    /// [`HEDGING_DELAY_SAMPLES`] were seen, `hedgingDelay` otherwise.
    pub(crate) fn hedging_delay(&self, path: &str, policy: &HedgingPolicy) -> Duration {
        let learned = self.settings.adaptive_hedging_delay.and_then(|q| {
            let map = self.latencies.lock().ok()?;
            map.get(path)?.quantile(q, HEDGING_DELAY_SAMPLES)
        });
        learned.unwrap_or(policy.hedging_delay)
    }

    /// The least time an attempt of `path` needs to be of use: the
    /// configured quantile of the recent answered attempts (one is enough),
    /// never below the configured floor; the floor alone before any answer.
    pub(crate) fn useful_attempt(&self, path: &str) -> Duration {
        let learned = self.latencies.lock().ok().and_then(|map| {
            map.get(path)?
                .quantile(self.settings.attempt_time_quantile, 1)
        });
        learned.map_or(self.settings.min_attempt_time, |l| {
            l.max(self.settings.min_attempt_time)
        })
    }

    /// Whether an attempt of `path` started `after` from now still fits in
    /// what `scope` has left. A scope without a deadline always fits.
    pub(crate) fn fits(&self, scope: Option<&Scope>, path: &str, after: Duration) -> bool {
        match scope.and_then(Scope::remaining) {
            None => true,
            Some(left) => left >= after + self.useful_attempt(path),
        }
    }

    /// The planner: may another attempt of `path` start `after` from now?
    /// Refused, and counted, when it cannot fit what `scope` has left, or
    /// when the throttle (or budget) says no; a budget is charged for an
    /// attempt it grants.
    pub(crate) fn permit(&self, scope: Option<&Scope>, path: &str, after: Duration) -> Permit {
        if !self.fits(scope, path, after) {
            if let Some(o) = self.observer() {
                o.attempt_refused_for_time();
            }
            return Permit::NoTime;
        }
        if !self.limiter.allow_retry() {
            if let Some(o) = self.observer() {
                o.retry_throttled();
            }
            return Permit::Throttled;
        }
        Permit::Send
    }

    /// Reads how an attempt of `path` that took `took` ended, and tells the
    /// throttle (a status in `failures` costs a token, a committed attempt
    /// gives some back) and the learned latencies (attempts the server
    /// answered only).
    pub(crate) fn settle<B>(
        &self,
        path: &str,
        took: Duration,
        result: Result<Response<B>, BoxError>,
        failures: Codes,
    ) -> Outcome<B> {
        let (replica, result) = crate::client::replica::take_replica(result);
        let mut outcome = classify(result);
        match &mut outcome {
            Outcome::Committed(_) => {
                self.limiter.on_attempt(false);
                self.record_latency(path, took);
                self.note_replica(replica, false);
            }
            Outcome::Failed {
                code,
                answered,
                replica: at,
                ..
            } => {
                *at = replica;
                if *answered {
                    self.record_latency(path, took);
                }
                self.limiter.on_attempt(failures.contains(*code));
            }
        }
        outcome
    }

    /// Notes how an attempt at `replica` ended: `failed` with a status its
    /// policy retries, or not. Only with the chain budget on: without it
    /// every hop retries wherever the balancer sends it, as before.
    pub(crate) fn note_replica(&self, replica: Option<Replica>, failed: bool) {
        let Some(replica) = replica.filter(|_| self.settings.chain_budget) else {
            return;
        };
        self.replicas
            .count
            .store(replica.replicas(), Ordering::Relaxed);
        if let Ok(mut map) = self.replicas.failed.lock() {
            if failed {
                map.insert(replica.id(), Instant::now());
            } else {
                map.remove(&replica.id());
            }
        }
    }

    /// The replicas the next attempt must not go to: the one the last
    /// attempt `failed` at, and those resting (their last attempt failed
    /// within [`Settings::replica_rest`]) — `None` when that names none, or
    /// every one (a retry then goes wherever the balancer sends it, or, for
    /// a failure marked for the chain, nowhere). A channel whose balancer
    /// names no replica pays one atomic load.
    pub(crate) fn avoid(&self, failed: Option<Replica>) -> Option<Avoid> {
        if !self.settings.chain_budget {
            return None;
        }
        let count = self.replicas.count.load(Ordering::Relaxed);
        if count == 0 {
            return None;
        }
        let mut avoid = Avoid::default();
        if let Some(replica) = failed {
            avoid.insert(replica.id());
        }
        let now = Instant::now();
        if let Ok(map) = self.replicas.failed.lock() {
            for (id, at) in map.iter() {
                if now.saturating_duration_since(*at) < self.settings.replica_rest {
                    avoid.insert(*id);
                }
            }
        }
        (!avoid.is_empty() && avoid.len() < count).then_some(avoid)
    }

    /// The scope one attempt runs in: a child of the caller's, capped by the
    /// per-attempt timeout if one is set.
    pub(crate) fn attempt_scope(&self, caller: &Scope) -> Scope {
        match self.settings.per_attempt_timeout {
            Some(cap) => caller.with_timeout(cap),
            None => caller.child(),
        }
    }
}

/// A ring of recent latencies, in microseconds.
#[derive(Debug, Default)]
struct Latencies {
    samples: Vec<u32>,
    next: usize,
}

impl Latencies {
    fn push(&mut self, took: Duration) {
        let us = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        if self.samples.len() < WINDOW {
            self.samples.push(us);
        } else {
            self.samples[self.next] = us;
        }
        self.next = (self.next + 1) % WINDOW;
    }

    fn quantile(&self, q: f64, min_samples: usize) -> Option<Duration> {
        if self.samples.is_empty() || self.samples.len() < min_samples {
            return None;
        }
        let mut sorted = self.samples.clone();
        sorted.sort_unstable();
        let i = ((sorted.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        Some(Duration::from_micros(u64::from(sorted[i])))
    }
}

/// The caller's scope for a call: the one the request carries, else the
/// task's current one; a per-request timeout (`grpc-timeout` written by
/// `tonic::Request::set_timeout`) becomes part of it, so it counts from the
/// call, not from each attempt.
///
/// A malformed header is left for the client layer to refuse.
pub(crate) fn caller_scope<B>(request: &mut Request<B>) -> Option<Scope> {
    let scope = match request.extensions().get::<Scope>() {
        Some(scope) => Some(scope.clone()),
        None => Scope::try_current(),
    };
    let Ok(Some(timeout)) = timeout_header::from_headers(request.headers()) else {
        return scope;
    };
    request.headers_mut().remove(GRPC_TIMEOUT);
    let base = scope.unwrap_or_else(Scope::background);
    Some(base.with_timeout(timeout))
}

/// The caller's scope for a call with a policy: [`caller_scope`], under the
/// method's `timeout` and marked with its `waitForReady` (see
/// [`pass_through`]).
pub(crate) fn policy_scope<B>(request: &mut Request<B>, resolved: &Resolved<'_>) -> Option<Scope> {
    mark_wait_for_ready(request, resolved);
    let scope = caller_scope(request);
    match resolved.timeout {
        Some(timeout) => Some(
            scope
                .unwrap_or_else(Scope::background)
                .with_timeout(timeout),
        ),
        None => scope,
    }
}

/// A call without a policy of this layer: the two fields of a method's
/// config that hold for every call still apply, through the request the
/// next layer sees — `waitForReady` as a [`WaitForReady`], `timeout` as a
/// capped scope. A call without them is passed on untouched.
pub(crate) fn pass_through<B>(mut request: Request<B>, resolved: &Resolved<'_>) -> Request<B> {
    mark_wait_for_ready(&mut request, resolved);
    if let Some(timeout) = resolved.timeout {
        let scope = caller_scope(&mut request)
            .unwrap_or_else(Scope::background)
            .with_timeout(timeout);
        request.extensions_mut().insert(scope);
    }
    request
}

fn mark_wait_for_ready<B>(request: &mut Request<B>, resolved: &Resolved<'_>) {
    if resolved.wait_for_ready {
        request.extensions_mut().insert(WaitForReady);
    }
}

/// What the message of a call's last answer gets when no further attempt
/// fitted in what its deadline left: the code stays the attempt's (an
/// `UNAVAILABLE` says nothing was done, safe to try later), and the
/// message says why the call ended before its deadline.
pub(crate) const NO_TIME_LEFT: &str = "no further attempt fitted before the deadline";

use crate::wire::DO_NOT_RETRY;

impl Core {
    /// The answer of a call whose retries (or hedges) this layer spent: the
    /// last failure, telling the caller not to try again (when the chain
    /// budget is on). A caller whose handler returns this status answers its
    /// own caller so, and the failure is retried once in the chain, at the
    /// hop above it, not at every hop.
    ///
    /// The mark is also noted on the root of the call's `scope` (the
    /// request's, inside a handler): a handler that answers a failure of
    /// its own making, without the mark, still tells its caller (the
    /// server layer adds it).
    pub(crate) fn spent<B>(
        &self,
        scope: Option<&Scope>,
        result: Result<Response<B>, BoxError>,
    ) -> Result<Response<B>, BoxError> {
        if !self.settings.chain_budget {
            return result;
        }
        if let Some(o) = self.observer() {
            o.retries_spent();
        }
        if let Some(scope) = scope {
            scope.note_retries_spent();
        }
        match result {
            Ok(mut response) => {
                response.headers_mut().insert(PUSHBACK, DO_NOT_RETRY);
                Ok(response)
            }
            Err(err) => {
                let mut status = match err.downcast::<tonic::Status>() {
                    Ok(status) => *status,
                    Err(other) => tonic::Status::from_error(other),
                };
                status.metadata_mut().insert(
                    crate::wire::PUSHBACK_KEY,
                    tonic::metadata::MetadataValue::from_static("-1"),
                );
                Err(Box::new(status))
            }
        }
    }
}

/// The last attempt's answer, as the call's when no further attempt fitted
/// in what was left: its status, with [`NO_TIME_LEFT`] added to its message
/// (an error's, or a trailers-only answer's `grpc-message`).
pub(crate) fn no_time_left<B>(
    result: Result<Response<B>, BoxError>,
) -> Result<Response<B>, BoxError> {
    fn amended(message: &str) -> String {
        if message.is_empty() {
            NO_TIME_LEFT.to_owned()
        } else {
            format!("{message}; {NO_TIME_LEFT}")
        }
    }
    match result {
        Ok(mut response) => {
            let headers = response.headers_mut();
            // `grpc-message` is percent-encoded; the text added is printable
            // ASCII without `%`, which stands for itself.
            let message = headers
                .get(crate::wire::GRPC_MESSAGE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            if let Ok(value) = HeaderValue::from_str(&amended(message)) {
                headers.insert(crate::wire::GRPC_MESSAGE, value);
            }
            Ok(response)
        }
        Err(err) => {
            let status = match err.downcast::<tonic::Status>() {
                Ok(status) => *status,
                Err(other) => tonic::Status::from_error(other),
            };
            Err(Box::new(tonic::Status::with_details_and_metadata(
                status.code(),
                amended(status.message()),
                Bytes::copy_from_slice(status.details()),
                status.metadata().clone(),
            )))
        }
    }
}

/// The planner's answer to "may another attempt start?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permit {
    Send,
    /// What the caller's scope has left cannot fit it.
    NoTime,
    /// Throttling or the budget says no.
    Throttled,
}

/// What the server's `grpc-retry-pushback-ms` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushback {
    /// No header: back off as the policy says.
    None,
    /// Wait exactly this long, and start the backoff sequence afresh.
    Delay(Duration),
    /// Negative or unparseable: do not retry.
    Stop,
}

pub(crate) fn pushback(headers: &HeaderMap) -> Pushback {
    let Some(value) = headers.get(PUSHBACK) else {
        return Pushback::None;
    };
    let text = value.to_str().unwrap_or("");
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Pushback::Stop;
    }
    match text.parse::<u64>() {
        Ok(ms) => Pushback::Delay(Duration::from_millis(ms)),
        Err(_) => Pushback::Stop,
    }
}

/// How an attempt ended, as far as retrying is concerned.
#[derive(Debug)]
pub(crate) enum Outcome<B> {
    /// Response headers arrived (or an OK): the call is committed to it.
    Committed(Response<B>),
    /// A failure with a status the policy may act on.
    Failed {
        code: Code,
        pushback: Pushback,
        /// The status came from the server (a trailers-only answer), so the
        /// attempt's time says how long an answer takes; not for a failure
        /// made on this side (no connection, a local timeout).
        answered: bool,
        /// The replica that failed, when the balancer below said.
        replica: Option<Replica>,
        result: Result<Response<B>, BoxError>,
    },
}

/// Reads an attempt's result: a trailers-only response or an error is a
/// failure with its code; anything else commits.
pub(crate) fn classify<B>(result: Result<Response<B>, BoxError>) -> Outcome<B> {
    match result {
        Ok(response) => {
            let Some(status) = response.headers().get(crate::wire::GRPC_STATUS) else {
                return Outcome::Committed(response);
            };
            let code = status
                .to_str()
                .ok()
                .and_then(|s| s.parse::<i32>().ok())
                .map_or(Code::Unknown, Code::from_i32);
            if code == Code::Ok {
                return Outcome::Committed(response);
            }
            Outcome::Failed {
                code,
                pushback: pushback(response.headers()),
                answered: true,
                replica: None,
                result: Ok(response),
            }
        }
        Err(err) => {
            let status = match err.downcast::<tonic::Status>() {
                Ok(status) => *status,
                Err(other) => tonic::Status::from_error(other),
            };
            Outcome::Failed {
                code: status.code(),
                pushback: Pushback::None,
                answered: false,
                replica: None,
                result: Err(Box::new(status)),
            }
        }
    }
}

/// Whether `code` may lead to another attempt: listed, and — for the codes
/// whose outcome is unknown — only for idempotent methods.
pub(crate) fn may_repeat(codes: Codes, code: Code, idempotent: bool) -> bool {
    codes.contains(code)
        && (idempotent || !matches!(code, Code::DeadlineExceeded | Code::Cancelled))
}

/// The parts of the caller's request each attempt is made from.
#[derive(Debug)]
pub(crate) struct Template {
    method: http::Method,
    uri: http::Uri,
    version: http::Version,
    headers: HeaderMap,
    extensions: http::Extensions,
}

impl Template {
    pub(crate) fn new(parts: http::request::Parts) -> Self {
        Self {
            method: parts.method,
            uri: parts.uri,
            version: parts.version,
            headers: parts.headers,
            extensions: parts.extensions,
        }
    }

    pub(crate) fn path(&self) -> &str {
        self.uri.path()
    }

    /// Attempt `n` (1-based) with `body`, running in `scope`, sent to none
    /// of the replicas `avoid` names.
    pub(crate) fn attempt(
        &self,
        n: u32,
        body: tonic::body::Body,
        scope: Option<Scope>,
        avoid: Option<Avoid>,
    ) -> Request<tonic::body::Body> {
        let mut request = Request::new(body);
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.version_mut() = self.version;
        *request.headers_mut() = self.headers.clone();
        *request.extensions_mut() = self.extensions.clone();
        if n > 1 {
            request
                .headers_mut()
                .insert(PREVIOUS_ATTEMPTS, HeaderValue::from(n - 1));
        }
        if let Some(scope) = scope {
            request.extensions_mut().insert(scope);
        }
        if let Some(avoid) = avoid {
            request.extensions_mut().insert(avoid);
        }
        request
    }
}

/// The request body, read once.
#[derive(Debug)]
pub(crate) enum Buffered {
    /// Complete within the buffer: replayed for every attempt.
    Replayable(Replay),
    /// A live stream or too large: the call is sent once, with this body.
    Live(tonic::body::Body),
}

/// Reads `body` while its frames are ready at once, up to `limit` bytes.
///
/// A body still pending is a live stream (client streaming, bidi): it
/// cannot be replayed without holding it back, so the call commits.
pub(crate) fn poll_buffer(
    body: &mut Option<tonic::body::Body>,
    data: &mut BytesMut,
    limit: usize,
    cx: &mut Context<'_>,
) -> Poll<Result<Buffered, BoxError>> {
    let Some(live) = body.as_mut() else {
        return Poll::Ready(Err("request body read twice".into()));
    };
    loop {
        match Pin::new(&mut *live).poll_frame(cx) {
            Poll::Ready(None) => {
                return Poll::Ready(Ok(Buffered::Replayable(Replay {
                    data: data.split().freeze(),
                    trailers: None,
                })));
            }
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(chunk) => {
                    data.extend_from_slice(&chunk);
                    if data.len() > limit {
                        return Poll::Ready(Ok(live_rest(body, data)));
                    }
                }
                Err(frame) => {
                    // Trailers end the body.
                    let trailers = frame.into_trailers().ok();
                    return Poll::Ready(Ok(Buffered::Replayable(Replay {
                        data: data.split().freeze(),
                        trailers,
                    })));
                }
            },
            Poll::Ready(Some(Err(status))) => return Poll::Ready(Err(Box::new(status))),
            Poll::Pending => return Poll::Ready(Ok(live_rest(body, data))),
        }
    }
}

fn live_rest(body: &mut Option<tonic::body::Body>, data: &mut BytesMut) -> Buffered {
    let rest = body.take().unwrap_or_else(tonic::body::Body::empty);
    let head = data.split().freeze();
    Buffered::Live(tonic::body::Body::new(Prefixed {
        head: (!head.is_empty()).then_some(head),
        rest,
    }))
}

/// A request body read in full, handed out again for each attempt.
#[derive(Debug, Clone)]
pub(crate) struct Replay {
    data: Bytes,
    trailers: Option<HeaderMap>,
}

impl Replay {
    pub(crate) fn body(&self) -> tonic::body::Body {
        tonic::body::Body::new(ReplayBody {
            data: (!self.data.is_empty()).then(|| self.data.clone()),
            trailers: self.trailers.clone(),
        })
    }
}

struct ReplayBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Body for ReplayBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// What was read of a live body, then the rest of it.
struct Prefixed {
    head: Option<Bytes>,
    rest: tonic::body::Body,
}

impl Body for Prefixed {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(head) = self.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_none() && self.rest.is_end_stream()
    }
}

/// Sets `timer` (a backoff or the next hedge) to fire `after` from now, or
/// when `scope` reaches its deadline if that comes first.
pub(crate) fn arm(timer: &mut Option<Pin<Box<Sleep>>>, scope: Option<&Scope>, after: Duration) {
    let at = Instant::now() + after;
    let at = match scope.and_then(Scope::deadline) {
        Some(deadline) => deadline.min(at),
        None => at,
    };
    match timer.as_mut() {
        Some(sleep) => sleep.as_mut().reset(at),
        None => *timer = Some(Box::pin(tokio::time::sleep_until(at))),
    }
}
