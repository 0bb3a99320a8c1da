//! Overrides (`/v1/overrides`): a limit set for one exact descriptor while
//! the service runs, in the place of the rule it matches; shared through
//! Redis by every replica, kept across restarts, safe by default.

mod common;
use tollgate_testkit::redis_server;

use std::sync::Arc;
use std::time::Duration;

use common::{call as client_call, config, on_port_0, NOON};
use redis_server::RedisServer;
use serde_json::{json, Value};
use tollgate::{AnyStore, ManualClock, MemoryStore, RedisStore, Timestamp};
use tollgate_server::http::AdminToken;
use tollgate_server::overrides::{Entry, OverrideRequest};
use tollgate_server::service::{CheckRequest, Descriptor};
use tollgate_server::{Options, Server, Service};

const CONFIG: &str = "
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 10}
";

/// One rule per algorithm, each of 100 units an hour.
const ALGORITHMS: &str = "
domain: carry
descriptors:
  - key: alg
    value: fixed_window
    rate_limit: {algorithm: {algorithm: fixed_window, limit: 100, window: 1h}}
  - key: alg
    value: sliding_window
    rate_limit: {algorithm: {algorithm: sliding_window, limit: 100, window: 1h}}
  - key: alg
    value: sliding_log
    rate_limit: {algorithm: {algorithm: sliding_log, limit: 100, window: 1h}}
  - key: alg
    value: token_bucket
    rate_limit: {algorithm: {algorithm: token_bucket, capacity: 100, refill: 100, interval: 1h}}
  - key: alg
    value: gcra
    rate_limit: {algorithm: {algorithm: gcra, rate: 100, period: 1h, burst: 100}}
  - key: alg
    value: reservation
    rate_limit: {algorithm: {algorithm: reservation, rate: 100, period: 1h, max_burst: 100}}
  - key: alg
    value: leaky_bucket
    rate_limit: {algorithm: {algorithm: leaky_bucket, rate: 100, period: 1h, capacity: 100}}
";

fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

fn descriptor(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs
        .iter()
        .map(|(key, value)| Entry {
            key: (*key).to_owned(),
            value: (*value).to_owned(),
        })
        .collect()
}

fn override_request(domain: &str, pairs: &[(&str, &str)], rate_limit: Value) -> OverrideRequest {
    OverrideRequest {
        domain: domain.to_owned(),
        descriptor: descriptor(pairs),
        rate_limit: Some(rate_limit),
        algorithm: None,
        expires_at: None,
        ttl: None,
        reason: Some("test".to_owned()),
    }
}

/// The limit and what remains for `pairs` after charging `cost` (0: a peek).
async fn charge(service: &Service, domain: &str, pairs: &[(&str, &str)], cost: u64) -> (u64, u64) {
    let request = CheckRequest {
        domain: domain.to_owned(),
        descriptors: vec![Descriptor::entries(entries(pairs))],
        cost: Some(cost),
    };
    let response = Box::pin(service.should_rate_limit(&request)).await.expect("decided");
    let status = &response.statuses[0];
    let decision = status.decision.as_ref().expect("decided in the store");
    (decision.limit, decision.remaining)
}

fn memory_service(text: &str, clock: &ManualClock) -> Service {
    Service::new(
        config(text),
        AnyStore::Memory(MemoryStore::with_clock(clock.clone())),
        Options::default(),
    )
    .with_overrides_clock(Arc::new(clock.clone()))
}

async fn redis_service(text: &str, redis: &RedisServer, clock: &ManualClock) -> Service {
    let store = RedisStore::builder(redis.url())
        .clock(clock.clone())
        .connect()
        .await
        .unwrap();
    Service::new(config(text), AnyStore::Redis(store), Options::default()).with_overrides_clock(Arc::new(clock.clone()))
}

#[tokio::test]
async fn an_override_replaces_the_rule_for_its_exact_descriptor_only() {
    let clock = ManualClock::new(Timestamp::from_micros(NOON));
    let service = memory_service(CONFIG, &clock);
    let acme = [("tenant", "acme")];
    assert_eq!(charge(&service, "api", &acme, 0).await.0, 100);
    let set = override_request("api", &acme, json!({"unit": "minute", "requests_per_unit": 2}));
    service.set_override(set).await.unwrap();
    assert_eq!(charge(&service, "api", &acme, 1).await, (2, 1));
    assert_eq!(charge(&service, "api", &acme, 1).await, (2, 0));
    let request = CheckRequest {
        domain: "api".to_owned(),
        descriptors: vec![Descriptor::entries(entries(&acme))],
        cost: Some(1),
    };
    let refused = Box::pin(service.should_rate_limit(&request)).await.unwrap();
    assert_eq!(refused.statuses[0].rule.as_deref(), Some("tenant_acme"));
    assert!(!refused.statuses[0].decision.as_ref().unwrap().allowed);
    // Another tenant, and a deeper descriptor of acme, keep the file's rules.
    assert_eq!(charge(&service, "api", &[("tenant", "bob")], 0).await.0, 100);
    assert_eq!(
        charge(&service, "api", &[("tenant", "acme"), ("path", "/")], 0).await.0,
        10
    );
    let deleted = service.delete_override("api", &descriptor(&acme)).await.unwrap();
    assert!(deleted.previous.is_some());
    // The file's rule again, with what was counted meanwhile (3 units, the
    // refused one recorded as envoyproxy/ratelimit counts).
    assert_eq!(charge(&service, "api", &acme, 0).await, (100, 97));
}

/// What carries over when a tenant's limit is raised to 200 after 80 of
/// 100 were used: every algorithm keeps what was used, so 120 remain. GCRA
/// keeps time (the instant its used cells will have drained): raised in
/// burst alone, 120 remain; with the rate doubled as well, the drain time
/// of 80 old cells is that of 160 new ones, so 40 remain at once, and they
/// come back at the new rate.
#[tokio::test]
async fn counts_carry_over_for_each_algorithm() {
    for store in ["memory", "redis"] {
        let clock = ManualClock::new(Timestamp::from_micros(NOON));
        let redis = (store == "redis").then(RedisServer::start);
        let service = match &redis {
            Some(redis) => redis_service(ALGORITHMS, redis, &clock).await,
            None => memory_service(ALGORITHMS, &clock),
        };
        for (algorithm, raised, expected) in [
            (
                "fixed_window",
                json!({"algorithm": "fixed_window", "limit": 200, "window": "1h"}),
                120,
            ),
            (
                "sliding_window",
                json!({"algorithm": "sliding_window", "limit": 200, "window": "1h"}),
                120,
            ),
            (
                "sliding_log",
                json!({"algorithm": "sliding_log", "limit": 200, "window": "1h"}),
                120,
            ),
            (
                "token_bucket",
                json!({"algorithm": "token_bucket", "capacity": 200, "refill": 100, "interval": "1h"}),
                120,
            ),
            (
                "gcra",
                json!({"algorithm": "gcra", "rate": 100, "period": "1h", "burst": 200}),
                120,
            ),
            (
                "gcra",
                json!({"algorithm": "gcra", "rate": 200, "period": "1h", "burst": 200}),
                40,
            ),
            (
                "reservation",
                json!({"algorithm": "reservation", "rate": 100, "period": "1h", "max_burst": 200}),
                120,
            ),
            (
                "leaky_bucket",
                json!({"algorithm": "leaky_bucket", "rate": 100, "period": "1h", "capacity": 200}),
                120,
            ),
        ] {
            let subject = [("alg", algorithm)];
            let _ = service.delete_override("carry", &descriptor(&subject)).await.unwrap();
            clock.advance(Duration::from_secs(3 * 3600));
            // (The reservation bucket reports one more than its stored
            // permits: the one it may borrow.)
            let (limit, remaining) = charge(&service, "carry", &subject, 80).await;
            assert_eq!(limit - remaining, 80, "{store} {algorithm}");
            let set = override_request("carry", &subject, json!({ "algorithm": raised }));
            service.set_override(set).await.unwrap();
            let (raised_limit, left) = charge(&service, "carry", &subject, 0).await;
            assert_eq!(raised_limit - limit, 100, "{store} {algorithm} raised to {raised}");
            assert_eq!(left, expected + (limit - 100), "{store} {algorithm} raised to {raised}");
        }
    }
}

#[tokio::test]
async fn an_expiring_override_ends_at_its_instant() {
    let clock = ManualClock::new(Timestamp::from_micros(NOON));
    let service = memory_service(CONFIG, &clock);
    let acme = [("tenant", "acme")];
    let mut set = override_request("api", &acme, json!({"unit": "hour", "requests_per_unit": 1000}));
    set.ttl = Some("10s".to_owned());
    service.set_override(set).await.unwrap();
    clock.advance(Duration::from_micros(9_999_999));
    assert_eq!(charge(&service, "api", &acme, 0).await.0, 1000);
    clock.advance(Duration::from_micros(1));
    assert_eq!(charge(&service, "api", &acme, 0).await.0, 100);
    assert!(service.list_overrides(Some("api")).unwrap().is_empty());
    // The refresh removes it, and says so.
    let changes = service.overrides().refresh(["api"].into_iter()).await.unwrap();
    assert_eq!(changes.len(), 1);
    assert!(changes[0].expired_here);
}

/// Two services on one Redis, as two replicas: what one sets, the other
/// applies at its next refresh; a new one (a restart) starts with it.
#[tokio::test]
async fn replicas_on_one_redis_share_overrides() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(Timestamp::from_micros(NOON));
    let one = redis_service(CONFIG, &redis, &clock).await;
    let two = redis_service(CONFIG, &redis, &clock).await;
    let domains = || ["api"].into_iter();
    two.overrides().refresh(domains()).await.unwrap();
    let acme = [("tenant", "acme")];
    let set = override_request("api", &acme, json!({"unit": "minute", "requests_per_unit": 2}));
    one.set_override(set).await.unwrap();
    assert_eq!(charge(&two, "api", &acme, 0).await.0, 100, "not before its refresh");
    let seen = two.overrides().refresh(domains()).await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(charge(&two, "api", &acme, 0).await.0, 2);
    let restarted = redis_service(CONFIG, &redis, &clock).await;
    restarted.overrides().refresh(domains()).await.unwrap();
    assert_eq!(charge(&restarted, "api", &acme, 0).await.0, 2);
    // More changes than the log keeps: the follower reads the table whole.
    for tenant in 0..1_100 {
        let name = format!("t{tenant}");
        let set = override_request(
            "api",
            &[("tenant", &name)],
            json!({"unit": "minute", "requests_per_unit": 7}),
        );
        one.set_override(set).await.unwrap();
    }
    two.delete_override("api", &descriptor(&acme)).await.unwrap();
    restarted.overrides().refresh(domains()).await.unwrap();
    assert_eq!(charge(&restarted, "api", &acme, 0).await.0, 100);
    assert_eq!(charge(&restarted, "api", &[("tenant", "t1099")], 0).await.0, 7);
    assert_eq!(restarted.list_overrides(Some("api")).unwrap().len(), 1_100);
    // A few changes: read from the log.
    one.delete_override("api", &descriptor(&[("tenant", "t5")]))
        .await
        .unwrap();
    let seen = restarted.overrides().refresh(domains()).await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(charge(&restarted, "api", &[("tenant", "t5")], 0).await.0, 100);
}

// --- Through HTTP. -------------------------------------------------------------

const TOKEN: &str = "s3cret-admin-token";

fn acme_body() -> Value {
    json!({
        "domain": "api",
        "descriptor": [{"key": "tenant", "value": "acme"}],
        "rate_limit": {"unit": "minute", "requests_per_unit": 2},
        "reason": "plan change"
    })
}

#[tokio::test]
async fn the_api_is_off_without_a_token_and_refuses_a_request_without_it() {
    let off = on_port_0(Server::new(
        config(CONFIG),
        None,
        AnyStore::Memory(MemoryStore::new()),
        Options::default(),
    ))
    .await;
    let url = format!("{}/v1/overrides", off.http);
    let (status, body) = client_call(reqwest::Method::PUT, &url, Some(TOKEN), Some(acme_body())).await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"].as_str().unwrap().contains("--admin-token-file"));
    off.stop().await;

    let server = Server::new(
        config(CONFIG),
        None,
        AnyStore::Memory(MemoryStore::new()),
        Options::default(),
    )
    .admin_token(AdminToken::new(TOKEN).unwrap());
    let on = on_port_0(server).await;
    let url = format!("{}/v1/overrides", on.http);
    for token in [
        None,
        Some("wrong"),
        Some("s3cret-admin-toke"),
        Some("s3cret-admin-token-"),
    ] {
        for method in [reqwest::Method::PUT, reqwest::Method::GET, reqwest::Method::DELETE] {
            let (status, _) = client_call(method.clone(), &url, token, Some(acme_body())).await;
            assert_eq!(status, 401, "{method} with {token:?}");
        }
    }
    let (status, body) = client_call(reqwest::Method::PUT, &url, Some(TOKEN), Some(acme_body())).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["override"]["rate_limit"]["requests_per_unit"], 2);
    assert_eq!(body["previous"], Value::Null);
    let (status, body) = client_call(reqwest::Method::GET, &format!("{url}?domain=api"), Some(TOKEN), None).await;
    assert_eq!(status, 200);
    assert_eq!(body["overrides"].as_array().unwrap().len(), 1);
    let rlconfig = on.text("/rlconfig").await;
    assert!(
        rlconfig
            .contains("api.tenant_acme: unit=MINUTE requests_per_unit=2, shadow_mode: false, override (plan change)"),
        "{rlconfig}"
    );
    let metrics = on.text("/metrics").await;
    assert!(metrics.contains("tollgate_overrides{domain=\"api\"} 1"), "{metrics}");
    assert!(
        metrics.contains("tollgate_override_changes_total{domain=\"api\",change=\"set\"} 1"),
        "{metrics}"
    );
    let delete = json!({"domain": "api", "descriptor": [{"key": "tenant", "value": "acme"}]});
    let (status, _) = client_call(reqwest::Method::DELETE, &url, Some(TOKEN), Some(delete.clone())).await;
    assert_eq!(status, 200);
    let (status, _) = client_call(reqwest::Method::DELETE, &url, Some(TOKEN), Some(delete)).await;
    assert_eq!(status, 404);
    on.stop().await;
}

/// Each bad request is a 400 naming the field, and leaves nothing in the
/// store.
#[tokio::test]
async fn bad_input_is_refused_and_writes_nothing() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let server = Server::new(config(CONFIG), None, AnyStore::Redis(store), Options::default())
        .admin_token(AdminToken::new(TOKEN).unwrap());
    let on = on_port_0(server).await;
    let url = format!("{}/v1/overrides", on.http);
    let with = |change: &dyn Fn(&mut Value)| {
        let mut body = acme_body();
        change(&mut body);
        body
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            with(&|body| body["domain"] = json!("nope")),
            "domain: no domain \"nope\"",
        ),
        (
            with(&|body| body["rate_limit"]["unit"] = json!("fortnight")),
            "invalid rate limit unit \"fortnight\"",
        ),
        (
            with(&|body| body["rate_limit"]["requests_per_unit"] = json!(0)),
            "rate_limit.requests_per_unit: must be at least 1",
        ),
        (
            with(&|body| body["expires_at"] = json!("2020-01-01T00:00:00Z")),
            "expires_at: 2020-01-01T00:00:00Z has passed",
        ),
        (
            with(&|body| body["expires_at"] = json!("tomorrow")),
            "expires_at: \"tomorrow\" is not an RFC 3339 instant",
        ),
        (with(&|body| body["ttl"] = json!("soon")), "ttl:"),
        (
            with(&|body| {
                body["descriptor"] = json!([
                    {"key": "tenant", "value": "acme"}, {"key": "path", "value": "/"}, {"key": "x", "value": "y"}
                ]);
            }),
            "descriptor: 3 entries, and no rule of domain \"api\" is deeper than 2",
        ),
        (
            with(&|body| body["descriptor"] = json!([])),
            "descriptor: must have at least one entry",
        ),
        (
            with(&|body| body["descriptor"] = json!([{"key": "", "value": "x"}])),
            "descriptor[0].key: must not be empty",
        ),
        (
            with(&|body| {
                body["rate_limit"] = json!({"algorithm": {"algorithm": "gcra", "rate": 0, "period": "1s", "burst": 1}});
            }),
            "rate_limit: algorithm:",
        ),
        (
            with(&|body| body["rate_limit"] = json!({"unlimited": true, "unit": "minute"})),
            "should not specify rate limit unit when unlimited",
        ),
        (with(&|body| body["surprise"] = json!(1)), "unknown field \"surprise\""),
        (
            with(&|body| {
                body.as_object_mut().unwrap().remove("rate_limit");
            }),
            "rate_limit: required",
        ),
    ];
    for (body, expected) in cases {
        let (status, answer) = client_call(reqwest::Method::PUT, &url, Some(TOKEN), Some(body.clone())).await;
        assert_eq!(status, 400, "{body} -> {answer}");
        let message = answer["error"].as_str().unwrap_or_default();
        assert!(
            message.contains(expected),
            "{body}: {message:?} should say {expected:?}"
        );
    }
    let mut connection = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut connection).await.unwrap();
    assert!(keys.is_empty(), "nothing written: {keys:?}");
    // The server still serves.
    let (status, _) = client_call(reqwest::Method::PUT, &url, Some(TOKEN), Some(acme_body())).await;
    assert_eq!(status, 200);
    on.stop().await;
}
