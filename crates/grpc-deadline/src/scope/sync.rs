//! The synchronisation primitives of the cancellation tree, in one place so
//! that the model checker can swap in its own (see `tree`).

pub(crate) use std::sync::atomic::{AtomicBool, Ordering};
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};
