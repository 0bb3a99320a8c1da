//! The one-word path against the general step: a store deciding a policy by
//! its kernel decides as the same store deciding it by the general step.

use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::clock::ManualClock;
use crate::Limit;

const T0: u64 = 1_700_000_000_123_457;

/// The request of step `ask` (1–5) weighing `cost`, at `now`; `taken`: an
/// earlier instant, for a refund.
fn request(ask: u8, cost: u64, now: u64, taken: u64) -> Request {
    let op = match ask {
        1 => Op::Check,
        2 => Op::CheckAtMost,
        3 => Op::Record,
        4 => Op::Refund {
            at: Timestamp::from_micros(taken),
            lease: None,
        },
        _ => Op::Acquire {
            lease: "one".into(),
            max_wait: None,
        },
    };
    Request::new(op, cost).at(Timestamp::from_micros(now))
}

proptest! {
    /// Whatever the limit offering a kernel (recording its overage or not)
    /// and the requests on a few subjects, the memory store's word path
    /// (`check_at` and `decide_now`) gives the outcome of its general step.
    #[test]
    fn the_word_path_decides_as_the_general_step(
        rate in 1u64..40,
        micros_per_cell in 1u64..200_000,
        burst in 1u64..20,
        recording: bool,
        steps in proptest::collection::vec((0u64..150_000, 0u8..6, 0u64..25, 0u8..3), 1..60),
    ) {
        let limit = Limit::gcra(rate, Duration::from_micros(rate * micros_per_cell), burst).unwrap();
        let limit = if recording { limit.recording_overage().unwrap() } else { limit };
        let fast = Policy::single(limit);
        prop_assert!(fast.kernel().is_some());
        let general = fast.clone().without_kernel();
        let word = MemoryStore::with_clock(ManualClock::new(Timestamp::EPOCH));
        let step = MemoryStore::with_clock(ManualClock::new(Timestamp::EPOCH));
        let mut now = T0;
        let mut taken = T0;
        for (dt, ask, cost, who) in steps {
            now += dt;
            let subject = Subject::new("tenant").and(format!("id={who}"));
            if ask == 0 {
                let at = Timestamp::from_micros(now);
                let got = word.check_at(&subject, &fast, cost, at).map_err(|error| error.to_string());
                let expected = step.check_at(&subject, &general, cost, at).map_err(|error| error.to_string());
                prop_assert_eq!(got, expected, "check at {}", now);
                taken = now;
                continue;
            }
            let request = request(ask, cost, now, taken);
            let got = word.decide_now(&subject, &fast, &request).map_err(|error| error.to_string());
            let expected = step.decide_now(&subject, &general, &request).map_err(|error| error.to_string());
            prop_assert_eq!(got, expected, "{:?} at {}", request.op, now);
            taken = now;
        }
    }
}

/// A limit redefined under the same name (a window, then a kernel's limit,
/// then the window again) starts afresh each time, as on the general step.
#[test]
fn a_limit_redefined_under_its_name_starts_afresh() {
    let store = MemoryStore::with_clock(ManualClock::new(Timestamp::from_micros(T0)));
    let subject = Subject::new("one");
    let window = Policy::new([("rule", Limit::fixed_window(2, Duration::from_secs(60)).unwrap())]).unwrap();
    let tat = Policy::new([("rule", Limit::gcra(1, Duration::from_secs(60), 1).unwrap())]).unwrap();
    assert!(tat.kernel().is_some() && window.kernel().is_none());
    assert!(store.check(&subject, &window, 2).unwrap().allowed);
    assert!(store.check(&subject, &tat, 1).unwrap().allowed);
    assert!(!store.check(&subject, &tat, 1).unwrap().allowed);
    assert!(store.check(&subject, &window, 2).unwrap().allowed);
    assert_eq!(store.len(), 1);
}

/// A GCRA whose interval is not whole microseconds leaves an instant with a
/// fraction, which no word holds: a whole-µs GCRA redefined under the same
/// name reads it by the general step, as the Redis store does, and is
/// refused until that instant.
#[test]
fn a_fractional_instant_under_a_kernels_name_is_read_by_the_general_step() {
    let store = MemoryStore::with_clock(ManualClock::new(Timestamp::from_micros(T0)));
    let subject = Subject::new("one");
    let fractional = Policy::new([("rule", Limit::gcra(2, Duration::from_micros(616_497), 1).unwrap())]).unwrap();
    let whole = Policy::new([("rule", Limit::gcra(1, Duration::from_micros(1), 1).unwrap())]).unwrap();
    assert!(fractional.kernel().is_none() && whole.kernel().is_some());
    assert!(store.check(&subject, &fractional, 1).unwrap().allowed);
    let at = Timestamp::from_micros(T0);
    let checked = store.check_at(&subject, &whole, 1, at).unwrap();
    assert!(!checked.allowed);
    assert_eq!(checked.retry_after, Some(Duration::from_micros(308_249)));
    let decided = store
        .decide_now(&subject, &whole, &Request::new(Op::Check, 1).at(at))
        .unwrap();
    assert_eq!(decided.decision, checked);
}
