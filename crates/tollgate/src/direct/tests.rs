use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::clock::ManualClock;
use crate::{Limit, MemoryStore, Subject};

const T0: u64 = 1_700_000_000_123_457;

/// The policies compared: the lock-free GCRA (also recording its
/// overage), a GCRA whose interval is not whole microseconds, the other
/// algorithms, and a policy of two.
fn policies() -> Vec<Policy> {
    let s = Duration::from_secs;
    let ms = Duration::from_millis;
    vec![
        Policy::single(Limit::gcra(10, s(1), 3).unwrap()),
        Policy::single(Limit::gcra(10, s(1), 3).unwrap().recording_overage().unwrap()),
        Policy::single(Limit::gcra(7, s(1), 2).unwrap()),
        Policy::single(Limit::token_bucket(5, 2, s(1)).unwrap()),
        Policy::single(Limit::fixed_window(4, ms(700)).unwrap()),
        Policy::single(Limit::sliding_window(6, s(1), 10).unwrap()),
        Policy::single(Limit::reservation(4, s(1), 2).unwrap()),
        Policy::single(Limit::sliding_log(5, ms(900)).unwrap()),
        Policy::single(Limit::leaky_bucket(3, s(1), 4).unwrap()),
        Policy::single(Limit::concurrency(3, ms(500)).unwrap()),
        Policy::new([
            ("per_second", Limit::gcra(5, s(1), 5).unwrap()),
            ("per_window", Limit::fixed_window(8, s(2)).unwrap()),
        ])
        .unwrap(),
    ]
}

/// The request of step `ask` (0–5) weighing `cost`, at `now`.
fn request(ask: u8, cost: u64, now: u64, lease: u8) -> Request {
    let op = match ask {
        0 | 1 => Op::Check,
        2 => Op::Record,
        3 => Op::Reserve {
            max_wait: Some(Duration::from_millis(300)),
        },
        4 => Op::Acquire {
            lease: format!("lease-{lease}"),
            max_wait: None,
        },
        _ => Op::Release {
            lease: format!("lease-{lease}"),
        },
    };
    Request::new(op, cost).at(Timestamp::from_micros(now))
}

proptest! {
    /// Whatever the policy and the requests, a direct limiter decides
    /// as a memory store does for one subject by the general step,
    /// outcome for outcome: its one-word path included.
    #[test]
    fn decides_as_the_memory_store_does(
        policy in 0..11usize,
        steps in proptest::collection::vec((0u64..400_000, 0u8..6, 0u64..5, 0u8..3), 1..40),
    ) {
        let policy = &policies()[policy];
        let direct = DirectLimiter::with_clock(policy.clone(), ManualClock::new(Timestamp::EPOCH));
        // The store decides by the general step alone: the direct
        // limiter's word is held to that step.
        let general = policy.clone().without_kernel();
        let store = MemoryStore::with_clock(ManualClock::new(Timestamp::EPOCH));
        let subject = Subject::new("one");
        let mut now = T0;
        for (dt, ask, cost, lease) in steps {
            now += dt;
            let request = request(ask, cost, now, lease);
            // Outcomes, or the errors' messages (an operation refused).
            let expected = store.decide_now(&subject, &general, &request).map_err(|error| error.to_string());
            if ask == 0 {
                // A check by `check_at`: the decision of the same outcome.
                let got = direct.check_at(cost, Timestamp::from_micros(now)).map_err(|error| error.to_string());
                prop_assert_eq!(got, expected.map(|outcome| outcome.decision), "check at {}", now);
                continue;
            }
            let got = direct.decide_now(&request).map_err(|error| error.to_string());
            prop_assert_eq!(got, expected, "{:?} at {}", request.op, now);
        }
    }
}

#[test]
fn whole_microsecond_gcra_is_lock_free_and_others_are_not() {
    let lock_free = |policy: &Policy| matches!(DirectLimiter::new(policy.clone()).cell, Cell::Word(..));
    let policies = policies();
    assert!(lock_free(&policies[0]) && lock_free(&policies[1]));
    assert!(policies[2..].iter().all(|policy| !lock_free(policy)));
}

#[test]
fn reset_forgets_every_state() {
    for policy in policies() {
        let direct = DirectLimiter::with_clock(policy.clone(), ManualClock::new(Timestamp::from_micros(T0)));
        let fresh = direct.decide_now(&request(0, 0, T0, 0)).unwrap();
        let spent = if policy.has_concurrency() {
            request(4, 1, T0, 0)
        } else {
            request(0, 1, T0, 0)
        };
        assert!(direct.decide_now(&spent).unwrap().decision.allowed);
        assert_ne!(direct.decide_now(&request(0, 0, T0, 0)).unwrap(), fresh);
        direct.reset();
        assert_eq!(direct.decide_now(&request(0, 0, T0, 0)).unwrap(), fresh, "{policy:?}");
    }
}

/// Eight threads on one lock-free limit admit exactly its burst.
#[test]
fn threads_racing_admit_exactly_the_burst() {
    let direct = DirectLimiter::with_clock(
        Limit::gcra(1, Duration::from_secs(3600), 1000).unwrap(),
        ManualClock::new(Timestamp::from_micros(T0)),
    );
    let admitted: u64 = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| (0..1000).filter(|_| direct.check(1).unwrap().allowed).count() as u64))
            .collect();
        threads.into_iter().map(|thread| thread.join().unwrap()).sum()
    });
    assert_eq!(admitted, 1000);
}
