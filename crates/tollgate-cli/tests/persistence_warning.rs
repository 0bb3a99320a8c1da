//! `tollgate serve` on a Redis that persists nothing warns, naming the
//! rules whose state lasts a day or longer; `/rlconfig` says it too.

mod common;

use std::time::{Duration, Instant};

use common::redis_server::RedisServer;

const CONFIG: &str = "
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: month, requests_per_unit: 1000000}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 10}
";

#[tokio::test]
async fn serve_warns_about_budgets_on_a_redis_that_persists_nothing() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("llm.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let serve = common::Serve::start_with(&config, &["--redis", &redis.url()]);
    // The check runs as the server starts: polled, with a deadline.
    let started = Instant::now();
    let rlconfig = loop {
        let text = common::rlconfig_at(&serve.http).await;
        if text.contains("# store:") {
            break text;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "no store line: {text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(rlconfig.contains("persists nothing"), "{rlconfig}");
    assert!(rlconfig.contains("lose it then: llm.tenant\n"), "{rlconfig}");
    let (clean, logs) = serve.terminate();
    assert!(clean);
    let warning = logs
        .iter()
        .find(|line| line.contains("persists nothing"))
        .unwrap_or_else(|| panic!("no warning in {logs:#?}"));
    assert!(warning.contains("WARN") && warning.contains("llm.tenant"), "{warning}");
    assert!(!warning.contains("llm.ip"), "{warning}");
}
