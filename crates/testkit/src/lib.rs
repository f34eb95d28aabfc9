//! What the workspace's tests and the lab share: the `probe.v1.Probe`
//! service they call, generated from `proto/` into `src/generated/`
//! (checked by [`codegen`] in the `generated` test); a Rapid Reset flood
//! from a raw client ([`flood`]), in the clear or over TLS with
//! certificates made for the run ([`tls`]); and what a test binary logged
//! ([`logs`]). HTTP/2 frames are read with the reset guard's frame module,
//! `tonic_deadline_guard::frames`, the one of the workspace.
//!
//! Shared by the library's integration tests and by `deadline-lab`.

#[cfg(feature = "codegen")]
pub mod codegen;
pub mod flood;
pub mod logs;
pub mod tls;

#[allow(missing_docs, unreachable_pub, clippy::all)]
mod generated {
    include!("generated/probe.v1.rs");
}
pub use generated::*;

/// The encoded file descriptor set, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("generated/probe_descriptor.bin");

/// The stream of a probe's streaming replies.
pub type ReplyStream = std::pin::Pin<
    Box<dyn tonic::codegen::tokio_stream::Stream<Item = Result<CallReply, tonic::Status>> + Send>,
>;

/// A probe that answers `Call` and nothing else: every such type is a whole
/// [`probe_server::Probe`] service, whose `Watch` and `Chat` answer
/// `UNIMPLEMENTED`. Most tests and experiments need `Call` alone; this
/// writes the two refusals once.
///
/// ```
/// use testkit::{CallOnly, CallReply, CallRequest};
/// use tonic::{Request, Response, Status};
///
/// struct Echo;
///
/// #[tonic::async_trait]
/// impl CallOnly for Echo {
///     async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
///         let payload = request.into_inner().payload;
///         Ok(Response::new(CallReply { payload, ..Default::default() }))
///     }
/// }
///
/// let _server = testkit::probe_server::ProbeServer::new(Echo);
/// ```
#[tonic::async_trait]
pub trait CallOnly: Send + Sync + 'static {
    /// Answers one `Call`.
    async fn call(
        &self,
        request: tonic::Request<CallRequest>,
    ) -> Result<tonic::Response<CallReply>, tonic::Status>;
}

#[tonic::async_trait]
impl<T: CallOnly> probe_server::Probe for T {
    async fn call(
        &self,
        request: tonic::Request<CallRequest>,
    ) -> Result<tonic::Response<CallReply>, tonic::Status> {
        CallOnly::call(self, request).await
    }

    type WatchStream = ReplyStream;

    async fn watch(
        &self,
        _: tonic::Request<CallRequest>,
    ) -> Result<tonic::Response<ReplyStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("this probe answers Call only"))
    }

    type ChatStream = ReplyStream;

    async fn chat(
        &self,
        _: tonic::Request<tonic::Streaming<CallRequest>>,
    ) -> Result<tonic::Response<ReplyStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("this probe answers Call only"))
    }
}
