//! The one table from scope causes to gRPC statuses.
//!
//! Every place that turns an ended scope into a status — the server's timer,
//! the client's race, a handler's `scope.check()?` — goes through
//! [`status_for`], so a deadline is `DEADLINE_EXCEEDED` everywhere and a
//! cancel is `CANCELLED` everywhere. Messages are fixed texts; the
//! details of which request and how much budget was left go to logs.

use std::error::Error;

use tonic::Status;

use crate::scope::{Cause, Ended};

/// The status reported for a scope that ended with `cause`.
///
/// ```
/// use tonic_deadline::{Cause, status::status_for};
/// let status = status_for(Cause::DeadlineExceeded);
/// assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
/// assert_eq!(status.message(), "deadline exceeded");
/// ```
pub fn status_for(cause: Cause) -> Status {
    cause_status(cause).clone()
}

/// The status of each cause, made once. Every error that stands for an
/// ended scope names one of these as (the end of) its
/// [`source`](Error::source) chain, so tonic's `Status::from_error` finds
/// the same code and message that [`status_for`] gives.
///
/// The table itself is the core's ([`grpc_deadline::tonic_status::of`]),
/// so that `?` from an [`Ended`] gives the same status.
pub(crate) fn cause_status(cause: Cause) -> &'static Status {
    grpc_deadline::tonic_status::of(cause)
}

/// `err` and then each error in its source chain. The one walk of a source
/// chain: [`from_error`], the HTTP client's `ended_in` and the client's
/// lost-connection test all look through errors with it.
pub(crate) fn chain<'a>(
    err: &'a (dyn Error + 'static),
) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(err), |&err| err.source())
}

/// The status for any error, looking through its source chain: the first
/// [`Ended`] or [`Status`] found decides; anything else is `UNKNOWN` with
/// the error's text, as tonic does.
///
/// Use it where an error crosses into a handler's answer as a boxed error
/// (`anyhow`, `Box<dyn Error>`, a wrapper of your own): a scope that ended
/// still answers `DEADLINE_EXCEEDED` or `CANCELLED`.
///
/// ```
/// use tonic_deadline::{Scope, status::from_error};
///
/// #[derive(Debug)]
/// struct LookupFailed(tonic_deadline::Ended);
/// impl std::fmt::Display for LookupFailed {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("lookup failed") }
/// }
/// impl std::error::Error for LookupFailed {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> { Some(&self.0) }
/// }
///
/// let scope = Scope::background();
/// scope.cancel();
/// let err = LookupFailed(scope.check().unwrap_err());
/// assert_eq!(from_error(&err).code(), tonic::Code::Cancelled);
/// ```
pub fn from_error(err: &(dyn Error + 'static)) -> Status {
    chain(err)
        .find_map(|err| {
            if let Some(ended) = err.downcast_ref::<Ended>() {
                return Some(Status::from(*ended));
            }
            let status = err.downcast_ref::<Status>()?;
            let mut copy = Status::new(status.code(), status.message());
            *copy.metadata_mut() = status.metadata().clone();
            Some(copy)
        })
        .unwrap_or_else(|| Status::unknown(err.to_string()))
}

/// The gRPC status of a plain-HTTP answer, so the series of an HTTP edge
/// and of the gRPC services behind it read alike: the HTTP statuses
/// `google.rpc.Code` gives its codes, read backwards (where two codes share
/// one, the more general), success and redirects `OK`, anything else
/// `UNKNOWN`.
pub(crate) fn code_for_http(status: http::StatusCode) -> tonic::Code {
    use tonic::Code;
    match status.as_u16() {
        100..=399 => Code::Ok,
        400 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 => Code::Aborted,
        429 => Code::ResourceExhausted,
        499 => Code::Cancelled,
        500 => Code::Internal,
        501 => Code::Unimplemented,
        503 => Code::Unavailable,
        504 => Code::DeadlineExceeded,
        _ => Code::Unknown,
    }
}

#[cfg(test)]
mod tests;
