//! `serve` across regions: a home redis-server, three regions each with its
//! own redis-server and two `serve` replicas (`--global-redis`,
//! `--region`), regions 2 and 3 reaching home through a link of 40 ms each
//! way. A global rule holds across all six replicas; a regional rule holds
//! per region.

mod common;

use std::time::Duration;

use common::Serve;
use futures_util::future::join_all;
use tollgate_testkit::redis_server::RedisServer;
use tollgate_testkit::slow_link::SlowLink;

const CONFIG: &str = "domain: api
descriptors:
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 100
      scope: global
  - key: ip
    rate_limit:
      unit: hour
      requests_per_unit: 20
";

/// A request of one descriptor to `serve`'s `/json`: whether it was admitted.
async fn admitted(client: &reqwest::Client, serve: &str, key: &str, value: &str) -> bool {
    let body = serde_json::json!({"domain": "api", "descriptors": [{"entries": [{"key": key, "value": value}]}]});
    let answer: serde_json::Value = client
        .post(format!("http://{serve}/json"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    answer["overallCode"] == "OK"
}

#[test]
fn six_replicas_in_three_regions_hold_one_global_limit() {
    let home = RedisServer::start();
    let regional: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let links: Vec<Option<SlowLink>> = (0..3)
        .map(|region| (region > 0).then(|| SlowLink::start(home.port(), Duration::from_millis(40))))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("limits.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "read-me\n").unwrap();
    let mut replicas = Vec::new();
    for (region, server) in regional.iter().enumerate() {
        let home_port = links[region].as_ref().map_or(home.port(), SlowLink::port);
        for _ in 0..2 {
            replicas.push(Serve::start_with(
                &config,
                &[
                    "--redis",
                    &server.url(),
                    "--global-redis",
                    &format!("redis://127.0.0.1:{home_port}"),
                    "--region",
                    &format!("r{}", region + 1),
                    "--store-timeout",
                    "1s",
                    "--read-token-file",
                    token.to_str().unwrap(),
                ],
            ));
        }
    }
    tollgate_testkit::runtime().block_on(async {
        let client = reqwest::Client::new();
        // Six times the global limit, every replica at once.
        let asks = (0..600).map(|turn| admitted(&client, &replicas[turn % 6].http, "tenant", "a"));
        let global = join_all(asks).await.into_iter().filter(|&ok| ok).count();
        assert!(
            global <= 100,
            "the six replicas admitted {global}, over the global limit of 100"
        );
        assert!(
            global >= 50,
            "the six replicas admitted only {global} of 100 under demand of six times it"
        );
        // A regional rule: each region admits its own 20.
        let asks = (0..240).map(|turn| admitted(&client, &replicas[turn % 6].http, "ip", "1"));
        let regional_admitted = join_all(asks).await.into_iter().filter(|&ok| ok).count();
        assert_eq!(regional_admitted, 60, "three regions, 20 each");
        // Home's count and the region's share, as /v1/usage shows them.
        let usage: serde_json::Value = client
            .post(format!("http://{}/v1/usage", replicas[2].http))
            .bearer_auth("read-me")
            .json(
                &serde_json::json!({"domain": "api", "descriptors": [{"entries": [{"key": "tenant", "value": "a"}]}]}),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let usage = &usage["usage"][0];
        assert_eq!(usage["global"]["region"], "r2", "{usage}");
        assert_eq!(usage["global"]["home_reachable"], true, "{usage}");
        let used = usage["used"].as_u64().unwrap();
        assert!(
            used >= u64::try_from(global).unwrap() && used <= 100,
            "home counted {used}, {global} admitted: {usage}"
        );
        let metrics = common::metrics_at(&replicas[4].http).await;
        assert!(
            metrics.contains("tollgate_region_home_reachable{region=\"r3\"} 1"),
            "{metrics}"
        );
        assert!(
            metrics.contains("tollgate_region_fills{region=\"r3\",rule="),
            "{metrics}"
        );
    });
    // The two replicas of a region share one share.
    for server in &regional {
        let keys = server.cli(&["KEYS", "*share*"]);
        assert_eq!(keys.lines().count(), 1, "one share per region: {keys}");
    }
    drop(replicas);
    drop(links);
}
