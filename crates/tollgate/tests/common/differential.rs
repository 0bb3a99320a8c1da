//! The differential test: a memory store and another store replay the same
//! random traces (every operation, several policies sharing limit names,
//! explicit `now`) and must give the same answers, step by step.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::{
    GcraSpec, Limit, LimitSpec, MemoryStore, Op, Period, Policy, Refill, Request, ReservationSpec, Store, Subject,
    Timestamp, TokenBucketSpec,
};

#[derive(Debug, Clone)]
pub enum StepOp {
    Check,
    AtMost,
    Reserve(Option<u64>),
    Acquire(u8),
    Release(u8),
    /// Give back the step's cost taken `k` steps ago (at that step's
    /// instant), with a lease when given.
    Refund(u8, Option<u8>),
    Reset,
    /// Count the step's cost as spent already ([`Op::Record`]).
    Record,
}

#[derive(Debug, Clone)]
pub struct Step {
    pub dt: u64,
    pub key: u8,
    pub cost: u64,
    pub op: StepOp,
    /// Per-limit costs for a two-limit policy.
    pub costs: Option<(u64, u64)>,
    /// Which of the trace's policies decides (modulo their number).
    pub policy: u8,
}

/// Microseconds as a duration.
pub fn micros(value: u64) -> Duration {
    Duration::from_micros(value)
}

/// Any limit; a third of those that can record their overage do.
pub fn any_limit() -> impl Strategy<Value = Limit> {
    (any_base_limit(), proptest::bool::weighted(0.3)).prop_map(|(limit, overage)| {
        if overage && !limit.is_concurrency() {
            limit.recording_overage().unwrap()
        } else {
            limit
        }
    })
}

fn any_base_limit() -> impl Strategy<Value = Limit> {
    let count = 1u64..12;
    let period = 1u64..3_000_000;
    prop_oneof![
        (count.clone(), period.clone()).prop_map(|(limit, window)| Limit::fixed_window(limit, micros(window)).unwrap()),
        (
            count.clone(),
            prop::sample::select(vec![Period::Day, Period::Week, Period::Month, Period::Year]),
            prop::sample::select(vec!["UTC", "Europe/Paris", "Asia/Tokyo", "America/New_York"])
        )
            .prop_map(|(limit, period, zone)| Limit::calendar_window(limit, period, zone).unwrap()),
        (count.clone(), 1u64..8, 1u64..300_000).prop_map(|(limit, buckets, sub)| Limit::sliding_window(
            limit,
            micros(buckets * sub),
            buckets
        )
        .unwrap()),
        (count.clone(), period.clone()).prop_map(|(limit, window)| Limit::sliding_log(limit, micros(window)).unwrap()),
        (
            count.clone(),
            1u64..10,
            period.clone(),
            any::<bool>(),
            0u64..=100,
            proptest::option::weighted(0.3, 0u64..10),
        )
            .prop_map(|(capacity, refill, interval, interval_mode, initial, max_debt)| {
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
                    max_debt,
                })
                .build()
                .unwrap()
            }),
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
        (
            1u64..50,
            period.clone(),
            count.clone(),
            proptest::option::weighted(0.3, 0u64..10)
        )
            .prop_map(|(rate, period, burst, max_debt)| LimitSpec::Gcra(GcraSpec {
                rate,
                period: micros(period),
                burst,
                max_debt,
            })
            .build()
            .unwrap()),
        (count, period).prop_map(|(limit, ttl)| Limit::concurrency(limit, micros(ttl)).unwrap()),
    ]
}

pub fn any_policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        2 => any_limit().prop_map(Policy::single),
        1 => (any_limit(), any_limit()).prop_map(|(a, b)| Policy::new([("first", a), ("second", b)]).unwrap()),
    ]
}

pub fn any_steps() -> impl Strategy<Value = Vec<Step>> {
    let op = prop_oneof![
        6 => Just(StepOp::Check),
        1 => Just(StepOp::AtMost),
        2 => proptest::option::of(0u64..2_000_000).prop_map(StepOp::Reserve),
        3 => (0u8..6).prop_map(StepOp::Acquire),
        2 => (0u8..6).prop_map(StepOp::Release),
        2 => (0u8..3, proptest::option::of(0u8..6)).prop_map(|(k, lease)| StepOp::Refund(k, lease)),
        1 => Just(StepOp::Reset),
        2 => Just(StepOp::Record),
    ];
    let dt = prop_oneof![3 => Just(0u64), 3 => 0u64..100_000, 2 => 0u64..3_000_000];
    let cost = prop_oneof![5 => Just(1u64), 2 => 0u64..15, 1 => 0u64..60];
    let costs = proptest::option::weighted(0.2, (0u64..8, 0u64..8));
    prop::collection::vec(
        (dt, 0u8..2, cost, op, costs, 0u8..3).prop_map(|(dt, key, cost, op, costs, policy)| Step {
            dt,
            key,
            cost,
            op,
            costs,
            policy,
        }),
        1..40,
    )
}

/// Three policies over the same limit names: `first` and `second` together,
/// `first` alone, and `second` alone but defined anew (often as another
/// algorithm), so that a trace mixes a limit's decisions across policy shapes
/// and redefinitions.
pub fn any_policies_sharing_names() -> impl Strategy<Value = [Policy; 3]> {
    (any_limit(), any_limit(), any_limit()).prop_map(|(first, second, redefined)| {
        [
            Policy::new([("first", first.clone()), ("second", second)]).unwrap(),
            Policy::new([("first", first)]).unwrap(),
            Policy::new([("second", redefined)]).unwrap(),
        ]
    })
}

pub async fn replay<S: Store>(store: &S, policies: &[Policy], steps: &[Step], subjects: &[Subject; 2]) -> Vec<String> {
    let mut now = super::conformance::T0;
    let mut answers = Vec::new();
    let mut instants = Vec::new();
    for step in steps {
        now += step.dt;
        instants.push(now);
        let subject = &subjects[usize::from(step.key)];
        let policy = &policies[usize::from(step.policy) % policies.len()];
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
            StepOp::Refund(back, lease) => Op::Refund {
                at: Timestamp::from_micros(instants[instants.len().saturating_sub(1 + usize::from(back))]),
                lease: lease.map(|lease| format!("lease-{lease}")),
            },
            StepOp::Record => Op::Record,
            StepOp::Reset => {
                answers.push(format!(
                    "{:?}",
                    store.reset(subject, policy).await.map_err(|e| e.to_string())
                ));
                continue;
            }
        };
        let mut request = Request::new(op, step.cost).at(Timestamp::from_micros(now));
        if let (Some((first, second)), 2) = (step.costs, policy.len()) {
            request = request.with_costs(vec![first, second]);
        }
        let outcome = store
            .decide(subject, policy, &request)
            .await
            .map_err(|error| error.to_string());
        answers.push(format!("{outcome:?}"));
    }
    answers
}

/// Replays `cases` traces through a memory store and through `store` (on
/// `runtime`), each step deciding by one of the trace's policies, and
/// compares every answer. Subjects are fresh per case and per `label`.
/// Failing cases are kept in `regressions` (a path from the crate's
/// directory) and replayed first on the next run.
pub fn memory_and_store_agree<S: Store>(
    runtime: &tokio::runtime::Runtime,
    store: &S,
    cases: u32,
    policies: impl Strategy<Value = Vec<Policy>>,
    label: &str,
    regressions: &'static str,
) {
    let case = AtomicUsize::new(0);
    let config = ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct(
            regressions,
        ))),
        ..ProptestConfig::default()
    };
    proptest!(config, |(policies in policies, steps in any_steps())| {
        // A fresh pair of subjects per case: no state carries over.
        let case = case.fetch_add(1, Ordering::Relaxed);
        let subjects = [Subject::new(label).and(case).and("a"), Subject::new(label).and(case).and("b:{x}")];
        let memory = MemoryStore::new();
        let expected = runtime.block_on(replay(&memory, &policies, &steps, &subjects));
        let actual = runtime.block_on(replay(store, &policies, &steps, &subjects));
        for (index, (expected, actual)) in expected.iter().zip(&actual).enumerate() {
            prop_assert_eq!(expected, actual, "step {} of {:?}\npolicies {:?}", index, steps, policies);
        }
    });
}
