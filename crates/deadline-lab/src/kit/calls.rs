//! Calls as the lab's client makes them, and what an experiment reads of
//! their outcome and of the wire.

use testkit::CallRequest;
use testkit::probe_client::ProbeClient;
use tonic_deadline::Scope;

use crate::net::{self, Layered};

/// A client to `addr` through our layer, with the connection already open.
pub async fn layered_client(addr: std::net::SocketAddr) -> anyhow::Result<ProbeClient<Layered>> {
    let mut client = ProbeClient::new(net::connect_layered(addr).await?);
    // Warm the connection so the measured call pays no handshake.
    without_deadline(client.call(CallRequest::default())).await?;
    Ok(client)
}

/// Runs a call of the lab's own client (the end user calling the first
/// service) with no deadline, the way a well-behaved client does: inside a
/// scope, here one without a deadline ([`Scope::background`]).
///
/// The call carries what it carried before (no deadline unless the request
/// sets one), but the client layer sees that it was made on purpose. The
/// lab's process also serves, and there a call outside any scope is
/// reported as one that lost its request's scope.
pub fn without_deadline<F: Future>(call: F) -> impl Future<Output = F::Output> {
    Scope::background().enter(call)
}

/// The status name of a call's result (`OK` or the gRPC code name).
pub fn status_name<T>(result: &Result<T, tonic::Status>) -> &'static str {
    match result {
        Ok(_) => "OK",
        Err(status) => crate::report::code_name(status.code()),
    }
}

/// The frames worth reading in a capture (requests, replies, resets), as
/// human lines.
pub fn wire_lines(records: &[crate::capture::Record]) -> Vec<String> {
    records
        .iter()
        .filter(|r| {
            use tonic_deadline_guard::frames::{CONTINUATION, DATA, GOAWAY, HEADERS, RST_STREAM};
            matches!(
                r.frame.kind,
                DATA | HEADERS | RST_STREAM | GOAWAY | CONTINUATION
            )
        })
        .map(crate::capture::Record::line)
        .collect()
}
