//! The registry behind [`Metrics`]: every series registered once per
//! handle, and per-method handles so that a request finds its series with
//! one lookup.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Registry, Unit};

use super::histogram::{COUNT_BOUNDS, DELAY_BOUNDS, Hist, Histogram};

/// How a request scope of the server layer ended: the `cause` label of
/// `tonic_deadline_scope_ended_total`, and what [`Metrics::scopes_ended`]
/// counts. Finer than [`Cause`](crate::Cause): a completed request that
/// answered with an error status, and a deadline that was this server's
/// own (its default or maximum) rather than the caller's, are told apart.
///
/// ```
/// use tonic_deadline::observe::{Metrics, ScopeEnding};
/// assert_eq!(ScopeEnding::LocalCap.as_str(), "local_cap");
/// assert_eq!(Metrics::new().scopes_ended(ScopeEnding::DeadlineExceeded), 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ScopeEnding {
    /// The handler answered `OK`.
    Completed,
    /// The handler answered with another status.
    Failed,
    /// The caller's deadline passed first.
    DeadlineExceeded,
    /// This server's own deadline (its default, or its maximum below the
    /// caller's) passed first.
    LocalCap,
    /// The request was dropped before its answer: a client reset, a closed
    /// connection, or an outer layer giving up.
    Abandoned,
    /// The scope was cancelled.
    Cancelled,
}

impl ScopeEnding {
    /// Every ending, in the order of the counters made for them up front.
    const ALL: [ScopeEnding; 6] = [
        ScopeEnding::Completed,
        ScopeEnding::Failed,
        ScopeEnding::DeadlineExceeded,
        ScopeEnding::LocalCap,
        ScopeEnding::Abandoned,
        ScopeEnding::Cancelled,
    ];

    /// The `cause` label: `completed`, `failed`, `deadline_exceeded`,
    /// `local_cap`, `abandoned` or `cancelled`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ScopeEnding::Completed => "completed",
            ScopeEnding::Failed => "failed",
            ScopeEnding::DeadlineExceeded => "deadline_exceeded",
            ScopeEnding::LocalCap => "local_cap",
            ScopeEnding::Abandoned => "abandoned",
            ScopeEnding::Cancelled => "cancelled",
        }
    }
}

/// Where work was refused because its deadline had already passed: the
/// `stage` label of `tonic_deadline_refused_expired_total`, and what
/// [`Metrics::refused_expired`] counts.
///
/// ```
/// use tonic_deadline::observe::{Metrics, Stage};
/// assert_eq!(Stage::Arrival.as_str(), "arrival");
/// assert_eq!(Metrics::new().refused_expired(Stage::Client), 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Stage {
    /// The server layer: the request arrived with no budget left.
    Arrival,
    /// The admission layer: the scope had expired before a permit.
    Admission,
    /// The client layer: an outbound call whose scope had expired.
    Client,
}

impl Stage {
    /// The `stage` label: `arrival`, `admission` or `client`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Stage::Arrival => "arrival",
            Stage::Admission => "admission",
            Stage::Client => "client",
        }
    }
}

/// The `Content-Type` of [`Metrics::encode`]'s text: the header to send
/// with it where Prometheus scrapes (`/metrics`).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How many distinct methods one handle labels; calls to any further method
/// are labelled `other`, so a client inventing paths cannot grow the
/// registry without bound.
pub(crate) const MAX_METHODS: usize = 200;

/// The registry the layers report to. Cheap to clone: clones share the
/// series. See the [module docs](super) for the series it holds.
///
/// At most 200 methods (or plain-HTTP paths) are labelled per handle;
/// calls to any further one are labelled `other`, so a client inventing
/// paths cannot grow the registry without bound.
///
/// ```
/// use tonic_deadline::{ClientDeadlineLayer, ServerDeadlineLayer, observe::Metrics};
/// let metrics = Metrics::new();
/// let server = ServerDeadlineLayer::new().metrics(&metrics);
/// let client = ClientDeadlineLayer::new().metrics(&metrics);
/// # let _ = (server, client);
/// assert_eq!(metrics.unscoped_calls(), 0);
/// // The text a Prometheus server scrapes (OpenMetrics). A labelled
/// // family appears with its first series; plain counters at once.
/// let text = metrics.encode();
/// assert!(text.contains("tonic_deadline_unscoped_calls_total 0"));
/// assert!(text.ends_with("# EOF\n"));
/// ```
#[derive(Clone)]
pub struct Metrics {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    registry: Registry,
    series: Series,
    pub(super) resilience: ResilienceSeries,
    /// Per-method handles, so a request finds its series with one lookup
    /// and allocates nothing for labels.
    methods: RwLock<HashMap<Box<str>, Arc<Method>>>,
    other: Arc<Method>,
}

pub(super) type HistFamily<L> = Family<L, Hist, fn() -> Hist>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct MethodLabel {
    pub(super) grpc_method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodStatus {
    grpc_method: String,
    grpc_status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// Every family; the registry holds clones of the same series.
#[derive(Debug, Clone)]
struct Series {
    server_started: Family<MethodLabel, Counter>,
    server_duration: HistFamily<MethodStatus>,
    budget_on_entry: HistFamily<MethodLabel>,
    server_no_deadline: Family<MethodLabel, Counter>,
    attempt_started: Family<MethodLabel, Counter>,
    attempt_duration: HistFamily<MethodStatus>,
    call_duration: HistFamily<MethodStatus>,
    granted: HistFamily<MethodLabel>,
    client_no_deadline: Family<MethodLabel, Counter>,
    queue_wait: HistFamily<MethodLabel>,
    admission_refused: Family<ReasonLabel, Counter>,
    scope_ended: Family<CauseLabel, Counter>,
    /// The counters of `scope_ended`, one per `ScopeEnding::ALL` entry, made
    /// up front: a request's end increments one without a lookup.
    scope_ended_by: [Counter; 6],
    refused_expired: Family<StageLabel, Counter>,
    outlived: Counter,
    outlived_by: Hist,
    unscoped: Counter,
    left_late: Counter,
    wait_ignored: Counter,
    floods_cut: Counter,
    held: Counter,
    refused: Counter,
    unguarded: Counter,
}

fn latency() -> Hist {
    Hist::latency()
}

impl Series {
    fn register(registry: &mut Registry) -> Self {
        let scope_ended = Family::<CauseLabel, Counter>::default();
        let scope_ended_by = ScopeEnding::ALL.map(|ending| {
            scope_ended.get_or_create_owned(&CauseLabel {
                cause: ending.as_str(),
            })
        });
        let series = Series {
            server_started: Family::default(),
            server_duration: Family::new_with_constructor(latency),
            budget_on_entry: Family::new_with_constructor(latency),
            server_no_deadline: Family::default(),
            attempt_started: Family::default(),
            attempt_duration: Family::new_with_constructor(latency),
            call_duration: Family::new_with_constructor(latency),
            granted: Family::new_with_constructor(latency),
            client_no_deadline: Family::default(),
            queue_wait: Family::new_with_constructor(latency),
            admission_refused: Family::default(),
            scope_ended,
            scope_ended_by,
            refused_expired: Family::default(),
            outlived: Counter::default(),
            outlived_by: Hist::latency(),
            unscoped: Counter::default(),
            left_late: Counter::default(),
            wait_ignored: Counter::default(),
            floods_cut: Counter::default(),
            held: Counter::default(),
            refused: Counter::default(),
            unguarded: Counter::default(),
        };
        let s = series.clone();
        registry.register(
            "grpc_server_call_started",
            "Calls started on the server",
            s.server_started,
        );
        registry.register_with_unit(
            "grpc_server_call_duration",
            "Time from a call's arrival to its end on the server",
            Unit::Seconds,
            s.server_duration,
        );
        registry.register_with_unit(
            "grpc_client_attempt_duration",
            "Time from an attempt's start to its status",
            Unit::Seconds,
            s.attempt_duration,
        );
        registry.register(
            "grpc_client_attempt_started",
            "Attempts started by the client (sent to the connection)",
            s.attempt_started,
        );
        registry.register_with_unit(
            "grpc_client_call_duration",
            "Time from a call's start to its status, as the application sees it",
            Unit::Seconds,
            s.call_duration,
        );
        registry.register_with_unit(
            "tonic_deadline_server_budget_on_entry",
            "Budget a request brought (its grpc-timeout), at arrival",
            Unit::Seconds,
            s.budget_on_entry,
        );
        registry.register(
            "tonic_deadline_server_no_deadline",
            "Requests that arrived without a deadline",
            s.server_no_deadline,
        );
        registry.register_with_unit(
            "tonic_deadline_admission_queue_wait",
            "Time an admitted request waited for its permit",
            Unit::Seconds,
            s.queue_wait,
        );
        registry.register(
            "tonic_deadline_admission_refused",
            "Requests the admission layer did not admit, by reason",
            s.admission_refused,
        );
        registry.register_with_unit(
            "tonic_deadline_client_budget_granted",
            "Budget written into an outbound call's grpc-timeout",
            Unit::Seconds,
            s.granted,
        );
        registry.register(
            "tonic_deadline_client_no_deadline",
            "Outbound calls sent without a deadline",
            s.client_no_deadline,
        );
        registry.register(
            "tonic_deadline_scope_ended",
            "Request scopes ended, by cause",
            s.scope_ended,
        );
        registry.register(
            "tonic_deadline_refused_expired",
            "Work refused because its deadline had already passed, by stage",
            s.refused_expired,
        );
        registry.register(
            "tonic_deadline_outlived",
            "Scope-tied work that finished after its scope had ended",
            s.outlived,
        );
        registry.register_with_unit(
            "tonic_deadline_outlived_by",
            "How long past its scope's deadline such work finished",
            Unit::Seconds,
            s.outlived_by,
        );
        registry.register(
            "tonic_deadline_unscoped_calls",
            "Outbound calls that found no scope (allowed with a warning, or refused)",
            s.unscoped,
        );
        registry.register(
            "tonic_deadline_budget_left_late",
            "Outbound calls whose request left more than 10 ms (and 5 % of the budget) after its grpc-timeout \
             was written: the server was told that much more than the caller had",
            s.left_late,
        );
        registry.register(
            "tonic_deadline_wait_for_ready_ignored",
            "Outbound calls that asked to wait for ready and were failed at once for want of a connection: \
             the channel below the client layer does not wait",
            s.wait_ignored,
        );
        registry.register(
            "tonic_deadline_reset_floods_cut",
            "Connections a reset guard closed: their client reset more streams soon after opening them, long \
             before their deadlines, than the guard allows",
            s.floods_cut,
        );
        registry.register(
            "tonic_deadline_connections_held",
            "Connections a reset guard held unread before cutting them off: they flooded again from an \
             address cut off for a reset flood lately",
            s.held,
        );
        registry.register(
            "tonic_deadline_connections_refused",
            "Connections a reset guard cut off at once when they flooded again from an address cut off \
             lately: as many of its connections as may be held were held",
            s.refused,
        );
        registry.register(
            "tonic_deadline_unguarded_servers",
            "Servers built by a reset guard's builder that met a connection the guard could not guard \
             (never wrapped, or TLS it cannot read), and refused it",
            s.unguarded,
        );
        series
    }
}

/// The retry and hedging block of [`Metrics`]: its families, and its
/// counters across all methods, which its accessors read.
#[derive(Debug)]
pub(super) struct ResilienceSeries {
    pub(super) calls: Counter,
    pub(super) attempts: Counter,
    /// All methods together, for the accessors.
    pub(super) retries: Hist,
    pub(super) hedges: Hist,
    pub(super) retry_delay: Hist,
    /// By `grpc_method`, as exposed.
    pub(super) retries_by: HistFamily<MethodLabel>,
    pub(super) hedges_by: HistFamily<MethodLabel>,
    pub(super) retry_delay_by: HistFamily<MethodLabel>,
    pub(super) hedge_losers_cancelled: Counter,
    pub(super) throttled: Counter,
    pub(super) no_time_for_attempt: Counter,
    pub(super) pushback_stops: Counter,
    pub(super) retries_spent: Counter,
    pub(super) committed_unreplayable: Counter,
}

impl ResilienceSeries {
    /// The block, its series registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let this = Self {
            calls: Counter::default(),
            attempts: Counter::default(),
            retries: Hist::new(COUNT_BOUNDS),
            hedges: Hist::new(COUNT_BOUNDS),
            retry_delay: Hist::new(DELAY_BOUNDS),
            retries_by: HistFamily::new_with_constructor(|| Hist::new(COUNT_BOUNDS)),
            hedges_by: HistFamily::new_with_constructor(|| Hist::new(COUNT_BOUNDS)),
            retry_delay_by: HistFamily::new_with_constructor(|| Hist::new(DELAY_BOUNDS)),
            hedge_losers_cancelled: Counter::default(),
            throttled: Counter::default(),
            no_time_for_attempt: Counter::default(),
            pushback_stops: Counter::default(),
            retries_spent: Counter::default(),
            committed_unreplayable: Counter::default(),
        };
        registry.register(
            "grpc_client_call_retries",
            "Retries per call, for calls that retried at least once",
            this.retries_by.clone(),
        );
        registry.register(
            "grpc_client_call_hedges",
            "Hedges (attempts after the first) per hedged call that sent any",
            this.hedges_by.clone(),
        );
        registry.register_with_unit(
            "grpc_client_call_retry_delay",
            "Time per retried call with no attempt in flight (backoff)",
            Unit::Seconds,
            this.retry_delay_by.clone(),
        );
        let counters = [
            (
                "tonic_deadline_resilient_calls",
                "Calls made through a retry or hedging layer, counted when they end",
                &this.calls,
            ),
            (
                "tonic_deadline_call_attempts",
                "Attempts sent by calls through a retry or hedging layer, first attempts included",
                &this.attempts,
            ),
            (
                "tonic_deadline_hedge_losers_cancelled",
                "Losing hedges reset once another attempt won",
                &this.hedge_losers_cancelled,
            ),
            (
                "tonic_deadline_retries_throttled",
                "Retries and hedges not sent because throttling or the retry budget said no",
                &this.throttled,
            ),
            (
                "tonic_deadline_attempts_refused_for_time",
                "Retries and hedges not sent because the deadline left no time for a useful attempt",
                &this.no_time_for_attempt,
            ),
            (
                "tonic_deadline_pushback_stops",
                "Calls that stopped retrying because the server's pushback said so",
                &this.pushback_stops,
            ),
            (
                "tonic_deadline_retries_spent",
                "Calls that failed with a status their policy retries, once this layer had sent every \
                 attempt it would: answered with grpc-retry-pushback-ms -1, the chain's one budget spent",
                &this.retries_spent,
            ),
            (
                "tonic_deadline_committed_unreplayable",
                "Calls sent once without retries because their request body could not be replayed",
                &this.committed_unreplayable,
            ),
        ];
        for (name, help, counter) in counters {
            registry.register(name, help, counter.clone());
        }
        this
    }
}

/// One method's series, fetched from the families when first used.
#[derive(Debug)]
pub(crate) struct Method {
    pub(super) name: String,
    server_started: OnceLock<Counter>,
    server_duration: ByStatus,
    budget_on_entry: OnceLock<Hist>,
    server_no_deadline: OnceLock<Counter>,
    attempt_started: OnceLock<Counter>,
    attempt_duration: ByStatus,
    call_duration: ByStatus,
    granted: OnceLock<Hist>,
    client_no_deadline: OnceLock<Counter>,
    queue_wait: OnceLock<Hist>,
}

/// One histogram per gRPC status code (0 to 16).
type ByStatus = [OnceLock<Hist>; 17];

impl Method {
    fn new(name: String) -> Self {
        Self {
            name,
            server_started: OnceLock::new(),
            server_duration: Default::default(),
            budget_on_entry: OnceLock::new(),
            server_no_deadline: OnceLock::new(),
            attempt_started: OnceLock::new(),
            attempt_duration: Default::default(),
            call_duration: Default::default(),
            granted: OnceLock::new(),
            client_no_deadline: OnceLock::new(),
            queue_wait: OnceLock::new(),
        }
    }

    fn label(&self) -> MethodLabel {
        MethodLabel {
            grpc_method: self.name.clone(),
        }
    }

    fn counter<'a>(
        &self,
        cell: &'a OnceLock<Counter>,
        family: &Family<MethodLabel, Counter>,
    ) -> &'a Counter {
        cell.get_or_init(|| family.get_or_create_owned(&self.label()))
    }

    fn hist<'a>(&self, cell: &'a OnceLock<Hist>, family: &HistFamily<MethodLabel>) -> &'a Hist {
        cell.get_or_init(|| family.get_or_create_owned(&self.label()))
    }

    fn by_status<'a>(
        &self,
        cells: &'a ByStatus,
        family: &HistFamily<MethodStatus>,
        code: tonic::Code,
    ) -> &'a Hist {
        let i = (code as usize).min(cells.len() - 1);
        cells[i].get_or_init(|| {
            family.get_or_create_owned(&MethodStatus {
                grpc_method: self.name.clone(),
                grpc_status: crate::wire::code_name(code),
            })
        })
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let series = Series::register(&mut registry);
        let resilience = ResilienceSeries::register(&mut registry);
        Self {
            inner: Arc::new(Inner {
                registry,
                series,
                resilience,
                methods: RwLock::new(HashMap::new()),
                other: Arc::new(Method::new("other".to_owned())),
            }),
        }
    }
}

impl Metrics {
    /// A registry with every series registered and at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// The text exposition of every series (OpenMetrics 1.0, which
    /// Prometheus scrapes; serve it with [`CONTENT_TYPE`]).
    ///
    /// ```
    /// let metrics = tonic_deadline::observe::Metrics::new();
    /// assert!(metrics.encode().contains("tonic_deadline_outlived_total 0"));
    /// ```
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail; our metrics encode infallibly.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.inner.registry);
        text
    }

    /// Outbound calls that found no scope (see
    /// [`Unscoped`](crate::client::Unscoped)), allowed or refused.
    pub fn unscoped_calls(&self) -> u64 {
        self.inner.series.unscoped.get()
    }

    /// Outbound calls whose request left more than 10 ms (and more than
    /// 5 % of the budget) after their `grpc-timeout` was written — a wait
    /// below the layer (a plain tonic `Channel` connecting or queueing for
    /// a stream, a middleware queue) that the budget on the wire does not
    /// show. Every call with a deadline is watched. See
    /// [`ClientDeadlineLayer`](crate::ClientDeadlineLayer).
    pub fn budgets_left_late(&self) -> u64 {
        self.inner.series.left_late.get()
    }

    /// Outbound calls that asked to wait for ready
    /// ([`WaitForReady`](crate::client::WaitForReady), a service config's
    /// `"waitForReady": true`) and were failed at once with `UNAVAILABLE`
    /// for want of a connection, because the channel below the client layer
    /// does not wait (a plain tonic `Channel`; a
    /// [`ReadyChannel`](crate::client::ReadyChannel) does).
    pub fn waits_for_ready_ignored(&self) -> u64 {
        self.inner.series.wait_ignored.get()
    }

    /// Connections a [`ResetGuard`](crate::server::ResetGuard) closed
    /// because their client reset more streams soon after opening them,
    /// long before their deadlines, than the guard allows: HTTP/2 reset
    /// floods.
    pub fn reset_floods_cut(&self) -> u64 {
        self.inner.series.floods_cut.get()
    }

    /// Connections a [`ResetGuard`](crate::server::ResetGuard) held unread
    /// before cutting them off, because they flooded again from an address
    /// cut off for a reset flood lately
    /// ([`ResetGuard::hold_after_cut`](crate::server::ResetGuard::hold_after_cut)).
    pub fn connections_held(&self) -> u64 {
        self.inner.series.held.get()
    }

    /// Connections a [`ResetGuard`](crate::server::ResetGuard) cut off at
    /// once when they flooded again from an address cut off lately, because
    /// 20 of its connections were held already.
    pub fn connections_refused(&self) -> u64 {
        self.inner.series.refused.get()
    }

    /// Servers built by a [`ResetGuard`](crate::server::ResetGuard)'s
    /// builder that met a connection the guard could not guard (one it
    /// never wrapped, or TLS it cannot read) and refused it (counted once
    /// per guard and kind).
    pub fn unguarded_servers(&self) -> u64 {
        self.inner.series.unguarded.get()
    }

    /// Request scopes of the server layer that ended in `ending`.
    pub fn scopes_ended(&self, ending: ScopeEnding) -> u64 {
        self.inner.series.scope_ended_by[ending as usize].get()
    }

    /// Work refused because its deadline had already passed, at `stage`:
    /// on arrival at the server layer, in admission, or at the client layer
    /// (an outbound call whose scope had expired).
    pub fn refused_expired(&self, stage: Stage) -> u64 {
        self.inner
            .series
            .refused_expired
            .get_or_create(&StageLabel {
                stage: stage.as_str(),
            })
            .get()
    }

    /// Pieces of scope-tied work (blocking work, database queries) that
    /// finished after their scope had ended: work that ignores
    /// cancellation.
    pub fn outlived(&self) -> u64 {
        self.inner.series.outlived.get()
    }

    /// How long past their scope's deadline those pieces of work finished.
    pub fn outlived_by(&self) -> Histogram {
        self.inner.series.outlived_by.read()
    }

    /// Budgets requests to `method` (`package.Service/Method`) brought on
    /// arrival, in seconds.
    pub fn budget_on_entry(&self, method: &str) -> Histogram {
        let m = self.method(method);
        m.hist(&m.budget_on_entry, &self.inner.series.budget_on_entry)
            .read()
    }

    /// The handles of `path` (`/package.Service/Method` or without the
    /// slash), made on first use; `other` past [`MAX_METHODS`] (200).
    pub(crate) fn method(&self, path: &str) -> Arc<Method> {
        self.named(path.strip_prefix('/').unwrap_or(path))
    }

    /// The handles labelled `name` as it is (a plain-HTTP path keeps its
    /// slash), made on first use; `other` past [`MAX_METHODS`] (200).
    pub(crate) fn named(&self, name: &str) -> Arc<Method> {
        let methods = &self.inner.methods;
        if let Some(m) = methods.read().ok().and_then(|m| m.get(name).cloned()) {
            return m;
        }
        let Ok(mut write) = methods.write() else {
            return self.inner.other.clone();
        };
        if let Some(m) = write.get(name) {
            return m.clone();
        }
        if write.len() >= MAX_METHODS {
            return self.inner.other.clone();
        }
        let m = Arc::new(Method::new(name.to_owned()));
        write.insert(name.into(), m.clone());
        m
    }

    fn series(&self) -> &Series {
        &self.inner.series
    }

    pub(crate) fn unscoped_call(&self) {
        self.series().unscoped.inc();
    }

    pub(crate) fn budget_left_late(&self) {
        self.series().left_late.inc();
    }

    pub(crate) fn wait_for_ready_ignored(&self) {
        self.series().wait_ignored.inc();
    }

    pub(crate) fn flood_cut(&self) {
        self.series().floods_cut.inc();
    }

    pub(crate) fn held_connection(&self) {
        self.series().held.inc();
    }

    pub(crate) fn refused_connection(&self) {
        self.series().refused.inc();
    }

    pub(crate) fn unguarded_server(&self) {
        self.series().unguarded.inc();
    }

    pub(crate) fn server_started(&self, m: &Method, requested: Option<Duration>) {
        let s = self.series();
        m.counter(&m.server_started, &s.server_started).inc();
        match requested {
            Some(budget) => m
                .hist(&m.budget_on_entry, &s.budget_on_entry)
                .observe(budget.as_secs_f64()),
            None => {
                m.counter(&m.server_no_deadline, &s.server_no_deadline)
                    .inc();
            }
        }
    }

    pub(crate) fn server_ended(&self, m: &Method, code: tonic::Code, took: Duration) {
        m.by_status(&m.server_duration, &self.series().server_duration, code)
            .observe(took.as_secs_f64());
    }

    /// Counts a request scope's end.
    pub(crate) fn scope_ended(&self, ending: ScopeEnding) {
        self.series().scope_ended_by[ending as usize].inc();
    }

    pub(crate) fn refused(&self, stage: Stage) {
        self.series()
            .refused_expired
            .get_or_create(&StageLabel {
                stage: stage.as_str(),
            })
            .inc();
    }

    pub(crate) fn attempt_started(&self, m: &Method, granted: Option<Duration>) {
        let s = self.series();
        m.counter(&m.attempt_started, &s.attempt_started).inc();
        match granted {
            Some(budget) => m.hist(&m.granted, &s.granted).observe(budget.as_secs_f64()),
            None => {
                m.counter(&m.client_no_deadline, &s.client_no_deadline)
                    .inc();
            }
        }
    }

    pub(crate) fn attempt_ended(&self, m: &Method, code: tonic::Code, took: Duration) {
        let s = self.series();
        m.by_status(&m.attempt_duration, &s.attempt_duration, code)
            .observe(took.as_secs_f64());
        m.by_status(&m.call_duration, &s.call_duration, code)
            .observe(took.as_secs_f64());
    }

    pub(crate) fn admitted(&self, m: &Method, waited: Duration) {
        m.hist(&m.queue_wait, &self.series().queue_wait)
            .observe(waited.as_secs_f64());
    }

    pub(crate) fn not_admitted(&self, reason: &'static str) {
        self.series()
            .admission_refused
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub(crate) fn outlived_scope(&self, by: Option<Duration>) {
        let s = self.series();
        s.outlived.inc();
        if let Some(by) = by {
            s.outlived_by.observe(by.as_secs_f64());
        }
    }
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("unscoped_calls", &self.unscoped_calls())
            .field("resilient_calls", &self.resilient_calls())
            .field("call_attempts", &self.call_attempts())
            .field("hedge_losers_cancelled", &self.hedge_losers_cancelled())
            .field("outlived", &self.outlived())
            .finish_non_exhaustive()
    }
}
