//! Experiments: each runs real services on loopback and measures one claim.
//!
//! An experiment is one file: its result type implements
//! [`Experiment`](crate::registry::Experiment) (its name, flags, run, table,
//! what it draws in the report and the line of `docs/lab.md` that lists
//! it), and its line in the list below puts it on the command line, in the
//! demo and in the report. What experiments share is in [`crate::kit`]:
//! none imports another.

crate::registry::entries! {
    /// Every experiment, in the order the demo runs them.
    ALL:
    wire::Wire,
    chain::Chain,
    grpc_crate::GrpcCrate,
    propagation::Propagation,
    expired::Expired,
    handler::Handler,
    drift::Drift,
    im::Im,
    ledger::LedgerResult,
    waterfall::Waterfall,
    shop::Shop,
    orders::Orders,
    db_cancel::DbCancel,
    seams::Seams,
    edge::Edge,
    hosts::Hosts,
    proxy::Proxy,
    faults::Faults,
    rapid_reset::RapidReset,
    honest_resets::HonestResets,
    amplification::Amplification,
    metastable::Metastable,
    retry::RetryCases,
    hedge::HedgeRows,
    jobs::JobsRun,
}
