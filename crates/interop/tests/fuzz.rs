//! Long property runs on the two places that read peer-controlled
//! `grpc-timeout` bytes: the header decoder, and the server layer's request
//! path in front of a real tonic service.
//!
//! Each run checks against the oracle of [`interop::spec`], written from the spec (not the
//! library's code), and fails on any panic. Case counts default to
//! [`DECODE_CASES`] and [`LAYER_CASES`]; set `INTEROP_FUZZ_SCALE=N` to run N
//! times as many (`scripts/conformance` runs a longer pass). Each test prints
//! how many inputs it ran.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request};
use http_body_util::BodyExt;
use interop::pb::test_service_server::TestServiceServer;
use interop::server::{BudgetReportLayer, REMAINING_HEADER, TestServer};
use interop::spec::{self, Verdict};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tonic::Code;
use tonic_deadline::ServerDeadlineLayer;
use tonic_deadline::timeout_header::decode;
use tower::{Layer, ServiceExt};

/// Inputs for the pure decoder at scale 1.
const DECODE_CASES: u32 = 50_000;
/// Requests through the server layer at scale 1.
const LAYER_CASES: u32 = 20_000;

fn scale() -> u32 {
    std::env::var("INTEROP_FUZZ_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1)
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

/// Bytes near the grammar (where the bugs are) and arbitrary bytes.
fn timeout_bytes() -> impl Strategy<Value = Vec<u8>> {
    let near_digit = prop_oneof![
        12 => b'0'..=b'9',
        1 => prop::sample::select(b"+- \t.xe".to_vec()),
        1 => any::<u8>(),
    ];
    let unit = prop::sample::select(b"HMSmunhsx \t".to_vec());
    prop_oneof![
        3 => (proptest::collection::vec(near_digit, 0..11), proptest::option::of(unit)).prop_map(
            |(mut digits, unit)| {
                digits.extend(unit);
                digits
            }
        ),
        1 => proptest::collection::vec(any::<u8>(), 0..12),
    ]
}

#[test]
fn decoder_matches_the_spec_on_every_input() {
    let cases = DECODE_CASES * scale();
    let ran = AtomicU64::new(0);
    runner(cases)
        .run(&timeout_bytes(), |value| {
            ran.fetch_add(1, Ordering::Relaxed);
            let got = decode(&value).ok();
            prop_assert_eq!(
                got,
                spec::timeout(&value),
                "value {:?}",
                value.escape_ascii().to_string()
            );
            Ok(())
        })
        .expect("the decoder must agree with the spec and never panic");
    println!("fuzz: decoder ran {} inputs", ran.load(Ordering::Relaxed));
}

#[test]
fn server_layer_answers_every_header_set_as_the_spec_says() {
    let cases = LAYER_CASES * scale();
    let ran = AtomicU64::new(0);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime must build");
    let service = ServerDeadlineLayer::new()
        .layer(BudgetReportLayer::new().layer(TestServiceServer::new(TestServer::new())));
    let header_sets = proptest::collection::vec(
        timeout_bytes()
            .prop_filter_map("a valid header value", |v| HeaderValue::from_bytes(&v).ok()),
        0..3,
    );
    runner(cases)
        .run(&header_sets, |values| {
            ran.fetch_add(1, Ordering::Relaxed);
            let mut request = Request::post("/grpc.testing.TestService/EmptyCall")
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(tonic::body::Body::new(http_body_util::Full::new(
                    Bytes::from_static(&[0; 5]),
                )))
                .expect("a static request builds");
            for value in &values {
                request.headers_mut().append("grpc-timeout", value.clone());
            }
            let (code, remaining) = runtime.block_on(async {
                let response = service
                    .clone()
                    .oneshot(request)
                    .await
                    .expect("the service never fails at the transport level");
                let remaining = response
                    .headers()
                    .get(REMAINING_HEADER)
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                let status = match tonic::Status::from_header_map(response.headers()) {
                    Some(status) => Some(status),
                    None => {
                        let body = response.into_body().collect().await.ok();
                        body.and_then(|b| b.trailers().and_then(tonic::Status::from_header_map))
                    }
                };
                (status.map(|s| s.code()), remaining)
            });
            match spec::verdict(&values) {
                Verdict::Internal => {
                    prop_assert_eq!(code, Some(Code::Internal), "{:?}", values);
                    prop_assert!(remaining.is_none(), "no handler may run for {:?}", values);
                }
                Verdict::Expired => {
                    prop_assert_eq!(code, Some(Code::DeadlineExceeded), "{:?}", values);
                    prop_assert!(remaining.is_none(), "no handler may run for {:?}", values);
                }
                Verdict::Runs(None) => {
                    prop_assert_eq!(code, Some(Code::Ok));
                    prop_assert_eq!(remaining.as_deref(), Some("none"));
                }
                Verdict::Runs(Some(budget)) => {
                    // A budget under a millisecond may end before the handler.
                    if budget > Duration::from_millis(50) {
                        prop_assert_eq!(code, Some(Code::Ok), "{:?}", values);
                        let seen: u128 = remaining
                            .as_deref()
                            .and_then(|r| r.parse().ok())
                            .ok_or_else(|| {
                                TestCaseError::fail("the handler must see a deadline")
                            })?;
                        prop_assert!(seen <= budget.as_micros(), "{:?}: saw {} us", values, seen);
                    } else {
                        prop_assert!(
                            code == Some(Code::Ok) || code == Some(Code::DeadlineExceeded),
                            "{:?}: {:?}",
                            values,
                            code
                        );
                    }
                }
            }
            Ok(())
        })
        .expect("the layer must answer as the spec says and never panic");
    println!(
        "fuzz: server layer ran {} requests",
        ran.load(Ordering::Relaxed)
    );
}
