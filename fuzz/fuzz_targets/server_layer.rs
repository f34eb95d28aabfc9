//! The server layer's request path, with no network: `ServerDeadline` in
//! front of a small handler, requests built from the fuzz input (0–3
//! `grpc-timeout` values, other headers, request body frames, the layer's
//! default and maximum, how long the handler works and how its reply
//! streams), run on a paused-clock runtime so time is exact and free.
//!
//! The oracle (`interop::spec::verdict` for the headers, the configured caps
//! on top): a malformed or repeated `grpc-timeout` is answered `INTERNAL`
//! naming the header, a zero budget `DEADLINE_EXCEEDED`, both before the
//! handler runs; otherwise the handler sees a deadline no later than its
//! budget (a budget of a millisecond or less may end before it is first
//! polled), and the call ends with the handler's own answer when the budget
//! covers its work and with `DEADLINE_EXCEEDED` when it does not. Nothing
//! panics and nothing hangs.
#![no_main]

// The oracle, written from the spec, shared with the interop crate's property
// runs: included as a module so the fuzz build compiles neither the interop
// crate nor its generated protos.
#[path = "../../crates/interop/src/spec.rs"]
#[allow(dead_code)]
mod spec;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use spec::{Verdict, verdict};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use tonic::Code;
use tonic_deadline::{Scope, ServerDeadlineLayer};
use tower::ServiceExt;
use tower_layer::Layer;

#[derive(Debug, Arbitrary)]
struct Input {
    timeouts: Vec<Vec<u8>>,
    headers: Vec<(u8, Vec<u8>)>,
    body: Vec<Vec<u8>>,
    default_ms: Option<u8>,
    max_ms: Option<u16>,
    handler_ms: u8,
    reply_frames: u8,
    reply_gap_ms: u8,
    fail: bool,
}

/// Header names other than `grpc-timeout` a request may carry.
const NAMES: [&str; 5] = [
    "x-trace-id",
    "content-type",
    "te",
    "grpc-encoding",
    "grpc-timeout-x",
];

/// What the handler saw.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    ran: bool,
    remaining: Option<Option<Duration>>,
}

fn reply_body(frames: u8, gap: Duration) -> tonic::body::Body {
    let stream = futures_util::stream::unfold(0u8, move |n| async move {
        if n > frames {
            return None;
        }
        tokio::time::sleep(gap).await;
        let frame = if n == frames {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            Frame::trailers(trailers)
        } else {
            Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]))
        };
        Some((Ok::<_, Infallible>(frame), n + 1))
    });
    tonic::body::Body::new(StreamBody::new(stream))
}

/// The code a response ends with: trailers-only, or its trailers.
async fn code_of(response: Response<impl http_body::Body<Data = Bytes>>) -> Option<(Code, String)> {
    if let Some(status) = tonic::Status::from_header_map(response.headers()) {
        return Some((status.code(), status.message().to_owned()));
    }
    let collected = response.into_body().collect().await.ok()?;
    let status = collected
        .trailers()
        .and_then(tonic::Status::from_header_map)?;
    Some((status.code(), status.message().to_owned()))
}

fuzz_target!(|input: Input| {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime builds");

    let timeouts: Vec<HeaderValue> = input
        .timeouts
        .iter()
        .take(3)
        .filter_map(|v| HeaderValue::from_bytes(v).ok())
        .collect();
    let mut request = Request::post("/probe.v1.Probe/Call")
        .body(StreamBody::new(futures_util::stream::iter(
            input
                .body
                .iter()
                .take(8)
                .map(|b| Ok::<_, Infallible>(Frame::data(Bytes::copy_from_slice(b))))
                .collect::<Vec<_>>(),
        )))
        .expect("a static request builds");
    for value in &timeouts {
        request.headers_mut().append("grpc-timeout", value.clone());
    }
    for (name, value) in input.headers.iter().take(4) {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            let name = HeaderName::from_static(NAMES[usize::from(*name) % NAMES.len()]);
            request.headers_mut().append(name, value);
        }
    }

    let mut layer = ServerDeadlineLayer::new().forward_metadata("x-trace-id");
    let default = input.default_ms.map(|ms| Duration::from_millis(ms.into()));
    let max = input.max_ms.map(|ms| Duration::from_millis(ms.into()));
    if let Some(d) = default {
        layer = layer.default_timeout(d);
    }
    if let Some(m) = max {
        layer = layer.max_timeout(m);
    }

    let seen = Arc::new(Mutex::new(Seen::default()));
    let (handler, gap, frames, fail) = (
        Duration::from_millis(input.handler_ms.into()),
        Duration::from_millis(input.reply_gap_ms.into()),
        input.reply_frames % 5,
        input.fail,
    );
    let inner = tower::service_fn({
        let seen = seen.clone();
        move |request: Request<_>| {
            let seen = seen.clone();
            async move {
                {
                    let mut seen = seen.lock().expect("not poisoned");
                    seen.ran = true;
                    seen.remaining = Some(Scope::try_current().and_then(|s| s.remaining()));
                }
                let _ = BodyExt::collect(request.into_body()).await;
                // Ignores its scope on purpose: the layer's own timer must end it.
                tokio::time::sleep(handler).await;
                if fail {
                    return Ok::<_, Infallible>(tonic::Status::invalid_argument("no").into_http());
                }
                Ok(Response::new(reply_body(frames, gap)))
            }
        }
    });
    let service = layer.layer(inner);

    let answer = runtime.block_on(async {
        let call = async {
            let response = service.oneshot(request).await.expect("infallible");
            code_of(response).await
        };
        tokio::time::timeout(Duration::from_secs(3600), call).await
    });
    let answer = answer.expect("the layer must answer, not hang");
    let (code, message) = answer.expect("every answer must carry a grpc-status");
    let seen = *seen.lock().expect("not poisoned");

    let budget = match verdict(&timeouts) {
        Verdict::Internal => {
            assert_eq!(code, Code::Internal, "{timeouts:?}: {message}");
            assert!(
                message.contains("grpc-timeout"),
                "the message must name the header: {message}"
            );
            assert!(!seen.ran, "no handler may run for {timeouts:?}");
            return;
        }
        Verdict::Expired => Some(Duration::ZERO),
        Verdict::Runs(requested) => requested.or(default),
    };
    // The configured caps, as the layer documents them.
    let budget = match (budget, max) {
        (Some(b), Some(m)) => Some(b.min(m)),
        (None, m) => m,
        (b, None) => b,
    };
    if budget == Some(Duration::ZERO) {
        assert_eq!(code, Code::DeadlineExceeded, "{timeouts:?}: {message}");
        assert!(!seen.ran, "no handler may run on a zero budget");
        return;
    }
    if !seen.ran {
        // The layer's timer fires a millisecond early (ahead of tonic's own),
        // so a budget that short may end before the handler is first polled.
        assert!(
            budget.is_some_and(|b| b <= Duration::from_millis(1)) && code == Code::DeadlineExceeded,
            "the handler must run for {timeouts:?} with a {budget:?} budget ({code:?})"
        );
        return;
    }
    let remaining = seen.remaining.expect("the handler records what it saw");
    assert_eq!(
        remaining.is_some(),
        budget.is_some(),
        "a deadline iff a budget"
    );
    if let (Some(left), Some(b)) = (remaining, budget) {
        assert!(left <= b, "the handler saw {left:?} of a {b:?} budget");
    }
    let work = if fail {
        handler
    } else {
        handler + gap * (u32::from(frames) + 1)
    };
    let natural = if fail {
        Code::InvalidArgument
    } else {
        Code::Ok
    };
    match budget {
        None => assert_eq!(code, natural, "no deadline: the handler's own answer"),
        Some(b) if b > work + Duration::from_millis(2) => {
            assert_eq!(
                code, natural,
                "budget {b:?} covers {work:?} of work: {message}"
            )
        }
        Some(b) if b + Duration::from_millis(1) < work => {
            assert_eq!(
                code,
                Code::DeadlineExceeded,
                "budget {b:?} under {work:?} of work"
            )
        }
        Some(_) => assert!(
            code == natural || code == Code::DeadlineExceeded,
            "at the edge: {code:?}"
        ),
    }
});
