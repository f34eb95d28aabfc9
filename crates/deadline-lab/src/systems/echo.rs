//! `grpc.health.v1.Health/Check`, for external load generators.

use std::net::SocketAddr;

use tonic::service::Routes;
use tonic_deadline::ServerDeadlineLayer;

use crate::net;

/// Serves the standard health service on `addr`, behind our server layer
/// unless `plain`.
pub async fn start(addr: &str, plain: bool) -> anyhow::Result<SocketAddr> {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let layer = (!plain).then(ServerDeadlineLayer::new);
    net::serve(addr, Routes::new(health), layer).await
}
