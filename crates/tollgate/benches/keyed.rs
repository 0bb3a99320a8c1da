//! Keyed GCRA checks over 10 000 keys: Tollgate's memory store next to
//! `governor`'s keyed rate limiter, on one thread and on two.
//!
//! All sides get the same quota (1000 per second, bursts of 50), the same
//! keys visited in the same fixed pseudo-random order, and the real clock
//! (Tollgate: `MemoryStore::new()` on its `SystemClock`, `decide_now` without
//! an explicit `now`; governor: its default quanta clock). Keys are built
//! once before timing: a `Vec<Subject>` (`Subject::new(i)`) for Tollgate; for
//! governor a `Vec<u64>` (its cheapest key) and, as `governor_string`, a
//! `Vec<String>` of the same bytes as Tollgate's subjects.
//!
//! On two threads each thread checks its own half of the key order and the
//! time reported is the wall time for `iters` checks *per thread*: with
//! perfect scaling the two-thread figure equals the one-thread figure, and
//! the printed throughput is per thread (double it for the total). A first
//! group times one reading of each side's clock. See BENCHMARKS.md for the
//! command and the figures.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{black_box, BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use futures_util::FutureExt as _;
use governor::clock::Clock as _;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::state::{InMemoryState, NotKeyed};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tollgate::{
    Clock as _, DirectLimiter, Limit, Limiter, MemoryStore, Op, Policy, Request, Subject, SystemClock, Timestamp,
};

/// Distinct keys.
const KEYS: usize = 10_000;
/// Cells per second, per key.
const RATE: u32 = 1_000;
/// Cells at once, per key.
const BURST: u32 = 50;
/// Checks simulated to report the share allowed.
const SAMPLE: usize = 1_000_000;

/// `0..KEYS` in a fixed pseudo-random order (Fisher–Yates over splitmix64).
fn key_order() -> Vec<u64> {
    let mut seed: u64 = 0x5EED_0F70_116A_7E00;
    let mut next = move || {
        seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut order: Vec<u64> = (0..KEYS as u64).collect();
    for i in (1..order.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// The two implementations under test, one method each.
trait Keyed: Sync {
    /// The key type, prebuilt before timing.
    type Key: Sync;

    fn keys(order: &[u64]) -> Vec<Self::Key>;

    /// One check of one unit; true when allowed.
    fn check(&self, key: &Self::Key) -> bool;
}

struct Tollgate {
    store: MemoryStore,
    policy: Policy,
    request: Request,
}

impl Tollgate {
    fn new() -> Self {
        let limit = Limit::gcra(u64::from(RATE), Duration::from_secs(1), u64::from(BURST)).expect("valid limit");
        Self {
            store: MemoryStore::new(),
            policy: Policy::single(limit),
            request: Request::new(Op::Check, 1),
        }
    }
}

impl Keyed for Tollgate {
    type Key = Subject;

    fn keys(order: &[u64]) -> Vec<Subject> {
        order.iter().map(|&i| Subject::new(i)).collect()
    }

    fn check(&self, key: &Subject) -> bool {
        self.store
            .decide_now(key, &self.policy, &self.request)
            .expect("a check")
            .decision
            .allowed
    }
}

/// Governor keyed by `K`.
struct Governor<K: std::hash::Hash + Eq + Clone>(DefaultKeyedRateLimiter<K>);

impl<K: std::hash::Hash + Eq + Clone> Governor<K> {
    fn new() -> Self {
        let quota = Quota::per_second(NonZeroU32::new(RATE).expect("non-zero"))
            .allow_burst(NonZeroU32::new(BURST).expect("non-zero"));
        Self(RateLimiter::keyed(quota))
    }
}

/// Keyed by the integer itself: governor's cheapest key.
impl Keyed for Governor<u64> {
    type Key = u64;

    fn keys(order: &[u64]) -> Vec<u64> {
        order.to_vec()
    }

    fn check(&self, key: &u64) -> bool {
        self.0.check_key(key).is_ok()
    }
}

/// Keyed by the same bytes as Tollgate's subjects, as a `String`.
impl Keyed for Governor<String> {
    type Key = String;

    fn keys(order: &[u64]) -> Vec<String> {
        order.iter().map(|&i| Subject::new(i).as_key().to_owned()).collect()
    }

    fn check(&self, key: &String) -> bool {
        self.0.check_key(key).is_ok()
    }
}

/// `iters` checks cycling over `keys` from `*at`; returns the allowed count.
fn run<K: Keyed>(limiter: &K, keys: &[K::Key], at: &mut usize, iters: u64) -> u64 {
    let mut allowed = 0;
    for _ in 0..iters {
        allowed += u64::from(limiter.check(black_box(&keys[*at])));
        *at += 1;
        if *at == keys.len() {
            *at = 0;
        }
    }
    allowed
}

/// Percentage allowed over [`SAMPLE`] checks on a fresh limiter, for the record.
fn allowed_share<K: Keyed>(limiter: &K, keys: &[K::Key]) -> f64 {
    let allowed = run(limiter, keys, &mut 0, SAMPLE as u64);
    allowed as f64 * 100.0 / SAMPLE as f64
}

type Group<'a> = BenchmarkGroup<'a, WallTime>;

/// `iters` checks on this thread; `run(keys, at, iters)` makes `iters`
/// checks over `keys` from `*at` and answers how many were allowed.
fn one_thread<Key>(group: &mut Group<'_>, name: &str, keys: &[Key], run: impl Fn(&[Key], &mut usize, u64) -> u64) {
    let mut at = 0;
    group.bench_function(BenchmarkId::from_parameter(name), |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            black_box(run(keys, &mut at, iters));
            start.elapsed()
        });
    });
}

/// Wall time for `iters` checks on each of two threads, each on its half of
/// the key order; the threads are spawned before the clock starts.
fn two_threads<Key: Sync>(
    group: &mut Group<'_>,
    name: &str,
    keys: &[Key],
    run: impl Fn(&[Key], &mut usize, u64) -> u64 + Sync,
) {
    let (first, second) = keys.split_at(keys.len() / 2);
    group.bench_function(BenchmarkId::from_parameter(name), |b| {
        b.iter_custom(|iters| {
            let barrier = Barrier::new(3);
            std::thread::scope(|scope| {
                for half in [first, second] {
                    let (barrier, run) = (&barrier, &run);
                    scope.spawn(move || {
                        barrier.wait();
                        black_box(run(half, &mut 0, iters));
                    });
                }
                barrier.wait();
                // Leaving the scope joins both threads; the clock stops after.
                Instant::now()
            })
            .elapsed()
        });
    });
}

/// Virtual time for the fair runs: every check moves its thread's time one
/// step on first (on both sides alike), so that both sides see the same
/// instants whatever their speed, and allow the same share. Each thread
/// keeps its own time (a thread-local), as each checks keys of its own: a
/// clock shared by two threads would be the contended line both measure.
#[derive(Clone, Copy)]
struct VirtualClock {
    step: u64,
}

std::thread_local! {
    static VIRTUAL_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The latest virtual time any thread reached: a thread spawned for a run
/// starts there, so that no key sees its time go back.
static VIRTUAL_FLOOR: AtomicU64 = AtomicU64::new(0);

impl VirtualClock {
    /// A clock moving `step` ns a check.
    fn new(step: u64) -> Self {
        Self { step }
    }

    /// Moves this thread's time one step on; the new time, ns.
    fn tick(self) -> u64 {
        VIRTUAL_NS.with(|now| {
            now.set(now.get() + self.step);
            now.get()
        })
    }
}

impl governor::clock::Clock for VirtualClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        Nanos::new(VIRTUAL_NS.with(std::cell::Cell::get))
    }
}

/// Virtual time between two checks of the keyed runs: with [`KEYS`] keys,
/// a key comes back every millisecond.
const STEP_NS: u64 = 100;
/// Between two checks of the one-key runs: Tollgate's clock counts whole
/// microseconds.
const DIRECT_STEP_NS: u64 = 1_000;

/// One side of a fair run: a check of one unit at the virtual time `ns`.
trait Fair: Sync {
    type Key: Sync;
    fn clock(&self) -> VirtualClock;
    fn check_at(&self, key: &Self::Key, ns: u64) -> bool;
}

/// Tollgate's memory store, deciding at the virtual time (an explicit
/// `now`): its `check_at`, or (`REQUEST`) a check `Request` through
/// `decide_now`.
struct FairTollgate<const REQUEST: bool> {
    store: MemoryStore,
    policy: Policy,
    clock: VirtualClock,
}

impl<const REQUEST: bool> FairTollgate<REQUEST> {
    fn new(rate: u32, burst: u32, step: u64) -> Self {
        let limit = Limit::gcra(u64::from(rate), Duration::from_secs(1), u64::from(burst)).expect("valid limit");
        Self {
            store: MemoryStore::new(),
            policy: Policy::single(limit),
            clock: VirtualClock::new(step),
        }
    }
}

impl<const REQUEST: bool> Fair for FairTollgate<REQUEST> {
    type Key = Subject;

    fn clock(&self) -> VirtualClock {
        self.clock
    }

    fn check_at(&self, key: &Subject, ns: u64) -> bool {
        let now = Timestamp::from_micros(ns / 1_000);
        if REQUEST {
            let request = Request::new(Op::Check, 1).at(now);
            return self
                .store
                .decide_now(key, &self.policy, &request)
                .expect("a check")
                .decision
                .allowed;
        }
        self.store.check_at(key, &self.policy, 1, now).expect("a check").allowed
    }
}

/// Tollgate's `Limiter` over the memory store: its async `decide`, the
/// future polled once (the memory store never waits), or with `now` its
/// `decide_now`, without a future.
struct FairLimiter {
    limiter: Limiter,
    clock: VirtualClock,
    now: bool,
}

impl FairLimiter {
    fn new(rate: u32, burst: u32, now: bool) -> Self {
        let limit = Limit::gcra(u64::from(rate), Duration::from_secs(1), u64::from(burst)).expect("valid limit");
        Self {
            limiter: Limiter::in_memory(limit),
            clock: VirtualClock::new(STEP_NS),
            now,
        }
    }
}

impl Fair for FairLimiter {
    type Key = Subject;

    fn clock(&self) -> VirtualClock {
        self.clock
    }

    fn check_at(&self, key: &Subject, ns: u64) -> bool {
        let request = Request::new(Op::Check, 1).at(Timestamp::from_micros(ns / 1_000));
        if self.now {
            return self
                .limiter
                .decide_now(key, &request)
                .expect("a check")
                .decision
                .allowed;
        }
        self.limiter
            .decide(key, &request)
            .now_or_never()
            .expect("the memory store never waits")
            .expect("a check")
            .decision
            .allowed
    }
}

/// governor keyed by `String` (the same bytes as Tollgate's subjects), on the virtual clock.
struct FairGovernor {
    limiter: RateLimiter<String, DefaultKeyedStateStore<String>, VirtualClock, NoOpMiddleware<Nanos>>,
    clock: VirtualClock,
}

impl FairGovernor {
    fn new(rate: u32, burst: u32) -> Self {
        let clock = VirtualClock::new(STEP_NS);
        let quota = Quota::per_second(NonZeroU32::new(rate).expect("non-zero"))
            .allow_burst(NonZeroU32::new(burst).expect("non-zero"));
        Self {
            limiter: RateLimiter::new(quota, DefaultKeyedStateStore::default(), clock),
            clock,
        }
    }
}

impl Fair for FairGovernor {
    type Key = String;

    fn clock(&self) -> VirtualClock {
        self.clock
    }

    fn check_at(&self, key: &String, _ns: u64) -> bool {
        self.limiter.check_key(key).is_ok()
    }
}

/// Tollgate's limiter without a key, deciding at the virtual time: its
/// `check_at`, or (`REQUEST`) a check `Request` through `decide_now`.
struct FairTollgateDirect<const REQUEST: bool> {
    limiter: DirectLimiter,
    clock: VirtualClock,
}

impl<const REQUEST: bool> FairTollgateDirect<REQUEST> {
    fn new(rate: u32, burst: u32) -> Self {
        let limit = Limit::gcra(u64::from(rate), Duration::from_secs(1), u64::from(burst)).expect("valid limit");
        Self {
            limiter: DirectLimiter::new(limit),
            clock: VirtualClock::new(DIRECT_STEP_NS),
        }
    }
}

impl<const REQUEST: bool> Fair for FairTollgateDirect<REQUEST> {
    type Key = ();

    fn clock(&self) -> VirtualClock {
        self.clock
    }

    fn check_at(&self, _key: &(), ns: u64) -> bool {
        let now = Timestamp::from_micros(ns / 1_000);
        if REQUEST {
            let request = Request::new(Op::Check, 1).at(now);
            return self.limiter.decide_now(&request).expect("a check").decision.allowed;
        }
        self.limiter.check_at(1, now).expect("a check").allowed
    }
}

/// One key: Tollgate's single subject against governor's direct limiter.
struct FairDirect {
    limiter: RateLimiter<NotKeyed, InMemoryState, VirtualClock, NoOpMiddleware<Nanos>>,
    clock: VirtualClock,
}

impl FairDirect {
    fn new(rate: u32, burst: u32) -> Self {
        let clock = VirtualClock::new(DIRECT_STEP_NS);
        let quota = Quota::per_second(NonZeroU32::new(rate).expect("non-zero"))
            .allow_burst(NonZeroU32::new(burst).expect("non-zero"));
        Self {
            limiter: RateLimiter::direct_with_clock(quota, clock),
            clock,
        }
    }
}

impl Fair for FairDirect {
    type Key = ();

    fn clock(&self) -> VirtualClock {
        self.clock
    }

    fn check_at(&self, _key: &(), _ns: u64) -> bool {
        self.limiter.check().is_ok()
    }
}

/// `iters` fair checks cycling over `keys` from `*at`; the allowed count.
fn run_fair<F: Fair>(side: &F, keys: &[F::Key], at: &mut usize, iters: u64) -> u64 {
    let mut allowed = 0;
    for _ in 0..iters {
        let ns = side.clock().tick();
        allowed += u64::from(side.check_at(black_box(&keys[*at]), ns));
        *at += 1;
        if *at == keys.len() {
            *at = 0;
        }
    }
    allowed
}

/// `iters` fair checks on this thread's virtual time, which starts where
/// the latest thread's ended (a thread spawned for a run starts at 0) and
/// is left for the next.
fn run_fair_from_floor<F: Fair>(side: &F, keys: &[F::Key], at: &mut usize, iters: u64) -> u64 {
    let floor = VIRTUAL_FLOOR.load(Ordering::Relaxed);
    VIRTUAL_NS.with(|now| now.set(now.get().max(floor)));
    let allowed = run_fair(side, keys, at, iters);
    VIRTUAL_FLOOR.fetch_max(VIRTUAL_NS.with(std::cell::Cell::get), Ordering::Relaxed);
    allowed
}

/// Times `side` on one thread and on two (each on its half of `keys`; one
/// key has no halves), after a warm-up that also reports the share it allows.
fn fair<F: Fair>(c: &mut Criterion, group: &str, name: &str, side: &F, keys: &[F::Key]) {
    let warm = SAMPLE as u64;
    let allowed = run_fair_from_floor(side, keys, &mut 0, warm);
    eprintln!(
        "{group}/{name}: allowed {:.1}% of {warm}",
        allowed as f64 * 100.0 / warm as f64
    );
    let run = |keys: &[F::Key], at: &mut usize, iters| run_fair_from_floor(side, keys, at, iters);
    let mut one = c.benchmark_group(format!("{group}/1_thread"));
    one.throughput(Throughput::Elements(1));
    one_thread(&mut one, name, keys, run);
    one.finish();
    if keys.len() > 1 {
        let mut two = c.benchmark_group(format!("{group}/2_threads"));
        two.throughput(Throughput::Elements(1));
        two_threads(&mut two, name, keys, run);
        two.finish();
    }
}

/// The fair runs: virtual time, the same keys in the same order, where both
/// sides always allow (a key comes back every 1 ms; 10 000 a second per key)
/// and where both deny half (500 a second per key, burst 1), on one thread
/// and two (Tollgate also through its `Limiter`, async and not); then one key on one thread, against governor's direct limiter
/// (a check every µs: 1 M/s always allows, 500 k/s allows half): Tollgate's
/// memory store with one subject, and its `DirectLimiter` (no key).
fn fair_runs(c: &mut Criterion, order: &[u64]) {
    let subjects = Tollgate::keys(order);
    let strings = Governor::<String>::keys(order);
    for (group, rate) in [("fair_allow", 10_000), ("fair_half", 500)] {
        fair(
            c,
            &format!("keyed/{group}"),
            "tollgate",
            &FairTollgate::<false>::new(rate, 1, STEP_NS),
            &subjects,
        );
        fair(
            c,
            &format!("keyed/{group}"),
            "tollgate_request",
            &FairTollgate::<true>::new(rate, 1, STEP_NS),
            &subjects,
        );
        fair(
            c,
            &format!("keyed/{group}"),
            "tollgate_limiter",
            &FairLimiter::new(rate, 1, false),
            &subjects,
        );
        fair(
            c,
            &format!("keyed/{group}"),
            "tollgate_limiter_now",
            &FairLimiter::new(rate, 1, true),
            &subjects,
        );
        fair(
            c,
            &format!("keyed/{group}"),
            "governor_string",
            &FairGovernor::new(rate, 1),
            &strings,
        );
    }
    let one = [Subject::new("one")];
    for (group, rate) in [("direct_allow", 1_000_000), ("direct_half", 500_000)] {
        fair(
            c,
            &format!("keyed/{group}"),
            "tollgate",
            &FairTollgate::<false>::new(rate, 1, DIRECT_STEP_NS),
            &one,
        );
        fair(
            c,
            &format!("keyed/{group}"),
            "tollgate_direct",
            &FairTollgateDirect::<false>::new(rate, 1),
            &[()],
        );
        fair(
            c,
            &format!("keyed/{group}"),
            "tollgate_direct_request",
            &FairTollgateDirect::<true>::new(rate, 1),
            &[()],
        );
        fair(
            c,
            &format!("keyed/{group}"),
            "governor_direct",
            &FairDirect::new(rate, 1),
            &[()],
        );
    }
}

fn keyed(c: &mut Criterion) {
    let order = key_order();
    let tollgate = Tollgate::new();
    let tollgate_keys = Tollgate::keys(&order);
    let governor = Governor::<u64>::new();
    let governor_keys = Governor::<u64>::keys(&order);
    let governor_string = Governor::<String>::new();
    let governor_string_keys = Governor::<String>::keys(&order);
    // Also fills both with every key, so that timing starts on a warm map.
    eprintln!(
        "allowed over {SAMPLE} checks on one thread: tollgate {:.1}%, governor {:.1}%, governor_string {:.1}%",
        allowed_share(&tollgate, &tollgate_keys),
        allowed_share(&governor, &governor_keys),
        allowed_share(&governor_string, &governor_string_keys),
    );
    // What one reading of each side's clock costs, for the breakdown in
    // BENCHMARKS.md.
    let mut group = c.benchmark_group("keyed/clock");
    let governor_clock = governor::clock::DefaultClock::default();
    group.bench_function("tollgate_system_clock", |b| b.iter(|| black_box(SystemClock.now())));
    group.bench_function("governor_default_clock", |b| b.iter(|| black_box(governor_clock.now())));
    group.finish();
    let mut group = c.benchmark_group("keyed/1_thread");
    group.throughput(Throughput::Elements(1));
    one_thread(&mut group, "tollgate", &tollgate_keys, |keys, at, iters| {
        run(&tollgate, keys, at, iters)
    });
    one_thread(&mut group, "governor", &governor_keys, |keys, at, iters| {
        run(&governor, keys, at, iters)
    });
    one_thread(
        &mut group,
        "governor_string",
        &governor_string_keys,
        |keys, at, iters| run(&governor_string, keys, at, iters),
    );
    group.finish();
    let mut group = c.benchmark_group("keyed/2_threads");
    group.throughput(Throughput::Elements(1));
    two_threads(&mut group, "tollgate", &tollgate_keys, |keys, at, iters| {
        run(&tollgate, keys, at, iters)
    });
    two_threads(&mut group, "governor", &governor_keys, |keys, at, iters| {
        run(&governor, keys, at, iters)
    });
    two_threads(
        &mut group,
        "governor_string",
        &governor_string_keys,
        |keys, at, iters| run(&governor_string, keys, at, iters),
    );
    group.finish();
    fair_runs(c, &order);
}

// What `criterion_group!` and `criterion_main!` expand to, without the
// undocumented `pub fn` the first one generates.
fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    keyed(&mut criterion);
    criterion.final_summary();
}
