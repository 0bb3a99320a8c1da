//! The resilient store in front of real `redis-server` processes that stop,
//! pause and come back: deadlines, the circuit breaker, every failure policy,
//! and the deny cache.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::{
    ErrorKind, Limit, MemoryStore, OnStoreError, Op, Outcome, Path, Policy, RedisStore, Request, ResilientStore,
    Result, Spread, Store, Subject,
};

use common::redis_server::RedisServer;

/// A store that counts the calls that reach it.
#[derive(Clone)]
struct Counting<S> {
    store: S,
    calls: Arc<AtomicUsize>,
}

impl<S: Store> Counting<S> {
    fn new(store: S) -> Self {
        Self {
            store,
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::Relaxed)
    }
}

impl<S: Store> Store for Counting<S> {
    async fn decide(&self, subject: &Subject, policy: &Policy, request: &Request) -> Result<Outcome> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.store.decide(subject, policy, request).await
    }

    async fn reset(&self, subject: &Subject, policy: &Policy) -> Result<()> {
        self.store.reset(subject, policy).await
    }
}

async fn redis(server: &RedisServer) -> RedisStore {
    RedisStore::builder(server.url())
        .max_batch(1)
        .connect()
        .await
        .expect("connect")
}

/// Three per hour: a run of this test cannot see it refill.
fn three_per_hour() -> Policy {
    Policy::single(Limit::gcra(3, Duration::from_secs(3_600), 3).unwrap())
}

fn check() -> Request {
    Request::new(Op::Check, 1)
}

#[tokio::test]
async fn resilient_store_conforms() {
    common::conformance::run_all(|| async {
        ResilientStore::builder(MemoryStore::new())
            .on_error(OnStoreError::Local)
            .deny_cache(100)
            .build()
    })
    .await;
}

#[tokio::test]
async fn a_working_store_decides_and_says_so() {
    let server = RedisServer::start();
    let store = ResilientStore::builder(redis(&server).await)
        .on_error(OnStoreError::Open)
        .build();
    let subject = Subject::new("working");
    let policy = three_per_hour();
    for remaining in (0..3).rev() {
        let outcome = store.decide(&subject, &policy, &check()).await.unwrap();
        assert!(outcome.decision.allowed);
        assert_eq!(outcome.decision.remaining, remaining);
        assert_eq!(outcome.path, Path::Store);
    }
    let denied = store.decide(&subject, &policy, &check()).await.unwrap();
    assert!(
        !denied.decision.allowed,
        "the store enforces the limit: open is only for faults"
    );
    assert_eq!(store.stats().store, 4);
    assert_eq!(store.stats().faults, 0);
}

#[tokio::test]
async fn each_policy_answers_for_a_stopped_redis() {
    let mut server = RedisServer::start();
    let redis = redis(&server).await;
    server.stop();
    let subject = Subject::new("stopped");
    let policy = three_per_hour();

    let error = ResilientStore::builder(redis.clone()).build();
    let fault = error.decide(&subject, &policy, &check()).await.unwrap_err();
    assert!(fault.is_transient(), "a store fault, not {fault:?}");

    let open = ResilientStore::builder(redis.clone())
        .on_error(OnStoreError::Open)
        .build();
    for _ in 0..10 {
        let outcome = open.decide(&subject, &policy, &check()).await.unwrap();
        assert!(outcome.decision.allowed);
        assert_eq!(outcome.granted, 1);
        assert_eq!(outcome.path, Path::Policy);
    }

    let closed = ResilientStore::builder(redis.clone())
        .on_error(OnStoreError::Closed)
        .build();
    let outcome = closed.decide(&subject, &policy, &check()).await.unwrap();
    assert!(!outcome.decision.allowed);
    assert_eq!(outcome.granted, 0);
    assert!(outcome.decision.retry_after.is_some_and(|retry| !retry.is_zero()));
    assert_eq!(outcome.path, Path::Policy);

    let local = ResilientStore::builder(redis).on_error(OnStoreError::Local).build();
    for remaining in (0..3).rev() {
        let outcome = local.decide(&subject, &policy, &check()).await.unwrap();
        assert!(outcome.decision.allowed);
        assert_eq!(outcome.decision.remaining, remaining);
        assert_eq!(outcome.path, Path::Local);
    }
    let outcome = local.decide(&subject, &policy, &check()).await.unwrap();
    assert!(!outcome.decision.allowed, "the local store enforces the limit");
    assert_eq!(outcome.path, Path::Local);
    assert_eq!(local.stats().local, 4);
    assert_eq!(local.stats().faults, 4);
}

#[tokio::test]
async fn invalid_arguments_stay_errors_whatever_the_policy() {
    let mut server = RedisServer::start();
    let redis = redis(&server).await;
    server.stop();
    let store = ResilientStore::builder(redis).on_error(OnStoreError::Open).build();
    // One cost per limit, for a policy of one limit: refused before the store.
    let request = Request::new(Op::Check, 1).with_costs(vec![1, 2]);
    let error = store
        .decide(&Subject::new("invalid"), &three_per_hour(), &request)
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    assert_eq!(store.stats().faults, 0);
}

#[tokio::test]
async fn the_breaker_skips_a_dead_store_until_its_back_off_ends() {
    let mut server = RedisServer::start();
    let counting = Counting::new(redis(&server).await);
    server.stop();
    let store = ResilientStore::builder(counting.clone())
        .on_error(OnStoreError::Local)
        .failures(3)
        .backoff(Duration::from_secs(3_600), Duration::from_secs(3_600))
        .build();
    let subject = Subject::new("breaker");
    let policy = Policy::single(Limit::gcra(1_000, Duration::from_secs(3_600), 1_000).unwrap());
    for _ in 0..100 {
        let outcome = store.decide(&subject, &policy, &check()).await.unwrap();
        assert_eq!(outcome.path, Path::Local);
    }
    assert_eq!(counting.calls(), 3, "after 3 faults the store is no longer called");
    let stats = store.stats();
    assert!(stats.breaker_open);
    assert_eq!(stats.breaker_opened, 1);
    assert_eq!(stats.faults, 100);
}

#[tokio::test]
async fn the_breaker_probes_and_hands_back_when_redis_returns() {
    let mut server = RedisServer::start();
    let counting = Counting::new(redis(&server).await);
    // A back-off of a microsecond: every decision after the first fault probes.
    let store = ResilientStore::builder(counting.clone())
        .on_error(OnStoreError::Local)
        .failures(1)
        .backoff(Duration::from_micros(1), Duration::from_micros(1))
        .build();
    let subject = Subject::new("returns");
    let policy = three_per_hour();
    server.stop();
    let outcome = store.decide(&subject, &policy, &check()).await.unwrap();
    assert_eq!(outcome.path, Path::Local);
    assert!(store.stats().breaker_open);
    server.restart();
    // The connection is re-established on the first calls after the restart.
    let mut back = None;
    for attempt in 0..50 {
        let outcome = store.decide(&subject, &policy, &check()).await.unwrap();
        if outcome.path == Path::Store {
            back = Some(attempt);
            break;
        }
    }
    assert!(back.is_some(), "Redis decides again once it answers");
    assert!(!store.stats().breaker_open);
    assert!(counting.calls() >= 2);
}

#[tokio::test]
async fn a_paused_redis_misses_the_deadline() {
    let server = RedisServer::start();
    let store = ResilientStore::builder(redis(&server).await)
        .timeout(Duration::from_millis(50))
        .build();
    let subject = Subject::new("paused");
    let policy = three_per_hour();
    store.decide(&subject, &policy, &check()).await.unwrap();
    server.cli(&["CLIENT", "PAUSE", "5000", "ALL"]);
    let error = store.decide(&subject, &policy, &check()).await.unwrap_err();
    server.cli(&["CLIENT", "UNPAUSE"]);
    assert_eq!(error.kind(), ErrorKind::Timeout);
}

#[tokio::test]
async fn a_flooded_denial_is_answered_without_redis() {
    let server = RedisServer::start();
    let counting = Counting::new(redis(&server).await);
    let store = ResilientStore::builder(counting.clone()).deny_cache(1_000).build();
    let subject = Subject::new("flooded");
    let policy = Policy::single(Limit::fixed_window(1, Duration::from_secs(86_400)).unwrap());
    assert!(
        store
            .decide(&subject, &policy, &check())
            .await
            .unwrap()
            .decision
            .allowed
    );
    let first = store.decide(&subject, &policy, &check()).await.unwrap();
    assert!(!first.decision.allowed);
    assert_eq!(first.path, Path::Store);
    let retry_after = first.decision.retry_after.unwrap();
    for _ in 0..1_000 {
        let outcome = store.decide(&subject, &policy, &check()).await.unwrap();
        assert!(!outcome.decision.allowed);
        assert_eq!(outcome.path, Path::DenyCache);
        assert_eq!(outcome.decision.limit, first.decision.limit);
        assert_eq!(outcome.decision.remaining, first.decision.remaining);
        assert!(outcome.decision.retry_after.unwrap() <= retry_after);
    }
    assert_eq!(counting.calls(), 2, "the flood never reached Redis");
    assert_eq!(store.stats().deny_cache, 1_000);

    // Another request, another subject: the store decides.
    let peek = Request::new(Op::Check, 0);
    assert_eq!(store.decide(&subject, &policy, &peek).await.unwrap().path, Path::Store);
    let other = Subject::new("other");
    assert_eq!(store.decide(&other, &policy, &check()).await.unwrap().path, Path::Store);
    // A reset forgets the denial.
    store.reset(&subject, &policy).await.unwrap();
    let outcome = store.decide(&subject, &policy, &check()).await.unwrap();
    assert!(outcome.decision.allowed);
    assert_eq!(outcome.path, Path::Store);
}

/// A gateway's spread decision whose limits are all of one subject (one
/// descriptor) is that subject's decision: the deny cache answers it too.
/// Over several subjects the store decides, and an invalid request is an
/// error whatever the policy, even while the store is unreachable.
#[tokio::test]
async fn a_spread_decision_of_one_subject_meets_the_deny_cache() {
    let server = RedisServer::start();
    let counting = Counting::new(redis(&server).await);
    let store = ResilientStore::builder(counting.clone())
        .deny_cache(1_000)
        .on_error(OnStoreError::Open)
        .build();
    let subject = Subject::new("spread-flood");
    let mut rows = Spread::builder();
    rows.row(
        subject.clone(),
        "rule",
        Limit::fixed_window(1, Duration::from_secs(86_400)).unwrap(),
        1,
    );
    let one = rows.build().unwrap();
    assert!(store.decide_spread(&one, Op::Check).await.unwrap().decision.allowed);
    let first = store.decide_spread(&one, Op::Check).await.unwrap();
    assert_eq!((first.decision.allowed, first.path), (false, Path::Store));
    for _ in 0..100 {
        let outcome = store.decide_spread(&one, Op::Check).await.unwrap();
        assert_eq!((outcome.decision.allowed, outcome.path), (false, Path::DenyCache));
    }
    assert_eq!(counting.calls(), 2, "the flood never reached Redis");

    let mut rows = Spread::builder();
    rows.row(
        Subject::new("a"),
        "rule",
        Limit::fixed_window(1, Duration::from_secs(86_400)).unwrap(),
        1,
    );
    rows.row(
        Subject::new("b"),
        "rule",
        Limit::fixed_window(5, Duration::from_secs(86_400)).unwrap(),
        1,
    );
    let two = rows.build().unwrap();
    assert_eq!(store.decide_spread(&two, Op::Check).await.unwrap().path, Path::Store);
    let reserve = Op::Reserve { max_wait: None };
    drop(server);
    let error = store.decide_spread(&two, reserve).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{error}");
}

#[tokio::test]
async fn leases_and_explicit_times_are_never_cached() {
    let server = RedisServer::start();
    let counting = Counting::new(redis(&server).await);
    let store = ResilientStore::builder(counting.clone()).deny_cache(1_000).build();
    let subject = Subject::new("leases");
    let policy = Policy::single(Limit::concurrency(1, Duration::from_secs(3_600)).unwrap());
    let acquire = |lease: &str| {
        Request::new(
            Op::Acquire {
                lease: lease.to_owned(),
                max_wait: None,
            },
            1,
        )
    };
    assert!(
        store
            .decide(&subject, &policy, &acquire("a"))
            .await
            .unwrap()
            .decision
            .allowed
    );
    for _ in 0..3 {
        let outcome = store.decide(&subject, &policy, &acquire("b")).await.unwrap();
        assert!(!outcome.decision.allowed);
        assert_eq!(outcome.path, Path::Store, "a release may free the lease early");
    }
    let release = Request::new(Op::Release { lease: "a".to_owned() }, 1);
    store.decide(&subject, &policy, &release).await.unwrap();
    assert!(
        store
            .decide(&subject, &policy, &acquire("b"))
            .await
            .unwrap()
            .decision
            .allowed
    );
    assert_eq!(counting.calls(), 6);
}
