//! The server through its real listeners (port 0) with a real gRPC client
//! and a real HTTP client, on the memory store and on a spawned redis-server.

mod common;
use tollgate_testkit::redis_server;

use std::path::Path;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tollgate::AnyStore;
use tollgate::{ManualClock, MemoryStore, RedisStore, Timestamp};
use tollgate_server::{Config, Options, Reload, Server};

use common::rls::{descriptor, statuses, OK, OVER_LIMIT};
use common::{on_port_0, OnPort0, NOON};
use redis_server::RedisServer;

const CONFIG: &str = r"
domain: test
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: user
    value: vip
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: path
    value: /api/*
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: path
    rate_limit: {unit: day, requests_per_unit: 50}
  - key: internal
    rate_limit: {unlimited: true}
  - key: blocked_ip
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 2}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: old
    rate_limit: {name: old_limit, unit: day, requests_per_unit: 1}
  - key: new
    rate_limit:
      name: new_limit
      replaces: [{name: old_limit}]
      unit: day
      requests_per_unit: 10
  - key: bucket
    rate_limit:
      name: bucket
      algorithm: {algorithm: token_bucket, capacity: 5, refill: 1, interval: 1h}
";

/// A server running on port 0 until dropped.
struct Running {
    server: OnPort0,
    reloads: tokio::sync::watch::Receiver<Reload>,
    dir: tempfile::TempDir,
    redis: Option<RedisServer>,
}

#[derive(Clone, Copy, Debug)]
enum Store {
    Memory,
    Redis,
}

async fn start(store: Store, options: Options) -> Running {
    start_with(store, options, CONFIG).await
}

async fn start_with(store: Store, options: Options, config: &str) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("test.yaml");
    std::fs::write(&file, config).unwrap();
    // The limits are windows of a day aligned on midnight UTC: every store
    // decides at noon, so no run crosses a window's end.
    let clock = ManualClock::new(Timestamp::from_micros(NOON));
    let (backend, redis) = match store {
        Store::Memory => (AnyStore::Memory(MemoryStore::with_clock(clock)), None),
        Store::Redis => {
            let server = RedisServer::start();
            let store = RedisStore::builder(server.url()).clock(clock).connect().await.unwrap();
            (AnyStore::Redis(store), Some(server))
        }
    };
    let server = Server::new(Config::load(&file).unwrap(), Some(file), backend, options);
    let reloads = server.reloads();
    Running {
        server: on_port_0(server).await,
        reloads,
        dir,
        redis,
    }
}

impl Running {
    async fn client(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::connect(self.server.grpc_url()).await.unwrap()
    }

    async fn grpc(&self, request: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        self.client()
            .await
            .should_rate_limit(request)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn post(&self, path: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
        reqwest::Client::new()
            .post(format!("{}{path}", self.server.http))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap()
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        self.server.get(path).await
    }

    async fn stop(self) {
        self.server.stop().await;
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "test".to_owned(),
        descriptors,
        hits_addend: hits,
    }
}

// --- The behaviour, on both stores. -----------------------------------------

async fn per_descriptor_statuses_over_a_window(store: Store) {
    let server = start(store, Options::default()).await;
    let both = || {
        request(
            vec![descriptor(&[("user", "alice")]), descriptor(&[("path", "/other")])],
            0,
        )
    };
    for remaining in [2, 1, 0] {
        let response = server.grpc(both()).await.unwrap();
        assert_eq!(response.overall_code, OK);
        assert_eq!(
            statuses(&response),
            vec![(OK, remaining, Some(3)), (OK, remaining + 47, Some(50))]
        );
    }
    // Over the user's limit: the request is refused and consumes nothing.
    let response = server.grpc(both()).await.unwrap();
    assert_eq!(response.overall_code, OVER_LIMIT);
    assert_eq!(statuses(&response), vec![(OVER_LIMIT, 0, Some(3)), (OK, 47, Some(50))]);
    let reset = response.statuses[0].duration_until_reset.unwrap();
    assert_eq!((reset.seconds, reset.nanos), (43_200, 0), "noon: half a day to go");
    let path_only = server
        .grpc(request(vec![descriptor(&[("path", "/other")])], 0))
        .await
        .unwrap();
    assert_eq!(
        statuses(&path_only),
        vec![(OK, 46, Some(50))],
        "the refused request took nothing"
    );
    server.stop().await;
}

async fn hits_addend_counts(store: Store) {
    let server = start(store, Options::default()).await;
    let response = server
        .grpc(request(vec![descriptor(&[("user", "bob")])], 2))
        .await
        .unwrap();
    assert_eq!(statuses(&response), vec![(OK, 1, Some(3))]);
    // A descriptor's own hits_addend overrides the request's.
    let mut own = descriptor(&[("user", "bob")]);
    own.hits_addend = Some(UInt64Value { value: 1 });
    let response = server
        .grpc(request(vec![own, descriptor(&[("path", "/x")])], 5))
        .await
        .unwrap();
    assert_eq!(statuses(&response), vec![(OK, 0, Some(3)), (OK, 45, Some(50))]);
    server.stop().await;
}

async fn matching_unlimited_replaces_and_blocks(store: Store) {
    let server = start(store, Options::default()).await;
    let single = |entries: &[(&str, &str)]| request(vec![descriptor(entries)], 0);
    // Exact value beats the key-only rule; a wildcard beats it too.
    let vip = server.grpc(single(&[("user", "vip")])).await.unwrap();
    assert_eq!(statuses(&vip), vec![(OK, 99, Some(100))]);
    let api = server.grpc(single(&[("path", "/api/v1/items")])).await.unwrap();
    assert_eq!(statuses(&api), vec![(OK, 1, Some(2))]);
    // Nested rules apply at their own depth only.
    let nested = server
        .grpc(single(&[("message_type", "marketing"), ("to_number", "555")]))
        .await
        .unwrap();
    assert_eq!(statuses(&nested), vec![(OK, 1, Some(2))]);
    let shallow = server.grpc(single(&[("message_type", "marketing")])).await.unwrap();
    assert_eq!(statuses(&shallow), vec![(OK, 0, None)]);
    let unknown = server.grpc(single(&[("nobody", "x")])).await.unwrap();
    assert_eq!(statuses(&unknown), vec![(OK, 0, None)]);
    // Unlimited: OK with everything remaining.
    let internal = server.grpc(single(&[("internal", "x")])).await.unwrap();
    assert_eq!(statuses(&internal), vec![(OK, u32::MAX, None)]);
    // requests_per_unit 0 blocks.
    let blocked = server.grpc(single(&[("blocked_ip", "50.0.0.5")])).await.unwrap();
    assert_eq!(blocked.overall_code, OVER_LIMIT);
    // new_limit replaces old_limit when both match.
    let both = request(vec![descriptor(&[("old", "a")]), descriptor(&[("new", "a")])], 0);
    let replaced = server.grpc(both.clone()).await.unwrap();
    assert_eq!(statuses(&replaced), vec![(OK, 0, None), (OK, 9, Some(10))]);
    let replaced = server.grpc(both).await.unwrap();
    assert_eq!(replaced.overall_code, OK, "old_limit (1 per day) was not applied");
    let alone = server.grpc(single(&[("old", "a")])).await.unwrap();
    assert_eq!(
        statuses(&alone),
        vec![(OK, 0, Some(1))],
        "alone, old_limit applies from scratch"
    );
    // Values of any length and bytes: long descriptors are hashed into their key.
    let long = "x".repeat(1_000);
    let response = server.grpc(single(&[("user", &long)])).await.unwrap();
    assert_eq!(statuses(&response), vec![(OK, 2, Some(3))]);
    let response = server.grpc(single(&[("user", "{odd} value: ü")])).await.unwrap();
    assert_eq!(statuses(&response), vec![(OK, 2, Some(3))]);
    // An algorithm block: a token bucket of 5.
    let bucket = server.grpc(single(&[("bucket", "b")])).await.unwrap();
    assert_eq!(statuses(&bucket), vec![(OK, 4, Some(5))]);
    server.stop().await;
}

async fn shadow_mode_counts_but_admits(store: Store) {
    let server = start(store, Options::default()).await;
    for _ in 0..3 {
        let response = server
            .grpc(request(vec![descriptor(&[("shadow", "s")])], 0))
            .await
            .unwrap();
        assert_eq!(response.overall_code, OK);
    }
    let metrics = server.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains(r#"tollgate_shadow_mode_total{domain="test",rule="shadow"} 2"#),
        "{metrics}"
    );
    server.stop().await;

    let server = start(
        store,
        Options {
            shadow_mode: true,
            ..Options::default()
        },
    )
    .await;
    for _ in 0..5 {
        let response = server
            .grpc(request(vec![descriptor(&[("user", "carol")])], 0))
            .await
            .unwrap();
        assert_eq!(response.overall_code, OK, "global shadow mode always answers OK");
    }
    server.stop().await;
}

async fn headers_when_enabled(store: Store) {
    let server = start(
        store,
        Options {
            response_headers: true,
            ..Options::default()
        },
    )
    .await;
    let user = || request(vec![descriptor(&[("user", "dave")])], 0);
    let headers = |response: &RateLimitResponse| -> Vec<(String, String)> {
        response
            .response_headers_to_add
            .iter()
            .map(|header| (header.key.clone(), header.value.clone()))
            .collect()
    };
    let response = server.grpc(user()).await.unwrap();
    let first = headers(&response);
    assert_eq!(first[0], ("RateLimit-Limit".to_owned(), "3".to_owned()), "{first:?}");
    assert_eq!(
        first[1],
        ("RateLimit-Remaining".to_owned(), "2".to_owned()),
        "{first:?}"
    );
    assert_eq!(first[2].0, "RateLimit-Reset", "{first:?}");
    server.grpc(user()).await.unwrap();
    server.grpc(user()).await.unwrap();
    let over = server.grpc(user()).await.unwrap();
    assert_eq!(headers(&over)[1], ("RateLimit-Remaining".to_owned(), "0".to_owned()));
    server.stop().await;
}

async fn http_json_and_check(store: Store) {
    let server = start(store, Options::default()).await;
    let body =
        json!({"domain": "test", "descriptors": [{"entries": [{"key": "user", "value": "erin"}]}], "hitsAddend": 2});
    let response = server.post("/json", body.to_string()).await;
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["overallCode"], "OK");
    assert_eq!(answer["statuses"][0]["limitRemaining"], 1);
    assert_eq!(
        answer["statuses"][0]["currentLimit"],
        json!({"requestsPerUnit": 3, "unit": "DAY"})
    );
    let response = server.post("/json", body.to_string()).await;
    assert_eq!(response.status(), 429);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["overallCode"], "OVER_LIMIT");

    // Tollgate's own: descriptors with a cost, a decision and headers.
    let check = json!({"domain": "test", "descriptors": [{"entries": [{"key": "user", "value": "frank"}]}], "cost": 3});
    let response = server.post("/v1/check", check.to_string()).await;
    assert_eq!(response.status(), 200);
    assert!(response.headers().contains_key("ratelimit"));
    let decision: Value = response.json().await.unwrap();
    assert_eq!(
        (decision["allowed"].clone(), decision["remaining"].clone()),
        (json!(true), json!(0))
    );
    let response = server.post("/v1/check", check.to_string()).await;
    assert_eq!(response.status(), 429);
    assert!(response.headers().contains_key("retry-after"));

    // A subject and a named limit.
    let named =
        |cost: u64| json!({"domain": "test", "subject": "user-42", "limit": "bucket", "cost": cost}).to_string();
    let response = server.post("/v1/check", named(5)).await;
    assert_eq!(response.status(), 200);
    let response = server.post("/v1/check", named(1)).await;
    assert_eq!(response.status(), 429);
    let decision: Value = response.json().await.unwrap();
    // One token an hour, less the moments since the bucket was emptied.
    let retry = decision["retry_after_ms"].as_f64().unwrap();
    assert!((3_590_000.0..=3_600_000.0).contains(&retry), "{decision}");
    server.stop().await;
}

async fn bad_requests_are_refused_and_serving_goes_on(store: Store) {
    let server = start(store, Options::default()).await;
    let response = server.post("/json", "x".repeat(100_000)).await;
    assert_eq!(response.status(), 413, "an oversized body");
    let answer: Value = response.json().await.unwrap();
    assert!(answer["error"].as_str().unwrap().contains("at most"), "{answer}");
    for (body, expected) in [
        ("{not json".to_owned(), "invalid JSON"),
        (json!({"domain": "", "descriptors": [{"entries": [{"key": "user", "value": "x"}]}]}).to_string(), "domain"),
        (json!({"domain": "test"}).to_string(), "descriptors"),
        (json!({"domain": "test", "descriptors": [{"entries": []}]}).to_string(), "no entries"),
        (json!({"domain": "test", "descriptors": [{"entries": [{"key": "user", "value": "x"}]}], "hitsAddend": "99999999999"}).to_string(), "hits_addend"),
        (json!({"domain": "test", "descriptorz": []}).to_string(), "descriptorz"),
    ] {
        let response = server.post("/json", body).await;
        assert_eq!(response.status(), 400);
        let answer: Value = response.json().await.unwrap();
        assert!(answer["error"].as_str().unwrap().contains(expected), "{answer} lacks {expected}");
    }
    let response = server.post("/v1/check", json!({"domain": "test"}).to_string()).await;
    assert_eq!(response.status(), 400);
    // A limit the domain does not have is the caller's fault, not the store's.
    let unknown = json!({"domain": "test", "subject": "x", "limit": "nope"});
    let response = server.post("/v1/check", unknown.to_string()).await;
    assert_eq!(response.status(), 400);
    let answer: Value = response.json().await.unwrap();
    assert!(
        answer["error"].as_str().unwrap().contains("no limit named \"nope\""),
        "{answer}"
    );
    let metrics = server.get("/metrics").await.text().await.unwrap();
    assert!(!metrics.contains("tollgate_store_errors_total{"), "{metrics}");
    for bad in [
        RateLimitRequest {
            domain: String::new(),
            descriptors: vec![descriptor(&[("user", "x")])],
            hits_addend: 0,
        },
        request(Vec::new(), 0),
        request(vec![descriptor(&[])], 0),
    ] {
        let status = server.grpc(bad).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    }
    let mut absurd = descriptor(&[("user", "x")]);
    absurd.hits_addend = Some(UInt64Value { value: u64::MAX });
    let status = server.grpc(request(vec![absurd], 0)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    // Still serving.
    let response = server
        .grpc(request(vec![descriptor(&[("user", "after")])], 0))
        .await
        .unwrap();
    assert_eq!(response.overall_code, OK);
    assert_eq!(server.get("/healthz").await.status(), 200);
    server.stop().await;
}

async fn metrics_config_and_health(store: Store) {
    let server = start(store, Options::default()).await;
    for _ in 0..4 {
        server
            .grpc(request(vec![descriptor(&[("user", "gina")])], 0))
            .await
            .unwrap();
    }
    let metrics = server.get("/metrics").await.text().await.unwrap();
    for line in [
        r#"tollgate_hits_total{domain="test",rule="user"} 4"#,
        r#"tollgate_within_limit_total{domain="test",rule="user"} 3"#,
        r#"tollgate_over_limit_total{domain="test",rule="user"} 1"#,
        // 80 % of 3 is 2.4: only the third hit is past floor(2.4) = 2.
        r#"tollgate_near_limit_total{domain="test",rule="user"} 1"#,
        r#"tollgate_decision_seconds_count{domain="test"} 4"#,
    ] {
        assert!(metrics.contains(line), "missing {line} in\n{metrics}");
    }
    let config: Value = server.get("/v1/config").await.json().await.unwrap();
    assert_eq!(config["domains"]["test"]["domain"], "test");
    assert_eq!(server.get("/healthz").await.text().await.unwrap(), "ok\n");
    server.stop().await;
}

/// `/v1/check`'s `cost` 0 is a peek, in both forms (nothing is consumed);
/// Envoy's `hits_addend` 0 keeps meaning 1.
async fn cost_zero_is_a_peek(store: Store) {
    let server = start(store, Options::default()).await;
    let remaining = |answer: &Value| answer["remaining"].as_u64().unwrap();
    let peek = json!({"domain": "test", "descriptors": [{"entries": [{"key": "user", "value": "paula"}]}], "cost": 0});
    let named = json!({"domain": "test", "subject": "user-7", "limit": "bucket", "cost": 0});
    for _ in 0..3 {
        let response = server.post("/v1/check", peek.to_string()).await;
        assert_eq!(response.status(), 200);
        assert_eq!(remaining(&response.json().await.unwrap()), 3);
        let response = server.post("/v1/check", named.to_string()).await;
        assert_eq!(response.status(), 200);
        assert_eq!(remaining(&response.json().await.unwrap()), 5);
    }
    let response = server
        .grpc(request(vec![descriptor(&[("user", "paula")])], 0))
        .await
        .unwrap();
    assert_eq!(statuses(&response), vec![(OK, 2, Some(3))]);
    let response = server.post("/v1/check", peek.to_string()).await;
    assert_eq!(remaining(&response.json().await.unwrap()), 2);
    server.stop().await;
}

/// On Envoy's protocol a reset is whole seconds, rounded up, as
/// envoyproxy/ratelimit sends it: Envoy's `x-ratelimit-reset` reads the
/// seconds alone, so a reset 0.1 s away sent as such would read 0 (retry
/// at once, and be refused again).
async fn envoy_resets_are_whole_seconds_rounded_up(store: Store) {
    const TEN_A_SECOND: &str = "
domain: fast
descriptors:
  - key: user
    rate_limit:
      algorithm: {algorithm: gcra, rate: 10, period: 1s, burst: 1}
";
    let server = start_with(store, Options::default(), TEN_A_SECOND).await;
    let ask = || RateLimitRequest {
        domain: "fast".to_owned(),
        ..request(vec![descriptor(&[("user", "rita")])], 0)
    };
    assert_eq!(server.grpc(ask()).await.unwrap().overall_code, OK);
    let over = server.grpc(ask()).await.unwrap();
    assert_eq!(over.overall_code, OVER_LIMIT);
    let reset = over.statuses[0].duration_until_reset.unwrap();
    assert_eq!((reset.seconds, reset.nanos), (1, 0), "0.1 s to go: {reset:?}");
    let body = json!({"domain": "fast", "descriptors": [{"entries": [{"key": "user", "value": "rita"}]}]});
    let answer: Value = server.post("/json", body.to_string()).await.json().await.unwrap();
    assert_eq!(answer["statuses"][0]["durationUntilReset"], "1s", "{answer}");
    // Tollgate's own API keeps the microseconds.
    let check = json!({"domain": "fast", "descriptors": [{"entries": [{"key": "user", "value": "rita"}]}]});
    let answer: Value = server.post("/v1/check", check.to_string()).await.json().await.unwrap();
    assert_eq!(answer["retry_after_ms"], json!(100.0), "{answer}");
    server.stop().await;
}

/// A request's descriptors are capped: above the cap the request is an
/// invalid argument naming it, on every front end, and serving goes on.
async fn descriptors_are_capped(store: Store) {
    let server = start(
        store,
        Options {
            max_descriptors: 10,
            ..Options::default()
        },
    )
    .await;
    let users = |count: usize| {
        let names: Vec<String> = (0..count).map(|index| format!("cap-{index}")).collect();
        let descriptors = names.iter().map(|name| descriptor(&[("user", name)])).collect();
        request(descriptors, 0)
    };
    let response = server.grpc(users(10)).await.unwrap();
    assert_eq!(response.statuses.len(), 10);
    let status = server.grpc(users(11)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("at most 10"), "{status:?}");
    let entries: Vec<Value> = (0..11)
        .map(|index| json!({"entries": [{"key": "user", "value": format!("cap-{index}")}]}))
        .collect();
    for path in ["/json", "/v1/check"] {
        let body = json!({"domain": "test", "descriptors": entries});
        let response = server.post(path, body.to_string()).await;
        assert_eq!(response.status(), 400, "{path}");
        let answer: Value = response.json().await.unwrap();
        assert!(answer["error"].as_str().unwrap().contains("at most 10"), "{answer}");
    }
    // Nothing of the refused requests was counted.
    let response = server.grpc(users(1)).await.unwrap();
    assert_eq!(statuses(&response), vec![(OK, 1, Some(3))]);
    server.stop().await;
}

/// A fixed window's reset comes from the instant the store decided at (here
/// the manual clock at noon: 12 hours to the day's end), never the host's,
/// even for a counter nothing has touched (a peek of Envoy's per-descriptor
/// `hits_addend` 0).
async fn resets_come_from_the_store_clock(store: Store) {
    let server = start(store, Options::default()).await;
    let mut peek = descriptor(&[("user", "quinn")]);
    peek.hits_addend = Some(UInt64Value { value: 0 });
    let response = server.grpc(request(vec![peek], 0)).await.unwrap();
    let reset = response.statuses[0].duration_until_reset.unwrap();
    assert_eq!((reset.seconds, reset.nanos), (12 * 3600, 0), "{response:?}");
    let response = server
        .grpc(request(vec![descriptor(&[("user", "quinn")])], 0))
        .await
        .unwrap();
    let reset = response.statuses[0].duration_until_reset.unwrap();
    assert_eq!((reset.seconds, reset.nanos), (12 * 3600, 0), "{response:?}");
    server.stop().await;
}

/// A request that a blocking rule refuses consumes nothing from its other
/// descriptors, whose statuses still say where they stand.
async fn a_blocked_request_consumes_nothing(store: Store) {
    let server = start(store, Options::default()).await;
    let both = || {
        request(
            vec![
                descriptor(&[("user", "rita")]),
                descriptor(&[("blocked_ip", "50.0.0.5")]),
            ],
            0,
        )
    };
    for _ in 0..2 {
        let response = server.grpc(both()).await.unwrap();
        assert_eq!(response.overall_code, OVER_LIMIT);
        assert_eq!(statuses(&response), vec![(OK, 3, Some(3)), (OVER_LIMIT, 0, Some(0))]);
    }
    let response = server
        .grpc(request(vec![descriptor(&[("user", "rita")])], 0))
        .await
        .unwrap();
    assert_eq!(
        statuses(&response),
        vec![(OK, 2, Some(3))],
        "the refused requests took nothing"
    );
    // `/v1/check` says so too: refused, never admissible (retry_after null).
    let check = json!({"domain": "test", "descriptors": [
        {"entries": [{"key": "user", "value": "rita"}]},
        {"entries": [{"key": "blocked_ip", "value": "50.0.0.5"}]},
    ]});
    let response = server.post("/v1/check", check.to_string()).await;
    assert_eq!(response.status(), 429);
    let decision: Value = response.json().await.unwrap();
    assert_eq!(decision["allowed"], false, "{decision}");
    assert_eq!(decision["retry_after_ms"], Value::Null, "{decision}");
    server.stop().await;
}

/// Take an estimate, then settle the actual (`/v1/estimate`,
/// `/v1/settle`): the unused part comes back, an excess is recorded (past the
/// limit too), settling again with the same amount answers the same, with
/// another is a conflict, and an unknown id is not found.
async fn estimates_settle_to_the_actual(store: Store) {
    const BUDGET: &str = "
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000}
";
    let server = start_with(store, Options::default(), BUDGET).await;
    let reserve = |cost: u64| {
        json!({"domain": "llm", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}], "cost": cost})
            .to_string()
    };
    let answer = |response: reqwest::Response| async move {
        let status = response.status().as_u16();
        (status, response.json::<Value>().await.unwrap())
    };
    let (status, first) = answer(server.post("/v1/estimate", reserve(400)).await).await;
    assert_eq!((status, first["remaining"].clone()), (200, json!(600)), "{first}");
    let first_id = first["estimate"]["id"].as_str().unwrap().to_owned();
    assert_eq!(first["estimate"]["ttl_ms"], 600_000, "{first}");
    let (_, second) = answer(server.post("/v1/estimate", reserve(400)).await).await;
    let second_id = second["estimate"]["id"].as_str().unwrap().to_owned();
    let (status, third) = answer(server.post("/v1/estimate", reserve(400)).await).await;
    assert_eq!(status, 429, "200 left: {third}");
    assert!(
        third.get("estimate").is_none(),
        "a refused estimate is not kept: {third}"
    );

    let settle = |id: &str, actual: u64| json!({"estimate": id, "actual": actual}).to_string();
    let (status, settled) = answer(server.post("/v1/settle", settle(&first_id, 100)).await).await;
    assert_eq!(
        (status, settled["remaining"].clone()),
        (200, json!(500)),
        "300 came back: {settled}"
    );
    let (status, again) = answer(server.post("/v1/settle", settle(&first_id, 100)).await).await;
    assert_eq!((status, &again), (200, &settled), "settling is idempotent");
    let (status, conflict) = answer(server.post("/v1/settle", settle(&first_id, 50)).await).await;
    assert_eq!(status, 409, "{conflict}");
    assert!(
        conflict["error"].as_str().unwrap().contains("settled with 100"),
        "{conflict}"
    );

    // 950 used where 400 were reserved: the excess counts, past the limit.
    let (status, over) = answer(server.post("/v1/settle", settle(&second_id, 950)).await).await;
    assert_eq!(status, 200, "a settlement is never refused: {over}");
    assert_eq!(
        (over["allowed"].clone(), over["remaining"].clone()),
        (json!(false), json!(0)),
        "{over}"
    );
    let peek = json!({"domain": "llm", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}], "cost": 0});
    assert_eq!(
        server.post("/v1/check", peek.to_string()).await.status(),
        429,
        "1 050 of 1 000 spent"
    );

    let (status, unknown) = answer(server.post("/v1/settle", settle("nope", 1)).await).await;
    assert_eq!(status, 404, "{unknown}");
    assert!(
        unknown["error"].as_str().unwrap().contains("unknown or has expired"),
        "{unknown}"
    );
    let bad = [
        (json!({"estimate": first_id}).to_string(), "actual"),
        (json!({"domain": "llm", "descriptors": [{"entries": [{"key": "tenant", "value": "b"}]}], "cost": 1, "ttl": "0s"}).to_string(), "ttl"),
        (json!({"domain": "llm", "descriptors": [{"entries": [{"key": "tenant", "value": "b"}], "cost": 2}]}).to_string(), "cost"),
    ];
    for (body, field) in bad {
        let path = if body.contains("estimate") {
            "/v1/settle"
        } else {
            "/v1/estimate"
        };
        let (status, refused) = answer(server.post(path, body.clone()).await).await;
        assert_eq!(status, 400, "{body}: {refused}");
        assert!(refused["error"].as_str().unwrap().contains(field), "{body}: {refused}");
    }
    let with_ttl =
        json!({"domain": "llm", "descriptors": [{"entries": [{"key": "tenant", "value": "b"}]}], "ttl": "1m"});
    assert_eq!(
        server.post("/v1/check", with_ttl.to_string()).await.status(),
        400,
        "ttl is an estimate's"
    );
    server.stop().await;
}

/// A budget that follows the calendar (Tollgate's `algorithm` block): a day
/// in Asia/Tokyo ends at 15:00 UTC, and the answer's reset says so.
async fn calendar_budgets_reset_with_the_zone(store: Store) {
    const DAILY: &str = "
domain: llm
descriptors:
  - key: tenant
    rate_limit:
      unit: day
      requests_per_unit: 1000
      algorithm: {algorithm: fixed_window, limit: 1000, calendar: day, time_zone: Asia/Tokyo, overage: record}
";
    let server = start_with(store, Options::default(), DAILY).await;
    let body = |cost: u64| {
        json!({"domain": "llm", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}], "cost": cost})
            .to_string()
    };
    let response = server.post("/v1/check", body(800)).await;
    assert_eq!(response.status(), 200);
    let decision: Value = response.json().await.unwrap();
    // Noon UTC is 21:00 in Tokyo: three hours to its midnight.
    assert_eq!(decision["reset_after_ms"], 10_800_000.0, "{decision}");
    // 800 more: over, and (overage: record) counted all the same.
    let response = server.post("/v1/check", body(800)).await;
    assert_eq!(response.status(), 429);
    let response = server.post("/v1/check", body(0)).await;
    assert_eq!(response.status(), 429, "1 600 of 1 000 spent");
    let decision: Value = response.json().await.unwrap();
    assert_eq!(decision["retry_after_ms"], 10_800_000.0, "{decision}");
    server.stop().await;
}

macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test] async fn $name() { super::$name(super::Store::Memory).await; })*
        }
        mod redis {
            $(#[tokio::test] async fn $name() { super::$name(super::Store::Redis).await; })*
        }
    };
}

on_both_stores!(
    per_descriptor_statuses_over_a_window,
    hits_addend_counts,
    matching_unlimited_replaces_and_blocks,
    shadow_mode_counts_but_admits,
    headers_when_enabled,
    http_json_and_check,
    bad_requests_are_refused_and_serving_goes_on,
    metrics_config_and_health,
    cost_zero_is_a_peek,
    a_blocked_request_consumes_nothing,
    descriptors_are_capped,
    resets_come_from_the_store_clock,
    envoy_resets_are_whole_seconds_rounded_up,
    estimates_settle_to_the_actual,
    calendar_budgets_reset_with_the_zone,
);

/// A 100 000-descriptor request is refused (the default cap is 1 000), and
/// unrelated requests are answered meanwhile.
#[tokio::test]
async fn a_huge_request_is_refused_at_the_cap() {
    let server = start(Store::Memory, Options::default()).await;
    let names: Vec<String> = (0..100_000).map(|index| format!("huge-{index}")).collect();
    let descriptors = names.iter().map(|name| descriptor(&[("user", name)])).collect();
    let status = server.grpc(request(descriptors, 0)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("100000 given, at most 1000"), "{status:?}");
    let response = server
        .grpc(request(vec![descriptor(&[("user", "after-huge")])], 0))
        .await
        .unwrap();
    assert_eq!(response.overall_code, OK);
    server.stop().await;
}

/// envoyproxy/ratelimit's debug listener (`DEBUG_HOST`, `DEBUG_PORT`):
/// `/rlconfig` and `/metrics`, where `config_load_success` counts the
/// configuration loaded at start.
#[tokio::test]
async fn the_debug_listener_serves_rlconfig_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("test.yaml");
    std::fs::write(&file, CONFIG).unwrap();
    let store = AnyStore::Memory(MemoryStore::new());
    let debug = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let debug_address = debug.local_addr().unwrap();
    let server = Server::new(Config::load(&file).unwrap(), Some(file), store, Options::default()).debug_on(debug);
    let running = on_port_0(server).await;
    let rlconfig = reqwest::get(format!("http://{debug_address}/rlconfig")).await.unwrap();
    assert_eq!(rlconfig.status(), 200);
    let text = rlconfig.text().await.unwrap();
    assert!(
        text.contains("test.user: unit=DAY requests_per_unit=3, shadow_mode: false"),
        "{text}"
    );
    let metrics = reqwest::get(format!("http://{debug_address}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let loaded = metrics
        .lines()
        .find(|line| line.starts_with("ratelimit_service_config_load_success"))
        .unwrap_or_else(|| panic!("no config_load_success in\n{metrics}"));
    assert!(loaded.ends_with(" 1"), "{loaded}");
    running.stop().await;
}

/// envoyproxy/ratelimit's `/rlconfig`: one line per rule.
#[tokio::test]
async fn rlconfig_prints_the_loaded_rules() {
    let server = start(Store::Memory, Options::default()).await;
    let response = server.get("/rlconfig").await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    for line in [
        "test.user: unit=DAY requests_per_unit=3, shadow_mode: false",
        "test.user_vip: unit=DAY requests_per_unit=100, shadow_mode: false",
        "test.message_type_marketing.to_number: unit=DAY requests_per_unit=2, shadow_mode: false",
        "test.shadow: unit=DAY requests_per_unit=1, shadow_mode: true",
        "test.internal: unit=UNKNOWN requests_per_unit=0, shadow_mode: false",
    ] {
        assert!(text.lines().any(|each| each == line), "no {line} in\n{text}");
    }
    server.stop().await;
}

/// A store that fails is `UNAVAILABLE` (503 over HTTP), so Envoy's
/// `failure_mode_deny` decides; the server recovers with the store.
#[tokio::test]
async fn store_faults_are_unavailable() {
    let mut server = start(Store::Redis, Options::default()).await;
    let user = || request(vec![descriptor(&[("user", "ivy")])], 0);
    assert_eq!(server.grpc(user()).await.unwrap().overall_code, OK);
    server.redis.as_mut().unwrap().stop();
    let status = server.grpc(user()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let body = json!({"domain": "test", "descriptors": [{"entries": [{"key": "user", "value": "ivy"}]}]});
    assert_eq!(server.post("/json", body.to_string()).await.status(), 503);
    let metrics = server.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains(r#"tollgate_store_errors_total{domain="test"} 2"#),
        "{metrics}"
    );
    server.stop().await;
}

// --- Configuration files. -----------------------------------------------------

async fn next_reload(server: &mut Running) -> Reload {
    tokio::time::timeout(Duration::from_secs(10), server.reloads.changed())
        .await
        .expect("a reload within 10 s")
        .unwrap();
    server.reloads.borrow_and_update().clone()
}

#[tokio::test]
async fn hot_reload_applies_good_changes_and_keeps_the_old_config_on_bad_ones() {
    let mut server = start(Store::Memory, Options::default()).await;
    // Once it answers, the server watches its files.
    assert_eq!(server.get("/healthz").await.status(), 200);
    let file = server.dir.path().join("test.yaml");
    std::fs::write(&file, CONFIG.replace("requests_per_unit: 3}", "requests_per_unit: 7}")).unwrap();
    assert_eq!(next_reload(&mut server).await, Reload::Loaded(1));
    let response = server
        .grpc(request(vec![descriptor(&[("user", "hank")])], 0))
        .await
        .unwrap();
    assert_eq!(statuses(&response), vec![(OK, 6, Some(7))]);

    std::fs::write(
        &file,
        "domain: test\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    )
    .unwrap();
    match next_reload(&mut server).await {
        Reload::Failed(message) => {
            assert!(message.contains("test.yaml:4"), "{message}");
            assert!(message.contains("fortnight"), "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let response = server
        .grpc(request(vec![descriptor(&[("user", "hank")])], 0))
        .await
        .unwrap();
    assert_eq!(
        statuses(&response),
        vec![(OK, 5, Some(7))],
        "the previous config stays in force"
    );
    server.stop().await;
}

fn parse(text: &str) -> Result<tollgate_server::config::Domain, tollgate_server::ConfigError> {
    tollgate_server::config::Domain::parse(text, Path::new("limits.yaml"))
}

/// envoyproxy/ratelimit's README examples, re-typed, load unchanged.
#[test]
fn envoyproxy_ratelimit_examples_load() {
    let examples = [
        "domain: mongo_cps\ndescriptors:\n  - key: database\n    value: users\n    rate_limit:\n      unit: second\n      requests_per_unit: 500\n\n  - key: database\n    value: default\n    rate_limit:\n      unit: second\n      requests_per_unit: 500\n",
        "domain: messaging\ndescriptors:\n  # Only allow 5 marketing messages a day\n  - key: message_type\n    value: marketing\n    descriptors:\n      - key: to_number\n        rate_limit:\n          unit: day\n          requests_per_unit: 5\n\n  # Only allow 100 messages a day to any unique phone number\n  - key: to_number\n    rate_limit:\n      unit: day\n      requests_per_unit: 100\n",
        "domain: edge_proxy_per_ip\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n\n  # Black list IP\n  - key: remote_address\n    value: 50.0.0.5\n    rate_limit:\n      unit: second\n      requests_per_unit: 0\n",
        "domain: edge_proxy_per_ip\ndescriptors:\n  - key: ip_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n\n  - key: ip_address\n    value: 50.0.0.5\n    descriptors:\n      - key: path\n        value: /foo/bar\n        rate_limit:\n          unit: second\n          requests_per_unit: 1\n",
        "domain: internal\ndescriptors:\n  - key: ldap\n    rate_limit:\n      unlimited: true\n\n  - key: azure\n    rate_limit:\n      unit: minute\n      requests_per_unit: 100\n",
        "domain: example\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      name: bkthomps\n      replaces:\n        - name: bkthomps2\n      unit: minute\n      requests_per_unit: 10\n  - key: key2\n    value: value2\n    rate_limit:\n      name: bkthomps2\n      unit: minute\n      requests_per_unit: 20\n",
        "domain: example\ndescriptors:\n  - key: remote_address\n    shadow_mode: true\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n",
        "domain: example\ndescriptors:\n  - key: path\n    value: /foo/*\n    share_threshold: true\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n  - key: hello\n    value: world\n    detailed_metric: true\n    rate_limit:\n      unit: hour\n      requests_per_unit: 7\n",
    ];
    for example in examples {
        let domain = parse(example).unwrap_or_else(|error| panic!("{error}\n{example}"));
        assert!(!domain.descriptors.is_empty());
    }
}

#[test]
fn bad_files_are_refused_with_file_and_line() {
    let cases = [
        ("domain: test\ndescriptors:\n  - key: a\n    rate_limit: [unit\n", 4, "limits.yaml:"),
        ("domain: test\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n", 5, "invalid rate limit unit \"fortnight\""),
        ("domain: test\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: -5\n", 6, "-5"),
        ("domain: test\ndescriptors:\n  - key: a\n    rate_limit:\n      algorithm: {algorithm: gcra, rate: 10, period: 1s, bursts: 5}\n", 5, "bursts"),
        ("domain: test\ndescriptors:\n  - key: a\n    rate_limit:\n      algorithm: {algorithm: gcra, rate: 10, period: \"10\", burst: 5}\n", 5, "needs a unit"),
        ("domain: test\ndescriptors:\n  - key: a\n    ratelimit:\n      unit: second\n", 4, "unknown key \"ratelimit\""),
        // A rate_limit without a unit is reported at the block.
        ("domain: test\ndescriptors:\n  - key: a\n    rate_limit:\n      requests_per_unit: 5\n", 5, "invalid rate limit unit \"\""),
        // A duplicate is reported at the second one.
        ("domain: test\ndescriptors:\n  - key: a\n    value: b\n  - key: a\n    value: b\n", 5, "duplicate descriptor composite key \"test.a_b\""),
        // A key given twice in one mapping is refused, never the last one winning.
        ("domain: test\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\ndescriptors:\n  - key: b\n", 5, "mapping key \"descriptors\" already defined"),
        ("domain: test\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      requests_per_unit: 100\n", 7, "mapping key \"requests_per_unit\" already defined"),
        ("domain: test\ndescriptors:\n  - key: a\n    key: b\n", 4, "mapping key \"key\" already defined"),
        ("domain: test\ndescriptors:\n  - key: a\n    rate_limit:\n      algorithm: {algorithm: gcra, rate: 10, rate: 20, period: 1s, burst: 5}\n", 5, "rate"),
        ("domain: test\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      scope: world\n", 5, "scope: expected \"global\""),
        ("domain: test\ndescriptors:\n  - key: a\n    rate_limit:\n      algorithm: {algorithm: concurrency, limit: 5, ttl: 1s}\n      scope: global\n", 5, "a concurrency limit cannot be global"),
        ("domain: test\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      scope: global\n", 5, "scope needs a limit"),
    ];
    for (text, line, expected) in cases {
        let error = parse(text).expect_err(text);
        let message = error.to_string();
        assert!(message.contains(expected), "{message} lacks {expected}");
        let reported = error.line.unwrap_or_else(|| panic!("no line in {message}"));
        assert!(
            reported.abs_diff(line) <= 1,
            "{message}: line {reported}, expected about {line}"
        );
        assert!(message.starts_with("limits.yaml:"), "{message}");
    }
}

/// `scope: global` beside a rule's limit makes it one limit across regions
/// (a refused check then counts nothing: a region refuses what its share
/// cannot grant); `regional`, or none, leaves it as it is.
#[test]
fn a_rule_opts_into_a_global_limit_with_its_scope() {
    let text = "domain: test\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1000\n      scope: global\n  - key: ip\n    rate_limit:\n      algorithm: {algorithm: gcra, rate: 10, period: 1s, burst: 5}\n      scope: regional\n";
    let domain = parse(text).unwrap();
    let limits: Vec<(String, bool, bool)> = domain
        .descriptors
        .nodes()
        .iter()
        .map(|node| match &node.rule.as_ref().unwrap().limit {
            tollgate_server::config::RuleLimit::Limited(limit) => {
                (node.key.clone(), limit.is_global(), limit.records_overage())
            }
            _ => panic!("a limit"),
        })
        .collect();
    assert_eq!(
        limits,
        [("tenant".to_owned(), true, false), ("ip".to_owned(), false, false)]
    );
}

/// Anchors, aliases and merge keys apply (an explicit key wins over a
/// merged one, which is no duplicate).
#[test]
fn anchors_and_merge_keys_keep_working() {
    let text = "domain: test\ndescriptors:\n  - key: a\n    rate_limit: &defaults\n      unit: second\n      requests_per_unit: 5\n  - key: b\n    rate_limit:\n      <<: *defaults\n      requests_per_unit: 7\n  - key: c\n    rate_limit: *defaults\n";
    let domain = parse(text).unwrap();
    let requests: Vec<(String, Option<u64>)> = domain
        .descriptors
        .nodes()
        .iter()
        .map(|node| (node.key.clone(), node.rule.as_ref().unwrap().requests_per_unit))
        .collect();
    assert_eq!(
        requests,
        [
            ("a".to_owned(), Some(5)),
            ("b".to_owned(), Some(7)),
            ("c".to_owned(), Some(5))
        ]
    );
}

#[test]
fn a_directory_holds_one_domain_per_file_and_no_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), "domain: one\ndescriptors: []\n").unwrap();
    std::fs::write(dir.path().join("b.yml"), "domain: two\n").unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a config").unwrap();
    let config = Config::load(dir.path()).unwrap();
    assert_eq!(config.domains.keys().collect::<Vec<_>>(), ["one", "two"]);
    std::fs::write(dir.path().join("c.yaml"), "domain: one\n").unwrap();
    let error = Config::load(dir.path()).unwrap_err();
    assert!(error.to_string().contains("duplicate domain \"one\""), "{error}");
    assert!(error.to_string().contains("c.yaml"), "{error}");
}

/// One rule for the most restrictive descriptor (the library's: the denial
/// with the longest `retry_after`), in `/v1/check`'s decision and
/// `Retry-After`, and in the headers of Envoy's protocol alike.
#[tokio::test]
async fn the_most_restrictive_denial_speaks_everywhere() {
    let config = "domain: d\ndescriptors:\n  - key: minute\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: day\n    rate_limit: {unit: day, requests_per_unit: 2}\n";
    let server = start_with(
        Store::Memory,
        Options {
            response_headers: true,
            ..Options::default()
        },
        config,
    )
    .await;
    let both = json!({"domain": "d", "descriptors": [
        {"entries": [{"key": "minute", "value": "m"}]},
        {"entries": [{"key": "day", "value": "x"}]},
    ]});
    // Use up both: the minute limit with one request, the day one with two.
    server.post("/v1/check", both.to_string()).await;
    let day = json!({"domain": "d", "descriptors": [{"entries": [{"key": "day", "value": "x"}]}]});
    server.post("/v1/check", day.to_string()).await;

    let response = server.post("/v1/check", both.to_string()).await;
    assert_eq!(response.status(), 429);
    let retry: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    let decision: Value = response.json().await.unwrap();
    assert_eq!(
        decision["limit"], 2,
        "the day limit (longest retry_after) speaks: {decision}"
    );
    assert!(
        retry > 60 || decision["retry_after_ms"].as_f64().unwrap() > 60_000.0,
        "{decision}"
    );

    let grpc = server
        .grpc(RateLimitRequest {
            domain: "d".to_owned(),
            descriptors: vec![descriptor(&[("minute", "m")]), descriptor(&[("day", "x")])],
            hits_addend: 0,
        })
        .await
        .unwrap();
    let limit = grpc
        .response_headers_to_add
        .iter()
        .find(|header| header.key == "RateLimit-Limit")
        .map(|header| header.value.clone());
    assert_eq!(limit.as_deref(), Some("2"), "{grpc:?}");
    server.stop().await;
}
