//! The heaviest descriptors (`/v1/top`): skewed traffic through two
//! replicas on one Redis, the merged answer against the truth.

mod common;
use tollgate_testkit::redis_server;

use std::collections::HashMap;
use std::sync::Arc;

use common::{config, on_port_0};
use redis_server::RedisServer;
use serde_json::Value;
use tollgate::{AnyStore, RedisStore};
use tollgate_server::http::AdminToken;
use tollgate_server::service::{CheckRequest, Descriptor};
use tollgate_server::{Options, Server, Service};

const CONFIG: &str = "
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000000}
    descriptors:
      - key: path
        value: /tiny
        rate_limit: {unit: day, requests_per_unit: 2}
";

const TENANTS: usize = 100_000;

/// Zipf (s = 1.1) over `TENANTS` tenants: the cumulative weights.
fn zipf() -> Vec<f64> {
    let mut total = 0.0;
    (1..=TENANTS)
        .map(|rank| {
            total += 1.0 / (rank as f64).powf(1.1);
            total
        })
        .collect()
}

fn draw(cumulative: &[f64], rng: &mut fastrand::Rng) -> usize {
    let at = rng.f64() * cumulative[cumulative.len() - 1];
    cumulative.partition_point(|&weight| weight < at)
}

fn request(tenants: &[usize]) -> CheckRequest {
    CheckRequest {
        domain: "api".to_owned(),
        descriptors: tenants
            .iter()
            .map(|tenant| Descriptor::entries(vec![("tenant".to_owned(), format!("t{tenant}"))]))
            .collect(),
        cost: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_true_heaviest_appear_in_the_merged_answer_within_its_bounds() {
    let redis = RedisServer::start();
    let options = Options {
        track_top: true,
        ..Options::default()
    };
    let replica = |options: Options| {
        let redis = redis.url();
        async move {
            let store = RedisStore::connect(&redis).await.unwrap();
            Arc::new(Service::new(config(CONFIG), AnyStore::Redis(store), options))
        }
    };
    let (a, b) = (replica(options.clone()).await, replica(options.clone()).await);
    let cumulative = zipf();
    let mut rng = fastrand::Rng::with_seed(7);
    let mut truth: HashMap<String, u64> = HashMap::new();
    for round in 0..300 {
        let tenants: Vec<usize> = (0..100).map(|_| draw(&cumulative, &mut rng)).collect();
        for tenant in &tenants {
            *truth.entry(format!("tenant=t{tenant}")).or_default() += 1;
        }
        let service = if round % 2 == 0 { &a } else { &b };
        service.should_rate_limit(&request(&tenants)).await.unwrap();
    }
    // Refusals: t1 at /tiny 5 times (3 refused), t2 4 times (2 refused).
    for (tenant, times) in [("t1", 5), ("t2", 4)] {
        for _ in 0..times {
            let tiny = CheckRequest {
                domain: "api".to_owned(),
                descriptors: vec![Descriptor::entries(vec![
                    ("tenant".to_owned(), tenant.to_owned()),
                    ("path".to_owned(), "/tiny".to_owned()),
                ])],
                cost: None,
            };
            b.should_rate_limit(&tiny).await.unwrap();
        }
    }
    b.publish_top_now().await.unwrap();

    let tops = a.top("api", None, 100).await.unwrap();
    let tenant = tops.iter().find(|top| top.rule == "tenant").expect("the tenant rule");
    let mut expected: Vec<(&String, &u64)> = truth.iter().collect();
    expected.sort_by(|x, y| y.1.cmp(x.1).then_with(|| x.0.cmp(y.0)));
    let listed: Vec<&str> = tenant.hits.iter().map(|heavy| heavy.key.as_str()).collect();
    for (key, _) in &expected[..10] {
        assert!(listed.contains(&key.as_str()), "{key} missing from {listed:?}");
    }
    for heavy in &tenant.hits {
        let real = truth[&heavy.key];
        assert!(heavy.min <= real && real <= heavy.max, "{heavy:?}, truly {real}");
    }
    // In order, within the bounds: one listed before another never truly
    // weighs less than the other's least.
    for pair in tenant.hits.windows(2) {
        assert!(pair[0].max >= pair[1].min, "{pair:?}");
    }
    for (key, real) in &truth {
        if !listed.contains(&key.as_str()) {
            assert!(
                *real <= tenant.hits_unlisted,
                "{key} {real} over {}",
                tenant.hits_unlisted
            );
        }
    }
    let tiny = tops
        .iter()
        .find(|top| top.rule == "tenant.path_/tiny")
        .expect("the /tiny rule");
    let refused: Vec<(&str, u64)> = tiny
        .refusals
        .iter()
        .map(|heavy| (heavy.key.as_str(), heavy.count))
        .collect();
    assert_eq!(refused, [("tenant=t1, path=/tiny", 3), ("tenant=t2, path=/tiny", 2)]);
    eprintln!(
        "top: 30 000 descriptors over two replicas; the first five listed {:?}; any other at most {}",
        &tenant.hits[..5],
        tenant.hits_unlisted
    );
}

#[tokio::test]
async fn top_is_behind_a_token_and_names_bad_input() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let options = Options {
        track_top: true,
        ..Options::default()
    };
    let server = Server::new(config(CONFIG), None, AnyStore::Redis(store), options)
        .read_token(AdminToken::new("reader").unwrap());
    let on = on_port_0(server).await;
    let client = reqwest::Client::new();
    let body = serde_json::json!({"domain": "api", "descriptors": [{"entries": [{"key": "tenant", "value": "<img src=x onerror=alert(1)>"}]}]});
    client
        .post(format!("{}/json", on.http))
        .json(&body)
        .send()
        .await
        .unwrap();
    let get = |query: &str, token: Option<&str>| {
        let mut request = client.get(format!("{}/v1/top{query}", on.http));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        async move {
            let response = request.send().await.unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    assert_eq!(get("?domain=api", None).await.0, 401);
    let (status, answer) = get("?domain=api&rule=tenant", Some("reader")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["rules"][0]["hits"][0]["key"],
        "tenant=<img src=x onerror=alert(1)>"
    );
    assert_eq!(answer["rules"][0]["hits"][0]["count"], 1);
    for (query, says) in [
        ("", "domain is required"),
        ("?domain=nope", "domain \"nope\" is not configured"),
        ("?domain=api&k=0", "k must be from 1 to 1000"),
        ("?domain=api&k=x", "k"),
    ] {
        let (status, answer) = get(query, Some("reader")).await;
        assert_eq!(status, 400, "{query}: {answer}");
        assert!(
            answer["error"].as_str().unwrap_or_default().contains(says),
            "{query}: {answer}"
        );
    }
    on.stop().await;
}
