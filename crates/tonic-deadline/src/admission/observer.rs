//! What the admission layer tells whoever observes it. The layer calls
//! this and knows nothing of what is recorded: `observe`'s `Metrics`
//! implements it, handed over by `AdmissionLayer::metrics`.
//!
//! A layer given no observer makes no call.

use std::any::Any;
use std::fmt;

use super::{Permit, Refused};

/// Observes the admission decisions of an [`AdmissionLayer`](super::AdmissionLayer).
pub(crate) trait Observer: Any + Send + Sync + fmt::Debug {
    /// A request to `path` was given `acquired`: a permit (which knows how
    /// long it waited), or a refusal (which knows why).
    fn decided(&self, path: &str, acquired: &Result<Permit, Refused>);
}
