//! `tollgate serve` started as envoyproxy/ratelimit's container starts: no
//! flags, its environment variables and its runtime directory layout
//! (`RUNTIME_ROOT` a link to a versioned directory,
//! `RUNTIME_SUBDIRECTORY/config/` holding the files, at any depth).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use common::{tollgate, Serve};
use serde_json::{json, Value};

/// A runtime version: `ratelimit/config/` with one file at the top, one in
/// a subdirectory, and a dot file.
fn version(root: &Path, name: &str, per_day: u32) {
    let config = root.join(name).join("ratelimit").join("config");
    std::fs::create_dir_all(config.join("team")).unwrap();
    std::fs::write(
        config.join("messaging.yaml"),
        format!(
            "domain: messaging\ndescriptors:\n  - key: to_number\n    rate_limit:\n      unit: day\n      requests_per_unit: {per_day}\n"
        ),
    )
    .unwrap();
    std::fs::write(
        config.join("team").join("edge.yml"),
        "domain: edge\ndescriptors:\n  - key: remote_address\n    value: 50.0.0.5\n    rate_limit:\n      unit: second\n      requests_per_unit: 0\n",
    )
    .unwrap();
    // Not YAML: envoyproxy/ratelimit skips it with RUNTIME_IGNOREDOTFILES.
    std::fs::write(config.join(".editor-swap"), "not: [valid").unwrap();
}

/// Points the `current` link at `target`, atomically (as a deploy swaps it).
fn swap_link(root: &Path, target: &str) {
    let next = root.join("current.next");
    let _ = std::fs::remove_file(&next);
    std::os::unix::fs::symlink(root.join(target), &next).unwrap();
    std::fs::rename(&next, root.join("current")).unwrap();
}

async fn json(http: &str, number: &str) -> Value {
    let body = json!({"domain": "messaging", "descriptors": [{"entries": [{"key": "to_number", "value": number}]}]});
    reqwest::Client::new()
        .post(format!("http://{http}/json"))
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn starts_with_envoyproxy_ratelimits_environment_and_no_flags() {
    let redis = RedisServer::start();
    let redis_address = redis.url().trim_start_matches("redis://").to_owned();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("runtime_data");
    std::fs::create_dir_all(&root).unwrap();
    version(&root, "v1", 3);
    swap_link(&root, "v1");

    let mut command = tollgate(&["serve"]);
    command.env_remove("RUST_LOG");
    for (name, value) in [
        ("RUNTIME_ROOT", root.join("current").to_str().unwrap()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "true"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
        ("USE_STATSD", "false"),
        ("LOG_LEVEL", "info"),
        ("BACKEND_TYPE", "redis"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", &redis_address),
        ("CACHE_KEY_PREFIX", "swapped"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_REMAINING_HEADER", "X-RateLimit-Left"),
        ("LOCAL_CACHE_SIZE_IN_BYTES", "0"),
    ] {
        command.env(name, value);
    }
    let server = Serve::start_command(command);
    assert!(
        server.ready.contains("store=\"redis\"") || server.ready.contains("store=redis"),
        "{}",
        server.ready
    );
    assert!(server.ready.contains("domains=2"), "{}", server.ready);
    let http = server.http.clone();

    // The limits of the files under RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config.
    let answer = json(&http, "555").await;
    assert_eq!(answer["overallCode"], "OK", "{answer}");
    assert_eq!(answer["statuses"][0]["limitRemaining"], 2, "{answer}");
    assert_eq!(answer["statuses"][0]["currentLimit"]["requestsPerUnit"], 3, "{answer}");
    let headers = &answer["responseHeadersToAdd"];
    assert_eq!(headers[1], json!({"key": "X-RateLimit-Left", "value": "2"}), "{answer}");
    assert_eq!(headers[0]["key"], "RateLimit-Limit", "{answer}");

    // envoyproxy/ratelimit's health check and metrics listener.
    let health = reqwest::get(format!("http://{http}/healthcheck")).await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().await.unwrap(), "OK");
    let metrics = common::metrics_at(&server.metrics).await;
    assert!(
        metrics.contains(r#"ratelimit_service_rate_limit_total_hits{domain="messaging",key1="to_number",key2=""} 1"#),
        "{metrics}"
    );

    // The counters live in Redis, under CACHE_KEY_PREFIX.
    let keys = std::process::Command::new("redis-cli")
        .args([
            "-p",
            redis_address.rsplit(':').next().unwrap(),
            "--scan",
            "--pattern",
            "swapped*",
        ])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&keys.stdout).trim().is_empty(),
        "no key under the prefix"
    );

    // A deploy swaps the RUNTIME_ROOT link: the new limits apply.
    version(&root, "v2", 7);
    swap_link(&root, "v2");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = json(&http, "777").await;
        if answer["statuses"][0]["currentLimit"]["requestsPerUnit"] == 7 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the swapped configuration was not loaded: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let (exited_cleanly, logs) = server.terminate();
    assert!(exited_cleanly, "{logs:?}");
    assert!(
        logs.iter()
            .any(|line| line.contains("LOCAL_CACHE_SIZE_IN_BYTES") && line.contains("USE_STATSD")),
        "settings without effect are logged: {logs:?}"
    );
}
