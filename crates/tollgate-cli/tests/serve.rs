//! `tollgate serve` as a process: config checks, a request, a graceful stop.

mod common;

use common::redis_cluster::RedisCluster;
use common::redis_server::RedisServer;
use common::tollgate;
use serde_json::{json, Value};

fn examples() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/config")
}

/// The example's 5 a minute per address, in a sliding log: no minute
/// boundary can pass during a test and refill it. The directory holds the
/// file while the test runs.
fn five_a_minute() -> (tempfile::TempDir, std::path::PathBuf) {
    per_address("minute", 5, "{algorithm: sliding_log, limit: 5, window: 1m}")
}

/// A configuration of domain `example` limiting each `remote_address` to
/// `requests` per `unit` with the `algorithm` block given; the directory
/// holds the file while the test runs.
fn per_address(unit: &str, requests: u64, algorithm: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("example.yaml");
    std::fs::write(
        &config,
        format!(
            "domain: example\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: {unit}\n      requests_per_unit: {requests}\n      algorithm: {algorithm}\n"
        ),
    )
    .unwrap();
    (dir, config)
}

#[test]
fn check_config_accepts_the_bundled_example() {
    let output = tollgate(&["serve", "--check-config", "--config"])
        .arg(examples())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "ok: 1 domain(s): example\n");
}

#[test]
fn check_config_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    std::fs::write(
        &file,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
    )
    .unwrap();
    let output = tollgate(&["serve", "--check-config", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bad.yaml:5: "), "{stderr}");
    assert!(stderr.contains("invalid rate limit unit \"fortnight\""), "{stderr}");
}

/// The quota service's intervals are refused unless Envoy can read them
/// (whole seconds), with a message naming the setting.
#[test]
fn rlqs_settings_envoy_cannot_read_are_refused() {
    let (_dir, config) = five_a_minute();
    for (args, message) in [
        (
            &["--rlqs-interval", "500ms"][..],
            "rlqs interval must be a whole number of seconds",
        ),
        (
            &["--rlqs-interval", "2s", "--rlqs-ttl", "1s"][..],
            "rlqs ttl must be a whole number of seconds, at least the interval",
        ),
        (
            &["--rlqs-ttl", "2500ms"][..],
            "rlqs ttl must be a whole number of seconds",
        ),
        (
            &["--rlqs-abandon-after", "1s"][..],
            "rlqs abandon-after must be at least 10s",
        ),
    ] {
        let output = tollgate(&["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--config"])
            .arg(&config)
            .args(args)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn serves_and_stops_gracefully_on_sigterm() {
    let (_dir, config) = five_a_minute();
    let server = common::Serve::start(&config);
    let http = &server.http;

    let body = r#"{"domain":"example","descriptors":[{"entries":[{"key":"remote_address","value":"198.51.100.1"}]}]}"#;
    let client = reqwest::Client::new();
    for expected in [200, 200, 200, 200, 200, 429] {
        let response = client
            .post(format!("http://{http}/v1/check"))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), expected);
    }

    let (exited_cleanly, logs) = server.terminate();
    assert!(exited_cleanly, "{logs:?}");
    assert!(logs.iter().any(|line| line.contains("stopped")), "{logs:?}");
}

/// A limit of 5 requests a minute, with Redis stopped, under each failure
/// policy: `open` admits all, `closed` denies all, `local` enforces the 5 in
/// the process, `error` answers 503; `/metrics` counts the path.
#[tokio::test]
async fn a_stopped_redis_is_answered_by_the_failure_policy() {
    let (_dir, config) = five_a_minute();
    let mut redis = RedisServer::start();
    let url = redis.url();
    let servers: Vec<(&str, common::Serve)> = ["open", "closed", "local", "error"]
        .into_iter()
        .map(|policy| {
            let args = [
                "--redis",
                url.as_str(),
                "--on-store-error",
                policy,
                "--store-timeout",
                "50ms",
            ];
            (policy, common::Serve::start_with(&config, &args))
        })
        .collect();
    redis.stop();
    let body = r#"{"domain":"example","descriptors":[{"entries":[{"key":"remote_address","value":"198.51.100.9"}]}]}"#;
    let client = reqwest::Client::new();
    for (policy, server) in &servers {
        let expected: &[u16] = match *policy {
            "open" => &[200; 7],
            "closed" => &[429; 7],
            "local" => &[200, 200, 200, 200, 200, 429, 429],
            _ => &[503; 7],
        };
        for (index, status) in expected.iter().enumerate() {
            let response = client
                .post(format!("http://{}/v1/check", server.http))
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status().as_u16(), *status, "{policy}: request {index}");
        }
        let metrics = common::metrics_at(&server.http).await;
        let path = match *policy {
            "open" | "closed" => Some("policy"),
            "local" => Some("local"),
            _ => None,
        };
        if let Some(path) = path {
            let line = format!("tollgate_decisions_by_path_total{{path=\"{path}\"}} 7");
            assert!(metrics.contains(&line), "{policy}: no {line} in\n{metrics}");
        }
    }
}

/// `tollgate serve` on a Redis Cluster of 3 masters: each descriptor is its
/// own subject, so 10 000 descriptors of one domain spread over the masters
/// (none holds more than half of the keys); a request whose descriptors
/// live in different slots is all-or-nothing (the one over its limit
/// refuses it, and the other gives its unit back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_domain_spreads_over_a_cluster_and_a_refused_request_takes_nothing() {
    let cluster = RedisCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("spread.yaml");
    // Sliding logs, not windows aligned on the clock: no window ends mid-test.
    std::fs::write(
        &config,
        "domain: spread\n\
         descriptors:\n\
         \x20 - key: remote_address\n\
         \x20   rate_limit: {unit: hour, requests_per_unit: 1, algorithm: {algorithm: sliding_log, limit: 1, window: 1h}}\n\
         \x20 - key: user\n\
         \x20   rate_limit: {unit: hour, requests_per_unit: 10, algorithm: {algorithm: sliding_log, limit: 10, window: 1h}}\n",
    )
    .unwrap();
    let url = cluster.url();
    // A loaded two-core machine runs the six nodes: a generous deadline.
    let server = common::Serve::start_with(&config, &["--redis", url.as_str(), "--store-timeout", "5s"]);
    let client = reqwest::Client::new();
    let send = |descriptors: Vec<(&str, String)>| {
        let descriptors: Vec<Value> = descriptors
            .into_iter()
            .map(|(key, value)| json!({"entries": [{"key": key, "value": value}]}))
            .collect();
        let body = json!({"domain": "spread", "descriptors": descriptors}).to_string();
        let request = client.post(format!("http://{}/json", server.http)).body(body).send();
        async move {
            let response = request.await.unwrap();
            let status = response.status().as_u16();
            let answer = response.text().await.unwrap();
            let answer: Value = serde_json::from_str(&answer).unwrap();
            let expected = if answer["overallCode"] == "OVER_LIMIT" {
                429
            } else {
                200
            };
            assert_eq!(status, expected, "{answer}");
            answer
        }
    };

    // 10 000 subjects of one domain, 100 descriptors per request.
    for batch in 0..100 {
        let descriptors = (0..100)
            .map(|index| ("remote_address", format!("10.0.{batch}.{index}")))
            .collect();
        let answer = send(descriptors).await;
        assert_eq!(answer["overallCode"], "OK", "{answer}");
    }
    let keys = cluster.keys_per_master();
    let total: u64 = keys.iter().sum();
    eprintln!("10 000 descriptors of one domain, keys per master: {keys:?}");
    assert_eq!(total, 10_000, "{keys:?}");
    assert!(keys.iter().all(|&held| held * 2 <= total), "keys per master: {keys:?}");

    // Across slots: the address (1 an hour, now spent) refuses; the user's
    // unit is given back, so the user still has 10 - 1 left afterwards.
    let user = || ("user", "alice".to_owned());
    let address = || ("remote_address", "10.0.0.0".to_owned());
    let alone = send(vec![user()]).await;
    assert_eq!(alone["statuses"][0]["limitRemaining"], 9, "{alone}");
    for _ in 0..20 {
        let refused = send(vec![address(), user()]).await;
        assert_eq!(refused["overallCode"], "OVER_LIMIT", "{refused}");
        assert_eq!(refused["statuses"][0]["code"], "OVER_LIMIT", "{refused}");
        assert_eq!(refused["statuses"][1]["code"], "OK", "{refused}");
        assert_eq!(refused["statuses"][1]["limitRemaining"], 9, "{refused}");
    }
    let after = send(vec![user()]).await;
    assert_eq!(
        after["statuses"][0]["limitRemaining"], 8,
        "20 refused requests took nothing: {after}"
    );
}

/// Polls `condition` every 20 ms until it holds (an event, such as a
/// connection, not a time); fails after 10 s.
async fn until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..500 {
        if condition().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("{what}: not within 10 s");
}

/// With a policy other than `error`, serve starts while Redis is
/// unreachable, answers by the policy within its deadline, tells its health
/// checks the truth (`--health-check-store`), and moves to Redis as soon as
/// one answers on that port.
#[tokio::test]
async fn serve_starts_before_redis_and_moves_to_it() {
    let (_dir, config) = five_a_minute();
    let mut redis = RedisServer::start();
    let url = redis.url();
    redis.stop();
    let server = common::Serve::start_with(
        &config,
        &[
            "--redis",
            url.as_str(),
            "--on-store-error",
            "open",
            "--health-check-store",
        ],
    );
    let client = reqwest::Client::new();
    let http = server.http.clone();
    let body = r#"{"domain":"example","descriptors":[{"entries":[{"key":"remote_address","value":"198.51.100.20"}]}]}"#;
    let ask = || {
        let request = client.post(format!("http://{http}/json")).body(body).send();
        async move { request.await.unwrap().status().as_u16() }
    };
    let get = |path: &'static str| {
        let request = client.get(format!("http://{http}{path}")).send();
        async move {
            let response = request.await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    // Admitted by the policy, however many: Redis is not there.
    for _ in 0..7 {
        assert_eq!(ask().await, 200);
    }
    until("unhealthy while Redis is away", || async {
        get("/healthcheck").await.0 == 500
    })
    .await;
    assert_eq!(get("/healthz").await.0, 503);
    let (_, metrics) = get("/metrics").await;
    assert!(
        metrics.contains("tollgate_decisions_by_path_total{path=\"policy\"} 7"),
        "{metrics}"
    );

    redis.restart();
    until("decided in Redis once it answers", || async {
        ask().await;
        get("/metrics")
            .await
            .1
            .lines()
            .any(|line| line.starts_with("tollgate_decisions_by_path_total{path=\"store\"}") && !line.ends_with(" 0"))
    })
    .await;
    until("healthy again", || async { get("/healthcheck").await.0 == 200 }).await;
    // The 5 a minute, now enforced in Redis.
    let keys = redis.cli(&["--scan"]);
    assert!(keys.contains("198.51.100.20"), "no key in Redis: {keys}");
    let statuses: Vec<u16> = {
        let mut statuses = Vec::new();
        for _ in 0..6 {
            statuses.push(ask().await);
        }
        statuses
    };
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
}

/// With the default policy (`error`) serve does not start without Redis, as
/// envoyproxy/ratelimit; the error is one line that says each cause once.
#[test]
fn serve_refuses_to_start_without_redis_under_the_error_policy() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    redis.stop();
    let output = tollgate(&[
        "serve",
        "--http",
        "127.0.0.1:0",
        "--grpc",
        "127.0.0.1:0",
        "--redis",
        &url,
        "--config",
    ])
    .arg(examples())
    .output()
    .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|line| line.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("cannot use the store"), "{stderr}");
    assert_eq!(errors[0].matches("Connection refused").count(), 1, "{stderr}");
}

/// A rule whose limit carries a lease, on Redis: requests are answered from
/// blocks (few library calls, the `leased` path counted), and on SIGTERM
/// what the process held goes back, so the store counts exactly what was
/// admitted.
#[tokio::test]
async fn a_leased_rule_takes_blocks_and_gives_back_what_is_left_on_sigterm() {
    let (_dir, config) = per_address(
        "hour",
        100_000,
        "{algorithm: fixed_window, limit: 100000, window: 1h, lease: 10s}",
    );
    let redis = RedisServer::start();
    let server = common::Serve::start_with(&config, &["--redis", redis.url().as_str()]);
    let body = r#"{"domain":"example","descriptors":[{"entries":[{"key":"remote_address","value":"198.51.100.7"}]}]}"#;
    let client = reqwest::Client::new();
    for index in 0..200 {
        let response = client
            .post(format!("http://{}/v1/check", server.http))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "request {index}");
    }
    let metrics = common::metrics_at(&server.http).await;
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("tollgate_decisions_by_path_total{path=\"leased\"}") && !line.ends_with(" 0")),
        "{metrics}"
    );
    // The engine deciding, one of two.
    let engines: Vec<&str> = metrics
        .lines()
        .filter(|line| line.starts_with("tollgate_store_engine{"))
        .collect();
    assert_eq!(engines.len(), 2, "{metrics}");
    assert_eq!(
        engines.iter().filter(|line| line.ends_with(" 1")).count(),
        1,
        "{engines:?}"
    );
    let stats = redis.cli(&["INFO", "commandstats"]);
    let calls: u64 = stats
        .lines()
        .filter(|line| line.starts_with("cmdstat_fcall:") || line.starts_with("cmdstat_tollgate.decide:"))
        .filter_map(|line| line.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
        .sum();
    assert!(calls < 20, "{calls} engine calls for 200 requests: {stats}");

    let (exited_cleanly, logs) = server.terminate();
    assert!(exited_cleanly, "{logs:?}");
    let keys = redis.cli(&["KEYS", "*"]);
    let value = redis.cli(&["GET", keys.trim()]);
    assert_eq!(
        value.trim().rsplit_once(':').map(|(_, count)| count),
        Some("200"),
        "{keys}: {value}"
    );
}
