//! Policy overrides: a limiter decides a subject that has one by the
//! override's policy, in the same keys; on Redis every process following
//! the table applies a change.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::redis_server::RedisServer;
use tollgate::{Limit, Limiter, ManualClock, MemoryStore, Policy, PolicyOverrides, RedisStore, Subject, Timestamp};

const NOON: u64 = 1_699_963_200_000_000;

fn per_hour(limit: u64) -> Policy {
    Policy::single(Limit::fixed_window(limit, Duration::from_secs(3600)).unwrap())
}

#[test]
fn a_policy_written_as_json_reads_back_as_it() {
    let single = per_hour(100);
    assert_eq!(Policy::from_value(single.to_value()).unwrap(), single);
    let named = Policy::from_json(
        r#"{"per_second": {"algorithm": "gcra", "rate": 10, "period": "1s", "burst": 20},
            "per_day": {"algorithm": "sliding_log", "limit": 1000, "window": "1d"}}"#,
    )
    .unwrap();
    assert_eq!(Policy::from_value(named.to_value()).unwrap(), named);
}

#[tokio::test]
async fn an_override_decides_its_subject_only_and_keeps_what_was_used() {
    let clock = ManualClock::new(Timestamp::from_micros(NOON));
    let overrides = Arc::new(PolicyOverrides::in_process());
    let limiter = Limiter::new(MemoryStore::with_clock(clock), per_hour(100)).with_overrides(Arc::clone(&overrides));
    let (acme, bob) = (Subject::new("acme"), Subject::new("bob"));
    assert_eq!(limiter.check_n(&acme, 80).await.unwrap().remaining, 20);
    assert!(overrides.set(&acme, per_hour(200)).await.unwrap().is_none());
    let peek = limiter.peek(&acme).await.unwrap();
    assert_eq!((peek.limit, peek.remaining), (200, 120));
    assert_eq!(limiter.check_now(&acme).unwrap().remaining, 119);
    assert_eq!(limiter.peek(&bob).await.unwrap().limit, 100);
    assert!(overrides.remove(&acme).await.unwrap().is_some());
    let peek = limiter.peek(&acme).await.unwrap();
    assert_eq!((peek.limit, peek.remaining), (100, 19));
    assert!(overrides.remove(&acme).await.unwrap().is_none());
}

#[tokio::test]
async fn processes_on_one_redis_share_overrides() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(Timestamp::from_micros(NOON));
    let connect = || async {
        RedisStore::builder(redis.url())
            .clock(clock.clone())
            .connect()
            .await
            .unwrap()
    };
    let (one, two) = (connect().await, connect().await);
    let one_overrides = Arc::new(PolicyOverrides::shared(one.table("plans")));
    let two_overrides = Arc::new(PolicyOverrides::shared(two.table("plans")));
    let first = Limiter::new(one, per_hour(100)).with_overrides(Arc::clone(&one_overrides));
    let second = Limiter::new(two, per_hour(100)).with_overrides(Arc::clone(&two_overrides));
    let acme = Subject::new("acme");
    first.check_n(&acme, 80).await.unwrap();
    one_overrides.set(&acme, per_hour(200)).await.unwrap();
    assert_eq!(first.peek(&acme).await.unwrap().remaining, 120);
    assert_eq!(second.peek(&acme).await.unwrap().limit, 100, "before its refresh");
    two_overrides.refresh().await.unwrap();
    assert_eq!(second.peek(&acme).await.unwrap().remaining, 120);
    // A process that starts reads them whole.
    let late = Arc::new(PolicyOverrides::shared(connect().await.table("plans")));
    late.refresh().await.unwrap();
    assert_eq!(late.get(&acme).as_deref(), Some(&per_hour(200)));
    two_overrides.remove(&acme).await.unwrap();
    one_overrides.refresh().await.unwrap();
    late.refresh().await.unwrap();
    assert!(one_overrides.get(&acme).is_none() && late.get(&acme).is_none());
    assert_eq!(first.peek(&acme).await.unwrap().limit, 100);
}
