//! The Redis store against real `redis-server` processes: conformance, the
//! differential test against the memory store, keys and expiry, faults.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::{
    Limit, LimitSpec, MemoryStore, Op, Policy, RedisStore, Refill, Request, ReservationSpec, Store, Subject, Timestamp,
    TokenBucketSpec,
};

use common::redis_server::RedisServer;

static PREFIXES: AtomicUsize = AtomicUsize::new(0);

/// A store on `server` with a prefix no other store of this process uses.
async fn store(server: &RedisServer) -> RedisStore {
    let prefix = format!("t{}", PREFIXES.fetch_add(1, Ordering::Relaxed));
    RedisStore::builder(server.url())
        .prefix(prefix)
        .connect()
        .await
        .expect("connect")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[tokio::test]
async fn redis_store_conforms() {
    let server = RedisServer::start();
    common::conformance::run_all(|| store(&server)).await;
}

#[tokio::test]
async fn decides_on_server_time_by_default() {
    let server = RedisServer::start();
    let limiter = tollgate::Limiter::new(
        store(&server).await,
        Limit::fixed_window(2, Duration::from_secs(3600)).unwrap(),
    );
    let subject = Subject::new("clock");
    assert!(limiter.check(&subject).await.unwrap().allowed);
    let second = limiter.check(&subject).await.unwrap();
    assert!(second.allowed);
    let third = limiter.check(&subject).await.unwrap();
    assert!(!third.allowed);
    // The window is aligned to the hour of the server's clock.
    let retry = third.retry_after.unwrap();
    assert!(
        retry > Duration::ZERO && retry <= Duration::from_secs(3600),
        "{retry:?}"
    );
}

// --- The differential test: memory and Redis decide identically. ---------

#[derive(Debug, Clone)]
enum StepOp {
    Check,
    AtMost,
    Reserve(Option<u64>),
    Acquire(u8),
    Release(u8),
    Reset,
}

#[derive(Debug, Clone)]
struct Step {
    dt: u64,
    key: u8,
    cost: u64,
    op: StepOp,
}

fn micros(value: u64) -> Duration {
    Duration::from_micros(value)
}

fn any_limit() -> impl Strategy<Value = Limit> {
    let count = 1u64..12;
    let period = 1u64..3_000_000;
    prop_oneof![
        (count.clone(), period.clone()).prop_map(|(limit, window)| Limit::fixed_window(limit, micros(window)).unwrap()),
        (count.clone(), 1u64..8, 1u64..300_000).prop_map(|(limit, buckets, sub)| Limit::sliding_window(
            limit,
            micros(buckets * sub),
            buckets
        )
        .unwrap()),
        (count.clone(), period.clone()).prop_map(|(limit, window)| Limit::sliding_log(limit, micros(window)).unwrap()),
        (count.clone(), 1u64..10, period.clone(), any::<bool>(), 0u64..=100).prop_map(
            |(capacity, refill, interval, interval_mode, initial)| {
                LimitSpec::TokenBucket(TokenBucketSpec {
                    capacity,
                    refill,
                    interval: micros(interval),
                    mode: if interval_mode {
                        Refill::Interval
                    } else {
                        Refill::Smooth
                    },
                    initial: Some(capacity * initial / 100),
                })
                .build()
                .unwrap()
            }
        ),
        (1u64..50, period.clone(), 0u64..10, 0u64..=100).prop_map(|(rate, period, max_burst, initial)| {
            LimitSpec::Reservation(ReservationSpec {
                rate,
                period: micros(period),
                max_burst,
                initial: Some(max_burst * initial / 100),
            })
            .build()
            .unwrap()
        }),
        (1u64..50, period.clone(), count.clone()).prop_map(|(rate, period, capacity)| Limit::leaky_bucket(
            rate,
            micros(period),
            capacity
        )
        .unwrap()),
        (1u64..50, period.clone(), count.clone()).prop_map(|(rate, period, burst)| Limit::gcra(
            rate,
            micros(period),
            burst
        )
        .unwrap()),
        (count, period).prop_map(|(limit, ttl)| Limit::concurrency(limit, micros(ttl)).unwrap()),
    ]
}

fn any_policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        2 => any_limit().prop_map(Policy::single),
        1 => (any_limit(), any_limit()).prop_map(|(a, b)| Policy::new([("first", a), ("second", b)]).unwrap()),
    ]
}

fn any_steps() -> impl Strategy<Value = Vec<Step>> {
    let op = prop_oneof![
        6 => Just(StepOp::Check),
        1 => Just(StepOp::AtMost),
        2 => proptest::option::of(0u64..2_000_000).prop_map(StepOp::Reserve),
        3 => (0u8..6).prop_map(StepOp::Acquire),
        2 => (0u8..6).prop_map(StepOp::Release),
        1 => Just(StepOp::Reset),
    ];
    let dt = prop_oneof![3 => Just(0u64), 3 => 0u64..100_000, 2 => 0u64..3_000_000];
    let cost = prop_oneof![5 => Just(1u64), 2 => 0u64..15];
    prop::collection::vec(
        (dt, 0u8..2, cost, op).prop_map(|(dt, key, cost, op)| Step { dt, key, cost, op }),
        1..40,
    )
}

async fn replay<S: Store>(store: &S, policy: &Policy, steps: &[Step], subjects: &[Subject; 2]) -> Vec<String> {
    let mut now = common::conformance::T0;
    let mut answers = Vec::new();
    for step in steps {
        now += step.dt;
        let subject = &subjects[usize::from(step.key)];
        let op = match step.op {
            StepOp::Check => Op::Check,
            StepOp::AtMost => Op::CheckAtMost,
            StepOp::Reserve(max_wait) => Op::Reserve {
                max_wait: max_wait.map(micros),
            },
            StepOp::Acquire(lease) => Op::Acquire {
                lease: format!("lease-{lease}"),
                max_wait: None,
            },
            StepOp::Release(lease) => Op::Release {
                lease: format!("lease-{lease}"),
            },
            StepOp::Reset => {
                answers.push(format!(
                    "{:?}",
                    store.reset(subject, policy).await.map_err(|e| e.to_string())
                ));
                continue;
            }
        };
        let request = Request::new(op, step.cost).at(Timestamp::from_micros(now));
        let outcome = store
            .decide(subject, policy, &request)
            .await
            .map_err(|error| error.to_string());
        answers.push(format!("{outcome:?}"));
    }
    answers
}

#[test]
fn redis_decides_exactly_as_memory() {
    let server = RedisServer::start();
    let runtime = runtime();
    let redis = runtime.block_on(store(&server));
    let cases = AtomicUsize::new(0);
    let config = ProptestConfig {
        cases: 300,
        ..ProptestConfig::default()
    };
    proptest!(config, |(policy in any_policy(), steps in any_steps())| {
        // A fresh pair of subjects per case: no state carries over.
        let case = cases.fetch_add(1, Ordering::Relaxed);
        let subjects = [Subject::new(case).and("a"), Subject::new(case).and("b:{x}")];
        let memory = MemoryStore::new();
        let expected = runtime.block_on(replay(&memory, &policy, &steps, &subjects));
        let actual = runtime.block_on(replay(&redis, &policy, &steps, &subjects));
        for (index, (expected, actual)) in expected.iter().zip(&actual).enumerate() {
            prop_assert_eq!(expected, actual, "step {} of {:?}\npolicy {:?}", index, steps, policy);
        }
    });
}
