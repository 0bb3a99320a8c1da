//! `tollgate serve` as a process: config checks, a request, a graceful stop.

mod common;

use common::redis_server::RedisServer;
use common::tollgate;

fn examples() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/config")
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

#[tokio::test]
async fn serves_and_stops_gracefully_on_sigterm() {
    let server = common::Serve::start(&examples());
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

/// The example's limit of 5 requests, with Redis stopped, under each failure
/// policy: `open` admits all, `closed` denies all, `local` enforces the 5 in
/// the process, `error` answers 503; `/metrics` counts the path.
#[tokio::test]
async fn a_stopped_redis_is_answered_by_the_failure_policy() {
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
            (policy, common::Serve::start_with(&examples(), &args))
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
        let metrics = client
            .get(format!("http://{}/metrics", server.http))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
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
