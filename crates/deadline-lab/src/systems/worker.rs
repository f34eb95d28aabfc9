//! A handler that does a fixed amount of work, either watching its scope
//! (async work that stops when the scope ends) or ignoring it (blocking work
//! that never checks, run through [`Scope::spawn_blocking`] so the library
//! detects that it outlived its scope).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;
use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tonic_deadline::{Scope, ServerDeadlineLayer};

use crate::pb::worker_server::{Worker, WorkerServer};
use crate::pb::{WorkReq, WorkResp};
use crate::systems::millis;
use crate::systems::trace::micros;

/// When things happened inside the worker, for one request at a time.
#[derive(Debug, Default, Clone)]
pub struct Times {
    /// The handler was entered.
    pub entered: Option<Instant>,
    /// The handler's scope ended (deadline, caller reset, or answered).
    pub scope_ended: Option<Instant>,
    /// Watching work noticed the end of its scope.
    pub noticed: Option<Instant>,
    /// The work ran to the end.
    pub completed: Option<Instant>,
}

/// The worker service; its [`Times`] are shared with whoever started it.
#[derive(Debug, Clone, Default)]
pub struct WorkerSvc {
    times: Arc<Mutex<Times>>,
}

impl WorkerSvc {
    /// A worker with empty times.
    pub fn new() -> Self {
        Self::default()
    }

    /// What happened so far, and a reset for the next request.
    pub fn take(&self) -> Times {
        self.times
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default()
    }

    fn set(times: &Mutex<Times>, field: fn(&mut Times) -> &mut Option<Instant>) {
        if let Ok(mut t) = times.lock() {
            *field(&mut t) = Some(Instant::now());
        }
    }
}

#[tonic::async_trait]
impl Worker for WorkerSvc {
    async fn work(&self, request: Request<WorkReq>) -> Result<Response<WorkResp>, Status> {
        Self::set(&self.times, |t| &mut t.entered);
        let header = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let scope = Scope::current();
        let remaining_us = micros(scope.remaining());
        let watcher = scope.clone();
        let times = self.times.clone();
        tonic_deadline::detach(async move {
            watcher.ended().await;
            Self::set(&times, |t| &mut t.scope_ended);
        });
        let request = request.into_inner();
        let work = millis(request.work_ms);
        let completed = if request.watch {
            // Scope-aware work, in a task tied to the request: it stops when
            // the scope ends. The observer outlives the handler (which the
            // server layer drops at the deadline) to record when that was.
            let task = scope.spawn(tokio::time::sleep(work));
            let times = self.times.clone();
            let observer = tonic_deadline::detach(async move {
                match task.await {
                    Ok(Ok(())) => {
                        Self::set(&times, |t| &mut t.completed);
                        true
                    }
                    _ => {
                        Self::set(&times, |t| &mut t.noticed);
                        false
                    }
                }
            });
            observer.await.unwrap_or(false)
        } else {
            let times = self.times.clone();
            // Never checks its scope: a thread cannot be stopped from outside.
            let result = scope
                .spawn_blocking(move |_scope| {
                    std::thread::sleep(work);
                    Self::set(&times, |t| &mut t.completed);
                })
                .await;
            result.is_ok()
        };
        Ok(Response::new(WorkResp {
            completed,
            remaining_us,
            header,
        }))
    }
}

/// Serves a worker on `listen`.
///
/// # Errors
///
/// When the port cannot be bound.
pub async fn start(listen: &str, worker: WorkerSvc) -> anyhow::Result<SocketAddr> {
    crate::systems::serve_lab(
        listen,
        Routes::new(WorkerServer::new(worker)),
        // The worker shows what the header gives a handler, to the
        // microsecond: it keeps nothing for the ledger's answer.
        ServerDeadlineLayer::new().reply_reserve(std::time::Duration::ZERO),
    )
    .await
}
