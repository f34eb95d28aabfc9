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

