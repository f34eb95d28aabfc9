//! What tonic is handed: the request's messages, encoded already by the
//! `grpc` crate's caller, and a codec that copies bytes both ways.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes};
use futures_util::Stream;
use tokio::sync::mpsc;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// A message encoded by the caller (`SendMessage::encode`).
pub(crate) type Outgoing = Box<dyn Buf + Send + Sync>;

/// The request body's messages, as the sending side queues them.
///
/// # Invariant
///
/// It ends (and tonic half-closes the stream with `END_STREAM`) only after
/// the sending side marked the request finished — a message sent as the
/// final one. A sending side dropped before that leaves it pending for
/// ever: the call's cancellation handle, cancelled first, resets the stream
/// instead, so an abandoned request never reads as a complete one.
#[derive(Debug)]
pub(crate) struct RequestMessages {
    queued: mpsc::Receiver<Outgoing>,
    finished: Arc<AtomicBool>,
}

impl RequestMessages {
    pub(crate) fn new(queued: mpsc::Receiver<Outgoing>) -> Self {
        Self {
            queued,
            finished: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Set by the sending side before it drops its sender, once the final
    /// message is queued.
    pub(crate) fn finished_flag(&self) -> Arc<AtomicBool> {
        self.finished.clone()
    }
}

impl Stream for RequestMessages {
    type Item = Outgoing;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Outgoing>> {
        match self.queued.poll_recv(cx) {
            Poll::Ready(Some(message)) => Poll::Ready(Some(message)),
            // The sender set the flag before dropping its end (Release);
            // the channel's close orders it before this read.
            Poll::Ready(None) if self.finished.load(Ordering::Acquire) => Poll::Ready(None),
            // Abandoned: the reset is on its way (see the invariant).
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

/// Bytes in, bytes out: the `grpc` crate's caller encodes and decodes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawCodec;

impl Codec for RawCodec {
    type Encode = Outgoing;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Outgoing;
    type Error = Status;

    fn encode(&mut self, mut item: Outgoing, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(&mut *item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
