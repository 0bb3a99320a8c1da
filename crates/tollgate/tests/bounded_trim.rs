//! Bounded work per call: a sliding log or a concurrency limiter's set that
//! holds far more ended entries than one call trims (250) loses at most
//! that many a call, the rest staying, known to have ended, for later calls;
//! and every answer is the memory store's, on the module, on the Lua
//! library, and on the two in turn over the same keys.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;

use tollgate::{Limit, MemoryStore, Op, Policy, RedisStore, Request, Store, Subject, Timestamp};

use common::conformance::T0;
use common::redis_server::RedisServer;

/// The most ended entries one call trims (the engine's `TRIM_STEP`).
const STEP: usize = 250;
const MS: u64 = 1_000;
const SECOND: u64 = 1_000_000;

/// One call of a trace, at an instant from `T0`.
#[derive(Debug, Clone)]
enum Call {
    Check(u64),
    Record(u64),
    /// Gives back `cost` units admitted at an instant from `T0`.
    Refund(u64, u64),
    Acquire(String, u64),
    Release(String),
}

/// A trace: `(µs from T0, policy index, call)`.
type Trace = Vec<(u64, usize, Call)>;

fn request(at: u64, call: &Call) -> Request {
    let (op, cost) = match call {
        Call::Check(cost) => (Op::Check, *cost),
        Call::Record(cost) => (Op::Record, *cost),
        Call::Refund(at, cost) => (
            Op::Refund {
                at: Timestamp::from_micros(T0 + at),
                lease: None,
            },
            *cost,
        ),
        Call::Acquire(lease, cost) => (
            Op::Acquire {
                lease: lease.clone(),
                max_wait: None,
            },
            *cost,
        ),
        Call::Release(lease) => (Op::Release { lease: lease.clone() }, 0),
    };
    Request::new(op, cost).at(Timestamp::from_micros(T0 + at))
}

/// Each call's answer, and (on Redis) how many members the key held after it.
async fn replay<S: Store>(
    stores: &[S],
    policies: &[Policy],
    trace: &Trace,
    mut size: impl FnMut() -> usize,
) -> Vec<(String, usize)> {
    let subject = Subject::new("backlog");
    let mut answers = Vec::with_capacity(trace.len());
    for (index, (at, policy, call)) in trace.iter().enumerate() {
        let store = &stores[index % stores.len()];
        let outcome = store.decide(&subject, &policies[*policy], &request(*at, call)).await;
        answers.push((format!("{:?}", outcome.map_err(|error| error.to_string())), size()));
    }
    answers
}

/// Runs `trace` as [`answers_agree`] does, and checks that the backlog
/// went in steps.
fn agree(server: &RedisServer, engines: &[&str], policies: &[Policy], trace: &Trace, most_removed: usize, label: &str) {
    let most = answers_agree(server, engines, policies, trace, most_removed, label);
    // The backlog was trimmed in steps, not left whole.
    assert!(
        most >= STEP / 2,
        "{label} on {engines:?}: at most {most} removed by one call"
    );
}

/// Runs `trace` on memory and on `server` by `engines` in turn, and checks
/// that every answer agrees and that no call removed more than
/// `most_removed` members of the key; gives the most one call removed.
fn answers_agree(
    server: &RedisServer,
    engines: &[&str],
    policies: &[Policy],
    trace: &Trace,
    most_removed: usize,
    label: &str,
) -> usize {
    let runtime = common::runtime();
    let prefix = format!("trim-{label}-{}", engines.join("-"));
    let stores: Vec<RedisStore> = engines
        .iter()
        .map(|engine| {
            runtime
                .block_on(
                    RedisStore::builder(format!("{}?engine={engine}", server.url()))
                        .prefix(prefix.clone())
                        .connect(),
                )
                .unwrap()
        })
        .collect();
    let name = policies[0].limits().next().unwrap().0.to_owned();
    let key = stores[0].key(&Subject::new("backlog"), &name);
    let memory = runtime.block_on(replay(&[MemoryStore::new()], policies, trace, || 0));
    let mut connection = redis::Client::open(server.url()).unwrap().get_connection().unwrap();
    let redis = runtime.block_on(replay(&stores, policies, trace, || {
        redis::cmd("ZCARD").arg(&key).query(&mut connection).unwrap()
    }));
    let mut before: usize = 0;
    let mut most = 0;
    for (index, ((expected, _), (actual, size))) in memory.iter().zip(&redis).enumerate() {
        assert_eq!(
            expected, actual,
            "{label} on {engines:?}, call {index}: {:?}",
            trace[index]
        );
        let removed = before.saturating_sub(*size);
        assert!(
            removed <= most_removed,
            "{label} on {engines:?}, call {index} ({:?}) removed {removed} members",
            trace[index]
        );
        most = most.max(removed);
        before = *size;
    }
    most
}

/// 2 500 one-unit entries a µs apart, 5 more at 500 ms; at 1 s + 2.6 ms
/// (2 500 ended, 5 live) peeks, a denial, refunds of an ended and a live
/// entry, records and admissions that trim the backlog in steps, and a
/// limit redefined with a window of 3 s (under which the ended entries not
/// yet trimmed count again).
fn a_backlogged_log() -> Trace {
    let mut trace: Trace = (0..2_500).map(|i| (i, 0, Call::Check(1))).collect();
    trace.extend((0..5).map(|i| (500 * MS + i, 0, Call::Check(1 + i))));
    let now = SECOND + 2_600;
    for cost in [0, 1, 4_000, 9_985, 9_986, 10_001] {
        trace.push((now, 0, Call::Check(cost)));
    }
    trace.push((now, 0, Call::Refund(10, 1)));
    trace.push((now, 0, Call::Refund(500 * MS + 2, 2)));
    trace.push((now, 0, Call::Check(0)));
    trace.push((now, 0, Call::Check(1)));
    trace.push((now, 1, Call::Check(0)));
    trace.push((now, 1, Call::Check(8_500)));
    trace.push((now + 1, 0, Call::Record(20)));
    trace.push((now + 2, 1, Call::Check(0)));
    trace.push((now + 3, 0, Call::Check(2)));
    trace.push((now + 4, 0, Call::Check(0)));
    trace.push((now + 5, 0, Call::Check(1)));
    trace.push((3 * SECOND, 0, Call::Check(1)));
    trace
}

/// `ended` leases of `cost(i)` units a µs apart for 1 s, 10 more at 500 ms
/// (and `live` more of `live_cost` units at 600 ms); at 1 s + 2.6 ms peeks,
/// denials that walk the live leases, a renewal of an ended lease beyond
/// the first step, releases of an ended and a live lease, and acquires.
fn a_backlog_of_leases(ended: u64, cost: fn(u64) -> u64, live: u64, live_cost: u64) -> Trace {
    let mut trace: Trace = (0..ended)
        .map(|i| (i, 0, Call::Acquire(format!("l{i}"), cost(i))))
        .collect();
    trace.extend((0..10).map(|i| (500 * MS + i, 0, Call::Acquire(format!("live{i}"), 1 + i % 2))));
    trace.extend((0..live).map(|i| (600 * MS + i, 0, Call::Acquire(format!("more{i}"), live_cost))));
    let now = SECOND + 2_600;
    let held = 15 + live_cost * live;
    for call in [
        Call::Check(0),
        Call::Acquire("big".into(), 10_000 - held + 1),
        Call::Acquire("big".into(), 10_000 - held + 12),
        Call::Acquire(format!("l{}", ended - 100), 10_000 - held),
        Call::Release(format!("l{}", ended - 200)),
        Call::Check(0),
        Call::Release("live3".into()),
        Call::Acquire(format!("l{}", ended - 300), 3),
        Call::Acquire("x1".into(), 1),
        Call::Check(0),
        Call::Acquire("x2".into(), 2),
        Call::Acquire("x3".into(), 1),
        Call::Acquire("x4".into(), 10_000),
    ] {
        trace.push((now, 0, call));
    }
    trace
}

/// `ended` one-unit leases a µs apart, all ended at 1 s + 2.6 ms: peeks,
/// releases of a lease read and of one unread, acquires and the release
/// that leaves no lease live; each call trims a step of the backlog, and
/// none drops the set whole.
fn an_ended_backlog_of_leases(ended: u64) -> Trace {
    let mut trace: Trace = (0..ended).map(|i| (i, 0, Call::Acquire(format!("l{i}"), 1))).collect();
    let now = SECOND + 2_600;
    let calls = [
        Call::Check(0),
        Call::Release("l3".into()),
        Call::Release(format!("l{}", ended - 5)),
        Call::Acquire("a".into(), 2),
        Call::Release("a".into()),
        Call::Check(0),
        Call::Acquire(format!("l{}", ended - 7), 1),
        Call::Release(format!("l{}", ended - 7)),
        Call::Acquire("b".into(), 10_000),
        Call::Acquire("c".into(), 1),
    ];
    trace.extend(calls.into_iter().enumerate().map(|(i, call)| (now + i as u64, 0, call)));
    trace
}

/// `entries` one-unit entries a µs apart under a window of 1 s, the log
/// lapsed at 3 s: peeks, admissions under 1 s and under a window of 3 s
/// redefined (which must not count the lapsed entries again: the memory
/// store dropped them), refunds of a lapsed entry and of the only live one
/// (which leaves none live); each call trims a step, none drops the set.
fn a_lapsed_log(entries: u64) -> Trace {
    let mut trace: Trace = (0..entries).map(|i| (i, 0, Call::Check(1))).collect();
    let now = 3 * SECOND;
    let calls = [
        (0, Call::Check(0)),
        (1, Call::Check(0)),
        (0, Call::Check(2)),
        (1, Call::Check(0)),
        (1, Call::Check(9_999)),
        (0, Call::Refund(5, 1)),
        (0, Call::Refund(3 * SECOND + 2, 2)),
        (1, Call::Check(0)),
        (0, Call::Check(1)),
        (1, Call::Record(3)),
        (0, Call::Check(10_000)),
        (1, Call::Check(1)),
        (0, Call::Check(1)),
    ];
    let at = |i: usize| now + 2 + i as u64;
    trace.extend(
        calls
            .into_iter()
            .enumerate()
            .map(|(i, (policy, call))| (at(i), policy, call)),
    );
    trace
}

#[test]
fn a_backlog_beyond_one_step_is_trimmed_in_steps_and_decided_exactly() {
    let server = RedisServer::start_with_module(&[]);
    let second = Duration::from_secs(1);
    let logs = [
        Policy::new([("log", Limit::sliding_log(10_000, second).unwrap())]).unwrap(),
        Policy::new([("log", Limit::sliding_log(10_000, 3 * second).unwrap())]).unwrap(),
    ];
    let leases = [Policy::new([("leases", Limit::concurrency(10_000, second).unwrap())]).unwrap()];
    let one = |_| 1;
    let mixed = |i| 1 + i % 3;
    let few = |i| if i % 100 == 0 { 3 } else { 1 };
    for engines in [&["module"][..], &["lua"], &["module", "lua"], &["lua", "module"]] {
        // A log's trim removes entries only; leases go with their "\0c" member.
        agree(&server, engines, &logs, &a_backlogged_log(), STEP, "log");
        // A log that lapsed whole goes in steps too ("\0x" renamed).
        agree(&server, engines, &logs, &a_lapsed_log(3_000), STEP + 1, "lapsed");
        // A release or a renewal removes the lease named too (and its "\0c").
        agree(
            &server,
            engines,
            &leases,
            &a_backlog_of_leases(2_500, one, 0, 1),
            STEP + 2,
            "leases",
        );
        // Every lease ended: the set still goes in steps, even when a
        // release leaves none live.
        agree(
            &server,
            engines,
            &leases,
            &an_ended_backlog_of_leases(4_000),
            STEP + 2,
            "all-ended",
        );
        // Leases of other than one unit: the units of the ended ones left
        // are walked where that is shortest (the live leases; those ended
        // leases; the leases of other than one unit).
        let (all, most) = (2 * STEP + 2, STEP + 2);
        agree(
            &server,
            engines,
            &leases,
            &a_backlog_of_leases(2_500, mixed, 0, 1),
            all,
            "mixed",
        );
        agree(
            &server,
            engines,
            &leases,
            &a_backlog_of_leases(1_100, mixed, 1_200, 2),
            all,
            "ended",
        );
        agree(
            &server,
            engines,
            &leases,
            &a_backlog_of_leases(2_500, few, 1_200, 1),
            most + 30,
            "few",
        );
    }
}

/// A random backlog: `ended` entries (leases) of one unit or of 1 to 3 a µs
/// apart, `live` more at 500 ms, then calls at 1 s + 2.6 ms on, some under
/// a limit redefined with a window (a lease) of 3 s.
fn a_random_backlog(leases: bool, mixed: bool, ended: u64, live: u64, calls: &[(u8, u64, u64, u8, u64)]) -> Trace {
    let cost = |i: u64| if mixed { 1 + i % 3 } else { 1 };
    let fill = |i: u64, name: String| {
        if leases {
            Call::Acquire(name, cost(i))
        } else {
            Call::Check(cost(i))
        }
    };
    let mut trace: Trace = (0..ended).map(|i| (i, 0, fill(i, format!("l{i}")))).collect();
    trace.extend((0..live).map(|i| (500 * MS + i, 0, fill(i, format!("live{i}")))));
    let name = |b: u64| match b % 3 {
        0 => format!("l{}", b % ended),
        1 => format!("live{}", b % live.max(1)),
        _ => format!("new{b}"),
    };
    let mut now = SECOND + 2_600;
    for &(kind, a, b, policy, dt) in calls {
        now += dt;
        let at = if b % 2 == 0 {
            b % ended
        } else {
            500 * MS + b % live.max(1)
        };
        let call = match (kind, leases) {
            (0, _) => Call::Check(a % 12_000),
            (1, _) => Call::Check(0),
            (2, false) => Call::Record(a % 300),
            (3, false) => Call::Refund(at, 1 + a % 4),
            (_, false) => Call::Check(1 + a % 3),
            (2 | 3, true) => Call::Acquire(name(b), 1 + a % 4),
            (_, true) => Call::Release(name(b)),
        };
        trace.push((now, usize::from(policy % 2), call));
    }
    trace
}

static CASES: AtomicUsize = AtomicUsize::new(0);

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// Random backlogs beyond a step, with random calls after them (some
    /// under a redefined limit): every answer is the memory store's, on the
    /// module, on Lua and on both in turn.
    #[test]
    fn random_backlogs_are_decided_exactly(
        leases in any::<bool>(),
        mixed in any::<bool>(),
        ended in 600u64..1_400,
        live in 0u64..700,
        calls in prop::collection::vec((0u8..6, 0u64..20_000, 0u64..3_000, 0u8..2, 0u64..2_000), 10..40),
    ) {
        let server = RedisServer::start_with_module(&[]);
        let second = Duration::from_secs(1);
        let policies: Vec<Policy> = [second, 3 * second]
            .into_iter()
            .map(|window| {
                let limit = if leases {
                    Limit::concurrency(10_000, window)
                } else {
                    Limit::sliding_log(10_000, window)
                };
                Policy::new([("backlog", limit.unwrap())]).unwrap()
            })
            .collect();
        let trace = a_random_backlog(leases, mixed, ended, live, &calls);
        let case = CASES.fetch_add(1, Ordering::Relaxed);
        for engines in [&["module"][..], &["lua"], &["module", "lua"]] {
            answers_agree(&server, engines, &policies, &trace, 2 * STEP + 2, &format!("random{case}"));
        }
    }
}
