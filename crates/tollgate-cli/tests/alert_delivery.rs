//! Alerts survive the replica delivering them: two `tollgate serve`
//! processes on one Redis; the one the webhook is answering is killed (by
//! its pid) in the middle of a delivery; the other takes its alerts over,
//! and every crossing is delivered, none with another id.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use common::redis_server::RedisServer;
use common::Serve;
use serde_json::{json, Value};

const CONFIG: &str = "
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 100, alerts: [50, 80, 100]}
";

/// What the webhook was sent: each POST's key and body, and whether it was
/// taken; it holds its first POST unanswered (a delivery in progress).
#[derive(Default)]
struct Webhook {
    posts: Mutex<Vec<(String, Value, bool)>>,
}

async fn receive(State(webhook): State<Arc<Webhook>>, headers: HeaderMap, Json(body): Json<Value>) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let first = {
        let mut posts = webhook.posts.lock().unwrap();
        let first = posts.is_empty();
        posts.push((key, body, !first));
        first
    };
    if first {
        // Never answered: its sender is killed meanwhile.
        std::future::pending::<()>().await;
    }
    StatusCode::OK
}

#[test]
fn a_replica_killed_mid_delivery_loses_no_alert() {
    let server = RedisServer::start_with_module(&[]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("alerts.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let webhook = Arc::new(Webhook::default());
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let url = format!("http://{}/alerts", listener.local_addr().unwrap());
    let router = Router::new()
        .route("/alerts", post(receive))
        .with_state(Arc::clone(&webhook));
    runtime.spawn(async move { axum::serve(listener, router).await });
    let redis = server.url();
    let args = [
        "--redis",
        redis.as_str(),
        "--alert-webhook",
        url.as_str(),
        "--alert-take-over",
        "1s",
    ];
    let first = Serve::start_with(&config, &args);
    // 120 hits of a limit of 100: 50, 80 and 100 % crossed, through the first.
    runtime.block_on(async {
        let client = reqwest::Client::new();
        for _ in 0..120 {
            let body = json!({"domain": "llm", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}]});
            let answer = client
                .post(format!("http://{}/json", first.http))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert!(answer.status().is_success() || answer.status() == 429);
        }
    });
    let posts = |webhook: &Webhook| webhook.posts.lock().unwrap().len();
    let wait_until = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "{what}: {:?}", webhook.posts.lock().unwrap());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // The first replica is delivering (its POST held): kill it.
    wait_until("the first delivery", &|| posts(&webhook) >= 1);
    let second = Serve::start_with(&config, &args);
    drop(first);
    let taken = || -> BTreeMap<String, Value> {
        webhook
            .posts
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, _, taken)| *taken)
            .map(|(key, body, _)| (key.clone(), body.clone()))
            .collect()
    };
    wait_until("every alert delivered", &|| taken().len() == 3);
    let taken = taken();
    let mut thresholds: Vec<u64> = taken
        .values()
        .map(|alert| alert["threshold"].as_u64().unwrap())
        .collect();
    thresholds.sort_unstable();
    assert_eq!(thresholds, [50, 80, 100]);
    for (key, alert) in &taken {
        assert_eq!(alert["id"], json!(key));
    }
    // The held one came again, with its id.
    let posts = webhook.posts.lock().unwrap();
    assert!(taken.contains_key(&posts[0].0), "{posts:?}");
    assert!(posts.iter().all(|(key, _, _)| taken.contains_key(key)), "{posts:?}");
    drop(posts);
    drop(second);
}
