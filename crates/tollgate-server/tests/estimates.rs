//! Estimates that nobody settles: their time to live is kept on tokio's
//! clock, paused and advanced here (no test waits for time).
#![recursion_limit = "256"]

mod common;

use std::time::Duration;

use tollgate::{AnyStore, ManualClock, MemoryStore, Timestamp};
use tollgate_server::service::{CheckRequest, Code, Descriptor, Failure};
use tollgate_server::{Options, Service};

use common::{config, NOON};

const BUDGET: &str = "
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 1000}
";

fn service() -> Service {
    let store = MemoryStore::with_clock(ManualClock::new(Timestamp::from_micros(NOON)));
    Service::new(config(BUDGET), AnyStore::Memory(store), Options::default())
}

fn request(cost: u64) -> CheckRequest {
    CheckRequest {
        domain: "llm".to_owned(),
        descriptors: vec![Descriptor::entries(vec![("tenant".to_owned(), "acme".to_owned())])],
        cost: Some(cost),
    }
}

async fn remaining(service: &Service) -> u64 {
    let peek = service.should_rate_limit(&request(0)).await.unwrap();
    peek.statuses[0].limit_remaining
}

/// Settled before its time to live ends, an estimate gives back what was
/// not used; once it has ended, its id is not found and the estimate stays
/// counted (settled at its estimate); settling again says so, and nothing
/// changes.
#[tokio::test(start_paused = true)]
async fn a_reservation_nobody_settles_is_settled_at_its_estimate_when_its_ttl_ends() {
    let service = service();
    let ttl = Duration::from_secs(60);
    let kept = service.estimate(&request(400), Some(ttl)).await.unwrap();
    let lapsing = service.estimate(&request(300), Some(ttl)).await.unwrap();
    assert_eq!(kept.response.overall, Code::Ok);
    assert_eq!(remaining(&service).await, 300);

    tokio::time::advance(Duration::from_millis(59_999)).await;
    let settled = service.settle(kept.id.as_deref().unwrap(), 100).await.unwrap();
    assert_eq!(settled.statuses[0].limit_remaining, 600, "300 came back in time");

    tokio::time::advance(Duration::from_millis(1)).await;
    let late = service.settle(lapsing.id.as_deref().unwrap(), 0).await;
    match late {
        Err(error) if error.kind() == Failure::NotFound => assert!(error.to_string().contains("expired"), "{error}"),
        other => panic!("expected not found, got {other:?}"),
    }
    assert_eq!(remaining(&service).await, 600, "the estimate of 300 stays counted");
    let kept_again = service.settle(kept.id.as_deref().unwrap(), 100).await;
    assert!(
        matches!(&kept_again, Err(error) if error.kind() == Failure::NotFound),
        "a settled estimate also lapses with its time to live: {kept_again:?}"
    );
}
