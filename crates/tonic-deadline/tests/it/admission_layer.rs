//! The server concurrency limit on a real tonic server.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use tokio_stream::wrappers::TcpListenerStream;
use tonic_deadline::ServerDeadlineLayer;
use tonic_deadline::admission::{Admission, AdmissionLayer};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_cannot_finish_in_time_is_refused_before_the_handler() {
    let admission = Admission::new(1).expected_service_time(Duration::from_millis(200));
    let (_, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(
                tower::ServiceBuilder::new()
                    .layer(ServerDeadlineLayer::new())
                    .layer(AdmissionLayer::new(admission.clone())),
            )
            .add_service(health)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connects");
    let mut client = HealthClient::new(channel);

    let mut short = tonic::Request::new(HealthCheckRequest::default());
    short.set_timeout(Duration::from_millis(100));
    let refused = client
        .check(short)
        .await
        .expect_err("100 ms cannot fit 200 ms of service");
    assert_eq!(refused.code(), tonic::Code::DeadlineExceeded);
    assert_eq!(admission.stats().granted, 0, "the handler never ran");
    assert_eq!(admission.stats().would_not_finish, 1);

    let mut roomy = tonic::Request::new(HealthCheckRequest::default());
    roomy.set_timeout(Duration::from_secs(5));
    client
        .check(roomy)
        .await
        .expect("a request with time enough is served");
    let stats = admission.stats();
    assert_eq!(
        (stats.granted, stats.in_use),
        (1, 0),
        "the permit is released with the response"
    );
}
