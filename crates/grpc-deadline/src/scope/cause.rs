//! Why a scope ended: the [`Cause`], the gRPC code each is reported as,
//! and [`Ended`], the error of work stopped by it. With the `tonic`
//! feature, the one table from a cause to its `tonic::Status` too, so that
//! an `Ended` names its status wherever it travels.

use std::fmt;

use crate::code::Code;

/// Why a scope ended.
///
/// Each cause maps to exactly one gRPC status code (see [`Cause::code`]);
/// the conversion lives in one table, so a deadline can never surface as
/// `UNKNOWN` or `CANCELLED`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use grpc_deadline::{Cause, Scope};
/// let scope = Scope::background();
/// scope.cancel();
/// assert_eq!(scope.cause(), Some(Cause::Cancelled));
/// assert_eq!(Cause::DeadlineExceeded.code(), grpc_deadline::Code::DeadlineExceeded);
/// # }
/// ```
///
/// Not `non_exhaustive`, on purpose: every layer maps each cause, and a new
/// one must make each of them choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// The deadline this scope obeys (its own or an inherited one) passed.
    DeadlineExceeded,
    /// Code in this process called [`Scope::cancel`](super::Scope::cancel)
    /// on this scope or an ancestor.
    Cancelled,
    /// The server dropped the request before answering it, for a reason
    /// this process cannot see: the caller reset the stream (its own
    /// deadline or cancel) or closed the connection — or a layer outside
    /// the stack's deadline layer gave up on it, such as tonic's
    /// `Server::timeout`.
    ///
    /// An HTTP/2 server drops the request's future in all of these cases
    /// and says nothing more, so the cause is not named after the caller:
    /// with another timer in front it would be wrong. Let the deadline
    /// layer enforce the server's own limit (tonic-deadline's
    /// `ServerDeadlineLayer::max_timeout` rather than `Server::timeout`),
    /// and an ended scope says [`DeadlineExceeded`](Cause::DeadlineExceeded)
    /// when that limit is the reason.
    Abandoned,
    /// The request this scope served has been answered; work still tied to it
    /// is no longer wanted (Go cancels a handler's context the same way).
    Completed,
}

impl Cause {
    /// The gRPC status code this cause is reported as.
    ///
    /// ```
    /// use grpc_deadline::{Cause, Code};
    /// assert_eq!(Cause::DeadlineExceeded.code(), Code::DeadlineExceeded);
    /// assert_eq!(Cause::Abandoned.code(), Code::Cancelled);
    /// ```
    pub const fn code(self) -> Code {
        // Exhaustive on purpose: a new cause must pick one.
        match self {
            Cause::DeadlineExceeded => Code::DeadlineExceeded,
            Cause::Cancelled | Cause::Abandoned | Cause::Completed => Code::Cancelled,
        }
    }
}

impl Cause {
    /// Every cause, each at its [`index`](Cause::index).
    pub const ALL: [Cause; 4] = [
        Cause::DeadlineExceeded,
        Cause::Cancelled,
        Cause::Abandoned,
        Cause::Completed,
    ];

    /// Where this cause sits in [`Cause::ALL`], for tables kept per cause.
    /// Exhaustive on purpose.
    pub const fn index(self) -> usize {
        match self {
            Cause::DeadlineExceeded => 0,
            Cause::Cancelled => 1,
            Cause::Abandoned => 2,
            Cause::Completed => 3,
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cause::DeadlineExceeded => "deadline exceeded",
            Cause::Cancelled => "cancelled",
            Cause::Abandoned => "abandoned before the answer",
            Cause::Completed => "request completed",
        })
    }
}

/// The error of work stopped because its scope ended.
///
/// It knows its code ([`Cause::code`]), and converts into each stack's
/// status with that code (with the `tonic` feature, `tonic::Status`), so
/// `?` in a handler is always correct — the Go pitfall of returning
/// `ctx.Err()` and answering `UNKNOWN` has no Rust equivalent here.
///
/// ```
/// use grpc_deadline::{Code, Scope};
/// let scope = Scope::background();
/// scope.cancel();
/// let ended = scope.check().unwrap_err();
/// assert_eq!(ended.cause().code(), Code::Cancelled);
/// assert_eq!(ended.to_string(), "scope ended: cancelled");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    cause: Cause,
}

impl Ended {
    /// The error of a scope that ended with `cause`: what a layer returns
    /// for work it stopped.
    pub const fn new(cause: Cause) -> Self {
        Self { cause }
    }

    /// The `Ended` of `cause` as a constant, for errors that name it as
    /// their [`source`](std::error::Error::source) without holding one.
    pub fn of(cause: Cause) -> &'static Ended {
        static ENDED: [Ended; 4] = [
            Ended::new(Cause::DeadlineExceeded),
            Ended::new(Cause::Cancelled),
            Ended::new(Cause::Abandoned),
            Ended::new(Cause::Completed),
        ];
        &ENDED[cause.index()]
    }

    /// Why the scope ended.
    pub fn cause(&self) -> Cause {
        self.cause
    }
}

impl fmt::Display for Ended {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "scope ended: {}", self.cause)
    }
}

/// With the `tonic` feature an `Ended` names its `tonic::Status` as its
/// source, so anything that looks for a status in an error's source chain
/// finds the right one — tonic's own `Status::from_error` included. Without
/// it, an `Ended` that travelled as a `Box<dyn Error>` (what `?` into a
/// boxed error gives) would become `UNKNOWN`.
impl std::error::Error for Ended {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        #[cfg(feature = "tonic")]
        return Some(tonic_status(self.cause));
        #[cfg(not(feature = "tonic"))]
        None
    }
}

/// The status of each cause, made once: what [`Ended`] converts into, and
/// what it names as its [`source`](std::error::Error::source), so tonic's
/// `Status::from_error` finds the same code and a fixed message.
///
/// ```
/// use grpc_deadline::{Cause, tonic_status};
/// let status = tonic_status::of(Cause::DeadlineExceeded);
/// assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
/// assert_eq!(status.message(), "deadline exceeded");
/// ```
#[cfg(feature = "tonic")]
pub fn tonic_status(cause: Cause) -> &'static tonic::Status {
    static STATUSES: std::sync::LazyLock<[tonic::Status; 4]> = std::sync::LazyLock::new(|| {
        Cause::ALL.map(|cause| tonic::Status::new(cause.code().into(), cause.to_string()))
    });
    &STATUSES[cause.index()]
}

/// `?` from an ended scope into a tonic handler's error: the status of its
/// cause (feature `tonic`).
///
/// ```
/// use grpc_deadline::Scope;
///
/// fn handler_step(scope: &Scope) -> Result<(), tonic::Status> {
///     scope.check()?; // DEADLINE_EXCEEDED or CANCELLED, never UNKNOWN
///     Ok(())
/// }
/// let scope = Scope::background();
/// scope.cancel();
/// assert_eq!(handler_step(&scope).unwrap_err().code(), tonic::Code::Cancelled);
/// ```
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl From<Ended> for tonic::Status {
    fn from(ended: Ended) -> tonic::Status {
        tonic_status(ended.cause()).clone()
    }
}

#[cfg(all(test, feature = "tonic"))]
mod tests {
    use super::*;

    #[test]
    fn an_ended_scope_answers_its_causes_code_boxed_or_not() {
        for cause in Cause::ALL {
            let code = tonic::Code::from(cause.code());
            assert_eq!(
                tonic::Status::from(Ended::new(cause)).code(),
                code,
                "{cause}: converted, an ended scope must answer its cause's code"
            );
            let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(Ended::new(cause));
            assert_eq!(
                tonic::Status::from_error(boxed).code(),
                code,
                "{cause}: boxed, its source must still answer its cause's code"
            );
        }
    }
}
