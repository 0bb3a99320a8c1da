//! Leases over a memory store, on explicit instants: several processes
//! (one `LeasedStore` each) share one limit.

use std::time::Duration;

use proptest::prelude::*;

use super::LeasedStore;
use crate::algorithm::leasable::{any_leasable, stated_bound};
use crate::{Limit, MemoryStore, Op, Outcome, Path, Policy, Request, Store, Subject, Timestamp};

/// An instant in the middle of a second, so that runs straddle windows.
const START: u64 = 1_800_000_000_250_000;

fn at(micros: u64) -> Timestamp {
    Timestamp::from_micros(START + micros)
}

fn check(micros: u64) -> Request {
    Request::new(Op::Check, 1).at(at(micros))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `processes` leased stores sharing one memory store.
fn processes(count: usize) -> (MemoryStore, Vec<LeasedStore<MemoryStore>>) {
    let shared = MemoryStore::new();
    let leased = (0..count)
        .map(|_| LeasedStore::new(shared.clone()).leasing(true))
        .collect();
    (shared, leased)
}

/// What the shared store has left for `policy` at `micros`: a peek.
async fn left(store: &MemoryStore, policy: &Policy, micros: u64) -> u64 {
    let peek = Request::new(Op::Check, 0).at(at(micros));
    store
        .decide(&subject(), policy, &peek)
        .await
        .unwrap()
        .decision
        .remaining
}

fn subject() -> Subject {
    Subject::new("hot")
}

/// Ten checks at instant 0, all admitted: from blocks of 1, 2, 4 and 8
/// units, so 15 are taken from the store and 5 are still held.
async fn ten_checks_at_0<S: Store>(store: &LeasedStore<S>, policy: &Policy) {
    for _ in 0..10 {
        let outcome = store.decide(&subject(), policy, &check(0)).await.unwrap();
        assert!(outcome.decision.allowed, "{outcome:?}");
    }
}

/// Runs `trace` (which process, then µs since the previous step) through
/// `stores`; the instants (µs since `START`) of the admissions, and every
/// outcome.
async fn replay(
    stores: &[LeasedStore<MemoryStore>],
    policy: &Policy,
    trace: &[(usize, u64)],
) -> (Vec<u64>, Vec<(usize, Outcome)>) {
    let (mut now, mut admitted, mut outcomes) = (0, Vec::new(), Vec::new());
    for &(process, dt) in trace {
        now += dt;
        let outcome = stores[process].decide(&subject(), policy, &check(now)).await.unwrap();
        if outcome.decision.allowed {
            admitted.push(now);
        }
        outcomes.push((process, outcome));
    }
    (admitted, outcomes)
}

/// Every run of admissions `admitted[i..=j]` is within `bound(first, last)`
/// (absolute µs).
fn assert_bound(admitted: &[u64], bound: impl Fn(u64, u64) -> u128) {
    for i in 0..admitted.len() {
        for j in i..admitted.len() {
            let total = (j - i + 1) as u128;
            let allowed = bound(START + admitted[i], START + admitted[j]);
            assert!(
                total <= allowed,
                "{total} admitted in [{}, {}] µs, bound stretched by the lease {allowed}",
                admitted[i],
                admitted[j]
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Four processes leasing one limit never admit, over any interval,
    /// more than the limit's bound over that interval stretched by one
    /// lease — blocks ending, going back, and being taken again included.
    #[test]
    fn leases_never_admit_beyond_the_bound_stretched_by_one_lease(
        (limit, scale) in any_leasable(),
        lease_part in 1u64..200,
        trace in proptest::collection::vec((0usize..16, 0u64..1_000), 1..400),
    ) {
        // A lease of 0.5 % to 100 % of the limit's time scale.
        let lease = Duration::from_micros((scale * lease_part / 200).max(1));
        let policy = Policy::single(limit.clone().with_lease(lease).unwrap());
        // Steps of up to a 25th of the time scale: demand well above most
        // limits, so that they deny and blocks are held across their edges.
        // Process 0 asks seldom (1 step in 16), so that its blocks are held
        // long, while the others keep the limit full.
        let trace: Vec<(usize, u64)> = trace
            .into_iter()
            .map(|(p, dt)| (if p == 0 { 0 } else { 1 + p % 3 }, dt * scale / 50_000))
            .collect();
        let (_, stores) = processes(4);
        let (admitted, _) = runtime().block_on(replay(&stores, &policy, &trace));
        let lease = u64::try_from(lease.as_micros()).unwrap();
        assert_bound(&admitted, |a, b| stated_bound(&limit, a.saturating_sub(lease), b));
    }
}

#[test]
fn unused_units_go_back_on_close() {
    runtime().block_on(async {
        let policy = Policy::single(
            Limit::fixed_window(100, Duration::from_secs(3_600))
                .unwrap()
                .with_lease(Duration::from_secs(1))
                .unwrap(),
        );
        let (shared, stores) = processes(1);
        ten_checks_at_0(&stores[0], &policy).await;
        assert_eq!(left(&shared, &policy, 0).await, 85);
        stores[0].close(Some(at(0))).await;
        assert_eq!(left(&shared, &policy, 0).await, 90);
        let stats = stores[0].stats();
        assert_eq!((stats.decisions, stats.calls), (10, 5), "4 blocks and one refund");
    });
}

#[test]
fn a_block_goes_back_when_its_lease_ends() {
    runtime().block_on(async {
        let lease = Duration::from_millis(50);
        let policy = Policy::single(
            Limit::fixed_window(100, Duration::from_secs(3_600))
                .unwrap()
                .with_lease(lease)
                .unwrap(),
        );
        let (shared, stores) = processes(1);
        ten_checks_at_0(&stores[0], &policy).await;
        // Within the lease the held units answer without a call.
        let calls = stores[0].stats().calls;
        let held = stores[0].decide(&subject(), &policy, &check(49_999)).await.unwrap();
        assert_eq!(held.path, Path::Leased);
        assert_eq!(held.decision.remaining, 89);
        assert_eq!(stores[0].stats().calls, calls);
        // At its end they go back before the next block is taken.
        let next = stores[0].decide(&subject(), &policy, &check(50_000)).await.unwrap();
        assert_eq!(next.path, Path::Store);
        assert_eq!(next.decision.remaining, 88, "11 used; the rest back or held");
        stores[0].close(Some(at(50_000))).await;
        assert_eq!(left(&shared, &policy, 50_000).await, 88);
    });
}

#[test]
fn a_bucket_gets_back_only_what_has_not_refilled_meanwhile() {
    runtime().block_on(async {
        // One unit a millisecond, burst 100; a lease of 50 ms.
        let gcra = Limit::gcra(1_000, Duration::from_secs(1), 100).unwrap();
        let policy = Policy::single(gcra.with_lease(Duration::from_millis(50)).unwrap());
        let (shared, stores) = processes(1);
        ten_checks_at_0(&stores[0], &policy).await;
        // 15 taken, 10 used, 5 held; 3 ms later 3 of the 15 have refilled,
        // so at most 2 of the 5 held may go back: the store sees 15 - 2 = 13
        // taken, less the 3 refilled.
        stores[0].close(Some(at(3_000))).await;
        assert_eq!(left(&shared, &policy, 3_000).await, 100 - 13 + 3);
    });
}

#[test]
fn demand_at_half_the_limit_is_never_denied() {
    runtime().block_on(async {
        for limit in [
            Limit::fixed_window(1_000, Duration::from_secs(1)).unwrap(),
            Limit::sliding_window(1_000, Duration::from_secs(1), 10).unwrap(),
            Limit::gcra(1_000, Duration::from_secs(1), 100).unwrap(),
            Limit::token_bucket(100, 1_000, Duration::from_secs(1)).unwrap(),
        ] {
            let policy = Policy::single(limit.with_lease(Duration::from_millis(50)).unwrap());
            let (_, stores) = processes(4);
            // 500 a second for 5 s, the four processes in turn.
            let trace: Vec<(usize, u64)> = (0..2_500).map(|i| (i % 4, 2_000)).collect();
            let (admitted, outcomes) = replay(&stores, &policy, &trace).await;
            assert_eq!(
                admitted.len(),
                2_500,
                "{policy:?}: denied {:?}",
                outcomes.iter().find(|(_, o)| !o.decision.allowed)
            );
        }
    });
}

#[test]
fn demand_at_twice_the_limit_is_shared_by_demand() {
    runtime().block_on(async {
        for limit in [
            Limit::fixed_window(1_000, Duration::from_secs(1)).unwrap(),
            Limit::gcra(1_000, Duration::from_secs(1), 100).unwrap(),
        ] {
            let policy = Policy::single(limit.with_lease(Duration::from_millis(50)).unwrap());
            let (_, stores) = processes(4);
            // 2 000 a second for 10 s, each request from one of the four
            // processes at random (a fixed turn would lock each process to
            // a phase of the limit's refill, with or without leases).
            let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
            let trace: Vec<(usize, u64)> = (0..20_000)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    ((seed % 4) as usize, 500)
                })
                .collect();
            let (admitted, outcomes) = replay(&stores, &policy, &trace).await;
            let mut shares = [0u64; 4];
            for (process, outcome) in &outcomes {
                shares[*process] += u64::from(outcome.decision.allowed);
            }
            let total = admitted.len() as f64;
            assert!(
                (9_000.0..=11_200.0).contains(&total),
                "{policy:?}: {total} admitted in 10 s"
            );
            for share in shares {
                let part = share as f64 / total;
                assert!((0.2..=0.3).contains(&part), "{policy:?}: shares {shares:?}");
            }
        }
    });
}

#[test]
fn a_hot_key_takes_few_store_calls() {
    runtime().block_on(async {
        let gcra = Limit::gcra(1_000_000, Duration::from_secs(1), 1_000).unwrap();
        let policy = Policy::single(gcra.with_lease(Duration::from_millis(50)).unwrap());
        let (_, stores) = processes(1);
        // 250 000 a second for 0.8 s: a quarter of the rate.
        let trace: Vec<(usize, u64)> = (0..200_000).map(|_| (0, 4)).collect();
        let (admitted, _) = replay(&stores, &policy, &trace).await;
        assert_eq!(admitted.len(), 200_000);
        let stats = stores[0].stats();
        assert!(
            stats.calls * 50 <= stats.decisions,
            "{stats:?}: more than 0.02 calls a decision"
        );
    });
}

#[test]
fn a_denial_is_answered_here_until_its_retry_after() {
    runtime().block_on(async {
        let policy = Policy::single(
            Limit::fixed_window(5, Duration::from_secs(1))
                .unwrap()
                .with_lease(Duration::from_millis(100))
                .unwrap(),
        );
        let (_, stores) = processes(1);
        // START is 0.25 s into a second.
        for _ in 0..5 {
            assert!(
                stores[0]
                    .decide(&subject(), &policy, &check(0))
                    .await
                    .unwrap()
                    .decision
                    .allowed
            );
        }
        let denied = stores[0].decide(&subject(), &policy, &check(0)).await.unwrap();
        assert!(!denied.decision.allowed);
        assert_eq!(denied.decision.retry_after, Some(Duration::from_millis(750)));
        let calls = stores[0].stats().calls;
        let again = stores[0].decide(&subject(), &policy, &check(700_000)).await.unwrap();
        assert_eq!((again.decision.allowed, again.path), (false, Path::Leased));
        assert_eq!(again.decision.retry_after, Some(Duration::from_millis(50)));
        assert_eq!(stores[0].stats().calls, calls, "answered without a call");
        let next = stores[0].decide(&subject(), &policy, &check(750_000)).await.unwrap();
        assert!(next.decision.allowed);
        assert!(stores[0].stats().calls > calls);
    });
}

#[test]
fn other_operations_and_unleased_policies_go_to_the_store() {
    runtime().block_on(async {
        let leased = Policy::single(
            Limit::fixed_window(5, Duration::from_secs(1))
                .unwrap()
                .with_lease(Duration::from_millis(100))
                .unwrap(),
        );
        let plain = Policy::single(Limit::fixed_window(5, Duration::from_secs(1)).unwrap());
        let (_, stores) = processes(1);
        stores[0].decide(&subject(), &plain, &check(0)).await.unwrap();
        let at_most = Request::new(Op::CheckAtMost, 3).at(at(0));
        assert_eq!(
            stores[0].decide(&subject(), &leased, &at_most).await.unwrap().granted,
            3
        );
        assert_eq!(stores[0].stats().decisions, 0);
    });
}

#[test]
fn a_lease_is_read_written_and_refused_where_it_cannot_apply() {
    let limit = Limit::from_json(r#"{"algorithm":"gcra","rate":10,"period":"1s","burst":5,"lease":"50ms"}"#).unwrap();
    assert_eq!(limit.lease(), Some(Duration::from_millis(50)));
    assert_eq!(Limit::from_json(&limit.to_string()).unwrap(), limit);
    for (json, field) in [
        (
            r#"{"algorithm":"leaky_bucket","rate":10,"period":"1s","capacity":5,"lease":"50ms"}"#,
            "lease: a leaky_bucket limit cannot be leased",
        ),
        (
            r#"{"algorithm":"concurrency","limit":10,"ttl":"1s","lease":"50ms"}"#,
            "lease: a concurrency limit",
        ),
        (
            r#"{"algorithm":"gcra","rate":10,"period":"1s","burst":5,"lease":"soon"}"#,
            "lease: ",
        ),
        (
            r#"{"algorithm":"gcra","rate":10,"period":"1s","burst":5,"lease":50}"#,
            "lease: expected a duration",
        ),
        (
            r#"{"algorithm":"gcra","rate":10,"period":"1s","burst":5,"lease":"0s"}"#,
            "lease: must be a positive",
        ),
    ] {
        let error = Limit::from_json(json).unwrap_err().to_string();
        assert!(error.contains(field), "{json}: {error}");
    }
    let mixed = Policy::from_json(
        r#"{"fast":{"algorithm":"gcra","rate":10,"period":"1s","burst":5,"lease":"50ms"},
            "slow":{"algorithm":"fixed_window","limit":100,"window":"1h"}}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(mixed.contains("slow.lease"), "{mixed}");
}

/// A memory store that fails while `down` is set.
#[derive(Clone)]
struct Flaky {
    store: MemoryStore,
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Flaky {
    fn new() -> Self {
        Self {
            store: MemoryStore::new(),
            down: std::sync::Arc::default(),
        }
    }

    fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Store for Flaky {
    async fn decide(&self, subject: &Subject, policy: &Policy, request: &Request) -> crate::Result<Outcome> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(crate::Error::new(crate::ErrorKind::Store, "down"));
        }
        self.store.decide(subject, policy, request).await
    }

    async fn reset(&self, subject: &Subject, policy: &Policy) -> crate::Result<()> {
        self.store.reset(subject, policy).await
    }
}

fn hourly(limit: u64) -> Policy {
    let limit = Limit::fixed_window(limit, Duration::from_secs(3_600)).unwrap();
    Policy::single(limit.with_lease(Duration::from_millis(50)).unwrap())
}

#[test]
fn a_block_the_store_cannot_take_back_lapses() {
    runtime().block_on(async {
        let policy = hourly(100);
        let flaky = Flaky::new();
        let leased = LeasedStore::new(flaky.clone());
        ten_checks_at_0(&leased, &policy).await;
        // 15 taken, 5 held; the lease ends while the store is down: the
        // refund fails, and so does the next block.
        flaky.set_down(true);
        assert!(leased.decide(&subject(), &policy, &check(50_000)).await.is_err());
        flaky.set_down(false);
        assert!(
            leased
                .decide(&subject(), &policy, &check(60_000))
                .await
                .unwrap()
                .decision
                .allowed
        );
        leased.close(Some(at(60_000))).await;
        // 11 used, and the 5 held when the store was down lapsed: counted,
        // never admitted (under-admission, never over).
        assert_eq!(left(&flaky.store, &policy, 60_000).await, 100 - 11 - 5);
    });
}

#[test]
fn units_a_failure_policy_granted_are_never_given_to_the_store() {
    runtime().block_on(async {
        let policy = hourly(100);
        let flaky = Flaky::new();
        let resilient = crate::ResilientStore::builder(flaky.clone())
            .on_error(crate::OnStoreError::Open)
            .build();
        let leased = LeasedStore::new(resilient);
        flaky.set_down(true);
        for _ in 0..3 {
            let outcome = leased.decide(&subject(), &policy, &check(0)).await.unwrap();
            assert!(outcome.decision.allowed, "{outcome:?}");
        }
        flaky.set_down(false);
        // The policy's block ends; nothing of it goes to the store, which
        // counts only what it granted from now on.
        leased.decide(&subject(), &policy, &check(50_000)).await.unwrap();
        leased.close(Some(at(50_000))).await;
        assert_eq!(left(&flaky.store, &policy, 50_000).await, 99);
    });
}

#[test]
fn over_the_memory_store_a_leased_store_decides_as_the_store() {
    runtime().block_on(async {
        let policy = Policy::single(
            Limit::gcra(10, Duration::from_secs(1), 3)
                .unwrap()
                .with_lease(Duration::from_millis(50))
                .unwrap(),
        );
        let plain = MemoryStore::new();
        let leased = LeasedStore::new(MemoryStore::new());
        for micros in (0..2_000_000).step_by(37_000) {
            let request = check(micros);
            let a = plain.decide(&subject(), &policy, &request).await.unwrap();
            let b = leased.decide(&subject(), &policy, &request).await.unwrap();
            assert_eq!(a.decision, b.decision, "at {micros} us");
        }
        assert_eq!(leased.stats().decisions, 0, "no lease over the memory store");
    });
}

#[test]
fn a_dropped_store_gives_its_blocks_back() {
    runtime().block_on(async {
        // Requests on the store's clock (no explicit instant), as a service makes them.
        let clock = crate::ManualClock::new(at(0));
        let shared = MemoryStore::with_clock(clock.clone());
        let policy = hourly(100);
        let leased = LeasedStore::with_clock(shared.clone(), clock).leasing(true);
        for _ in 0..10 {
            let outcome = leased
                .decide(&subject(), &policy, &Request::new(Op::Check, 1))
                .await
                .unwrap();
            assert!(outcome.decision.allowed);
        }
        assert_eq!(left(&shared, &policy, 0).await, 85);
        drop(leased);
        // The refund runs on a task of the runtime: let it.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(left(&shared, &policy, 0).await, 90);
    });
}

#[test]
fn a_limit_redefined_under_its_name_is_not_answered_from_the_old_block() {
    runtime().block_on(async {
        let (_, stores) = processes(1);
        ten_checks_at_0(&stores[0], &hourly(100)).await;
        // The same key, now a limit of 12: the 15 taken already exceed it,
        // and the 5 units held under the old limit are not handed out.
        let outcome = stores[0].decide(&subject(), &hourly(12), &check(1)).await.unwrap();
        assert!(!outcome.decision.allowed, "{outcome:?}");
    });
}

/// A memory store on a manual clock standing at `at(0)`, and one process
/// leasing from it through `Gated`. Requests that name their instants start
/// no sweeper: the tests drive its steps themselves.
fn gated() -> (crate::ManualClock, Gated, LeasedStore<Gated>) {
    let clock = crate::ManualClock::new(at(0));
    let gated = Gated::new(MemoryStore::with_clock(clock.clone()));
    let leased = LeasedStore::with_clock(gated.clone(), clock.clone()).leasing(true);
    (clock, gated, leased)
}

/// A memory store whose next refund, once armed, stops until resumed: to
/// hold a sweep in the middle of giving back.
#[derive(Clone)]
struct Gated {
    store: MemoryStore,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Told when the armed refund has stopped.
    stopped: std::sync::Arc<tokio::sync::Notify>,
    /// Lets it go on.
    resume: std::sync::Arc<tokio::sync::Notify>,
}

impl Gated {
    fn new(store: MemoryStore) -> Self {
        Self {
            store,
            armed: std::sync::Arc::default(),
            stopped: std::sync::Arc::default(),
            resume: std::sync::Arc::default(),
        }
    }

    fn arm(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Store for Gated {
    async fn decide(&self, subject: &Subject, policy: &Policy, request: &Request) -> crate::Result<Outcome> {
        if matches!(request.op, Op::Refund { .. }) && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.stopped.notify_one();
            self.resume.notified().await;
        }
        self.store.decide(subject, policy, request).await
    }

    async fn reset(&self, subject: &Subject, policy: &Policy) -> crate::Result<()> {
        self.store.reset(subject, policy).await
    }
}

/// What `store` has left for `subject` under `policy` at `micros`.
async fn left_of(store: &MemoryStore, subject: &Subject, policy: &Policy, micros: u64) -> u64 {
    let peek = Request::new(Op::Check, 0).at(at(micros));
    store.decide(subject, policy, &peek).await.unwrap().decision.remaining
}

#[test]
fn a_sweep_between_taking_an_entry_and_recording_its_block_loses_nothing() {
    runtime().block_on(async {
        let policy = hourly(100);
        let (clock, gated, leased) = gated();
        ten_checks_at_0(&leased, &policy).await;
        // 15 taken, 5 held until 50 ms. A check at 50 ms takes the key's
        // entry; the sweeper runs before it calls the store (the lease has
        // ended: it gives the 5 back); then the check takes its next block.
        clock.set(at(50_000));
        let lease = policy.lease().unwrap();
        let entry = leased.entry(&subject(), &policy, lease);
        leased.shared.sweep(lease, at(50_000)).await;
        let outcome = leased.check_entry(&entry, &check(50_000)).await.unwrap();
        assert!(outcome.decision.allowed, "{outcome:?}");
        drop(entry);
        // 11 used; what the new block holds goes back on close.
        leased.close(Some(at(50_000))).await;
        assert_eq!(left(&gated.store, &policy, 50_000).await, 89);
    });
}

#[test]
fn a_block_taken_while_the_store_closes_is_given_back() {
    runtime().block_on(async {
        let policy = hourly(100);
        let (_clock, gated, leased) = gated();
        ten_checks_at_0(&leased, &policy).await;
        // A check takes the key's entry; the store closes before the check
        // calls it (giving back the 5 held); then the check takes a block
        // into an entry the map no longer holds.
        let lease = policy.lease().unwrap();
        let entry = leased.entry(&subject(), &policy, lease);
        leased.close(Some(at(50_000))).await;
        let outcome = leased.check_entry(&entry, &check(50_000)).await.unwrap();
        assert!(outcome.decision.allowed, "{outcome:?}");
        // 11 used: the new block's rest came back at once.
        assert_eq!(left(&gated.store, &policy, 50_000).await, 89);
    });
}

#[test]
fn the_last_clone_dropped_during_a_sweep_gives_its_blocks_back() {
    runtime().block_on(async {
        let policy = hourly(100);
        let (clock, gated, leased) = gated();
        let (cold, warm) = (Subject::new("cold"), Subject::new("warm"));
        // 15 taken for each, 5 held: the cold key's lease ends at 50 ms, the
        // warm one's at 90 ms.
        for (subject, micros) in [(&cold, 0), (&warm, 40_000)] {
            for _ in 0..10 {
                let outcome = leased.decide(subject, &policy, &check(micros)).await.unwrap();
                assert!(outcome.decision.allowed, "{outcome:?}");
            }
        }
        // At 50 ms the sweeper gives the cold block back, and stops in its
        // refund; the last clone of the store drops meanwhile.
        clock.set(at(50_000));
        gated.arm();
        let sweeper = std::sync::Arc::downgrade(&leased.shared);
        let lease = policy.lease().unwrap();
        let sweep = tokio::spawn(async move {
            let shared = sweeper.upgrade().expect("the store is alive");
            shared.sweep(lease, at(50_000)).await;
        });
        gated.stopped.notified().await;
        drop(leased);
        gated.resume.notify_one();
        sweep.await.unwrap();
        // The warm block goes back from a task of the runtime: let it.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(left_of(&gated.store, &cold, &policy, 50_000).await, 90);
        assert_eq!(left_of(&gated.store, &warm, &policy, 50_000).await, 90);
    });
}

#[test]
fn each_lease_length_has_its_own_sweeper() {
    runtime().block_on(async {
        let (short, long) = (Duration::from_millis(50), Duration::from_secs(3_600));
        let policy = |lease| {
            let limit = Limit::fixed_window(100, Duration::from_secs(3_600)).unwrap();
            Policy::single(limit.with_lease(lease).unwrap())
        };
        let (fast, slow) = (Subject::new("fast"), Subject::new("slow"));
        let (clock, gated, leased) = gated();
        // Requests on the store's clock, as a service makes them: each
        // lease length starts its sweeper.
        for (subject, lease) in [(&fast, short), (&slow, long)] {
            for _ in 0..10 {
                let outcome = leased
                    .decide(subject, &policy(lease), &Request::new(Op::Check, 1))
                    .await
                    .unwrap();
                assert!(outcome.decision.allowed, "{outcome:?}");
            }
        }
        let swept = |leased: &LeasedStore<Gated>| {
            let mut swept: Vec<Duration> = leased.shared.entries.lock().swept.iter().copied().collect();
            swept.sort();
            swept
        };
        assert_eq!(swept(&leased), [short, long]);
        // The short lease's sweep, once it has ended, gives its block back
        // and leaves the long lease's alone; with no key of its length
        // left, that sweeper stops.
        clock.set(at(50_000));
        assert!(!leased.shared.sweep(short, at(50_000)).await);
        assert_eq!(left_of(&gated.store, &fast, &policy(short), 50_000).await, 90);
        assert_eq!(left_of(&gated.store, &slow, &policy(long), 50_000).await, 85);
        assert_eq!(swept(&leased), [long]);
        // The long lease's sweep finds nothing ended and goes on.
        assert!(leased.shared.sweep(long, at(50_000)).await);
        assert_eq!(left_of(&gated.store, &slow, &policy(long), 50_000).await, 85);
        // The next block of the short lease starts its sweeper again.
        leased
            .decide(&fast, &policy(short), &Request::new(Op::Check, 1))
            .await
            .unwrap();
        assert_eq!(swept(&leased), [short, long]);
    });
}
