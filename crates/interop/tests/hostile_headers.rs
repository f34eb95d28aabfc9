//! Every hostile `grpc-timeout` row against our server over raw HTTP/2: the
//! exact status the spec requires, the connection still usable afterwards,
//! and no panic anywhere in the process.

use std::sync::atomic::{AtomicUsize, Ordering};

use interop::hostile::{Answer, Connection, Expect, table};
use tonic::Code;

static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        default(info);
    }));
}

async fn start_server() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding a loopback port must work");
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    #[allow(clippy::disallowed_methods)] // the server outlives every request
    tokio::spawn(interop::server::serve_reporting_budget(
        listener,
        std::future::pending(),
    ));
    addr
}

fn plain_call_ok(answer: &Answer) -> bool {
    answer.code == Some(Code::Ok) && answer.remaining.as_deref() == Some("none")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_grpc_timeout_gets_the_spec_status_and_the_connection_survives() {
    count_panics();
    let addr = start_server().await;
    let mut connection = Connection::open(addr)
        .await
        .expect("the server must accept an HTTP/2 connection");
    let mut failures = Vec::new();
    let rows = table();
    assert!(rows.len() >= 28, "the table must keep every row");
    for row in &rows {
        let answer = connection
            .call(&row.values)
            .await
            .unwrap_or_else(|e| panic!("{}: the server must answer: {e:#}", row.shown()));
        assert!(
            answer.refused_locally.is_none(),
            "{}: every row must be sendable over HTTP/2, so it reaches the server",
            row.shown()
        );
        if let Err(why) = row.check(&answer) {
            failures.push(format!("{} ({}): {why}", row.shown(), row.origin));
        }
        let next = connection
            .call(&[])
            .await
            .unwrap_or_else(|e| panic!("{}: the connection must stay usable: {e:#}", row.shown()));
        assert!(
            plain_call_ok(&next),
            "{}: the next plain call on the connection must succeed, got {next}",
            row.shown()
        );
    }
    assert!(
        failures.is_empty(),
        "rows answered against the spec:\n{}",
        failures.join("\n")
    );
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "nothing may panic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_name_the_header_and_the_problem() {
    let addr = start_server().await;
    let mut connection = Connection::open(addr)
        .await
        .expect("the server must accept an HTTP/2 connection");
    let cases: &[(&[u8], &str)] = &[
        (b"123456789S", "more than 8 digits"),
        (b"1s", "unit"),
        (b"+1S", "digits"),
        (b"", "at least one digit"),
    ];
    for &(value, says) in cases {
        let answer = connection
            .call(&[value.to_vec()])
            .await
            .expect("the server must answer");
        assert_eq!(answer.code, Some(Code::Internal), "{answer}");
        assert!(
            answer.message.contains("malformed grpc-timeout") && answer.message.contains(says),
            "the message for {:?} must say {says:?}: {:?}",
            value.escape_ascii().to_string(),
            answer.message
        );
    }
    let answer = connection
        .call(&[b"1S".to_vec(), b"2S".to_vec()])
        .await
        .expect("the server must answer");
    assert!(
        answer.message.contains("more than once"),
        "a duplicated header must be named as such: {answer}"
    );
}

#[test]
fn every_grpc_go_decode_row_is_in_the_table() {
    // grpc-go's TestTimeoutDecode: "1234S", "1234x", "1", "".
    let rows = table();
    let go: Vec<_> = rows.iter().filter(|r| r.origin == "grpc-go").collect();
    let values: Vec<&[u8]> = go.iter().map(|r| r.values[0].as_slice()).collect();
    assert_eq!(values, [&b"1234S"[..], b"1234x", b"1", b""]);
    assert!(matches!(go[0].expect, Expect::Budget(_)));
}
