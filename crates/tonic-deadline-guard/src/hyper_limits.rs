//! hyper's guards against reset streams, as a [`ResetGuard`](crate::ResetGuard)
//! sets them.

/// How many streams a client may have reset before the server accepted
/// them, at one time on one connection, on a server built by
/// [`ResetGuard::builder`](crate::ResetGuard::builder) (hyper's default is
/// 20): a backstop, far beyond what the guard itself allows. Public for a
/// server built on hyper directly (axum, plain HTTP) whose connections a
/// [`ResetGuard`](crate::ResetGuard) wraps, to set the same:
/// `http2_max_pending_accept_reset_streams(Some(PENDING_ACCEPT_RESETS))`.
/// Without the guard it only bounds floods faster than the server's accept
/// loop, and loosely.
///
/// ```
/// assert!(tonic_deadline_guard::PENDING_ACCEPT_RESETS > 20);
/// ```
pub const PENDING_ACCEPT_RESETS: usize = 4096;

/// How many streams the server may reset for a client's protocol errors
/// on one connection, on a server built by
/// [`ResetGuard::builder`](crate::ResetGuard::builder): hyper's own default, which
/// tonic's `Server` turns off. Public for a server built on hyper directly,
/// to set the same guard:
/// `http2_max_local_error_reset_streams(Some(LOCAL_ERROR_RESETS))`.
///
/// ```
/// assert_eq!(tonic_deadline_guard::LOCAL_ERROR_RESETS, 1024);
/// ```
pub const LOCAL_ERROR_RESETS: usize = 1024;
