//! Budgets that last: `serve` asks its Redis what it keeps across a
//! restart, names the rules a restart would reset when it keeps nothing,
//! and a budget kept on a Redis with an append-only file survives its
//! restart.

mod common;
use tollgate_testkit::redis_server;

use common::config;
use redis_server::RedisServer;
use tollgate::{AnyStore, MemoryStore, Persistence, RedisStore};
use tollgate_server::service::{CheckRequest, Descriptor};
use tollgate_server::{Options, Service};

const CONFIG: &str = "
domain: llm
descriptors:
  - key: tenant
    rate_limit:
      unit: month
      requests_per_unit: 1000000
    descriptors:
      - key: model
        rate_limit: {unit: minute, requests_per_unit: 100}
  - key: team
    rate_limit:
      algorithm: {algorithm: fixed_window, limit: 5000000, calendar: month}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 10}
";

async fn service_on(redis: &RedisServer) -> Service {
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    Service::new(config(CONFIG), AnyStore::Redis(store), Options::default())
}

fn tokens(tenant: &str, cost: u64) -> CheckRequest {
    CheckRequest {
        domain: "llm".to_owned(),
        descriptors: vec![Descriptor::entries(vec![("tenant".to_owned(), tenant.to_owned())])],
        cost: Some(cost),
    }
}

#[tokio::test]
async fn a_redis_that_keeps_nothing_is_named_with_the_rules_it_would_reset() {
    let redis = RedisServer::start();
    let service = service_on(&redis).await;
    assert_eq!(service.long_lived_rules(), ["llm.tenant", "llm.team"]);
    let lasting = service.check_persistence().await.expect("asked");
    assert_eq!(lasting.persistence, Persistence::Nothing);
    assert_eq!(lasting.lost_on_restart(), ["llm.tenant", "llm.team"]);
    let line = lasting.describe();
    assert!(
        line.contains("persists nothing") && line.contains("llm.tenant, llm.team"),
        "{line}"
    );
    let metrics = service.metrics().encode();
    assert!(
        metrics.contains("tollgate_store_persistence{persists=\"none\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("tollgate_rules_lost_on_restart 2"), "{metrics}");
    // The memory store outlives nothing either, but it is the process's own.
    let memory = Service::new(config(CONFIG), AnyStore::Memory(MemoryStore::new()), Options::default());
    assert!(memory.check_persistence().await.is_none());
}

#[tokio::test]
async fn a_redis_refusing_config_is_said_to_be_unknown() {
    let redis = RedisServer::start();
    redis.cli(&["ACL", "SETUSER", "default", "-config"]);
    let service = service_on(&redis).await;
    let lasting = service.check_persistence().await.expect("asked");
    assert!(matches!(lasting.persistence, Persistence::Unknown(_)), "{lasting:?}");
    assert!(lasting.lost_on_restart().is_empty());
}

#[tokio::test]
async fn a_monthly_budget_on_a_redis_with_an_append_only_file_survives_its_restart() {
    let args = ["--appendonly", "yes", "--appendfsync", "always"].map(str::to_owned);
    let mut redis = RedisServer::start_with(&args);
    let service = service_on(&redis).await;
    let lasting = service.check_persistence().await.expect("asked");
    assert_eq!(
        lasting.persistence,
        Persistence::Persists {
            aof: true,
            snapshots: false
        }
    );
    assert!(lasting.lost_on_restart().is_empty());
    let used = Box::pin(service.should_rate_limit(&tokens("acme", 250_000)))
        .await
        .unwrap();
    assert_eq!(used.statuses[0].limit_remaining, 750_000);
    redis.stop();
    redis.restart();
    // The store reconnects by itself; the month's usage is still there.
    let mut after = None;
    for _ in 0..100 {
        match Box::pin(service.should_rate_limit(&tokens("acme", 0))).await {
            Ok(response) => {
                after = Some(response);
                break;
            }
            // Polled, with a deadline of 2 s: the reconnection is an event,
            // not a time to wait out.
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
    let after = after.expect("the store answers after Redis restarted");
    assert_eq!(after.statuses[0].limit_remaining, 750_000);
}

/// A rule whose limit asks for durable records, on a Redis with no replica:
/// the request is counted, and answered as a store fault (the failure
/// policy's to decide; here UNAVAILABLE).
#[tokio::test]
async fn a_durable_rule_without_a_replica_is_a_store_fault() {
    let redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .timeout(std::time::Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let config = config(
        "
domain: llm
descriptors:
  - key: tenant
    rate_limit:
      algorithm: {algorithm: fixed_window, limit: 1000000, calendar: month, overage: record, durable: replicated}
",
    );
    let service = Service::new(config, AnyStore::Redis(store), Options::default());
    let error = Box::pin(service.should_rate_limit(&tokens("acme", 500)))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), tollgate_server::service::Failure::Unavailable, "{error}");
    assert!(error.to_string().contains("not replicated"), "{error}");
    // Counted all the same; a peek never waits.
    let peek = Box::pin(service.should_rate_limit(&tokens("acme", 0))).await.unwrap();
    assert_eq!(peek.statuses[0].limit_remaining, 1_000_000 - 500);
}
