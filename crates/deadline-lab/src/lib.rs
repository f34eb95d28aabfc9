//! The lab behind the `deadline-lab` command: the seed systems as real tonic
//! services, the experiments and benchmarks that measure them, and a capture
//! proxy that reads HTTP/2 frames on the wire.
//!
//! Everything runs on loopback in one process by default.

pub mod bench;
pub mod capture;
pub mod catalog;
pub mod cli;
pub mod clock;
pub mod demo;
pub mod experiments;
pub mod html;
pub mod kit;
pub mod logs;
pub mod metrics;
pub mod net;
pub mod netns;
pub mod nginx;
pub mod otlp;
pub mod page;
pub mod pb;
pub mod process;
pub mod registry;
pub mod report;
pub mod systems;
