//! What each lab service records about its budget: on entry, and for every
//! downstream call the budget it handed on and how the call ended.
//!
//! Records go into the reply (so a client in another process sees the whole
//! path of a successful request) and into an in-process [`Journal`] (so an
//! experiment also sees the path of a request that failed).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tonic::{Request, Response, Status};
use tonic_deadline::{Ended, Scope};

use crate::clock::deadline_ns;
use crate::pb::Trace;
use crate::report::code_name;

/// Every record made by the services of one system, in order.
#[derive(Debug, Clone, Default)]
pub struct Journal {
    records: Arc<Mutex<Vec<Trace>>>,
}

impl Journal {
    /// An empty journal.
    pub fn new() -> Self {
        Self::default()
    }

    fn push(&self, trace: Trace) {
        if let Ok(mut records) = self.records.lock() {
            records.push(trace);
        }
    }

    /// Removes and returns everything recorded so far.
    pub fn take(&self) -> Vec<Trace> {
        self.records
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default()
    }
}

/// Microseconds of a remaining budget; -1 for none.
pub fn micros(remaining: Option<Duration>) -> i64 {
    remaining.map_or(-1, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// The records of one service for one request.
#[derive(Debug)]
pub struct Tracer {
    service: &'static str,
    entered: Instant,
    journal: Journal,
    records: Mutex<Vec<Trace>>,
}

impl Tracer {
    /// Records entry: the current scope's remaining budget and the
    /// `grpc-timeout` header as received.
    pub fn enter<T>(service: &'static str, request: &Request<T>, journal: &Journal) -> Self {
        let header = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let tracer = Self {
            service,
            entered: Instant::now(),
            journal: journal.clone(),
            records: Mutex::new(Vec::new()),
        };
        let scope = Scope::current();
        tracer.record(Trace {
            service: service.to_owned(),
            target: String::new(),
            remaining_us: micros(scope.remaining()),
            header,
            outcome: String::new(),
            at_us: 0,
            deadline_mono_ns: deadline_ns(scope.deadline()),
        });
        tracer
    }

    fn since_entry(&self) -> i64 {
        micros(Some(self.entered.elapsed()))
    }

    fn record(&self, trace: Trace) {
        self.journal.push(trace.clone());
        if let Ok(mut records) = self.records.lock() {
            records.push(trace);
        }
    }

    /// Makes a downstream call under `scope` and records the budget handed to
    /// `target` (read just before the call) and the call's status.
    pub async fn call<T, F>(&self, target: &str, scope: &Scope, call: F) -> Result<T, Status>
    where
        F: Future<Output = Result<Response<T>, Status>>,
    {
        let at_us = self.since_entry();
        let remaining_us = micros(scope.remaining());
        let deadline_mono_ns = deadline_ns(scope.deadline());
        let result = scope.enter(call).await;
        let outcome = match &result {
            Ok(_) => "OK",
            Err(status) => code_name(status.code()),
        };
        self.record(Trace {
            service: self.service.to_owned(),
            target: target.to_owned(),
            remaining_us,
            header: String::new(),
            outcome: outcome.to_owned(),
            at_us,
            deadline_mono_ns,
        });
        result.map(Response::into_inner)
    }

    /// Records how this service's own work ended (`target` = "(work)").
    pub fn work_ended(&self, result: Result<(), Ended>) {
        let outcome = match result {
            Ok(()) => "OK",
            Err(ended) => code_name(Status::from(ended).code()),
        };
        self.record(Trace {
            service: self.service.to_owned(),
            target: "(work)".to_owned(),
            remaining_us: micros(Scope::current().remaining()),
            header: String::new(),
            outcome: outcome.to_owned(),
            at_us: self.since_entry(),
            deadline_mono_ns: deadline_ns(Scope::current().deadline()),
        });
    }

    /// This service's records followed by `below` (the records its
    /// downstream calls returned).
    pub fn finish(self, below: impl IntoIterator<Item = Trace>) -> Vec<Trace> {
        let mut out = self.records.into_inner().unwrap_or_default();
        out.extend(below);
        out
    }
}

/// `work` of scope-aware work: stops when the current scope ends.
///
/// How it ended is recorded even when the handler is dropped mid-way (the
/// server layer drops a handler at its deadline or when the caller resets):
/// `stopped` (if given) is then counted too.
pub async fn work(
    tracer: &Tracer,
    work: Duration,
    stopped: Option<&AtomicU64>,
) -> Result<(), Status> {
    let mut guard = WorkGuard {
        tracer,
        stopped,
        finished: false,
    };
    let result = Scope::current().run(tokio::time::sleep(work)).await;
    guard.finished = true;
    tracer.work_ended(result);
    if result.is_err()
        && let Some(stopped) = stopped
    {
        stopped.fetch_add(1, Ordering::Relaxed);
    }
    result.map_err(Status::from)
}

/// Records a stop if the work's future is dropped before it finished.
struct WorkGuard<'a> {
    tracer: &'a Tracer,
    stopped: Option<&'a AtomicU64>,
    finished: bool,
}

impl Drop for WorkGuard<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let cause = Scope::try_current()
            .and_then(|s| s.cause())
            .map_or("CANCELLED", |c| c.code().name());
        self.tracer.record(Trace {
            service: self.tracer.service.to_owned(),
            target: "(work)".to_owned(),
            remaining_us: micros(Scope::try_current().and_then(|s| s.remaining())),
            header: String::new(),
            outcome: cause.to_owned(),
            at_us: self.tracer.since_entry(),
            deadline_mono_ns: deadline_ns(Scope::try_current().and_then(|s| s.deadline())),
        });
        if let Some(stopped) = self.stopped {
            stopped.fetch_add(1, Ordering::Relaxed);
        }
    }
}
