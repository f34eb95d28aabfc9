//! The `grpc-timeout` decoder agrees with the spec's grammar on every input
//! (the oracle is `interop::spec::timeout`, written from the spec), never
//! panics, and what it accepts survives a round trip through the encoder
//! without growing.
#![no_main]

// The oracle, written from the spec, shared with the interop crate's property
// runs: included as a module so the fuzz build compiles neither the interop
// crate nor its generated protos.
#[path = "../../crates/interop/src/spec.rs"]
#[allow(dead_code)]
mod spec;

use libfuzzer_sys::fuzz_target;
use tonic_deadline::timeout_header::{decode, encode};

fuzz_target!(|data: &[u8]| {
    let got = decode(data).ok();
    assert_eq!(
        got,
        spec::timeout(data),
        "decode({:?}) disagrees with the spec",
        data.escape_ascii().to_string()
    );
    if let Some(budget) = got {
        // Rounded up to the finest unit that fits eight digits: never less
        // time than was left, and at most one unit (< 1/100 000 of it) more.
        let again = decode(encode(budget).as_bytes()).expect("what we encode must decode");
        assert!(
            again >= budget,
            "encode({budget:?}) decoded as less: {again:?}"
        );
        assert!(
            again - budget <= budget / 100_000,
            "encode({budget:?}) decoded as {again:?}"
        );
    }
});
