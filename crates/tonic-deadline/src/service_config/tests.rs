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
        ("initialBackoff", json!("1.s"), Err(field("initialBackoff"))),
        ("initialBackoff", json!(".5s"), Err(field("initialBackoff"))),
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
            "methodConfig[0]",
        ),
        (
            json!({ "methodConfig": [{ "name": [{ "service": "a.A" }], "retryPolicy": [] }] }),
            "methodConfig[0].retryPolicy",
        ),
        (
            json!({ "methodConfig": [{ "name": [{ "service": "a.A" }], "idempotent": "yes" }] }),
            "methodConfig[0]",
        ),
        (json!({ "methodConfig": {} }), "(document)"),
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
fn hedging_needs_methods_declared_idempotent() {
    let config = ServiceConfig::from_value(&json!({
        "methodConfig": [{ "name": [{ "service": "kv.Store", "method": "Get" }], "hedgingPolicy": hedging_policy() }]
    }))
    .expect("the JSON itself is valid");
    let err = config
        .check_hedging()
        .expect_err("hedging a method not declared idempotent must be refused");
    assert_eq!(err.field(), "methodConfig[0].name[0]");
    assert!(err.problem().contains("idempotent"), "{err}");
    let by_service = config
        .clone()
        .idempotent("kv.Store")
        .expect("a service name is valid");
    by_service
        .check_hedging()
        .expect("a service declared idempotent covers its methods");
    let by_method = config
        .clone()
        .idempotent("kv.Store/Get")
        .expect("a method name is valid");
    by_method
        .check_hedging()
        .expect("the method itself declared idempotent");
    let other = config
        .clone()
        .idempotent("kv.Store/Put")
        .expect("a method name is valid");
    assert!(
        other.check_hedging().is_err(),
        "another method's declaration does not count"
    );
    for bad in ["kv.Store/", "/Get", "a/b/c"] {
        let err = config
            .clone()
            .idempotent(bad)
            .expect_err("a malformed name must be refused");
        assert_eq!(err.field(), "idempotent");
    }
}

#[test]
fn codes_print_by_name_and_round_trip() {
    for i in 0..17 {
        let code = Code::from_i32(i);
        assert_eq!(code_from_name(code_name(code)), Some(code), "{code:?}");
    }
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
