//! One retried or hedged call: what each of its attempts is made from, and
//! what it reports as it ends.

use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::BytesMut;
use http::Request;
use tower_service::Service;

use super::observer::CallReport;
use super::shared::{self, Buffered, Core, Replay, Template};
use crate::BoxError;
use crate::client::Avoid;
use crate::scope::{Cancelled, Scope};
use crate::status::status_for;

/// What every retried or hedged call keeps: the ready service, the caller's
/// scope, the request to make each attempt from, and how many were sent.
pub(super) struct Call<S> {
    pub(super) service: S,
    pub(super) core: Arc<Core>,
    pub(super) scope: Option<Scope>,
    template: Template,
    /// The body while it is read; the replay once read.
    body: Option<tonic::body::Body>,
    read: BytesMut,
    replay: Option<Replay>,
    /// Attempts sent.
    pub(super) attempts: u32,
    /// The last attempt's scope, when the per-attempt timeout ended it
    /// before the caller's deadline would have.
    capped: Option<(Scope, Duration)>,
}

impl<S> Call<S>
where
    S: Service<Request<tonic::body::Body>>,
{
    /// A call of `request` through `service`, which is ready for its first
    /// attempt, in the caller's `scope`.
    pub(super) fn new(
        service: S,
        core: Arc<Core>,
        scope: Option<Scope>,
        request: Request<tonic::body::Body>,
    ) -> Self {
        core.limiter.on_call();
        let (parts, body) = request.into_parts();
        Self {
            service,
            core,
            scope,
            template: Template::new(parts),
            body: Some(body),
            read: BytesMut::new(),
            replay: None,
            attempts: 0,
            capped: None,
        }
    }

    pub(super) fn path(&self) -> &str {
        self.template.path()
    }

    /// The end of the caller's scope, to watch between attempts.
    pub(super) fn watch(&self) -> Option<Cancelled> {
        self.scope.as_ref().map(Scope::cancelled)
    }

    /// Reads the request body for replay: `Ok(None)` once it is (at once if
    /// it was before); `Ok(Some(attempt))` when it is a live stream or too
    /// large, and was sent as the call's one attempt.
    pub(super) fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<S::Future>, BoxError>> {
        if self.replay.is_some() {
            return Poll::Ready(Ok(None));
        }
        let limit = self.core.settings.replay_buffer;
        match ready!(shared::poll_buffer(
            &mut self.body,
            &mut self.read,
            limit,
            cx
        ))? {
            Buffered::Replayable(replay) => {
                self.replay = Some(replay);
                Poll::Ready(Ok(None))
            }
            Buffered::Live(body) => {
                if let Some(observer) = self.core.observer() {
                    observer.committed_unreplayable();
                }
                Poll::Ready(Ok(Some(self.send_with(body))))
            }
        }
    }

    /// Sends the next attempt, with the replayed body, to none of the
    /// replicas `avoid` names.
    pub(super) fn send(&mut self, avoid: Option<Avoid>) -> S::Future {
        let body = self
            .replay
            .as_ref()
            .expect("read before the first attempt")
            .body();
        self.send_to(body, avoid)
    }

    fn send_with(&mut self, body: tonic::body::Body) -> S::Future {
        self.send_to(body, None)
    }

    fn send_to(&mut self, body: tonic::body::Body, avoid: Option<Avoid>) -> S::Future {
        let scope = self.scope.as_ref().map(|s| self.core.attempt_scope(s));
        self.capped = match (self.core.settings.per_attempt_timeout, &scope) {
            (Some(cap), Some(attempt)) if cut_short(attempt, self.scope.as_ref()) => {
                Some((attempt.clone(), cap))
            }
            _ => None,
        };
        self.attempts += 1;
        let request = self.template.attempt(self.attempts, body, scope, avoid);
        self.service.call(request)
    }

    /// Whether the last attempt ran out of the time its per-attempt timeout
    /// gave it, with the caller's deadline still ahead: what it has left is
    /// under a quarter of the cap. The hops below ran out of that time too,
    /// each ending its handler up to a twentieth of its budget early (the
    /// server layer's reply reserve), so their answer comes a little before
    /// the cap's end — five hops' reserves are under a quarter of it.
    pub(super) fn ran_out_of_its_cap(&self) -> bool {
        self.capped
            .as_ref()
            .is_some_and(|(scope, cap)| scope.remaining().is_some_and(|left| left < *cap / 4))
    }

    /// The status for a caller's scope that ended.
    pub(super) fn ended(&self) -> Option<tonic::Status> {
        self.scope.as_ref().and_then(Scope::cause).map(status_for)
    }

    /// Reports the call as it ends with `result`: `hedged` or retried, with
    /// `delay` spent backing off.
    pub(super) fn finish<T>(&self, hedged: bool, delay: Duration, result: T) -> Poll<T> {
        if let Some(observer) = self.core.observer() {
            observer.call_ended(
                self.template.path(),
                CallReport {
                    attempts: self.attempts,
                    hedged,
                    delay,
                },
            );
        }
        Poll::Ready(result)
    }
}

/// Whether `attempt` ends before `caller` does: its per-attempt timeout
/// cut it short.
fn cut_short(attempt: &Scope, caller: Option<&Scope>) -> bool {
    match (attempt.deadline(), caller.and_then(Scope::deadline)) {
        (Some(attempt), Some(caller)) => attempt < caller,
        (Some(_), None) => true,
        (None, _) => false,
    }
}
