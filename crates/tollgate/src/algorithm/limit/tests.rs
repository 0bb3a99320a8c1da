use super::*;

/// One limit of each algorithm.
fn one_of_each() -> Vec<Limit> {
    let second = Duration::from_secs(1);
    [
        Limit::fixed_window(10, second),
        Limit::sliding_window(10, second, 10),
        Limit::sliding_log(10, second),
        Limit::token_bucket(10, 1, second),
        Limit::reservation(10, second, 5),
        Limit::leaky_bucket(10, second, 5),
        Limit::gcra(10, second, 5),
        Limit::concurrency(10, second),
    ]
    .into_iter()
    .map(|limit| limit.expect("valid limit"))
    .collect()
}

#[test]
fn every_algorithm_in_the_registry_reads_back_by_its_name() {
    let limits = one_of_each();
    let names: Vec<&str> = limits.iter().map(Limit::algorithm).collect();
    let registered: Vec<&str> = ALGORITHMS.iter().map(|entry| entry.name).collect();
    assert_eq!(names, registered, "one limit of each algorithm, in registry order");
    for limit in limits {
        let value = serde_json::to_value(limit.spec()).expect("a spec serializes");
        assert_eq!(value["algorithm"], limit.algorithm());
        assert_eq!(LimitSpec::from_value(value).expect("reads back"), *limit.spec());
    }
    let unknown = LimitSpec::from_value(serde_json::json!({"algorithm": "leaky"})).unwrap_err();
    assert_eq!(
        unknown.to_string(),
        "unknown algorithm \"leaky\" (expected fixed_window, sliding_window, sliding_log, \
         token_bucket, reservation, leaky_bucket, gcra or concurrency)"
    );
    let gcra = Limit::gcra(1, Duration::from_secs(1), 1).expect("valid limit");
    assert_eq!(
        gcra.supports(Action::Reserve(None), 1).unwrap_err().to_string(),
        "reserve needs a borrowing or shaping limit (reservation, leaky_bucket), not gcra"
    );
}

#[test]
fn a_global_limit_reads_back_and_refuses_what_it_cannot_be() {
    let limit =
        Limit::from_json(r#"{"algorithm": "fixed_window", "limit": 1000, "window": "1m", "scope": "global"}"#).unwrap();
    assert!(limit.is_global());
    assert_eq!(Limit::from_value(limit.to_value()).unwrap(), limit);
    let regional =
        Limit::from_json(r#"{"algorithm": "gcra", "rate": 1, "period": "1s", "burst": 1, "scope": "regional"}"#)
            .unwrap();
    assert_eq!(regional.scope(), Scope::Regional);
    assert!(regional.to_value().get("scope").is_none());
    let wrong = Limit::from_json(r#"{"algorithm": "gcra", "rate": 1, "period": "1s", "burst": 1, "scope": "world"}"#)
        .unwrap_err();
    assert_eq!(
        wrong.to_string(),
        "scope: expected \"global\" (one limit across regions) or \"regional\""
    );
    let concurrency = Limit::concurrency(10, Duration::from_secs(1)).unwrap();
    assert!(concurrency
        .with_scope(Scope::Global)
        .unwrap_err()
        .to_string()
        .contains("scope: a concurrency limit cannot be global"));
    let alerting = Limit::fixed_window(10, Duration::from_secs(1))
        .unwrap()
        .alerting([80])
        .unwrap();
    assert!(alerting
        .clone()
        .with_scope(Scope::Global)
        .unwrap_err()
        .to_string()
        .contains("scope:"));
    let global = Limit::fixed_window(10, Duration::from_secs(1))
        .unwrap()
        .with_scope(Scope::Global)
        .unwrap();
    assert!(global
        .alerting([80])
        .unwrap_err()
        .to_string()
        .contains("alerts: a global limit"));
}
