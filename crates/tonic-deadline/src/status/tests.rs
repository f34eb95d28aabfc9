use std::fmt;

use tonic::Code;

use super::*;

#[test]
fn every_cause_maps_to_deadline_or_cancelled_never_unknown() {
    let table = [
        (Cause::DeadlineExceeded, Code::DeadlineExceeded),
        (Cause::Cancelled, Code::Cancelled),
        (Cause::Abandoned, Code::Cancelled),
        (Cause::Completed, Code::Cancelled),
    ];
    for (cause, code) in table {
        assert_eq!(Status::from(Ended::new(cause)).code(), code, "{cause}");
    }
}

#[test]
fn boxed_ended_becomes_its_status_through_tonic_from_error() {
    for (cause, code) in [
        (Cause::DeadlineExceeded, Code::DeadlineExceeded),
        (Cause::Cancelled, Code::Cancelled),
        (Cause::Abandoned, Code::Cancelled),
        (Cause::Completed, Code::Cancelled),
    ] {
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(Ended::new(cause));
        let status = Status::from_error(boxed);
        assert_eq!(
            status.code(),
            code,
            "{cause}: an Ended boxed by `?` must not become UNKNOWN"
        );
    }
}

#[test]
fn from_error_finds_ended_or_status_deep_in_the_chain() {
    #[derive(Debug)]
    struct Wrap(Box<dyn Error + Send + Sync>);
    impl fmt::Display for Wrap {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("wrapped")
        }
    }
    impl Error for Wrap {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&*self.0)
        }
    }
    let ended = Wrap(Box::new(Wrap(Box::new(Ended::new(
        Cause::DeadlineExceeded,
    )))));
    assert_eq!(from_error(&ended).code(), Code::DeadlineExceeded);
    let status = Wrap(Box::new(Status::unavailable("down")));
    assert_eq!(from_error(&status).code(), Code::Unavailable);
    assert_eq!(from_error(&status).message(), "down");
    let other = Wrap(Box::new(std::io::Error::other("disk")));
    assert_eq!(
        from_error(&other).code(),
        Code::Unknown,
        "an error that holds neither keeps tonic's answer"
    );
}

#[test]
fn ended_boxed_as_error_is_recognised_by_tonic() {
    let boxed: Box<dyn std::error::Error + Send + Sync> =
        Box::new(Status::from(Ended::new(Cause::DeadlineExceeded)));
    assert_eq!(
        Status::from_error(boxed).code(),
        Code::DeadlineExceeded,
        "a status crossing a service boundary as BoxError must keep its code"
    );
}

/// Every error type the crate returns, and the code it must answer both
/// ways an error reaches a status: converted (`Status::from`, or
/// [`from_error`] when it has no conversion) and boxed by `?` into a
/// `BoxError` that tonic's `Status::from_error` turns into a status.
mod every_error {
    use super::*;
    use crate::BoxError;
    use crate::admission::{Reason, Refused};

    const CAUSES: [(Cause, Code); 4] = [
        (Cause::DeadlineExceeded, Code::DeadlineExceeded),
        (Cause::Cancelled, Code::Cancelled),
        (Cause::Abandoned, Code::Cancelled),
        (Cause::Completed, Code::Cancelled),
    ];

    /// `make()` answers `code` boxed, through both walks of its source chain.
    #[track_caller]
    fn boxed_answers<E>(name: &str, make: impl Fn() -> E, code: Code)
    where
        E: Error + Send + Sync + 'static,
    {
        let boxed: BoxError = Box::new(make());
        assert_eq!(
            Status::from_error(boxed).code(),
            code,
            "{name}: boxed by `?`, tonic's Status::from_error must find {code:?}"
        );
        assert_eq!(
            from_error(&make()).code(),
            code,
            "{name}: status::from_error must find {code:?}"
        );
    }

    /// `make()` answers `code` converted and boxed, with the same message
    /// both ways unless the boxed one is a fixed text (`same_message`).
    #[track_caller]
    fn answers<E>(name: &str, make: impl Fn() -> E, code: Code, same_message: bool)
    where
        E: Error + Send + Sync + 'static,
        Status: From<E>,
    {
        let converted = Status::from(make());
        assert_eq!(converted.code(), code, "{name}: converted must be {code:?}");
        boxed_answers(name, &make, code);
        if same_message {
            let boxed = Status::from_error(Box::new(make()));
            assert_eq!(
                boxed.message(),
                converted.message(),
                "{name}: boxed and converted must say the same"
            );
        }
    }

    #[test]
    fn ended_answers_its_cause() {
        for (cause, code) in CAUSES {
            answers(&format!("Ended({cause})"), || Ended::new(cause), code, true);
        }
    }

    #[test]
    fn refused_answers_deadline_cancel_or_resource_exhausted() {
        for (cause, code) in CAUSES {
            let name = format!("Refused(Ended({cause}))");
            answers(&name, || Refused::new(Reason::Ended(cause)), code, true);
        }
        let table = [
            (Reason::WouldNotFinish, Code::DeadlineExceeded),
            (Reason::QueueFull, Code::ResourceExhausted),
        ];
        for (reason, code) in table {
            let name = format!("Refused({reason:?})");
            answers(&name, || Refused::new(reason), code, true);
        }
    }

    #[test]
    fn refused_for_an_ended_scope_has_the_ended_in_its_chain() {
        let refused = Refused::new(Reason::Ended(Cause::Cancelled));
        let ended = chain(&refused).find_map(|err| err.downcast_ref::<Ended>());
        assert_eq!(
            ended.map(Ended::cause),
            Some(Cause::Cancelled),
            "a walker looking for Ended must find it behind the refusal"
        );
    }

    #[test]
    fn malformed_grpc_timeout_answers_internal() {
        let malformed = || crate::wire::timeout_header::decode(b"1x").expect_err("x is no unit");
        answers("MalformedTimeout", malformed, Code::Internal, false);
        assert_eq!(
            Status::from(malformed()).message(),
            malformed().to_string(),
            "the converted status must name what is wrong"
        );
    }

    #[test]
    fn malformed_deadline_header_answers_internal() {
        use crate::deadline_headers::DeadlineHeader;
        let malformed = || {
            DeadlineHeader::GrpcTimeout
                .decode(&http::HeaderValue::from_static("1x"))
                .expect_err("x is no unit")
        };
        answers("MalformedDeadline", malformed, Code::Internal, false);
    }

    #[cfg(feature = "service-config")]
    #[test]
    fn config_error_is_no_request_error_and_stays_unknown() {
        let invalid = || {
            crate::service_config::ServiceConfig::from_json("not json")
                .expect_err("not JSON is no config")
        };
        boxed_answers("ConfigError", invalid, Code::Unknown);
    }

    #[test]
    fn layer_errors_are_statuses_and_keep_their_code() {
        // What the client, retry and hedge layers fail with as `BoxError`.
        for cause in [Cause::DeadlineExceeded, Cause::Cancelled] {
            boxed_answers(
                &format!("Status of {cause}"),
                || status_for(cause),
                cause.code().into(),
            );
        }
        boxed_answers(
            "Status unavailable",
            || Status::unavailable("down"),
            Code::Unavailable,
        );
    }
}
