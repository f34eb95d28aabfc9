//! The lab's tests, in one binary so that the lab and the helpers are
//! linked once (the library has no test build of its own: its unit tests
//! are here too).
//!
//! The modules behind a feature need a peer the machine may not have
//! (PostgreSQL, root for network namespaces, valgrind, Prometheus, nginx,
//! Chromium); `scripts/test-all` installs them and enables every feature.

mod common;

mod callgrind_output;
mod capture;
mod cascade;
mod clock;
mod docs;
mod experiments;
mod faults;
mod generated;
mod grpc_crate;
mod ledger;
mod logs;
mod peers;
mod rapid_reset;
mod registry;
mod report_html;
mod resilience;
mod resources;
mod traces;

#[cfg(feature = "postgres-tests")]
mod edge;
#[cfg(feature = "netns-tests")]
mod hosts;
#[cfg(feature = "callgrind-tests")]
mod instructions_callgrind;
#[cfg(feature = "prometheus-tests")]
mod prometheus;
#[cfg(feature = "nginx-tests")]
mod proxy;
#[cfg(feature = "chromium-tests")]
mod report_chromium;
