//! Hostile `grpc-timeout` values over raw HTTP/2, and what the spec requires
//! of the server for each.
//!
//! [`table`] holds every row of grpc-go's `decodeTimeout` test table, the
//! edges of grpc-go's decoder (too long, hour clamp) and the extras a careless
//! parser gets wrong (signs, spaces, lower-case units, non-ASCII, a
//! duplicated header). [`Connection`] sends each as a real
//! `grpc.testing.TestService/EmptyCall` on one HTTP/2 connection with the `h2`
//! crate, below any gRPC library, and reads the answer; [`Row::check`]
//! compares it with the spec (R-3, R-4): `INTERNAL` naming the header before
//! any handler runs, or a deadline of the value sent, or `DEADLINE_EXCEEDED`
//! for a zero budget.
//!
//! The same table runs against foreign servers (`interop-hostile`), to show
//! where their behaviour differs from ours.
//!
//! # Example
//!
//! ```no_run
//! use interop::hostile::{Connection, table};
//!
//! # async fn run() -> anyhow::Result<()> {
//! let mut connection = Connection::open("127.0.0.1:10000".parse()?).await?;
//! for row in table() {
//!     let answer = connection.call(&row.values).await?;
//!     println!("{:<14} {}", row.shown(), answer);
//! }
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request};
use tokio::net::TcpStream;
use tonic::Code;
use tonic_deadline::timeout_header::MAX_DECODED;

use crate::server::REMAINING_HEADER;

/// What the spec requires for one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// `INTERNAL`, with a message naming `grpc-timeout`; no handler runs.
    Internal,
    /// The handler runs with at most this budget (and not much less).
    Budget(Duration),
    /// `DEADLINE_EXCEEDED` at once: the budget is already spent.
    Expired,
    /// The handler runs without a deadline.
    NoDeadline,
}

/// One hostile input.
#[derive(Debug, Clone)]
pub struct Row {
    /// Where the row comes from: `grpc-go` (its decode test table),
    /// `grpc-go rule` (an edge of its decoder) or `extra`.
    pub origin: &'static str,
    /// The `grpc-timeout` values sent: none, one, or several (duplicated).
    pub values: Vec<Vec<u8>>,
    /// What the spec requires.
    pub expect: Expect,
}

impl Row {
    fn new(origin: &'static str, values: &[&[u8]], expect: Expect) -> Self {
        Self {
            origin,
            values: values.iter().map(|v| v.to_vec()).collect(),
            expect,
        }
    }

    /// The values as shown in reports: escaped, `|`-separated when duplicated.
    pub fn shown(&self) -> String {
        if self.values.is_empty() {
            return "(absent)".to_owned();
        }
        self.values
            .iter()
            .map(|v| format!("\"{}\"", v.escape_ascii()))
            .collect::<Vec<_>>()
            .join(" + ")
    }

    /// Like [`check`](Row::check), for a server that does not report the
    /// handler's budget: a row that must run the handler only needs `OK`.
    ///
    /// # Errors
    ///
    /// A sentence saying what differs.
    pub fn check_code(&self, answer: &Answer) -> Result<(), String> {
        match self.expect {
            Expect::Budget(_) | Expect::NoDeadline if answer.remaining.is_none() => {
                if answer.code == Some(Code::Ok) {
                    Ok(())
                } else {
                    Err(format!("must run the handler, got {answer}"))
                }
            }
            _ => self.check(answer),
        }
    }

    /// Whether `answer` is what the spec requires for this row.
    ///
    /// # Errors
    ///
    /// A sentence saying what differs.
    pub fn check(&self, answer: &Answer) -> Result<(), String> {
        let code = answer.code;
        match self.expect {
            Expect::Internal => {
                if code != Some(Code::Internal) {
                    return Err(format!("must be INTERNAL, got {answer}"));
                }
                if !answer.message.contains("grpc-timeout") {
                    return Err(format!("the message must name grpc-timeout: {answer}"));
                }
                if answer.remaining.is_some() {
                    return Err(format!("no handler may run: {answer}"));
                }
                Ok(())
            }
            Expect::Expired => {
                if code != Some(Code::DeadlineExceeded) || answer.remaining.is_some() {
                    return Err(format!(
                        "must be DEADLINE_EXCEEDED before the handler, got {answer}"
                    ));
                }
                Ok(())
            }
            Expect::NoDeadline => {
                if code != Some(Code::Ok) || answer.remaining.as_deref() != Some("none") {
                    return Err(format!("must run without a deadline, got {answer}"));
                }
                Ok(())
            }
            Expect::Budget(sent) => {
                if code != Some(Code::Ok) {
                    return Err(format!("must run the handler, got {answer}"));
                }
                let seen = answer
                    .remaining
                    .as_deref()
                    .and_then(|r| r.parse::<u128>().ok())
                    .ok_or_else(|| format!("the handler must see a deadline: {answer}"))?;
                let sent = sent.as_micros();
                // At most what was sent; at least what is left after a
                // generous allowance for a slow machine.
                if seen > sent || sent - seen > 2_000_000 {
                    return Err(format!("sent {sent} us, the handler saw {seen} us"));
                }
                Ok(())
            }
        }
    }
}

const SECOND: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3600);

/// Every hostile row, grpc-go's table first.
pub fn table() -> Vec<Row> {
    use Expect::{Budget, Expired, Internal, NoDeadline};
    vec![
        // grpc-go, internal/transport/http_util_test.go, TestTimeoutDecode.
        Row::new("grpc-go", &[b"1234S"], Budget(SECOND * 1234)),
        Row::new("grpc-go", &[b"1234x"], Internal),
        Row::new("grpc-go", &[b"1"], Internal),
        Row::new("grpc-go", &[b""], Internal),
        // The edges of grpc-go's decodeTimeout.
        Row::new("grpc-go rule", &[b"100000000S"], Internal),
        Row::new("grpc-go rule", &[b"2562047H"], Budget(HOUR * 2_562_047)),
        Row::new("grpc-go rule", &[b"2562048H"], Budget(MAX_DECODED)),
        // Extras.
        Row::new("extra", &[], NoDeadline),
        Row::new("extra", &[b"123456789n"], Internal),
        Row::new("extra", &[b"+1S"], Internal),
        Row::new("extra", &[b"-1S"], Internal),
        Row::new("extra", &[b" 1S"], Internal),
        Row::new("extra", &[b"1S "], Internal),
        Row::new("extra", &[b"1 S"], Internal),
        Row::new("extra", &[b"1\tS"], Internal),
        Row::new("extra", &[b"1s"], Internal),
        Row::new("extra", &[b"1h"], Internal),
        Row::new("extra", &[b"1.5S"], Internal),
        Row::new("extra", &[b"0x1S"], Internal),
        Row::new("extra", &[b"1\xe9S"], Internal),
        Row::new("extra", &["\u{FF11}S".as_bytes()], Internal),
        Row::new("extra", &[b"99999999H"], Budget(MAX_DECODED)),
        Row::new("extra", &[b"00000001S"], Budget(SECOND)),
        Row::new(
            "extra",
            &[b"99999999n"],
            Budget(Duration::from_nanos(99_999_999)),
        ),
        Row::new("extra", &[b"0n"], Expired),
        Row::new("extra", &[b"00000000H"], Expired),
        Row::new("extra", &[b"1S", b"2S"], Internal),
        Row::new("extra", &[b"1S", b"1S"], Internal),
    ]
}

/// A server's answer to one request, as seen on the wire.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    /// `grpc-status`, from the headers of a trailers-only answer or from the
    /// trailers; `None` if the server sent neither.
    pub code: Option<Code>,
    /// `grpc-message`, percent-decoded.
    pub message: String,
    /// The HTTP status.
    pub http_status: u16,
    /// The handler's remaining budget in microseconds (`none` without a
    /// deadline), when the server reports it ([`REMAINING_HEADER`]).
    pub remaining: Option<String>,
    /// The stream was reset instead of answered.
    pub reset: Option<h2::Reason>,
    /// The `h2` client itself refused to send the value (not valid in an
    /// HTTP header); nothing reached the server.
    pub refused_locally: Option<String>,
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(why) = &self.refused_locally {
            return write!(f, "not sent ({why})");
        }
        if let Some(reason) = self.reset {
            return write!(f, "RST_STREAM {reason:?}");
        }
        match self.code {
            Some(code) => write!(f, "{}", code_name(code))?,
            None => write!(f, "no grpc-status (HTTP {})", self.http_status)?,
        }
        if !self.message.is_empty() {
            write!(f, " {:?}", self.message)?;
        }
        match self.remaining.as_deref() {
            Some("none") => write!(f, " [handler saw no deadline]")?,
            Some(remaining) => write!(f, " [handler saw {remaining} us]")?,
            None => {}
        }
        Ok(())
    }
}

/// The upper-case name of a code, as the gRPC spec writes it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// One HTTP/2 connection to a gRPC server, sending hand-made requests.
#[derive(Debug)]
pub struct Connection {
    addr: SocketAddr,
    send: h2::client::SendRequest<Bytes>,
}

/// An empty protobuf message in gRPC framing: not compressed, length 0.
const EMPTY_MESSAGE: [u8; 5] = [0; 5];

/// How long one request may take before the server counts as hung.
pub const ANSWER_LIMIT: Duration = Duration::from_secs(10);

impl Connection {
    /// Opens a plaintext HTTP/2 connection (prior knowledge) to `addr`.
    ///
    /// # Errors
    ///
    /// When the TCP connection or the HTTP/2 handshake fails.
    pub async fn open(addr: SocketAddr) -> anyhow::Result<Self> {
        let tcp = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        let (send, connection) = h2::client::handshake(tcp)
            .await
            .context("HTTP/2 handshake")?;
        #[allow(clippy::disallowed_methods)] // drives the raw connection, not a request
        tokio::spawn(async move {
            // Ends with the connection; its error, if any, shows up in the
            // next request instead.
            let _ = connection.await;
        });
        Ok(Self { addr, send })
    }

    /// Sends `EmptyCall` with these `grpc-timeout` values (none, one, or
    /// several) and reads the answer.
    ///
    /// # Errors
    ///
    /// When the connection is gone or the server does not answer within
    /// [`ANSWER_LIMIT`]. A reset stream is an [`Answer`], not an error.
    pub async fn call(&mut self, values: &[Vec<u8>]) -> anyhow::Result<Answer> {
        tokio::time::timeout(ANSWER_LIMIT, self.call_unbounded(values))
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {ANSWER_LIMIT:?}"))?
    }

    async fn call_unbounded(&mut self, values: &[Vec<u8>]) -> anyhow::Result<Answer> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(format!(
                "http://{}/grpc.testing.TestService/EmptyCall",
                self.addr
            ))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .context("a static request must build")?;
        for value in values {
            match HeaderValue::from_bytes(value) {
                Ok(value) => {
                    request.headers_mut().append("grpc-timeout", value);
                }
                Err(e) => {
                    return Ok(Answer {
                        refused_locally: Some(e.to_string()),
                        ..Answer::default()
                    });
                }
            }
        }
        let mut send = self
            .send
            .clone()
            .ready()
            .await
            .context("the connection must accept a new stream")?;
        let (response, mut body) = send
            .send_request(request, false)
            .context("sending the request headers")?;
        self.send = send;
        // The server may already have answered and closed the stream; a
        // failure to send the body then is expected.
        let _ = body.send_data(Bytes::from_static(&EMPTY_MESSAGE), true);
        let response = match response.await {
            Ok(response) => response,
            Err(e) => {
                return match e.reason() {
                    Some(reason) => Ok(Answer {
                        reset: Some(reason),
                        ..Answer::default()
                    }),
                    None => Err(e).context("waiting for the answer"),
                };
            }
        };
        let http_status = response.status().as_u16();
        let (parts, mut body) = response.into_parts();
        let remaining = parts
            .headers
            .get(REMAINING_HEADER)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let mut status_headers = parts.headers.clone();
        if !parts.headers.contains_key("grpc-status") {
            // Bounded by ANSWER_LIMIT: read the reply, then its trailers.
            while let Some(data) = body.data().await {
                let data = match data {
                    Ok(data) => data,
                    Err(e) => return reset_or(e),
                };
                let _ = body.flow_control().release_capacity(data.len());
            }
            match body.trailers().await {
                Ok(Some(trailers)) => status_headers = trailers,
                Ok(None) => status_headers = HeaderMap::new(),
                Err(e) => return reset_or(e),
            }
        }
        let status = tonic::Status::from_header_map(&status_headers);
        Ok(Answer {
            code: status.as_ref().map(tonic::Status::code),
            message: status.map(|s| s.message().to_owned()).unwrap_or_default(),
            http_status,
            remaining,
            reset: None,
            refused_locally: None,
        })
    }
}

fn reset_or(e: h2::Error) -> anyhow::Result<Answer> {
    match e.reason() {
        Some(reason) => Ok(Answer {
            reset: Some(reason),
            ..Answer::default()
        }),
        None => Err(e).context("reading the answer"),
    }
}
