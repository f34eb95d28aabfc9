//! The job queue against real processes: a worker killed mid-job leaves
//! the job to be taken again, never lost and never run twice at once.

#[cfg(feature = "sqlite")]
mod sigkill;
