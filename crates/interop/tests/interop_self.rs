//! Our interop client against our interop server: all fourteen official
//! cases, in process, over loopback. The same cases run against gRPC's own
//! Ruby client and server from `scripts/conformance`.

// Tests start servers, peers and drivers that belong to no request.
#![allow(clippy::disallowed_methods)]

use interop::client::{Clients, TestCase, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_official_case_passes_against_our_own_server() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding a loopback port must work");
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    tokio::spawn(interop::server::serve(listener, std::future::pending()));
    let mut clients = Clients::connect("127.0.0.1", addr.port())
        .await
        .expect("the client must connect");
    let mut failed = Vec::new();
    for case in TestCase::ALL {
        if let Err(e) = run(case, &mut clients).await {
            failed.push(format!("{case}: {e:#}"));
        }
    }
    assert!(failed.is_empty(), "cases failed:\n{}", failed.join("\n"));
}

#[test]
fn case_names_round_trip_through_the_flag() {
    for case in TestCase::ALL {
        assert_eq!(case.name().parse::<TestCase>(), Ok(case));
    }
    assert!("cancel_after_everything".parse::<TestCase>().is_err());
}
