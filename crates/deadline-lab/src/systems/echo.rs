//! `grpc.health.v1.Health/Check`, for external load generators.

use std::net::SocketAddr;

use tonic::service::Routes;
use tonic_deadline::ServerDeadlineLayer;

use crate::net;

/// Serves the standard health service on `addr`, behind our server layer
/// unless `plain`, and (as the README serves) the reset guard unless
/// `layer_only`.
pub async fn start(addr: &str, plain: bool, layer_only: bool) -> anyhow::Result<SocketAddr> {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let layer = (!plain).then(ServerDeadlineLayer::new);
    let guard = if layer_only {
        net::Guard::LayerOnly
    } else {
        net::Guard::Reset
    };
    net::serve_with(addr, Routes::new(health), layer, guard).await
}
