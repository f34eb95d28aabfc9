//! The resilience layer over the client layer over a scripted server, on a
//! paused clock: every figure is exact.

mod hedge;
mod replicas;
mod retry;
mod retry_and_hedge;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use tokio::time::Instant;
use tonic::Code;
use tower::{Layer, Service, ServiceExt};

use super::*;
use crate::{ClientDeadlineLayer, Scope, timeout_header};

/// What one attempt does on the scripted server.
#[derive(Debug, Clone)]
struct Step {
    after: Duration,
    /// `None`: answers with response headers (the call commits).
    code: Option<Code>,
    pushback: Option<&'static str>,
}

fn fail(code: Code, after_ms: u64) -> Step {
    Step {
        after: Duration::from_millis(after_ms),
        code: Some(code),
        pushback: None,
    }
}

fn answer(after_ms: u64) -> Step {
    Step {
        after: Duration::from_millis(after_ms),
        code: None,
        pushback: None,
    }
}

/// What the server saw of one attempt.
#[derive(Debug, Clone)]
struct Seen {
    at: Instant,
    budget: Option<Duration>,
    previous: Option<String>,
    body: Vec<u8>,
    /// Set when the attempt's future was dropped before it answered.
    dropped: Arc<Mutex<Option<Instant>>>,
}

#[derive(Clone, Default)]
struct Server {
    script: Arc<Mutex<Vec<Step>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

struct DropMark(Arc<Mutex<Option<Instant>>>, bool);

impl Drop for DropMark {
    fn drop(&mut self) {
        if !self.1 {
            *self.0.lock().expect("not poisoned") = Some(Instant::now());
        }
    }
}

impl Server {
    fn new(steps: Vec<Step>) -> Self {
        Self {
            script: Arc::new(Mutex::new(steps)),
            seen: Arc::default(),
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("not poisoned").clone()
    }

    fn service(
        &self,
    ) -> impl Service<
        Request<tonic::body::Body>,
        Response = Response<tonic::body::Body>,
        Error = BoxError,
        Future = impl Send,
    > + Clone {
        let server = self.clone();
        tower::service_fn(move |request: Request<tonic::body::Body>| {
            let server = server.clone();
            async move {
                let budget = timeout_header::from_headers(request.headers()).expect("well formed");
                let previous = request
                    .headers()
                    .get(shared::PREVIOUS_ATTEMPTS)
                    .map(|v| v.to_str().expect("ascii").to_owned());
                let body = http_body_util::BodyExt::collect(request.into_body())
                    .await
                    .map(|b| b.to_bytes().to_vec())
                    .unwrap_or_default();
                let step = {
                    let mut script = server.script.lock().expect("not poisoned");
                    if script.is_empty() {
                        answer(0)
                    } else {
                        script.remove(0)
                    }
                };
                let dropped = Arc::new(Mutex::new(None));
                server.seen.lock().expect("not poisoned").push(Seen {
                    at: Instant::now(),
                    budget,
                    previous,
                    body,
                    dropped: dropped.clone(),
                });
                let mut mark = DropMark(dropped, false);
                tokio::time::sleep(step.after).await;
                mark.1 = true;
                let mut response = Response::new(tonic::body::Body::empty());
                if let Some(code) = step.code {
                    let headers = response.headers_mut();
                    headers.insert("content-type", "application/grpc".parse().expect("valid"));
                    headers.insert("grpc-status", (code as i32).into());
                    if let Some(p) = step.pushback {
                        headers.insert(shared::PUSHBACK, p.parse().expect("valid"));
                    }
                }
                Ok::<_, BoxError>(response)
            }
        })
    }
}

fn request(path: &str) -> Request<tonic::body::Body> {
    let mut request = Request::new(tonic::body::Body::new(http_body_util::Full::new(
        bytes::Bytes::from_static(b"\0\0\0\0\x02hi"),
    )));
    *request.uri_mut() = format!("http://server{path}").parse().expect("a valid uri");
    request
}

/// The method the retry and hedging tests call.
const PATH: &str = "/kv.Store/Get";

fn stack(
    layer: ResilienceLayer,
    server: &Server,
) -> impl Service<
    Request<tonic::body::Body>,
    Response = Response<crate::client::ClientBody<tonic::body::Body>>,
    Error = BoxError,
> + Clone {
    layer.layer(ClientDeadlineLayer::new().layer(server.service()))
}

/// Trailers-only answers carry their status in the headers: turn them into
/// the call's code for the assertions.
fn code_of<B>(response: &Response<B>) -> Code {
    response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .map_or(Code::Ok, Code::from_i32)
}

/// Calls [`PATH`] in `scope`: the code the call ends with, and when.
async fn outcome<S, RB>(service: &mut S, scope: &Scope) -> (Code, Duration)
where
    S: Service<Request<tonic::body::Body>, Response = Response<RB>, Error = BoxError>,
{
    outcome_of(service, PATH, scope).await
}

/// Calls `path` in `scope`: the code the call ends with, and when.
async fn outcome_of<S, RB>(service: &mut S, path: &str, scope: &Scope) -> (Code, Duration)
where
    S: Service<Request<tonic::body::Body>, Response = Response<RB>, Error = BoxError>,
{
    let started = Instant::now();
    let mut req = request(path);
    req.extensions_mut().insert(scope.clone());
    let result = service.ready().await.expect("ready").call(req).await;
    let code = match result {
        Ok(response) => code_of(&response),
        Err(err) => err
            .downcast_ref::<tonic::Status>()
            .map_or(Code::Unknown, tonic::Status::code),
    };
    (code, started.elapsed())
}

/// Cancels `scope` `after` from now.
async fn cancel_after(scope: &Scope, after: Duration) {
    tokio::time::sleep(after).await;
    scope.cancel();
}
