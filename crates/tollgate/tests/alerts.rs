//! Alert thresholds: a decision that takes a limit's use from below a
//! threshold to at or above it reports the crossing, found in the store's
//! atomic step, so that each crossing is reported once however many
//! processes share the store; on the memory store, the module and the Lua
//! library alike.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use tollgate::{Crossing, Limit, MemoryStore, Op, Outcome, Policy, RedisStore, Request, Store, Subject, Timestamp};

use common::conformance::T0;
use common::redis_server::RedisServer;

const DAY: Duration = Duration::from_secs(86_400);
const THRESHOLDS: [u8; 3] = [50, 80, 100];

/// A day's window of `limit` units alerting at 50, 80 and 100 %, recording
/// the overage of a check it refuses when `overage`.
fn budget(limit: u64, overage: bool) -> Policy {
    let mut window = Limit::fixed_window(limit, DAY).unwrap().alerting(THRESHOLDS).unwrap();
    if overage {
        window = window.recording_overage().unwrap();
    }
    Policy::new([("budget", window)]).unwrap()
}

/// One call of a trace: a check, a record (usage reported after the fact)
/// or a refund of units taken at the trace's start.
#[derive(Debug, Clone, Copy)]
enum Call {
    Check(u64),
    Record(u64),
    Refund(u64),
}

fn request(index: usize, call: Call) -> Request {
    let at = Timestamp::from_micros(T0 + index as u64);
    match call {
        Call::Check(cost) => Request::new(Op::Check, cost).at(at),
        Call::Record(cost) => Request::new(Op::Record, cost).at(at),
        Call::Refund(cost) => Request::new(
            Op::Refund {
                at: Timestamp::from_micros(T0),
                lease: None,
            },
            cost,
        )
        .at(at),
    }
}

/// The thresholds crossed, per call, as reported.
fn reported(outcome: &Outcome) -> Vec<u8> {
    outcome.crossed.iter().map(|crossing| crossing.threshold).collect()
}

/// The thresholds a single counter would cross, per call: the use (the
/// limit less what remains, as each answer reports it) rising from the
/// previous call's through each.
fn model(limit: u64, outcomes: &[Outcome]) -> Vec<Vec<u8>> {
    let mut before = 0;
    outcomes
        .iter()
        .map(|outcome| {
            let after = limit - outcome.decision.remaining.min(limit);
            let crossed = THRESHOLDS
                .iter()
                .copied()
                .filter(|&threshold| {
                    let at = u64::from(threshold) * limit;
                    before * 100 < at && after * 100 >= at
                })
                .collect();
            before = after;
            crossed
        })
        .collect()
}

async fn replay<S: Store>(store: &S, subject: &Subject, policy: &Policy, calls: &[Call]) -> Vec<Outcome> {
    let mut outcomes = Vec::with_capacity(calls.len());
    for (index, &call) in calls.iter().enumerate() {
        outcomes.push(store.decide(subject, policy, &request(index, call)).await.unwrap());
    }
    outcomes
}

fn a_call() -> impl Strategy<Value = Call> {
    prop_oneof![
        4 => (0u64..40).prop_map(Call::Check),
        2 => (0u64..60).prop_map(Call::Record),
        1 => (1u64..30).prop_map(Call::Refund),
    ]
}

static CASES: AtomicUsize = AtomicUsize::new(0);

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Across random checks, reports after the fact and refunds, the
    /// thresholds each call reports are those a single counter would
    /// cross, on memory, on the module and on Lua.
    #[test]
    fn the_thresholds_crossed_are_a_single_counters(
        limit in 20u64..400,
        overage in any::<bool>(),
        calls in prop::collection::vec(a_call(), 1..80),
    ) {
        let server = RedisServer::start_with_module(&[]);
        let runtime = common::runtime();
        let policy = budget(limit, overage);
        let case = CASES.fetch_add(1, Ordering::Relaxed);
        let subject = Subject::new(format!("tenant-{case}"));
        let memory = runtime.block_on(replay(&MemoryStore::new(), &subject, &policy, &calls));
        let expected = model(limit, &memory);
        prop_assert_eq!(memory.iter().map(reported).collect::<Vec<_>>(), expected.clone(), "memory");
        for engine in ["module", "lua"] {
            let store = runtime
                .block_on(RedisStore::builder(format!("{}?engine={engine}", server.url())).prefix(format!("alerts-{engine}")).connect())
                .unwrap();
            let redis = runtime.block_on(replay(&store, &subject, &policy, &calls));
            prop_assert_eq!(redis.iter().map(reported).collect::<Vec<_>>(), expected.clone(), "{}", engine);
            // With the figures of the answer.
            for (outcome, memory) in redis.iter().zip(&memory) {
                prop_assert_eq!(&outcome.crossed, &memory.crossed, "{}", engine);
            }
        }
    }
}

/// Two processes (two stores on one server) and eight tasks push one
/// descriptor's budget past 100 %: each threshold is reported exactly once,
/// on the module and on Lua.
#[test]
fn each_crossing_is_reported_once_across_processes() {
    let server = RedisServer::start_with_module(&[]);
    let runtime = tollgate_testkit::runtime();
    for engine in ["module", "lua"] {
        let url = format!("{}?engine={engine}", server.url());
        let crossings: Vec<Crossing> = runtime.block_on(async {
            let replicas = [
                RedisStore::builder(url.as_str()).connect().await.unwrap(),
                RedisStore::builder(url.as_str()).connect().await.unwrap(),
            ];
            let policy = Arc::new(budget(1_000, false));
            let subject = Subject::new(format!("acme-{engine}"));
            let mut tasks = Vec::new();
            for task in 0..8 {
                let store = replicas[task % 2].clone();
                let (policy, subject) = (policy.clone(), subject.clone());
                tasks.push(tokio::spawn(async move {
                    let mut crossed = Vec::new();
                    // Until refused: 1 000 units, 1 to 3 at a time.
                    for i in 0.. {
                        let cost = 1 + (i + task) as u64 % 3;
                        let outcome = store
                            .decide(&subject, &policy, &Request::new(Op::Check, cost))
                            .await
                            .unwrap();
                        crossed.extend(outcome.crossed);
                        if outcome.decision.remaining == 0 {
                            break;
                        }
                    }
                    crossed
                }));
            }
            let mut all = Vec::new();
            for task in tasks {
                all.extend(task.await.unwrap());
            }
            all
        });
        let mut thresholds: Vec<u8> = crossings.iter().map(|crossing| crossing.threshold).collect();
        thresholds.sort_unstable();
        assert_eq!(thresholds, THRESHOLDS, "{engine}: {crossings:?}");
        for crossing in &crossings {
            assert_eq!(crossing.limit, 1_000);
            assert!(
                crossing.used * 100 >= u64::from(crossing.threshold) * 1_000,
                "{crossing:?}"
            );
            assert!(crossing.reset_after <= DAY);
        }
    }
}

/// A limit given alerts checks them: 1 to 100, at most eight, not leased;
/// JSON reads and writes them.
#[test]
fn alerts_are_validated_and_read_from_json() {
    let window = Limit::fixed_window(10, DAY).unwrap();
    for wrong in [&[0][..], &[101], &[1, 2, 3, 4, 5, 6, 7, 8, 9]] {
        let error = window.clone().alerting(wrong.iter().copied()).unwrap_err();
        assert!(error.to_string().contains("alerts"), "{error}");
    }
    let leased = Limit::gcra(10, Duration::from_secs(1), 10)
        .unwrap()
        .with_lease(Duration::from_millis(50))
        .unwrap();
    assert!(leased.alerting([50]).unwrap_err().to_string().contains("alerts"));
    let limit =
        Limit::from_json(r#"{"algorithm":"fixed_window","limit":10,"window":"1d","alerts":[100,50,50]}"#).unwrap();
    assert_eq!(limit.alerts(), [50, 100]);
    assert_eq!(Limit::from_value(limit.to_value()).unwrap(), limit);
    let error = Limit::from_json(r#"{"algorithm":"fixed_window","limit":10,"window":"1d","alerts":"80"}"#).unwrap_err();
    assert!(error.to_string().contains("alerts"), "{error}");
}

/// With an outbox, the call that crosses a threshold adds it to the stream:
/// read through a consumer group, taken over from a consumer that stopped
/// once idle long enough, gone once acknowledged; on the module and on Lua.
#[test]
fn crossings_are_written_to_the_outbox_by_the_call_that_crossed() {
    let server = RedisServer::start_with_module(&[]);
    let runtime = common::runtime();
    for engine in ["module", "lua"] {
        runtime.block_on(async {
            let store = RedisStore::builder(format!("{}?engine={engine}", server.url()))
                .prefix(format!("outbox-{engine}"))
                .alert_outbox(1_000)
                .connect()
                .await
                .unwrap();
            let outbox = store.outbox("deliver").unwrap();
            // Joined twice: the group is made once.
            outbox.join().await.unwrap();
            outbox.join().await.unwrap();
            let policy = budget(10, false);
            let subject = Subject::new("acme");
            for i in 0..12 {
                let request = Request::new(Op::Check, 1)
                    .at(Timestamp::from_micros(T0 + i))
                    .with_labels(vec![std::sync::Arc::from("acme's budget")]);
                store.decide(&subject, &policy, &request).await.unwrap();
            }
            let thresholds =
                |entries: &[tollgate::OutboxEntry]| entries.iter().map(|entry| entry.threshold).collect::<Vec<_>>();
            let first = outbox.read("a", 2).await.unwrap();
            assert_eq!(thresholds(&first), [50, 80], "{engine}");
            let key = store.key(&subject, "budget");
            for (entry, used) in first.iter().zip([5, 8]) {
                assert_eq!(
                    (entry.key.as_str(), entry.label.as_str()),
                    (key.as_str(), "acme's budget")
                );
                assert_eq!((entry.used, entry.limit), (used, 10));
                assert_eq!(entry.at.as_micros(), T0 + used - 1);
                assert!(
                    entry.reset_at > entry.at && entry.reset_at.as_micros() <= entry.at.as_micros() + 86_400_000_000
                );
            }
            // "a" stops: once idle long enough, "b" takes its entries over.
            assert!(outbox.claim("b", Duration::from_secs(60), 10).await.unwrap().is_empty());
            let claimed = outbox.claim("b", Duration::ZERO, 10).await.unwrap();
            assert_eq!(claimed, first);
            let rest = outbox.read("b", 10).await.unwrap();
            assert_eq!(thresholds(&rest), [100]);
            assert_eq!(outbox.pending("b", 10).await.unwrap().len(), 3);
            let ids: Vec<String> = claimed.iter().chain(&rest).map(|entry| entry.id.clone()).collect();
            outbox.ack(&ids).await.unwrap();
            assert!(outbox.pending("b", 10).await.unwrap().is_empty());
            assert_eq!(outbox.len().await.unwrap(), 0);
        });
    }
}
