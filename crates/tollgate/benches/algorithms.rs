//! Nanoseconds per decision for each algorithm, through the memory store.
//!
//! Every benchmark drives one subject of a fresh [`MemoryStore`] with
//! `decide_now` and an explicit `now` that moves forward by [`STEP`] (9 ms) per
//! decision: 111 requests per second offered to limits of 100 per second, so
//! that about nine decisions in ten are allowed and one in ten is denied
//! once the first burst is spent (the shares are printed before each run).
//! The concurrency benchmark times an acquire and its release (two
//! decisions). See BENCHMARKS.md for the command and the figures.
//!
//! The `live_entries` group times the two algorithms whose state grows with
//! traffic on one key holding 10 to 100 000 live log entries or leases, under
//! limits large enough that every decision is allowed: a sliding log check
//! (one entry leaves the window and one enters at each decision), and an
//! acquire and its release next to that many other leases held.

use std::time::Duration;

use criterion::{black_box, BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use tollgate::{Limit, LimitSpec, MemoryStore, Op, Policy, Refill, Request, Subject, Timestamp, TokenBucketSpec};

/// How far `now` moves between two decisions.
const STEP: u64 = 9_000;

/// The first `now`, µs since the epoch (November 2023).
const START: u64 = 1_700_000_000_000_000;

/// Decisions simulated to report the share allowed.
const SAMPLE: u64 = 100_000;

fn second() -> Duration {
    Duration::from_secs(1)
}

/// The single-limit policies: 100 per second, bursts of 10 where the
/// algorithm has a burst.
fn policies() -> Vec<(&'static str, Policy)> {
    let token_bucket_interval = LimitSpec::TokenBucket(TokenBucketSpec {
        capacity: 10,
        refill: 1,
        interval: Duration::from_millis(10),
        mode: Refill::Interval,
        initial: None,
        max_debt: None,
    })
    .build();
    let limits = [
        ("fixed_window", Limit::fixed_window(100, second())),
        ("sliding_window", Limit::sliding_window(100, second(), 10)),
        ("sliding_log", Limit::sliding_log(100, second())),
        ("token_bucket_smooth", Limit::token_bucket(10, 100, second())),
        ("token_bucket_interval", token_bucket_interval),
        ("reservation", Limit::reservation(100, second(), 10)),
        ("leaky_bucket", Limit::leaky_bucket(100, second(), 10)),
        ("gcra", Limit::gcra(100, second(), 10)),
    ];
    limits
        .into_iter()
        .map(|(name, limit)| (name, Policy::single(limit.expect("valid limit"))))
        .collect()
}

/// 100 per second (GCRA, bursts of 10) and 360 000 per hour (fixed window).
fn two_limits() -> Policy {
    Policy::new([
        ("per_second", Limit::gcra(100, second(), 10).expect("valid limit")),
        (
            "per_hour",
            Limit::fixed_window(360_000, Duration::from_secs(3_600)).expect("valid limit"),
        ),
    ])
    .expect("valid policy")
}

/// Percentage of [`SAMPLE`] checks allowed on a fresh store, for the record.
fn allowed_share(policy: &Policy) -> f64 {
    let store = MemoryStore::new();
    let subject = Subject::new("203.0.113.7");
    let allowed = (1..=SAMPLE)
        .filter(|i| {
            let request = Request::new(Op::Check, 1).at(Timestamp::from_micros(START + i * STEP));
            store
                .decide_now(&subject, policy, &request)
                .expect("a check")
                .decision
                .allowed
        })
        .count();
    allowed as f64 * 100.0 / SAMPLE as f64
}

/// One benchmark: `Op::Check` of cost 1, `now` advancing by [`STEP`].
fn bench_check(group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>, name: &str, policy: &Policy) {
    eprintln!("{name}: {:.1}% allowed", allowed_share(policy));
    let store = MemoryStore::new();
    let subject = Subject::new("203.0.113.7");
    let mut now = START;
    group.bench_function(name, |b| {
        b.iter(|| {
            now += STEP;
            let request = Request::new(Op::Check, 1).at(Timestamp::from_micros(now));
            black_box(store.decide_now(black_box(&subject), black_box(policy), black_box(&request)))
        });
    });
}

fn algorithms(c: &mut Criterion) {
    let mut group = c.benchmark_group("algorithms");
    group.throughput(Throughput::Elements(1));
    for (name, policy) in policies() {
        bench_check(&mut group, name, &policy);
    }
    bench_check(&mut group, "gcra_per_second+fixed_window_per_hour", &two_limits());

    // Concurrency is taken with a lease and given back: one acquire and its
    // release per iteration, so two decisions. The requests are built once
    // (the lease name is a `String`) and only their `now` moves.
    let policy = Policy::single(Limit::concurrency(10, Duration::from_secs(30)).expect("valid limit"));
    let store = MemoryStore::new();
    let subject = Subject::new("203.0.113.7");
    let mut acquire = Request::new(
        Op::Acquire {
            lease: "0123456789abcdef".to_owned(),
            max_wait: None,
        },
        1,
    );
    let mut release = Request::new(
        Op::Release {
            lease: "0123456789abcdef".to_owned(),
        },
        0,
    );
    let mut now = START;
    group.throughput(Throughput::Elements(2));
    group.bench_function("concurrency_acquire+release", |b| {
        b.iter(|| {
            now += STEP;
            acquire.now = Some(Timestamp::from_micros(now));
            release.now = Some(Timestamp::from_micros(now));
            let acquired = store.decide_now(black_box(&subject), black_box(&policy), black_box(&acquire));
            let released = store.decide_now(black_box(&subject), black_box(&policy), black_box(&release));
            black_box((acquired, released))
        });
    });
    group.finish();
}

/// Live log entries or leases held on the key in the `live_entries` group.
const LIVE: [u64; 4] = [10, 1_000, 20_000, 100_000];

/// A sliding log check on a key holding `live` entries: the window spans
/// `live` steps of 10 µs, so each decision drops the oldest entry and adds one.
fn bench_log(group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>, live: u64) {
    const STEP: u64 = 10;
    let window = Duration::from_micros(live * STEP);
    let policy = Policy::single(Limit::sliding_log(live + 1, window).expect("valid limit"));
    let subject = Subject::new("203.0.113.7");
    let check = |store: &MemoryStore, now: u64| {
        let request = Request::new(Op::Check, 1).at(Timestamp::from_micros(now));
        store.decide_now(&subject, &policy, &request).expect("a check")
    };
    // Filled on the first run only (not at all when filtered out).
    let mut filled = None;
    group.bench_function(BenchmarkId::new("sliding_log", live), |b| {
        let (store, now) = filled.get_or_insert_with(|| {
            let store = MemoryStore::new();
            let mut now = START;
            for _ in 0..live {
                now += STEP;
                check(&store, now);
            }
            now += STEP;
            let last = check(&store, now).decision;
            assert!(last.allowed && last.remaining == 1, "{live} live entries: {last:?}");
            (store, now)
        });
        b.iter(|| {
            *now += STEP;
            black_box(check(store, black_box(*now)))
        });
    });
}

/// An acquire and its release next to `live` other leases held for a day,
/// `now` advancing by 1 µs.
fn bench_leases(group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>, live: u64) {
    let policy = Policy::single(Limit::concurrency(live + 1, Duration::from_secs(86_400)).expect("valid limit"));
    let subject = Subject::new("203.0.113.7");
    let mut acquire = Request::new(
        Op::Acquire {
            lease: "0123456789abcdef".to_owned(),
            max_wait: None,
        },
        1,
    );
    let mut release = Request::new(
        Op::Release {
            lease: "0123456789abcdef".to_owned(),
        },
        0,
    );
    // Filled on the first run only (not at all when filtered out).
    let mut filled = None;
    group.bench_function(BenchmarkId::new("concurrency_acquire+release", live), |b| {
        let (store, now) = filled.get_or_insert_with(|| {
            let store = MemoryStore::new();
            let mut now = START;
            for held in 0..live {
                now += 1;
                let lease = format!("held-{held}");
                let request = Request::new(Op::Acquire { lease, max_wait: None }, 1).at(Timestamp::from_micros(now));
                let outcome = store.decide_now(&subject, &policy, &request).expect("an acquire");
                assert!(outcome.decision.allowed, "lease {held} of {live} denied");
            }
            (store, now)
        });
        b.iter(|| {
            *now += 1;
            acquire.now = Some(Timestamp::from_micros(*now));
            release.now = Some(Timestamp::from_micros(*now));
            let acquired = store.decide_now(black_box(&subject), black_box(&policy), black_box(&acquire));
            let released = store.decide_now(black_box(&subject), black_box(&policy), black_box(&release));
            black_box((acquired, released))
        });
    });
}

fn live_entries(c: &mut Criterion) {
    let mut group = c.benchmark_group("live_entries");
    group.throughput(Throughput::Elements(1));
    for live in LIVE {
        bench_log(&mut group, live);
    }
    group.throughput(Throughput::Elements(2));
    for live in LIVE {
        bench_leases(&mut group, live);
    }
    group.finish();
}

// What `criterion_group!` and `criterion_main!` expand to, without the
// undocumented `pub fn` the first one generates.
fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    algorithms(&mut criterion);
    live_entries(&mut criterion);
    criterion.final_summary();
}
