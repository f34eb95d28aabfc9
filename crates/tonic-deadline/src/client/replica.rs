//! Which replica of a balanced channel answered, and which ones the next
//! attempt should not go to: what a balancer and the retry layer above it
//! tell each other.
//!
//! A balancer that knows which of its replicas took a call puts a
//! [`Replica`] in the response's extensions (or, for a failure made on this
//! side, wraps its error in a [`ReplicaFailed`]), and picks none of the
//! replicas an [`Avoid`] in the request's extensions names.
//! [`Balanced`](super::Balanced) does both; the
//! [`resilience`](crate::resilience) layer reads the one and writes the
//! other, so that a retry goes to another replica than the one that failed.

use std::fmt;

use crate::BoxError;

/// The replica of a balanced channel that took a call: an id unique among
/// the balancer's replicas, and how many replicas it held when it picked.
///
/// A balancer puts it in the extensions of every response it hands back
/// (and in a [`ReplicaFailed`] for a failure made on this side), so that a
/// layer above can tell which replica answered.
///
/// ```
/// use tonic_deadline::client::Replica;
///
/// let mut response = http::Response::new(());
/// response.extensions_mut().insert(Replica::new(2, 3));
/// let replica = response.extensions().get::<Replica>().copied();
/// assert_eq!(replica.map(|r| (r.id(), r.replicas())), Some((2, 3)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Replica {
    id: u64,
    replicas: usize,
}

impl Replica {
    /// Replica `id` of a balancer holding `replicas` of them.
    pub const fn new(id: u64, replicas: usize) -> Self {
        Self { id, replicas }
    }

    /// The replica's id.
    pub const fn id(&self) -> u64 {
        self.id
    }

    /// How many replicas the balancer held when it picked this one.
    pub const fn replicas(&self) -> usize {
        self.replicas
    }
}

/// The replicas a call's attempt must not go to, put in the request's
/// extensions by the layer above a balancer. A balancer that tags its
/// responses with [`Replica`] honours it: it picks a replica the set does
/// not name, and when it names every one it sends nothing and fails the
/// attempt with `UNAVAILABLE`.
///
/// ```
/// use tonic_deadline::client::Avoid;
///
/// let mut avoid = Avoid::default();
/// avoid.insert(1);
/// avoid.insert(1);
/// assert!(avoid.contains(1) && !avoid.contains(2));
/// assert_eq!(avoid.len(), 1);
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(avoid);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Avoid {
    // A handful of ids at most: a scan beats hashing.
    ids: Vec<u64>,
}

impl Avoid {
    /// Adds the replica `id`.
    pub fn insert(&mut self, id: u64) {
        if !self.contains(id) {
            self.ids.push(id);
        }
    }

    /// Whether the replica `id` is to be avoided.
    pub fn contains(&self, id: u64) -> bool {
        self.ids.contains(&id)
    }

    /// How many replicas are to be avoided.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether no replica is to be avoided.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The ids, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.ids.iter().copied()
    }
}

/// A call that failed on this side (no connection, a local timeout) at a
/// known replica: the error, with the [`Replica`] the balancer had picked.
/// Its [`source`](std::error::Error::source) is the failure, so that
/// `tonic::Status::from_error` finds the status inside.
///
/// ```
/// use tonic_deadline::client::{Replica, ReplicaFailed};
///
/// let err: tonic_deadline::BoxError = Box::new(ReplicaFailed::new(
///     Replica::new(0, 2),
///     Box::new(tonic::Status::unavailable("connection refused")),
/// ));
/// let failed = err.downcast_ref::<ReplicaFailed>().expect("tagged");
/// assert_eq!(failed.replica().id(), 0);
/// assert_eq!(tonic::Status::from_error(err).code(), tonic::Code::Unavailable);
/// ```
#[derive(Debug)]
pub struct ReplicaFailed {
    replica: Replica,
    source: BoxError,
}

impl ReplicaFailed {
    /// `source`, the failure of a call `replica` took.
    pub fn new(replica: Replica, source: BoxError) -> Self {
        Self { replica, source }
    }

    /// The replica the call went to.
    pub fn replica(&self) -> Replica {
        self.replica
    }

    /// The failure itself.
    pub fn into_source(self) -> BoxError {
        self.source
    }
}

impl fmt::Display for ReplicaFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "replica {}: {}", self.replica.id, self.source)
    }
}

impl std::error::Error for ReplicaFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// The replica an attempt's result names, and the result with a
/// [`ReplicaFailed`] unwrapped to the failure inside.
#[cfg_attr(
    not(feature = "service-config"),
    allow(dead_code, reason = "the resilience layer reads it")
)]
pub(crate) fn take_replica<RB>(
    result: Result<http::Response<RB>, BoxError>,
) -> (Option<Replica>, Result<http::Response<RB>, BoxError>) {
    match result {
        Ok(response) => (
            response.extensions().get::<Replica>().copied(),
            Ok(response),
        ),
        Err(err) => match err.downcast::<ReplicaFailed>() {
            Ok(failed) => (Some(failed.replica), Err(failed.source)),
            Err(err) => (None, Err(err)),
        },
    }
}
