//! The lab's metrics: the handle the systems built inside [`with_metrics`]
//! report to, and the `/metrics` endpoint a Prometheus server scrapes.
//!
//! The handle is task-local, not process-wide: it is in force only while
//! the future given to [`with_metrics`] builds its services (each layer
//! keeps its own clone), so `deadline-lab serve --metrics-listen` turns
//! metrics on without every system's constructor taking one more argument,
//! and experiments and tests that do not ask for metrics get layers that
//! record nothing.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tonic_deadline::observe::{CONTENT_TYPE, Metrics};
use tonic_deadline::{ClientDeadlineLayer, ServerDeadlineLayer};

tokio::task_local! {
    static METRICS: Metrics;
}

/// Runs `build` with `metrics` as the handle of every layer the lab makes
/// meanwhile.
pub async fn with_metrics<F: Future>(metrics: Metrics, build: F) -> F::Output {
    METRICS.scope(metrics, build).await
}

/// Runs `run` with `metrics` in force when given, as it is otherwise.
pub async fn maybe_with<F: Future>(metrics: Option<Metrics>, run: F) -> F::Output {
    match metrics {
        Some(metrics) => with_metrics(metrics, run).await,
        None => run.await,
    }
}

/// The handle in force, if any.
pub fn current() -> Option<Metrics> {
    METRICS.try_with(Clone::clone).ok()
}

/// `layer`, reporting to the handle in force.
pub fn server_layer(layer: ServerDeadlineLayer) -> ServerDeadlineLayer {
    match current() {
        Some(metrics) => layer.metrics(&metrics),
        None => layer,
    }
}

/// `layer`, reporting to the handle in force.
pub fn client_layer(layer: ClientDeadlineLayer) -> ClientDeadlineLayer {
    match current() {
        Some(metrics) => layer.metrics(&metrics),
        None => layer,
    }
}

/// Serves `metrics` as text on `GET /metrics` at `listen` (port 0 picks a
/// free one) in the background; other paths answer 404, other methods 405.
///
/// # Errors
///
/// When the address cannot be bound.
pub async fn serve(listen: &str, metrics: Metrics) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(listen).await?;
    let bound = listener.local_addr()?;
    tonic_deadline::detach(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let metrics = metrics.clone();
            tonic_deadline::detach(async move {
                let service = hyper::service::service_fn(move |request| {
                    let metrics = metrics.clone();
                    async move { Ok::<_, Infallible>(answer(&metrics, &request)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(bound)
}

fn answer(metrics: &Metrics, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => {
            (StatusCode::OK, CONTENT_TYPE, metrics.encode())
        }
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "GET /metrics\n".to_owned(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "metrics are at /metrics\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = http::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, value);
    }
    response
}
