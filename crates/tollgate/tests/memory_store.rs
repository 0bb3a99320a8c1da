//! The memory store: conformance, concurrency without over-admission, and
//! eviction of state that carries no information.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate::{Clock, Limit, Limiter, ManualClock, MemoryStore, Op, Policy, Request, Subject, Timestamp};

#[tokio::test]
async fn memory_store_conforms() {
    common::conformance::run_all(|| async { MemoryStore::new() }).await;
}

/// 8 threads × 100 000 checks on one key, each on its own thread, counting
/// what was admitted.
fn hammer(store: &MemoryStore, policy: &Policy, clock: Option<&ManualClock>) -> u64 {
    const THREADS: usize = 8;
    const CHECKS: usize = 100_000;
    let admitted = AtomicU64::new(0);
    let subject = Subject::new("hot-key");
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                let request = Request::new(Op::Check, 1);
                let mut mine = 0;
                for _ in 0..CHECKS {
                    if let Some(clock) = clock {
                        clock.advance(Duration::from_micros(1));
                    }
                    if store.decide_now(&subject, policy, &request).unwrap().decision.allowed {
                        mine += 1;
                    }
                }
                admitted.fetch_add(mine, Ordering::Relaxed);
            });
        }
    });
    admitted.into_inner()
}

#[test]
fn eight_threads_on_one_key_admit_exactly_the_limit() {
    let start = Timestamp::from_micros(common::conformance::T0);
    for limit in [
        Limit::gcra(1, Duration::from_secs(3600), 1_000).unwrap(),
        Limit::fixed_window(1_000, Duration::from_secs(3600)).unwrap(),
        Limit::sliding_log(1_000, Duration::from_secs(3600)).unwrap(),
        Limit::sliding_window(1_000, Duration::from_secs(3600), 10).unwrap(),
        Limit::token_bucket(1_000, 1, Duration::from_secs(3600)).unwrap(),
        Limit::leaky_bucket(1, Duration::from_secs(3600), 1_000).unwrap(),
    ] {
        let clock = ManualClock::new(start);
        let store = MemoryStore::with_clock(clock);
        let policy = Policy::single(limit.clone());
        // The clock stands still: exactly the burst is admitted, not one more.
        assert_eq!(hammer(&store, &policy, None), 1_000, "{limit}");
    }
}

#[test]
fn eight_threads_with_time_passing_stay_within_the_bound() {
    // 100 000 per second (one per 10 µs), burst 50; every check moves time
    // by 1 µs, so the 800 000 checks span 0.8 s and demand is 10× the rate.
    let clock = ManualClock::new(Timestamp::from_micros(common::conformance::T0));
    let store = MemoryStore::with_clock(clock.clone());
    let policy = Policy::single(Limit::gcra(100_000, Duration::from_secs(1), 50).unwrap());
    let admitted = hammer(&store, &policy, Some(&clock));
    let elapsed = clock.now().as_micros() - common::conformance::T0;
    let bound = 50 + elapsed / 10;
    assert_eq!(elapsed, 800_000);
    assert!(admitted <= bound, "admitted {admitted} over the bound {bound}");
    // Demand far exceeds the rate, so nearly the whole bound is used.
    assert!(admitted >= bound * 9 / 10, "admitted only {admitted} of {bound}");
}

#[tokio::test]
async fn idle_state_is_evicted() {
    let clock = ManualClock::new(Timestamp::from_micros(common::conformance::T0));
    let store = MemoryStore::with_clock(clock.clone());
    let policy = Policy::new([
        ("rate", Limit::gcra(10, Duration::from_secs(1), 5).unwrap()),
        ("window", Limit::fixed_window(100, Duration::from_secs(60)).unwrap()),
        ("log", Limit::sliding_log(100, Duration::from_secs(10)).unwrap()),
    ])
    .unwrap();
    let limiter = Limiter::new(store.clone(), policy);
    for user in 0..10_000 {
        limiter.check(&Subject::new("user").and(user)).await.unwrap();
    }
    assert_eq!(store.len(), 30_000);

    // A state is kept exactly as long as it carries information.
    clock.advance(Duration::from_secs(10));
    store.evict_expired();
    assert!(!store.is_empty(), "the fixed window still counts until the minute ends");

    clock.advance(Duration::from_secs(60));
    store.evict_expired();
    assert_eq!(store.len(), 0, "all state expired");
}

#[tokio::test]
async fn activity_sweeps_expired_state() {
    let clock = ManualClock::new(Timestamp::from_micros(common::conformance::T0));
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(1)
        .sweep_every(Duration::from_secs(1))
        .build();
    let limiter = Limiter::new(store.clone(), Limit::gcra(10, Duration::from_secs(1), 5).unwrap());
    for user in 0..1_000 {
        limiter.check(&Subject::new(user)).await.unwrap();
    }
    assert_eq!(store.len(), 1_000);
    clock.advance(Duration::from_secs(2));
    // One decision is enough for the shard to notice and drop the rest.
    limiter.check(&Subject::new("newcomer")).await.unwrap();
    assert_eq!(store.len(), 1);
}

#[tokio::test]
async fn full_state_is_dropped_at_once() {
    let store = MemoryStore::new();
    let limiter = Limiter::new(store.clone(), Limit::concurrency(3, Duration::from_secs(60)).unwrap());
    let subject = Subject::new("jobs");
    let permit = match limiter.acquire(&subject, 1, Duration::ZERO).await.unwrap() {
        tollgate::Acquired::Granted(permit) => permit,
        tollgate::Acquired::Denied(decision) => panic!("denied: {decision:?}"),
    };
    assert_eq!(store.len(), 1);
    let after = permit.release().await.unwrap().expect("a lease");
    assert_eq!(after.remaining, 3);
    assert_eq!(store.len(), 0, "no lease in flight, nothing to keep");
}

#[test]
fn explicit_now_overrides_the_clock() {
    let store = MemoryStore::with_clock(ManualClock::new(Timestamp::EPOCH));
    let policy = Policy::single(Limit::fixed_window(1, Duration::from_secs(1)).unwrap());
    let subject = Subject::new("replay");
    let at = |micros| Request::new(Op::Check, 1).at(Timestamp::from_micros(micros));
    assert!(
        store
            .decide_now(&subject, &policy, &at(5_000_000))
            .unwrap()
            .decision
            .allowed
    );
    assert!(
        !store
            .decide_now(&subject, &policy, &at(5_999_999))
            .unwrap()
            .decision
            .allowed
    );
    assert!(
        store
            .decide_now(&subject, &policy, &at(6_000_000))
            .unwrap()
            .decision
            .allowed
    );
}

/// Tables grow (and rehash) as subjects arrive: every state is found again
/// after, whichever table holds it (GCRA's or the others'), for a policy of
/// one limit and for one of several whose names are shared.
#[test]
fn state_is_found_again_after_the_tables_grow() {
    let store = MemoryStore::with_clock(ManualClock::new(Timestamp::EPOCH));
    let gcra = Policy::single(Limit::gcra(1, Duration::from_secs(60), 2).unwrap());
    let bucket = Policy::single(Limit::token_bucket(2, 1, Duration::from_secs(60)).unwrap());
    let both = Policy::new([
        ("per_minute", Limit::gcra(1, Duration::from_secs(60), 3).unwrap()),
        ("window", Limit::fixed_window(3, Duration::from_secs(60)).unwrap()),
    ])
    .unwrap();
    let subjects: Vec<Subject> = (0..5_000).map(|i| Subject::new(format!("user-{i}"))).collect();
    let check = |subject, policy| {
        store
            .decide_now(subject, policy, &Request::new(Op::Check, 1))
            .unwrap()
            .decision
            .remaining
    };
    for round in 0..2 {
        for subject in &subjects {
            assert_eq!(check(subject, &gcra), 1 - round, "{subject}: gcra, round {round}");
            assert_eq!(
                check(subject, &bucket),
                1 - round,
                "{subject}: token bucket, round {round}"
            );
            assert_eq!(check(subject, &both), 2 - round, "{subject}: policy, round {round}");
        }
    }
    for subject in &subjects {
        let denied = store.decide_now(subject, &gcra, &Request::new(Op::Check, 1)).unwrap();
        assert!(!denied.decision.allowed, "{subject}: a third check of a burst of 2");
    }
    // Per subject: `gcra`, `token_bucket`, and the policy's two limits.
    assert_eq!(store.len(), 5_000 * 4);
}

/// The limiter's calls without a future decide on the same state as its
/// async ones, with the same answers.
#[tokio::test]
async fn decisions_without_a_future_share_the_async_ones_state() {
    let clock = ManualClock::new(Timestamp::from_micros(1_700_000_000_000_000));
    let limit = Limit::gcra(1, Duration::from_secs(60), 4).unwrap();
    let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()), limit);
    let subject = Subject::new("both");
    assert_eq!(limiter.check(&subject).await.unwrap().remaining, 3);
    assert_eq!(limiter.check_now(&subject).unwrap().remaining, 2);
    assert_eq!(limiter.check(&subject).await.unwrap().remaining, 1);
    let peek = Request::new(Op::Check, 0);
    assert_eq!(
        limiter.decide_now(&subject, &peek).unwrap(),
        limiter.decide(&subject, &peek).await.unwrap()
    );
    assert!(limiter.check_now(&subject).unwrap().allowed);
    let denied = limiter.check_now(&subject).unwrap();
    assert!(!denied.allowed);
    assert_eq!(denied.retry_after, Some(Duration::from_secs(60)));
    clock.advance(Duration::from_secs(60));
    assert!(limiter.check_now(&subject).unwrap().allowed);
}

proptest::proptest! {
    /// Any limit, after any history: a check (an acquire, on leases) and its
    /// refund at the same instant leave every limit as a peek saw it before.
    #[test]
    fn a_check_and_its_refund_leave_every_limit_as_it_was(
        limit in common::differential::any_limit(),
        history in proptest::collection::vec((0u64..400_000, 0u64..4), 0..12),
        cost in 1u64..5,
    ) {
        let store = MemoryStore::new();
        let policy = Policy::new([("limit", limit.clone())]).unwrap();
        let subject = Subject::new("refund");
        let take = |index: usize| {
            if limit.is_concurrency() {
                Op::Acquire { lease: format!("lease-{index}"), max_wait: None }
            } else {
                Op::Check
            }
        };
        let mut now = common::conformance::T0;
        for (index, (dt, units)) in history.into_iter().enumerate() {
            now += dt;
            let request = Request::new(take(index), units).at(Timestamp::from_micros(now));
            store.decide_now(&subject, &policy, &request).unwrap();
        }
        let at = Timestamp::from_micros(now);
        let peek = || {
            let release = Request::new(Op::Release { lease: "nobody".to_owned() }, 0).at(at);
            store.decide_now(&subject, &policy, &release).unwrap().limits
        };
        let before = peek();
        let taken = store.decide_now(&subject, &policy, &Request::new(take(99), cost).at(at)).unwrap();
        if taken.decision.allowed {
            let lease = limit.is_concurrency().then(|| "lease-99".to_owned());
            let refund = Request::new(Op::Refund { at: taken.decided_at, lease }, cost).at(at);
            let refunded = store.decide_now(&subject, &policy, &refund).unwrap();
            proptest::prop_assert_eq!(&refunded.limits, &before);
            proptest::prop_assert_eq!(peek(), before);
        }
    }
}

proptest::proptest! {
    /// Any policy of one or two limits (GCRA among them, recording its
    /// overage or not): `check_at` answers the decision `decide_now` gives
    /// the same check, step for step, on two stores fed the same history of
    /// checks and other operations.
    #[test]
    fn check_at_decides_as_a_check_request_does(
        policy in common::differential::any_policy(),
        steps in proptest::collection::vec((0u64..300_000, 0u64..4, proptest::bool::ANY), 1..30),
    ) {
        let checked = MemoryStore::new();
        let requested = MemoryStore::new();
        let subject = Subject::new("check");
        let mut now = common::conformance::T0;
        for (dt, cost, check) in steps {
            now += dt;
            let at = Timestamp::from_micros(now);
            let request = if check {
                Request::new(Op::Check, cost).at(at)
            } else {
                // Another operation on both, so that checks meet states of
                // every kind.
                Request::new(Op::Record, cost).at(at)
            };
            let expected = requested.decide_now(&subject, &policy, &request).map_err(|error| error.to_string());
            if check {
                let got = checked.check_at(&subject, &policy, cost, at).map_err(|error| error.to_string());
                proptest::prop_assert_eq!(got, expected.map(|outcome| outcome.decision));
            } else {
                let got = checked.decide_now(&subject, &policy, &request).map_err(|error| error.to_string());
                proptest::prop_assert_eq!(got, expected);
            }
        }
    }
}
