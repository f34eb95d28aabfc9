use std::time::Duration;

use serde_json::{Value, json};
use tonic::Code;

use super::*;

fn retry_policy() -> Value {
    json!({
        "maxAttempts": 3,
        "initialBackoff": "0.1s",
        "maxBackoff": "1s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]
    })
}

fn hedging_policy() -> Value {
    json!({ "maxAttempts": 3, "hedgingDelay": "0.02s", "nonFatalStatusCodes": ["UNAVAILABLE"] })
}

/// A config with one method config whose `field` of `policy` is `value`
/// (`Value::Null` removes it).
fn with_field(policy: &str, field: &str, value: Value) -> Value {
    let mut p = if policy == "retryPolicy" {
        retry_policy()
    } else {
        hedging_policy()
    };
    let fields = p.as_object_mut().expect("an object");
    if value.is_null() {
        fields.remove(field);
    } else {
        fields.insert(field.to_owned(), value);
    }
    json!({ "methodConfig": [{ "name": [{ "service": "s.S" }], "idempotent": true, policy: p }] })
}

fn retry(config: &ServiceConfig) -> &RetryPolicy {
    match config.methods[0].policy.as_ref() {
        Some(Policy::Retry(r)) => r,
        other => panic!("a retry policy was expected, got {other:?}"),
    }
}

fn hedge(config: &ServiceConfig) -> &HedgingPolicy {
    match config.methods[0].policy.as_ref() {
        Some(Policy::Hedge(h)) => h,
        other => panic!("a hedging policy was expected, got {other:?}"),
    }
}

fn error_of(value: Value) -> ConfigError {
    ServiceConfig::from_value(&value).expect_err("an invalid config must be refused")
}

#[test]
fn every_retry_policy_field_is_parsed_or_refused_by_name() {
    let field = |f: &str| format!("methodConfig[0].retryPolicy.{f}");
    // (field, value, Ok(check) or Err(expected error field))
    type Check = fn(&ServiceConfig) -> bool;
    let cases: Vec<(&str, Value, Result<Check, String>)> = vec![
        ("maxAttempts", json!(2), Ok(|c| retry(c).max_attempts == 2)),
        ("maxAttempts", json!(5), Ok(|c| retry(c).max_attempts == 5)),
        ("maxAttempts", json!(9), Ok(|c| retry(c).max_attempts == 5)),
        (
            "maxAttempts",
            json!(3.0),
            Ok(|c| retry(c).max_attempts == 3),
        ),
        ("maxAttempts", json!(1), Err(field("maxAttempts"))),
        ("maxAttempts", json!(0), Err(field("maxAttempts"))),
        ("maxAttempts", json!(-3), Err(field("maxAttempts"))),
        ("maxAttempts", json!(2.5), Err(field("maxAttempts"))),
        ("maxAttempts", json!("3"), Err(field("maxAttempts"))),
        ("maxAttempts", Value::Null, Err(field("maxAttempts"))),
        (
            "initialBackoff",
            json!("0.25s"),
            Ok(|c| retry(c).initial_backoff == Duration::from_millis(250)),
        ),
        (
            "initialBackoff",
            json!("2s"),
            Ok(|c| retry(c).initial_backoff == Duration::from_secs(2)),
        ),
        (
            "initialBackoff",
            json!("0.000000001s"),
            Ok(|c| retry(c).initial_backoff == Duration::from_nanos(1)),
        ),
        ("initialBackoff", json!("0s"), Err(field("initialBackoff"))),
        ("initialBackoff", json!("-1s"), Err(field("initialBackoff"))),
        ("initialBackoff", json!("1"), Err(field("initialBackoff"))),
        ("initialBackoff", json!("1ms"), Err(field("initialBackoff"))),
        // As grpc-go reads them: either side of the point may be empty.
        (
            "initialBackoff",
            json!("1.s"),
            Ok(|c| retry(c).initial_backoff == Duration::from_secs(1)),
        ),
        (
            "initialBackoff",
            json!(".5s"),
            Ok(|c| retry(c).initial_backoff == Duration::from_millis(500)),
        ),
        ("initialBackoff", json!(".s"), Err(field("initialBackoff"))),
        ("initialBackoff", json!("-1s"), Err(field("initialBackoff"))),
        (
            "initialBackoff",
            json!("0.0000000001s"),
            Err(field("initialBackoff")),
        ),
        ("initialBackoff", json!(0.1), Err(field("initialBackoff"))),
        ("initialBackoff", Value::Null, Err(field("initialBackoff"))),
        (
            "maxBackoff",
            json!("30s"),
            Ok(|c| retry(c).max_backoff == Duration::from_secs(30)),
        ),
        ("maxBackoff", json!("0s"), Err(field("maxBackoff"))),
        ("maxBackoff", json!("ten seconds"), Err(field("maxBackoff"))),
        ("maxBackoff", Value::Null, Err(field("maxBackoff"))),
        (
            "backoffMultiplier",
            json!(1.5),
            Ok(|c| retry(c).backoff_multiplier == 1.5),
        ),
        (
            "backoffMultiplier",
            json!(0.5),
            Ok(|c| retry(c).backoff_multiplier == 0.5),
        ),
        (
            "backoffMultiplier",
            json!(0),
            Err(field("backoffMultiplier")),
        ),
        (
            "backoffMultiplier",
            json!(-2),
            Err(field("backoffMultiplier")),
        ),
        (
            "backoffMultiplier",
            json!("2"),
            Err(field("backoffMultiplier")),
        ),
        (
            "backoffMultiplier",
            Value::Null,
            Err(field("backoffMultiplier")),
        ),
        (
            "retryableStatusCodes",
            json!(["UNAVAILABLE", "resource_exhausted", 4]),
            Ok(|c| {
                let codes = retry(c).retryable;
                codes.contains(Code::Unavailable)
                    && codes.contains(Code::ResourceExhausted)
                    && codes.contains(Code::DeadlineExceeded)
                    && !codes.contains(Code::Internal)
            }),
        ),
        (
            "retryableStatusCodes",
            json!([]),
            Err(field("retryableStatusCodes")),
        ),
        (
            "retryableStatusCodes",
            json!("UNAVAILABLE"),
            Err(field("retryableStatusCodes")),
        ),
        (
            "retryableStatusCodes",
            json!(["UNAVAILABLE", "NOPE"]),
            Err(field("retryableStatusCodes[1]")),
        ),
        (
            "retryableStatusCodes",
            json!([17]),
            Err(field("retryableStatusCodes[0]")),
        ),
        (
            "retryableStatusCodes",
            json!([-1]),
            Err(field("retryableStatusCodes[0]")),
        ),
        (
            "retryableStatusCodes",
            json!(["OK"]),
            Err(field("retryableStatusCodes[0]")),
        ),
        (
            "retryableStatusCodes",
            json!([true]),
            Err(field("retryableStatusCodes[0]")),
        ),
        (
            "retryableStatusCodes",
            Value::Null,
            Err(field("retryableStatusCodes")),
        ),
    ];
    for (name, value, expected) in cases {
        let shown = value.to_string();
        let parsed = ServiceConfig::from_value(&with_field("retryPolicy", name, value));
        match (expected, parsed) {
            (Ok(check), Ok(config)) => {
                assert!(
                    check(&config),
                    "{name} = {shown} must parse to what it says: {config:?}"
                )
            }
            (Err(field), Err(err)) => {
                assert_eq!(
                    err.field(),
                    field,
                    "{name} = {shown} must be refused naming {field}: {err}"
                );
                assert!(
                    err.to_string().contains(&field),
                    "the message must name the field: {err}"
                );
            }
            (Ok(_), Err(err)) => panic!("{name} = {shown} must be accepted, got {err}"),
            (Err(field), Ok(config)) => {
                panic!("{name} = {shown} must be refused at {field}, got {config:?}")
            }
        }
    }
}

#[test]
fn every_hedging_policy_field_is_parsed_or_refused_by_name() {
    let field = |f: &str| format!("methodConfig[0].hedgingPolicy.{f}");
    type Check = fn(&ServiceConfig) -> bool;
    let cases: Vec<(&str, Value, Result<Check, String>)> = vec![
        ("maxAttempts", json!(4), Ok(|c| hedge(c).max_attempts == 4)),
        (
            "maxAttempts",
            json!(100),
            Ok(|c| hedge(c).max_attempts == 5),
        ),
        ("maxAttempts", json!(1), Err(field("maxAttempts"))),
        ("maxAttempts", Value::Null, Err(field("maxAttempts"))),
        (
            "hedgingDelay",
            json!("0.5s"),
            Ok(|c| hedge(c).hedging_delay == Duration::from_millis(500)),
        ),
        (
            "hedgingDelay",
            json!("0s"),
            Ok(|c| hedge(c).hedging_delay.is_zero()),
        ),
        (
            "hedgingDelay",
            Value::Null,
            Ok(|c| hedge(c).hedging_delay.is_zero()),
        ),
        ("hedgingDelay", json!("-0.1s"), Err(field("hedgingDelay"))),
        ("hedgingDelay", json!(20), Err(field("hedgingDelay"))),
        (
            "nonFatalStatusCodes",
            json!(["UNAVAILABLE", 8]),
            Ok(|c| {
                let codes = hedge(c).non_fatal;
                codes.contains(Code::Unavailable) && codes.contains(Code::ResourceExhausted)
            }),
        ),
        (
            "nonFatalStatusCodes",
            json!([]),
            Ok(|c| hedge(c).non_fatal.is_empty()),
        ),
        (
            "nonFatalStatusCodes",
            Value::Null,
            Ok(|c| hedge(c).non_fatal.is_empty()),
        ),
        (
            "nonFatalStatusCodes",
            json!(["SOMETIMES"]),
            Err(field("nonFatalStatusCodes[0]")),
        ),
        (
            "nonFatalStatusCodes",
            json!({"UNAVAILABLE": 1}),
            Err(field("nonFatalStatusCodes")),
        ),
    ];
    for (name, value, expected) in cases {
        let shown = value.to_string();
        let parsed = ServiceConfig::from_value(&with_field("hedgingPolicy", name, value));
        match (expected, parsed) {
            (Ok(check), Ok(config)) => {
                assert!(
                    check(&config),
                    "{name} = {shown} must parse to what it says: {config:?}"
                )
            }
            (Err(field), Err(err)) => {
                assert_eq!(
                    err.field(),
                    field,
                    "{name} = {shown} must be refused naming {field}: {err}"
                )
            }
            (Ok(_), Err(err)) => panic!("{name} = {shown} must be accepted, got {err}"),
            (Err(field), Ok(config)) => {
                panic!("{name} = {shown} must be refused at {field}, got {config:?}")
            }
        }
    }
}

#[test]
fn retry_throttling_fields_are_parsed_or_refused_by_name() {
    type Expected = Result<(u32, u32), &'static str>;
    let cases: Vec<(Value, Expected)> = vec![
        (json!({"maxTokens": 10, "tokenRatio": 0.1}), Ok((10, 100))),
        (
            json!({"maxTokens": 1000, "tokenRatio": 1}),
            Ok((1000, 1000)),
        ),
        (json!({"maxTokens": 1, "tokenRatio": 0.0014}), Ok((1, 1))),
        (
            json!({"maxTokens": 0, "tokenRatio": 0.1}),
            Err("retryThrottling.maxTokens"),
        ),
        (
            json!({"maxTokens": 1001, "tokenRatio": 0.1}),
            Err("retryThrottling.maxTokens"),
        ),
        (
            json!({"maxTokens": -5, "tokenRatio": 0.1}),
            Err("retryThrottling.maxTokens"),
        ),
        (
            json!({"maxTokens": 2.5, "tokenRatio": 0.1}),
            Err("retryThrottling.maxTokens"),
        ),
        (
            json!({"maxTokens": "10", "tokenRatio": 0.1}),
            Err("retryThrottling.maxTokens"),
        ),
        (json!({"tokenRatio": 0.1}), Err("retryThrottling.maxTokens")),
        (
            json!({"maxTokens": 10, "tokenRatio": 0}),
            Err("retryThrottling.tokenRatio"),
        ),
        (
            json!({"maxTokens": 10, "tokenRatio": -0.1}),
            Err("retryThrottling.tokenRatio"),
        ),
        (
            json!({"maxTokens": 10, "tokenRatio": 0.0001}),
            Err("retryThrottling.tokenRatio"),
        ),
        (json!({"maxTokens": 10}), Err("retryThrottling.tokenRatio")),
        (json!([10, 0.1]), Err("retryThrottling")),
    ];
    for (throttling, expected) in cases {
        let shown = throttling.to_string();
        let parsed = ServiceConfig::from_value(&json!({ "retryThrottling": throttling }));
        match (expected, parsed) {
            (Ok((tokens, milli)), Ok(config)) => {
                let t = config.throttling.expect("throttling must be kept");
                assert_eq!(
                    (t.max_tokens, t.token_ratio_milli),
                    (tokens, milli),
                    "{shown}"
                );
            }
            (Err(field), Err(err)) => assert_eq!(err.field(), field, "{shown}: {err}"),
            (Ok(_), Err(err)) => panic!("{shown} must be accepted, got {err}"),
            (Err(field), Ok(config)) => {
                panic!("{shown} must be refused at {field}, got {config:?}")
            }
        }
    }
}

#[test]
fn names_resolve_method_then_service_then_default() {
    let config = ServiceConfig::from_value(&json!({
        "methodConfig": [
            { "name": [{}], "retryPolicy": retry_policy() },
            { "name": [{ "service": "kv.Store" }], "idempotent": true, "hedgingPolicy": hedging_policy() },
            { "name": [{ "service": "kv.Store", "method": "Put" }, { "service": "kv.Log", "method": "" }] }
        ]
    }))
    .expect("a valid config");
    assert!(
        matches!(
            config.resolve("/kv.Store/Get").policy,
            Some(Policy::Hedge(_))
        ),
        "the service entry covers Get"
    );
    assert!(config.resolve("/kv.Store/Get").idempotent);
    assert_eq!(
        config.resolve("/kv.Store/Put").policy,
        None,
        "the method entry (no policy) beats the service entry"
    );
    assert!(!config.resolve("/kv.Store/Put").idempotent);
    assert_eq!(
        config.resolve("/kv.Log/Append").policy,
        None,
        "an empty method names the whole service"
    );
    assert!(
        matches!(
            config.resolve("/other.Svc/Call").policy,
            Some(Policy::Retry(_))
        ),
        "the default covers the rest"
    );
    assert_eq!(
        config.method("not a path"),
        None,
        "a malformed path matches nothing"
    );
    assert_eq!(config.method("/kv.Store/Get/extra"), None);
}

#[test]
fn name_and_structure_errors_name_their_field() {
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({ "methodConfig": [{ "name": [{ "method": "Get" }] }] }),
            "methodConfig[0].name[0].service",
        ),
        (
            json!({ "methodConfig": [{ "name": [{ "service": "a.A" }], "retryPolicy": retry_policy(), "hedgingPolicy": hedging_policy() }] }),
            "methodConfig[0].hedgingPolicy",
        ),
        (
            json!({ "methodConfig": [{ "name": [{ "service": "a.A" }] }, { "name": [{ "service": "b.B" }, { "service": "a.A" }] }] }),
            "methodConfig[1].name[1]",
        ),
        (
            json!({ "methodConfig": [{ "name": [{}] }, { "name": [{ "service": "" }] }] }),
            "methodConfig[1].name[0]",
        ),
        (
            json!({ "methodConfig": [{ "name": "a.A" }] }),
            "methodConfig[0].name",
        ),
        (
            json!({ "methodConfig": [{ "name": [{ "service": "a.A" }], "retryPolicy": [] }] }),
            "methodConfig[0].retryPolicy",
        ),
        (
            json!({ "methodConfig": [{ "name": [{ "service": "a.A" }], "idempotent": "yes" }] }),
            "methodConfig[0].idempotent",
        ),
        (json!({ "methodConfig": {} }), "methodConfig"),
        (json!([]), "(document)"),
    ];
    for (value, field) in cases {
        let err = error_of(value.clone());
        assert_eq!(
            err.field(),
            field,
            "{value} must be refused naming {field}: {err}"
        );
    }
    let not_json = ServiceConfig::from_json("{\"methodConfig\": [")
        .expect_err("truncated JSON must be refused");
    assert_eq!(not_json.field(), "(document)");
}

#[test]
fn unknown_fields_are_ignored_like_other_grpc_stacks_do() {
    let config = ServiceConfig::from_value(&json!({
        "loadBalancingConfig": [{ "round_robin": {} }],
        "methodConfig": [{ "name": [{ "service": "a.A" }], "timeout": "1s", "waitForReady": true, "retryPolicy": retry_policy() }]
    }))
    .expect("fields this layer does not use must not make the config invalid");
    assert_eq!(retry(&config).max_attempts, 3);
    assert_eq!(
        ServiceConfig::from_json("{}").expect("an empty config is valid"),
        ServiceConfig::default()
    );
}

#[test]
fn idempotent_in_code_covers_what_it_names() {
    let config = ServiceConfig::from_value(&json!({
        "methodConfig": [{ "name": [{ "service": "kv.Store" }], "retryPolicy": retry_policy() }]
    }))
    .expect("valid");
    assert!(!config.resolve("/kv.Store/Get").idempotent);
    let by_service = config.clone().idempotent("kv.Store").expect("a service");
    assert!(by_service.resolve("/kv.Store/Put").idempotent);
    let by_method = config.clone().idempotent("kv.Store/Get").expect("a method");
    assert!(by_method.resolve("/kv.Store/Get").idempotent);
    assert!(!by_method.resolve("/kv.Store/Put").idempotent);
    for bad in ["kv.Store/", "/Get", "a/b/c"] {
        let err = config
            .clone()
            .idempotent(bad)
            .expect_err("a malformed name must be refused");
        assert_eq!(err.field(), "idempotent");
    }
}

/// Configs as other gRPC stacks publish them, unchanged: each parses, and
/// means what it means there.
#[test]
fn configs_from_grpc_go_and_grpc_java_parse_unchanged() {
    struct Case {
        from: &'static str,
        json: &'static str,
        path: &'static str,
        check: fn(&ServiceConfig, Resolved<'_>),
    }
    let cases = [
        Case {
            // grpc-go, examples/features/retry/client/main.go: field names
            // in Go's case, a duration without its leading zero.
            from: "grpc-go examples/features/retry",
            json: r#"{
                "methodConfig": [{
                  "name": [{"service": "grpc.examples.echo.Echo"}],
                  "retryPolicy": {
                      "MaxAttempts": 4,
                      "InitialBackoff": ".01s",
                      "MaxBackoff": ".01s",
                      "BackoffMultiplier": 1.0,
                      "RetryableStatusCodes": [ "UNAVAILABLE" ]
                  }
                }]}"#,
            path: "/grpc.examples.echo.Echo/UnaryEcho",
            check: |_, r| {
                let Some(Policy::Retry(p)) = r.policy else {
                    panic!("a retry policy: {r:?}")
                };
                assert_eq!(p.max_attempts, 4);
                assert_eq!(p.initial_backoff, Duration::from_millis(10));
                assert_eq!(p.max_backoff, Duration::from_millis(10));
                assert!(p.retryable.contains(Code::Unavailable));
                assert_eq!((r.timeout, r.wait_for_ready), (None, false));
            },
        },
        Case {
            // grpc-java, examples/src/main/resources/io/grpc/examples/
            // retrying/retrying_service_config.json.
            from: "grpc-java examples retrying_service_config.json",
            json: r#"{
                "methodConfig": [{
                  "name": [{"service": "helloworld.Greeter", "method": "SayHello"}],
                  "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.5s",
                    "maxBackoff": "30s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"]
                  }
                }]}"#,
            path: "/helloworld.Greeter/SayHello",
            check: |_, r| {
                let Some(Policy::Retry(p)) = r.policy else {
                    panic!("a retry policy: {r:?}")
                };
                assert_eq!(
                    (p.max_attempts, p.max_backoff),
                    (5, Duration::from_secs(30))
                );
            },
        },
        Case {
            // grpc-java, examples/src/main/resources/io/grpc/examples/
            // hedging/hedging_service_config.json: no "idempotent", which
            // is ours; hedging is the config author's statement.
            from: "grpc-java examples hedging_service_config.json",
            json: r#"{
                "methodConfig": [{
                  "name": [{"service": "helloworld.Greeter", "method": "SayHello"}],
                  "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "1s"}
                }],
                "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#,
            path: "/helloworld.Greeter/SayHello",
            check: |config, r| {
                let Some(Policy::Hedge(p)) = r.policy else {
                    panic!("a hedging policy: {r:?}")
                };
                assert_eq!(
                    (p.max_attempts, p.hedging_delay),
                    (3, Duration::from_secs(1))
                );
                assert_eq!(
                    config.throttling,
                    Some(Throttling {
                        max_tokens: 10,
                        token_ratio_milli: 100
                    })
                );
            },
        },
        Case {
            // The fields of gRPC's doc/service_config.md (grpc/grpc), a
            // load-balancing config this crate does not use beside them.
            from: "after grpc doc/service_config.md",
            json: r#"{
                "loadBalancingConfig": [ { "round_robin": {} } ],
                "methodConfig": [
                  {
                    "name": [
                      { "service": "foo", "method": "bar" },
                      { "service": "baz" }
                    ],
                    "timeout": "1.000000001s"
                  }
                ]}"#,
            path: "/baz/Any",
            check: |_, r| {
                assert_eq!(r.timeout, Some(Duration::new(1, 1)));
                assert!(r.policy.is_none() && !r.wait_for_ready);
            },
        },
        Case {
            // grpc-go's service_config_test.go: its waitForReady case,
            // with a timeout added as its timeout cases write one.
            from: "after grpc-go service_config_test.go",
            json: r#"{
                "methodConfig": [
                    {
                        "name": [{"service": "foo", "method": "Bar"}],
                        "waitForReady": true,
                        "timeout": "1s"
                    }
                ]}"#,
            path: "/foo/Bar",
            check: |_, r| {
                assert!(r.wait_for_ready);
                assert_eq!(r.timeout, Some(Duration::from_secs(1)));
            },
        },
    ];
    for case in cases {
        let config = ServiceConfig::from_json(case.json)
            .unwrap_or_else(|e| panic!("{} must parse unchanged: {e}", case.from));
        (case.check)(&config, config.resolve(case.path));
    }
}

#[test]
fn timeout_and_wait_for_ready_are_read_or_refused_by_name() {
    let method = |extra: Value| {
        let mut m = json!({ "name": [{ "service": "a.A" }] });
        for (k, v) in extra.as_object().expect("an object") {
            m[k] = v.clone();
        }
        json!({ "methodConfig": [m] })
    };
    let ok = ServiceConfig::from_value(&method(
        json!({ "timeout": "0.25s", "waitForReady": false }),
    ))
    .expect("valid");
    let r = ok.resolve("/a.A/M");
    assert_eq!(
        (r.timeout, r.wait_for_ready),
        (Some(Duration::from_millis(250)), false)
    );
    for (extra, field) in [
        (json!({ "timeout": "0s" }), "methodConfig[0].timeout"),
        (json!({ "timeout": "1" }), "methodConfig[0].timeout"),
        (json!({ "timeout": 1 }), "methodConfig[0].timeout"),
        (json!({ "timeout": ".s" }), "methodConfig[0].timeout"),
        (
            json!({ "waitForReady": "yes" }),
            "methodConfig[0].waitForReady",
        ),
    ] {
        let err = error_of(method(extra.clone()));
        assert_eq!(err.field(), field, "{extra}: {err}");
    }
}

#[test]
fn codes_print_by_name() {
    let set = Codes::empty().with(Code::Unavailable).with(Code::Aborted);
    assert_eq!(format!("{set:?}"), "{\"ABORTED\", \"UNAVAILABLE\"}");
}

proptest::proptest! {
    #[test]
    fn any_json_is_parsed_or_refused_without_panicking(text in "\\PC{0,200}") {
        let _ = ServiceConfig::from_json(&text);
    }

    #[test]
    fn any_duration_text_is_parsed_or_refused_without_panicking(text in "[-0-9.s ]{0,30}") {
        if let Some(d) = parse_duration(&text) {
            proptest::prop_assert!(text.ends_with('s'));
            proptest::prop_assert!(d.as_secs() <= 315_576_000_000);
        }
    }
}
