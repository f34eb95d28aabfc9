// Tests start drivers that belong to no request.
#![allow(clippy::disallowed_methods)]
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use tower::{Layer, ServiceExt};

use crate::scope::{Cause, Scope};
use crate::server::ServerDeadlineLayer;

type Reply = Response<Full<Bytes>>;

fn request(headers: &[(&str, &str)]) -> Request<Empty<Bytes>> {
    let mut builder = Request::get("/");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Empty::new()).expect("a valid request")
}

#[tokio::test(start_paused = true)]
async fn server_timer_fires_exactly_at_the_deadline() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Empty<Bytes>>, Reply>();
    let service = ServerDeadlineLayer::http().layer(service);
    let started = tokio::time::Instant::now();
    let call = tokio::spawn(service.oneshot(request(&[("grpc-timeout", "250m")])));
    let (request, _never_answered) = handle.next_request().await.expect("the handler runs");
    let scope = request
        .extensions()
        .get::<Scope>()
        .cloned()
        .expect("the scope is a request extension");
    let response = call
        .await
        .expect("no panic")
        .expect("the layer answers itself");
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(250),
        "answered at the deadline, to the tick"
    );
    assert_eq!(scope.cause(), Some(Cause::DeadlineExceeded));
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(body, "deadline exceeded");
}

#[tokio::test(start_paused = true)]
async fn an_outer_layer_giving_up_looks_like_a_caller_disconnect() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Empty<Bytes>>, Reply>();
    let service = ServerDeadlineLayer::http().layer(service);
    let outer = tokio::spawn(tokio::time::timeout(
        Duration::from_millis(100),
        service.oneshot(request(&[])),
    ));
    let (request, _never_answered) = handle.next_request().await.expect("the handler runs");
    let scope = request.extensions().get::<Scope>().cloned().expect("scope");
    assert!(
        outer.await.expect("no panic").is_err(),
        "the outer timeout fired"
    );
    assert_eq!(
        scope.cause(),
        Some(Cause::Abandoned),
        "a drop cannot tell an outer timeout from a client that went away"
    );
}

#[tokio::test(start_paused = true)]
async fn the_handler_future_runs_inside_the_request_scope() {
    let service = tower::service_fn(|_request: Request<Empty<Bytes>>| async {
        let remaining = Scope::current().remaining();
        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(format!(
            "{remaining:?}"
        )))))
    });
    let service = ServerDeadlineLayer::http()
        .default_timeout(Duration::from_millis(900))
        .layer(service);
    let response = service.oneshot(request(&[])).await.expect("answered");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(body, "Some(900ms)");
}
