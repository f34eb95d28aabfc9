//! Experiments: each runs real services on loopback and measures one claim.
//!
//! An experiment is one file: its result type implements
//! [`Experiment`](crate::registry::Experiment) (its name, flags, run, table
//! and what it draws in the report), and its line in [`ALL`] (beside its
//! `mod` line here) puts it on the command line, in the demo and in the
//! report.

pub mod amplification;
pub mod chain;
pub mod db_cancel;
pub mod drift;
pub mod edge;
pub mod expired;
pub mod faults;
pub mod grpc_crate;
pub mod handler;
pub mod hedge;
pub mod honest_resets;
pub mod hosts;
pub mod im;
pub mod jobs;
pub mod ledger;
pub mod metastable;
pub mod orders;
pub mod propagation;
pub mod proxy;
pub mod rapid_reset;
pub mod retry;
pub mod seams;
pub mod shop;
pub mod waterfall;
pub mod wire;

use probe::CallRequest;
use probe::probe_client::ProbeClient;
use tonic_deadline::Scope;

use crate::net::{self, Layered};
use crate::registry::Entry;

/// Every experiment, in the order the demo runs them.
pub static ALL: &[Entry] = &[
    Entry::of::<wire::Wire>(),
    Entry::of::<chain::Chain>(),
    Entry::of::<grpc_crate::GrpcCrate>(),
    Entry::of::<propagation::Propagation>(),
    Entry::of::<expired::Expired>(),
    Entry::of::<handler::Handler>(),
    Entry::of::<drift::Drift>(),
    Entry::of::<im::Im>(),
    Entry::of::<ledger::LedgerResult>(),
    Entry::of::<waterfall::Waterfall>(),
    Entry::of::<shop::Shop>(),
    Entry::of::<orders::Orders>(),
    Entry::of::<db_cancel::DbCancel>(),
    Entry::of::<seams::Seams>(),
    Entry::of::<edge::Edge>(),
    Entry::of::<hosts::Hosts>(),
    Entry::of::<proxy::Proxy>(),
    Entry::of::<faults::Faults>(),
    Entry::of::<rapid_reset::RapidReset>(),
    Entry::of::<honest_resets::HonestResets>(),
    Entry::of::<amplification::Amplification>(),
    Entry::of::<metastable::Metastable>(),
    Entry::of::<retry::RetryCases>(),
    Entry::of::<hedge::HedgeRows>(),
    Entry::of::<jobs::JobsRun>(),
];

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
