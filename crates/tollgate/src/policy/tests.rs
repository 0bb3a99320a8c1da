use proptest::prelude::*;

use crate::algorithm::properties::{checks, commit, ms, refilled, steps, Admission, Harness, START};
use crate::algorithm::{Action, Limit, State};
use crate::policy::Policy;
use crate::request::{Op, Request};

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// A policy is all-or-nothing: a denial leaves every limit as it was, an
    /// admission consumes the cost from every limit, and each limit's own
    /// bound holds.
    #[test]
    fn policies_are_all_or_nothing(
        rate in 1u64..20, burst in 1u64..10, window_limit in 1u64..30, window_ms in 1u64..3_000,
        trace in steps(1_000_000, 12, checks()),
    ) {
        let gcra = Limit::gcra(rate, ms(1_000), burst).unwrap();
        let window = Limit::fixed_window(window_limit, ms(window_ms)).unwrap();
        let policy = Policy::new([("rate", gcra.clone()), ("window", window.clone())]).unwrap();
        let mut states: [Option<State>; 2] = [None, None];
        let mut now = START;
        let mut admitted = Vec::new();
        for step in &trace {
            now += step.dt;
            let refs = [states[0].as_ref(), states[1].as_ref()];
            let before = [gcra.available(refs[0], now), window.available(refs[1], now)];
            let request = crate::Request::new(Op::Check, step.cost);
            let mut writes = Vec::new();
            policy.validate(&request).unwrap();
            let outcome =
                policy.decide_validated(&refs, now, &request, |index, change, ttl| writes.push((index, change, ttl)));
            for (index, change, ttl) in writes {
                commit(&mut states[index], Some(change));
                states[index] = states[index].take().filter(|_| ttl > 0);
            }
            let allowed = outcome.decision.allowed;
            prop_assert_eq!(allowed, outcome.limits.iter().all(|(_, d)| d.allowed));
            let refs = [states[0].as_ref(), states[1].as_ref()];
            let after = [gcra.available(refs[0], now), window.available(refs[1], now)];
            if allowed {
                prop_assert_eq!([before[0] - step.cost, before[1] - step.cost], after);
                if step.cost > 0 {
                    admitted.push(Admission { at: now, cost: step.cost, departs: now });
                }
            } else {
                prop_assert_eq!(before, after, "a denied policy consumed");
                let denying = outcome.limits.iter().filter(|(_, d)| !d.allowed).count();
                prop_assert!(denying >= 1);
            }
        }
        let harness = Harness::of_admissions(&gcra, admitted);
        harness.assert_bound(|a, b| u128::from(burst) + refilled(b - a, rate, 1_000_000));
        let window_us = window_ms * 1_000;
        harness.assert_bound(|a, b| u128::from(window_limit) * u128::from(b / window_us - a / window_us + 1));
    }
}

proptest! {
    /// A check that a limit recording its overage refuses counts its
    /// cost as a record does, and stays refused.
    #[test]
    fn a_refused_check_of_a_limit_recording_its_overage_is_recorded(
        rate in 1u64..50,
        period_us in 1u64..5_000_000,
        burst in 1u64..20,
        debt in 1u64..40,
        bucket: bool,
    ) {
        let period = std::time::Duration::from_micros(period_us);
        let limit = if bucket {
            Limit::token_bucket(burst, rate, period).unwrap()
        } else {
            Limit::gcra(rate, period, burst).unwrap()
        }
        .recording_overage()
        .unwrap();
        let mut recorded = None;
        let full = limit.decide(None, START, Action::Record, burst);
        commit(&mut recorded, full.change);
        let policy = Policy::single(limit.clone());
        let request = Request::new(Op::Check, debt);
        let mut checked = recorded.clone();
        let mut write = None;
        policy.validate(&request).unwrap();
        let outcome = policy.decide_validated(&[checked.as_ref()], START, &request, |_, change, _| write = Some(change));
        commit(&mut checked, write);
        let record = limit.decide(recorded.as_ref(), START, Action::Record, debt);
        commit(&mut recorded, record.change);
        prop_assert!(!outcome.decision.allowed);
        prop_assert_eq!(outcome.granted, 0);
        prop_assert_eq!(checked, recorded);
    }
}
