use std::time::Duration;

use http::HeaderMap;
use prost::Message as _;

use super::wire::{attach, entries_of_headers};
use super::*;

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

fn hop(method: &str, budget: u64, took: u64, calls: Vec<Call>) -> Hop {
    Hop {
        method: method.into(),
        budget: Some(ms(budget)),
        took: ms(took),
        queued: Duration::ZERO,
        transit: None,
        calls,
        more_calls: 0,
    }
}

fn call(method: &str, granted: u64, took: u64, reply: Reply) -> Call {
    Call {
        method: method.into(),
        granted: Some(ms(granted)),
        took: ms(took),
        code: Code::DeadlineExceeded,
        reply,
        started: None,
    }
}

fn at(mut call: Call, started: u64) -> Call {
    call.started = Some(ms(started));
    call
}

/// What a handler's `Status` becomes on the wire.
fn headers_of(status: &tonic::Status) -> HeaderMap {
    let mut headers = HeaderMap::new();
    status.add_header(&mut headers).expect("valid headers");
    headers
}

fn status_of(headers: &HeaderMap) -> tonic::Status {
    tonic::Status::from_header_map(headers).expect("a status")
}

#[test]
fn a_line_reads_back_as_it_was_written() {
    let written = hop(
        "/im.Logic/Send",
        800,
        799,
        vec![
            call("/im.Route/Deliver", 700, 300, Reply::NoLedger),
            call("/im.Route/Deliver", 399, 398, Reply::Ledger),
        ],
    );
    let line = written.to_line();
    assert_eq!(
        line,
        "/im.Logic/Send budget=800.00 took=799.00 call=/im.Route/Deliver,700.00,300.00,4,n \
         call=/im.Route/Deliver,399.00,398.00,4,l"
    );
    assert_eq!(Hop::from_line(&line), Some(written.clone()));
    assert_eq!(written.own(), ms(101));
}

#[test]
fn calls_that_do_not_fit_in_a_line_are_counted() {
    let calls = (0..10)
        .map(|_| {
            call(
                "/a.very.long.package.Service/AMethodWithALongName",
                1,
                1,
                Reply::Unanswered,
            )
        })
        .collect();
    let line = hop("/x.Y/Z", 10, 10, calls).to_line();
    assert!(
        line.len() <= MAX_ENTRY_BYTES,
        "{} bytes: {line}",
        line.len()
    );
    let read = Hop::from_line(&line).expect("a line");
    assert_eq!(read.calls.len() as u32 + read.more_calls, 10, "{line}");
    assert!(read.more_calls > 0);
}

#[test]
fn the_ledger_goes_into_the_details_and_the_message_beside_what_the_handler_set() {
    let handler_detail = prost_types::Any {
        type_url: "type.googleapis.com/google.rpc.ErrorInfo".into(),
        value: vec![10, 3, b'w', b'h', b'y'],
    };
    let details = tonic_types::pb::Status {
        code: 4,
        message: "slow".into(),
        details: vec![handler_detail.clone()],
    };
    let status = tonic::Status::with_details(
        tonic::Code::DeadlineExceeded,
        "route: slow 100%",
        details.encode_to_vec().into(),
    );
    let mut headers = headers_of(&status);
    let entries = vec![
        hop(
            "/im.Logic/Send",
            800,
            799,
            vec![call("/im.Route/Deliver", 798, 798, Reply::Ledger)],
        )
        .to_line(),
        hop("/im.Route/Deliver", 798, 798, vec![]).to_line(),
    ];
    attach(&mut headers, entries.clone());
    let status = status_of(&headers);
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    assert_eq!(
        status.message(),
        "route: slow 100% [ledger] 800.00 ms budget: Logic/Send 1.00 ms → Deliver 798.00 ms (stalled here)"
            .replace("Deliver 798", "Route/Deliver 798")
    );
    let read = tonic_types::pb::Status::decode(status.details()).expect("well-formed details");
    assert_eq!(read.code, 4);
    assert_eq!(read.message, status.message());
    assert_eq!(
        read.details[0], handler_detail,
        "the handler's detail is kept"
    );
    let ledger = from_status(&status).expect("a ledger");
    assert_eq!(ledger.hops().len(), 2);
    assert_eq!(
        ledger.stalled().map(|h| h.method.as_str()),
        Some("/im.Route/Deliver")
    );
    assert!(!ledger.capped());

    // The hop above replaces the ledger and the line; it never doubles them.
    let mut above = entries;
    above.insert(0, hop("/im.Gateway/Send", 801, 800, vec![]).to_line());
    attach(&mut headers, above);
    let status = status_of(&headers);
    assert_eq!(
        status.message().matches("[ledger]").count(),
        1,
        "{}",
        status.message()
    );
    let read = tonic_types::pb::Status::decode(status.details()).expect("well-formed details");
    assert_eq!(read.details.len(), 2, "the handler's and one ledger");
    assert_eq!(from_status(&status).map(|l| l.hops().len()), Some(3));
}

#[test]
fn details_that_are_not_a_status_are_kept_and_the_ledger_goes_in_the_message() {
    let status = tonic::Status::with_details(
        tonic::Code::DeadlineExceeded,
        "late",
        vec![0xff, 0x01].into(),
    );
    let mut headers = headers_of(&status);
    attach(&mut headers, vec![hop("/a.B/C", 10, 10, vec![]).to_line()]);
    let status = status_of(&headers);
    assert_eq!(status.details(), &[0xff, 0x01]);
    assert!(
        status
            .message()
            .starts_with("late [ledger] 10.00 ms budget: B/C 10.00 ms")
    );
    assert!(from_status(&status).is_none());
}

#[test]
fn a_malformed_or_huge_ledger_is_capped_and_said_so_never_a_panic() {
    let ledger_status = |stack_entries: Vec<String>| {
        let info = tonic_types::pb::DebugInfo {
            stack_entries,
            detail: DETAIL.into(),
        };
        let details = tonic_types::pb::Status {
            code: 4,
            message: String::new(),
            details: vec![prost_types::Any {
                type_url: "type.googleapis.com/google.rpc.DebugInfo".into(),
                value: info.encode_to_vec(),
            }],
        };
        tonic::Status::with_details(
            tonic::Code::DeadlineExceeded,
            "x",
            details.encode_to_vec().into(),
        )
    };
    let good = hop("/a.B/C", 10, 10, vec![]).to_line();
    for bad in [
        "no method".to_owned(),
        "/a.B/C budget=-1".into(),
        "/a.B/C took=NaN".into(),
        "/a.B/C took=1e300".into(),
        "/a.B/C call=/x,1,2".into(),
        "/a.B/C call=/x,1,2,99999999999,l".into(),
        "/a.B/C queued=-1".into(),
        "/a.B/C call=/x,1,2,4,l,NaN".into(),
        format!("/a.B/C {}", "x=1 ".repeat(100)),
    ] {
        let ledger =
            from_status(&ledger_status(vec![good.clone(), bad.clone()])).expect("still a ledger");
        assert!(ledger.capped(), "{bad}");
        assert_eq!(ledger.hops().len(), 1, "{bad}");
        assert!(ledger.summary().ends_with("(capped)"));
    }
    let many = from_status(&ledger_status(vec![good.clone(); 100])).expect("a ledger");
    assert_eq!(many.hops().len(), MAX_HOPS);
    assert!(many.capped());

    // Details too large to be a ledger are not read; the status is kept.
    let huge = ledger_status(vec![good; 10_000]);
    let mut headers = headers_of(&huge);
    assert!(entries_of_headers(&headers).is_none());
    attach(&mut headers, vec![hop("/a.B/D", 5, 5, vec![]).to_line()]);
    let status = status_of(&headers);
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    assert!(status.message().starts_with("x [ledger] "));
    // Not base64 at all: tonic's own reading would panic; ours reads none.
    let mut headers = headers_of(&tonic::Status::deadline_exceeded("y"));
    headers.insert(
        "grpc-status-details-bin",
        http::HeaderValue::from_static("!!!"),
    );
    assert!(entries_of_headers(&headers).is_none());
    attach(&mut headers, vec![hop("/a.B/D", 5, 5, vec![]).to_line()]);
    assert_eq!(headers["grpc-status-details-bin"], "!!!");
}

#[test]
fn the_summary_names_where_the_chain_was_cut() {
    let ledger = Ledger {
        hops: vec![hop(
            "/shop.Checkout/Buy",
            500,
            499,
            vec![call("/shop.Pricing/Quote", 498, 498, Reply::NoLedger)],
        )],
        capped: false,
    };
    assert_eq!(
        ledger.summary(),
        "500.00 ms budget: Checkout/Buy 1.00 ms → Pricing/Quote 498.00 ms, \
         answered without a ledger (stalled here)"
    );
    assert_eq!(
        ledger.cut().map(|c| c.method.as_str()),
        Some("/shop.Pricing/Quote")
    );
    assert_eq!(short("/grpc.health.v1.Health/Check"), "Health/Check");
    assert_eq!(message_with("a [ledger] old", "new"), "a [ledger] new");
}

#[test]
fn queue_time_and_when_calls_started_read_back_and_tell_the_backoff() {
    let mut written = hop(
        "/a.A/Call",
        300,
        290,
        vec![
            at(call("/b.B/Call", 290, 1, Reply::NoLedger), 2),
            at(call("/b.B/Call", 277, 276, Reply::Ledger), 13),
        ],
    );
    written.queued = ms(2);
    let line = written.to_line();
    assert_eq!(
        line,
        "/a.A/Call budget=300.00 took=290.00 queued=2.00 call=/b.B/Call,290.00,1.00,4,n,2.00 \
         call=/b.B/Call,277.00,276.00,4,l,13.00"
    );
    assert_eq!(Hop::from_line(&line), Some(written.clone()));
    assert_eq!(
        written.gaps(),
        vec![ms(10)],
        "the backoff between the attempts"
    );
    assert_eq!(
        Ledger::from_entries(std::slice::from_ref(&line), false).summary(),
        "300.00 ms budget: A/Call 11.00 ms + 2.00 ms queued (10.00 ms between calls) \
         (stalled here) → B/Call 1.00 ms, answered without a ledger"
    );
    assert_eq!(written.own(), ms(290 - 2 - 1 - 276));
    // A line of the first version (no queue, no start) still reads.
    let old = Hop::from_line("/a.A/Call budget=300.00 took=290.00 call=/b.B/Call,290.00,1.00,4,n")
        .expect("a line");
    assert_eq!(old.calls[0].started, None);
    assert!(old.gaps().is_empty());
}

#[test]
fn the_transit_is_the_call_less_the_next_hop_and_the_summary_tells_queue_and_transit() {
    let mut route = hop("/im.Route/Get", 770, 760, vec![]);
    route.queued = ms(700);
    let entries = vec![
        hop(
            "/im.Logic/Send",
            800,
            799,
            vec![
                call("/im.Route/Get", 790, 5, Reply::NoLedger),
                call("/im.Route/Get", 785, 790, Reply::Ledger),
            ],
        )
        .to_line(),
        route.to_line(),
    ];
    let ledger = Ledger::from_entries(&entries, false);
    assert_eq!(ledger.hops()[0].transit, None, "the root has none");
    assert_eq!(
        ledger.hops()[1].transit,
        Some(ms(30)),
        "the call that brought the line back"
    );
    assert_eq!(
        ledger.stalled().map(|h| h.method.as_str()),
        Some("/im.Route/Get"),
        "a queue is where the time went"
    );
    assert_eq!(
        ledger.summary(),
        "800.00 ms budget: Logic/Send 4.00 ms → 30.00 ms in transit → \
         Route/Get 60.00 ms + 700.00 ms queued (stalled here)"
    );
    assert_eq!(ledger.cut(), None);
}

/// What a `tonic::Status` caller reads: the ledger in its details.
fn from_status(status: &tonic::Status) -> Option<Ledger> {
    Ledger::from_details(status.details())
}
