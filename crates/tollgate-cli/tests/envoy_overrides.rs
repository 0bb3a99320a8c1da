//! Overrides (`/v1/overrides`) behind a real Envoy: two `tollgate serve`
//! replicas on one `redis-server`, Envoy's HTTP rate limit filter asking
//! them round robin for the descriptor `tenant=<x-tenant header>` of domain
//! `example`, where the file says 100 a minute per tenant.
//!
//! The issue's criteria: an override for tenant `acme` (2 a minute) set
//! through one replica is enforced by both within a second; deleting it
//! (through the other) restores the file's rule; an expiring override ends
//! on time; restarting one replica keeps it.
//!
//! "Both replicas enforce" is asked of each replica directly (`POST
//! /v1/check` with cost 0, a peek: the limit and what remains), and seen
//! through Envoy (429s, and each replica's own count of refusals). The
//! limits are sliding logs (no window boundary can pass during a test and
//! refill them), except where an override's literal `rate_limit` (a fixed
//! minute) is the point, and there the assertions allow for a boundary.
//!
//! The measured delays are printed (`--nocapture` shows them).

// The tests read as the issue's story, step by step.
#![allow(clippy::too_many_lines)]

mod common;

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::envoy::{Envoy, ONE_AT_A_TIME};
use common::redis_server::{free_port, RedisServer};
use serde_json::{json, Value};

/// The file: 100 a minute per tenant, as a sliding log.
const CONFIG: &str = "
domain: example
descriptors:
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: 100
      algorithm: {algorithm: sliding_log, limit: 100, window: 1m}
";

const TOKEN: &str = "an-admin-token-for-the-test";

/// "Within a second".
const WITHIN: Duration = Duration::from_secs(1);

/// Envoy in front of an upstream answering 200, its rate limit filter
/// sending `tenant=<x-tenant>` in domain `example` to the cluster
/// `ratelimit`: both replicas, round robin. The filter waits 250 ms (not
/// the examples' 20 ms: this is no latency test, and a debug build on two
/// cores beside Envoy and Redis may take more) and denies when it hears
/// nothing (`failure_mode_deny`), so a failed call is a 500, never a pass.
const ENVOY_YAML: &str = r#"
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: ${ADMIN_PORT}}}
bootstrap_extensions:
- name: envoy.bootstrap.internal_listener
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener
static_resources:
  listeners:
  - name: front
    address: {socket_address: {address: 127.0.0.1, port_value: ${HTTP_PORT}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: front
          route_config:
            name: front
            virtual_hosts:
            - name: front
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route:
                  cluster: backend
                  rate_limits:
                  - actions:
                    - request_headers: {header_name: x-tenant, descriptor_key: tenant}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: example
              failure_mode_deny: true
              timeout: 0.25s
              enable_x_ratelimit_headers: DRAFT_VERSION_03
              rate_limit_service:
                grpc_service: {envoy_grpc: {cluster_name: ratelimit}}
                transport_api_version: V3
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  - name: backend
    internal_listener: {}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: backend
          route_config:
            name: backend
            virtual_hosts:
            - name: backend
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                direct_response: {status: 200, body: {inline_string: "ok\n"}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: backend
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: backend
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {envoy_internal_address: {server_listener_name: backend}}}
  - name: ratelimit
    type: STATIC
    connect_timeout: 1s
    lb_policy: ROUND_ROBIN
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
    load_assignment:
      cluster_name: ratelimit
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: ${GRPC_PORT}}}}
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: ${GRPC_PORT_B}}}}
"#;

/// Replica names, for messages.
const NAMES: [&str; 2] = ["A", "B"];

/// What a replica says of one descriptor when asked directly.
#[derive(Debug, Clone)]
struct Peek {
    limit: u64,
    remaining: u64,
    rule: String,
}

/// One `redis-server`, two replicas on it (gRPC on fixed ports, so that
/// one can be restarted where Envoy looks for it), and Envoy asking both.
struct Setup {
    redis: RedisServer,
    dir: tempfile::TempDir,
    grpc: [String; 2],
    replicas: [Option<common::Serve>; 2],
    envoy: Envoy,
    client: reqwest::Client,
}

impl Setup {
    async fn start() -> Self {
        let redis = RedisServer::start();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("example.yaml"), CONFIG).unwrap();
        std::fs::write(dir.path().join("admin-token"), format!("{TOKEN}\n")).unwrap();
        std::fs::write(dir.path().join("envoy-template.yaml"), ENVOY_YAML).unwrap();
        let grpc = [0, 1].map(|_| format!("127.0.0.1:{}", free_port()));
        let replicas = [0, 1].map(|index| Some(start_replica(dir.path(), &grpc[index], &redis.url())));
        // The helper reads templates under examples/; an absolute path
        // (this test's own template) replaces that directory.
        let template = dir.path().join("envoy-template.yaml");
        let port_b = grpc[1].rsplit_once(':').unwrap().1;
        let envoy = Envoy::start_with_values(template.to_str().unwrap(), &grpc[0], &[("GRPC_PORT_B", port_b)]);
        let setup = Self {
            redis,
            dir,
            grpc,
            replicas,
            envoy,
            client: reqwest::Client::new(),
        };
        setup.warm_up().await;
        setup
    }

    fn replica(&self, index: usize) -> &common::Serve {
        self.replicas[index].as_ref().expect("the replica runs")
    }

    fn http(&self, index: usize) -> String {
        self.replica(index).http.clone()
    }

    /// Terminates replica `index` (SIGTERM, by its pid) and starts it again
    /// on the same gRPC address and the same Redis.
    fn restart(&mut self, index: usize) {
        let (clean, logs) = self.replicas[index].take().expect("the replica runs").terminate();
        assert!(clean, "replica {} did not exit cleanly: {logs:?}", NAMES[index]);
        self.replicas[index] = Some(start_replica(self.dir.path(), &self.grpc[index], &self.redis.url()));
    }

    /// The first calls through Envoy open its connections to both
    /// replicas: a tenant of its own takes them until several in a row
    /// pass; Envoy's counters start after them.
    async fn warm_up(&self) {
        let mut in_a_row = 0;
        for _ in 0..100 {
            if self.through_envoy("warm-up").await == 200 {
                in_a_row += 1;
                if in_a_row == 4 {
                    self.envoy.reset_counters().await;
                    return;
                }
            } else {
                in_a_row = 0;
            }
        }
        panic!("Envoy never passed 4 warm-up requests in a row");
    }

    /// The status Envoy answers a request of `tenant` with.
    async fn through_envoy(&self, tenant: &str) -> u16 {
        let response = self
            .client
            .get(format!("http://{}/", self.envoy.http))
            .header("x-tenant", tenant)
            .send()
            .await
            .expect("envoy answers");
        let status = response.status().as_u16();
        let _ = response.bytes().await;
        status
    }

    /// The statuses of `count` requests of `tenant` through Envoy, one after
    /// the other.
    async fn statuses(&self, tenant: &str, count: usize) -> Vec<u16> {
        let mut statuses = Vec::with_capacity(count);
        for _ in 0..count {
            statuses.push(self.through_envoy(tenant).await);
        }
        statuses
    }

    /// What replica `index` says of `tenant` now (a check of cost 0).
    async fn peek(&self, index: usize, tenant: &str) -> Peek {
        let body = json!({
            "domain": "example",
            "descriptors": [{"entries": [{"key": "tenant", "value": tenant}]}],
            "cost": 0,
        });
        let response = self
            .client
            .post(format!("http://{}/v1/check", self.http(index)))
            .json(&body)
            .send()
            .await
            .expect("the replica answers");
        let status = response.status().as_u16();
        let answer: Value = response.json().await.expect("a JSON answer");
        assert!(
            status == 200 || status == 429,
            "peek at {}: {status} {answer}",
            NAMES[index]
        );
        let descriptor = &answer["descriptors"][0];
        Peek {
            limit: descriptor["limit"]
                .as_u64()
                .unwrap_or_else(|| panic!("no limit: {answer}")),
            remaining: descriptor["remaining"]
                .as_u64()
                .unwrap_or_else(|| panic!("no remaining: {answer}")),
            rule: descriptor["rule"].as_str().unwrap_or_default().to_owned(),
        }
    }

    /// `method /v1/overrides` at replica `index` with the admin token:
    /// the status and the answer.
    async fn overrides(&self, index: usize, method: reqwest::Method, body: Option<Value>) -> (u16, Value) {
        self.overrides_as(index, method, body, Some(TOKEN)).await
    }

    async fn overrides_as(
        &self,
        index: usize,
        method: reqwest::Method,
        body: Option<Value>,
        token: Option<&str>,
    ) -> (u16, Value) {
        let mut url = format!("http://{}/v1/overrides", self.http(index));
        if method == reqwest::Method::GET {
            url.push_str("?domain=example");
        }
        let mut request = self.client.request(method, url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("the replica answers");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// `PUT /v1/overrides` at replica `index`; it must succeed.
    async fn put(&self, index: usize, body: Value) -> Value {
        let (status, answer) = self.overrides(index, reqwest::Method::PUT, Some(body)).await;
        assert_eq!(status, 200, "PUT at {}: {answer}", NAMES[index]);
        answer
    }

    /// `GET /v1/overrides?domain=example` at replica `index`.
    async fn listed(&self, index: usize) -> Vec<Value> {
        let (status, answer) = self.overrides(index, reqwest::Method::GET, None).await;
        assert_eq!(status, 200, "GET at {}: {answer}", NAMES[index]);
        answer["overrides"]
            .as_array()
            .unwrap_or_else(|| panic!("{answer}"))
            .clone()
    }

    /// How many requests of `tenant` replica `index` refused under an
    /// override (its `ratelimit_service_rate_limit_over_limit` series of the
    /// override's stat key, the descriptor's own: `tenant_<tenant>`; under
    /// the file's rule the key is `tenant`).
    async fn refused_by(&self, index: usize, tenant: &str) -> u64 {
        let metrics = common::metrics_at(&self.http(index)).await;
        let key = format!("tenant_{tenant}\"");
        metrics
            .lines()
            .filter(|line| line.starts_with("ratelimit_service_rate_limit_over_limit{") && line.contains(&key))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|value| value as u64)
            .sum()
    }

    /// Each replica's count of override changes of kind `change` (`set`,
    /// `delete`, `expire`: `tollgate_override_changes_total`).
    async fn changes_counted(&self, change: &str) -> Vec<u64> {
        let mut counted = Vec::new();
        for index in 0..2 {
            let metrics = common::metrics_at(&self.http(index)).await;
            let label = format!("change=\"{change}\"");
            counted.push(
                metrics
                    .lines()
                    .filter(|line| line.starts_with("tollgate_override_changes") && line.contains(&label))
                    .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                    .map(|value| value as u64)
                    .sum(),
            );
        }
        counted
    }

    /// Polls each replica's peek of `tenant` until it answers `limit`;
    /// fails after `deadline` from `since`. The delay from `since` at
    /// which each one first did.
    async fn until_both_say(&self, tenant: &str, limit: u64, since: Instant, deadline: Duration) -> [Duration; 2] {
        let mut seen: [Option<Duration>; 2] = [None, None];
        loop {
            for (index, when) in seen.iter_mut().enumerate() {
                if when.is_none() {
                    let peek = self.peek(index, tenant).await;
                    if peek.limit == limit {
                        *when = Some(since.elapsed());
                    }
                }
            }
            if let [Some(a), Some(b)] = seen {
                return [a, b];
            }
            if since.elapsed() > deadline {
                let peeks = [self.peek(0, tenant).await, self.peek(1, tenant).await];
                panic!("after {deadline:?}, the replicas still answer {peeks:?} for {tenant}, not limit {limit}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

fn start_replica(dir: &Path, grpc: &str, redis: &str) -> common::Serve {
    let mut command = common::tollgate(&["serve", "--http", "127.0.0.1:0", "--grpc", grpc, "--config"]);
    command
        .arg(dir.join("example.yaml"))
        .args(["--redis", redis])
        .arg("--admin-token-file")
        .arg(dir.join("admin-token"))
        // The token comes from the file alone.
        .env_remove("TOLLGATE_ADMIN_TOKEN");
    common::Serve::start_command(command)
}

fn acme() -> Value {
    json!([{"key": "tenant", "value": "acme"}])
}

/// The override of the issue: 2 a minute for `acme`, as a sliding log.
fn two_a_minute() -> Value {
    json!({"algorithm": "sliding_log", "limit": 2, "window": "1m"})
}

/// Envoy's counters: none of its calls failed or timed out.
fn assert_no_envoy_errors(envoy: &Envoy) {
    let stats = envoy.stats();
    for name in [
        "cluster.backend.ratelimit.error",
        "cluster.backend.ratelimit.failure_mode_allowed",
        "cluster.ratelimit.upstream_rq_timeout",
    ] {
        assert_eq!(stats.get(name), 0, "{name}: {:?}", stats.0);
    }
}

fn report(what: &str, delay: Duration) {
    eprintln!("envoy_overrides: {what}: {:.1} ms", delay.as_secs_f64() * 1_000.0);
}

/// µs since the Unix epoch of an RFC 3339 instant in UTC as the server
/// writes it (`2026-01-31T12:00:00.123456Z`).
fn parse_utc(text: &str) -> u64 {
    let malformed = format!("not an RFC 3339 instant in UTC: {text}");
    let text = text.strip_suffix('Z').expect(&malformed);
    let (date, time) = text.split_once('T').expect(&malformed);
    let date: Vec<i64> = date.split('-').map(|part| part.parse().unwrap()).collect();
    let (hms, fraction) = time.split_once('.').unwrap_or((time, ""));
    let hms: Vec<i64> = hms.split(':').map(|part| part.parse().unwrap()).collect();
    let (year, month, day) = (date[0], date[1], date[2]);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    let seconds = days * 86_400 + hms[0] * 3_600 + hms[1] * 60 + hms[2];
    let micros: i64 = format!("{fraction:0<6}")[..6].parse().unwrap();
    u64::try_from(seconds * 1_000_000 + micros).unwrap()
}

fn now_micros() -> u64 {
    u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros()).unwrap()
}

/// Runs `body` alone among this file's tests (each runs two replicas, Redis
/// and Envoy on a small machine).
async fn alone<F: Future<Output = ()>>(body: F) {
    let _alone = ONE_AT_A_TIME.lock().await;
    body.await;
}

/// Before: the file's 100 a minute for everyone. An override for `acme`
/// (2 a minute) set through replica A is answered by both replicas within
/// a second; through Envoy `acme` is refused at once, the 10 requests it
/// made under the file's rule counting against the override (the same
/// counter), by both replicas; `bob` is not touched. Deleting it through
/// replica B brings the file's rule back on both within a second, with
/// what `acme` used still counted. The API refuses requests without the
/// token.
#[tokio::test]
async fn an_override_set_through_one_replica_holds_on_both_within_a_second_and_its_deletion_restores_the_file() {
    alone(async {
        let setup = Setup::start().await;

        // 1. Before: the file's rule.
        assert_eq!(setup.statuses("acme", 10).await, [200; 10]);
        assert_eq!(setup.statuses("bob", 3).await, [200; 3]);
        for (index, name) in NAMES.iter().enumerate() {
            let peek = setup.peek(index, "acme").await;
            assert_eq!((peek.limit, peek.remaining), (100, 90), "{name} before: {peek:?}");
        }
        let file_rule = setup.peek(0, "acme").await.rule;

        // Without the token, or with another, nothing changes.
        let body = json!({"domain": "example", "descriptor": acme(), "algorithm": two_a_minute()});
        for token in [None, Some("not-the-token")] {
            let (status, answer) = setup
                .overrides_as(0, reqwest::Method::PUT, Some(body.clone()), token)
                .await;
            assert_eq!(status, 401, "{token:?}: {answer}");
        }
        assert!(setup.listed(1).await.is_empty());

        // 2. Set through A.
        let sent = Instant::now();
        let answer = setup
            .put(
                0,
                json!({
                    "domain": "example",
                    "descriptor": acme(),
                    "algorithm": two_a_minute(),
                    "reason": "acme floods us",
                }),
            )
            .await;
        let answered = sent.elapsed();
        assert_eq!(answer["override"]["domain"], "example", "{answer}");
        assert_eq!(answer["override"]["descriptor"], acme(), "{answer}");
        assert_eq!(answer["override"]["reason"], "acme floods us", "{answer}");
        assert_eq!(answer["previous"], Value::Null, "{answer}");
        let [on_a, on_b] = setup.until_both_say("acme", 2, sent, WITHIN).await;
        report("set through A: PUT answered after", answered);
        report("set through A: A answers limit 2 after", on_a);
        report("set through A: B answers limit 2 after", on_b);
        for (index, name) in NAMES.iter().enumerate() {
            let peek = setup.peek(index, "acme").await;
            // The 10 used in the last minute count against the 2.
            assert_eq!((peek.limit, peek.remaining), (2, 0), "{name}: {peek:?}");
            assert_ne!(peek.rule, file_rule, "{name}: {peek:?}");
            let bob = setup.peek(index, "bob").await;
            assert_eq!((bob.limit, bob.remaining), (100, 97), "{name}: {bob:?}");
        }
        // Through Envoy, round robin over both: acme refused by each.
        let refused_before = [setup.refused_by(0, "acme").await, setup.refused_by(1, "acme").await];
        assert_eq!(setup.statuses("acme", 6).await, [429; 6]);
        let refused_after = [setup.refused_by(0, "acme").await, setup.refused_by(1, "acme").await];
        for index in 0..2 {
            assert!(
                refused_after[index] > refused_before[index],
                "replica {} refused none of acme's requests through Envoy: {refused_before:?} -> {refused_after:?}",
                NAMES[index]
            );
        }
        assert_eq!(
            refused_after[0] + refused_after[1] - refused_before[0] - refused_before[1],
            6
        );
        assert_eq!(setup.statuses("bob", 3).await, [200; 3], "bob is not overridden");
        // Listed by both, with its reason.
        for (index, name) in NAMES.iter().enumerate() {
            let listed = setup.listed(index).await;
            assert_eq!(listed.len(), 1, "{name}: {listed:?}");
            assert_eq!(listed[0]["descriptor"], acme());
            assert_eq!(listed[0]["reason"], "acme floods us");
            let rlconfig = common::rlconfig_at(&setup.http(index)).await;
            let (_, overrides) = rlconfig
                .split_once("# overrides")
                .unwrap_or_else(|| panic!("{name}: no overrides in /rlconfig:\n{rlconfig}"));
            assert!(overrides.contains("example.tenant_acme:"), "{name}:\n{rlconfig}");
        }

        // 3. Delete through B: the file's rule is back on both.
        let sent = Instant::now();
        let (status, answer) = setup
            .overrides(
                1,
                reqwest::Method::DELETE,
                Some(json!({"domain": "example", "descriptor": acme()})),
            )
            .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["deleted"]["descriptor"], acme(), "{answer}");
        let [on_a, on_b] = setup.until_both_say("acme", 100, sent, WITHIN).await;
        report("deleted through B: A answers limit 100 after", on_a);
        report("deleted through B: B answers limit 100 after", on_b);
        for (index, name) in NAMES.iter().enumerate() {
            let peek = setup.peek(index, "acme").await;
            // The 10 admitted still count; the 6 refused never did.
            assert_eq!((peek.limit, peek.remaining), (100, 90), "{name}: {peek:?}");
            assert_eq!(peek.rule, file_rule);
            assert!(setup.listed(index).await.is_empty());
            let rlconfig = common::rlconfig_at(&setup.http(index)).await;
            assert!(!rlconfig.contains("# overrides"), "{name}:\n{rlconfig}");
        }
        assert_eq!(setup.statuses("acme", 5).await, [200; 5]);
        // Deleting it again: there is none.
        let (status, answer) = setup
            .overrides(
                0,
                reqwest::Method::DELETE,
                Some(json!({"domain": "example", "descriptor": acme()})),
            )
            .await;
        assert_eq!(status, 404, "{answer}");

        let stats = setup.envoy.stats();
        assert_eq!(stats.get("cluster.backend.ratelimit.over_limit"), 6, "{:?}", stats.0);
        assert_eq!(
            stats.get("cluster.backend.ratelimit.ok"),
            10 + 3 + 3 + 5,
            "{:?}",
            stats.0
        );
        assert_no_envoy_errors(&setup.envoy);
    })
    .await;
}

/// An override with `ttl: 2s`, set as the issue says it (`rate_limit`: 2
/// a minute, a fixed minute) through A: enforced by both (2 pass through
/// Envoy, then 429); it stops applying on both replicas no earlier than
/// its `expires_at` and no later than a second after it; then one replica
/// (one only) removes it from Redis.
#[tokio::test]
async fn an_override_with_a_ttl_ends_on_time_on_both_replicas() {
    alone(async {
        let setup = Setup::start().await;
        let sent = Instant::now();
        let answer = setup
            .put(
                0,
                json!({
                    "domain": "example",
                    "descriptor": acme(),
                    "rate_limit": {"unit": "minute", "requests_per_unit": 2},
                    "ttl": "2s",
                    "reason": "a short squeeze",
                }),
            )
            .await;
        let expires_at_text = answer["override"]["expires_at"]
            .as_str()
            .unwrap_or_else(|| panic!("no expires_at: {answer}"))
            .to_owned();
        let expires_at = parse_utc(&expires_at_text);
        let set_at = parse_utc(answer["override"]["set_at"].as_str().unwrap());
        assert_eq!(expires_at - set_at, 2_000_000, "{answer}");
        let [on_a, on_b] = setup.until_both_say("acme", 2, sent, WITHIN).await;
        report("ttl 2s, set through A: A answers limit 2 after", on_a);
        report("ttl 2s, set through A: B answers limit 2 after", on_b);

        // 2 a minute, in fixed minutes: 2 pass, then 429 (unless a minute
        // ended among the requests, which refills the window once).
        let first = now_micros();
        let statuses = setup.statuses("acme", 5).await;
        let last = now_micros();
        assert!(
            last < expires_at,
            "the requests took too long to test the override: {statuses:?}"
        );
        if first / 60_000_000 == last / 60_000_000 {
            assert_eq!(statuses, [200, 200, 429, 429, 429]);
        } else {
            let passed = statuses.iter().filter(|&&status| status == 200).count();
            assert!(passed <= 4 && statuses[..2] == [200, 200], "{statuses:?}");
            assert!(
                statuses.iter().all(|&status| status == 200 || status == 429),
                "{statuses:?}"
            );
        }

        // Until it ends: each replica, asked over and over, says 2 until
        // expires_at and 100 from then on.
        let mut last_two: [Option<u64>; 2] = [None, None];
        let mut first_hundred: [Option<u64>; 2] = [None, None];
        let mut sent_at_first_hundred: [u64; 2] = [0; 2];
        let give_up = expires_at + 1_000_000;
        while first_hundred.iter().any(Option::is_none) {
            for index in 0..2 {
                if first_hundred[index].is_some() {
                    continue;
                }
                let asked = now_micros();
                let peek = setup.peek(index, "acme").await;
                let answered = now_micros();
                match peek.limit {
                    2 => last_two[index] = Some(asked),
                    100 => {
                        assert!(
                            answered >= expires_at,
                            "replica {} ended the override {} µs before its expires_at {expires_at_text}",
                            NAMES[index],
                            expires_at - answered
                        );
                        first_hundred[index] = Some(answered);
                        sent_at_first_hundred[index] = asked;
                    }
                    other => panic!("replica {} answers limit {other}: {peek:?}", NAMES[index]),
                }
                assert!(
                    asked <= give_up,
                    "replica {} still applies the override a second after {expires_at_text}",
                    NAMES[index]
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        for index in 0..2 {
            let ended = first_hundred[index].unwrap();
            let still = last_two[index]
                .unwrap_or_else(|| panic!("replica {} never applied the override while polled", NAMES[index]));
            eprintln!(
                "envoy_overrides: ttl: replica {} last said 2 when asked {:+.1} ms from expires_at, first said 100 \
                 (asked {:+.1} ms, answered {:+.1} ms from it)",
                NAMES[index],
                (still as f64 - expires_at as f64) / 1_000.0,
                (sent_at_first_hundred[index] as f64 - expires_at as f64) / 1_000.0,
                (ended as f64 - expires_at as f64) / 1_000.0,
            );
        }
        // Through Envoy, the file's rule again.
        assert_eq!(setup.statuses("acme", 3).await, [200; 3]);
        for (index, name) in NAMES.iter().enumerate() {
            assert!(setup.listed(index).await.is_empty(), "{name}");
            let rlconfig = common::rlconfig_at(&setup.http(index)).await;
            assert!(!rlconfig.contains("# overrides"), "{name}:\n{rlconfig}");
        }
        // One replica removes it from Redis (within a refresh or two), and
        // counts the expiry; the other does not.
        let table = "tollgate:table:{overrides:example}";
        let since = Instant::now();
        loop {
            let fields = setup.redis.cli(&["HLEN", table]);
            let counted = setup.changes_counted("expire").await;
            if fields == "0" && counted.iter().sum::<u64>() == 1 {
                report("ttl: removed from Redis after the check saw it end", since.elapsed());
                break;
            }
            assert!(
                since.elapsed() < WITHIN,
                "expired override still in Redis ({fields} fields in {table}: {:?}) or expiries counted {counted:?}",
                setup.redis.cli(&["KEYS", "*"])
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_no_envoy_errors(&setup.envoy);
    })
    .await;
}

/// An override set through B (2 pass through Envoy, then 429, whichever
/// replica asks); replica A terminated (SIGTERM, by its pid) and started
/// again on the same Redis and gRPC address, with no new PUT: within a
/// second of saying it is ready it applies the override, with the count
/// kept in Redis, lists it, and refuses `acme` through Envoy.
#[tokio::test]
async fn a_restarted_replica_keeps_the_override() {
    alone(async {
        let mut setup = Setup::start().await;
        let sent = Instant::now();
        setup
            .put(
                1,
                json!({"domain": "example", "descriptor": acme(), "algorithm": two_a_minute()}),
            )
            .await;
        let [on_a, on_b] = setup.until_both_say("acme", 2, sent, WITHIN).await;
        report("set through B: A answers limit 2 after", on_a);
        report("set through B: B answers limit 2 after", on_b);
        // acme has used nothing: 2 pass, then 429, whichever replica asks.
        assert_eq!(setup.statuses("acme", 6).await, [200, 200, 429, 429, 429, 429]);
        for (index, name) in NAMES.iter().enumerate() {
            assert!(setup.refused_by(index, "acme").await >= 1, "{name}");
        }
        assert_no_envoy_errors(&setup.envoy);

        setup.restart(0);
        // A replica reads the overrides in the store before it answers: its
        // very first answer holds the override.
        let first = setup.peek(0, "acme").await;
        assert_eq!(
            (first.limit, first.remaining),
            (2, 0),
            "restarted A's first answer: {first:?}"
        );
        let peek = setup.peek(0, "acme").await;
        assert_eq!((peek.limit, peek.remaining), (2, 0), "restarted A: {peek:?}");
        let listed = setup.listed(0).await;
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0]["descriptor"], acme());
        let rlconfig = common::rlconfig_at(&setup.http(0)).await;
        assert!(rlconfig.contains("# overrides"), "{rlconfig}");

        // Through Envoy: the restarted replica (a new process, its counters
        // from 0) refuses acme too.
        setup.warm_up().await;
        assert_eq!(setup.statuses("acme", 6).await, [429; 6]);
        assert!(setup.refused_by(0, "acme").await >= 1, "the restarted A refused none");
        assert_eq!(setup.statuses("bob", 3).await, [200; 3]);
        assert_no_envoy_errors(&setup.envoy);
    })
    .await;
}
