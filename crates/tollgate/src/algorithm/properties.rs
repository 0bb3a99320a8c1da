//! Property tests shared by every algorithm, over random traces of
//! `(time step, cost)`:
//!
//! - (a) the admitted cost in any interval never exceeds the algorithm's
//!   stated bound (in each module's docs);
//! - (b) waiting `retry_after` and repeating the same request succeeds, and
//!   one microsecond less does not (retry_after is exact);
//! - (c) a denied request leaves the state unchanged;
//! - (d) after a decision, exactly `remaining` further unit requests at the
//!   same instant are admitted and the next is denied;
//! - (e) after `reset_after` with no traffic the limit is full again, and one
//!   microsecond earlier it is not;
//! - (f) a peek never changes anything.
//!
//! The harness also drops state once its `reset_after` has passed, as the
//! stores do, so (a) proves that expiry never forgets too early.

use proptest::prelude::*;

use super::{Action, Change, Limit, State};
use crate::decision::Decision;

/// One admitted request: when, how much, and (shaping) when it departs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admission {
    pub(crate) at: u64,
    pub(crate) cost: u64,
    pub(crate) departs: u64,
}

/// What a trace step asks.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ask {
    Check,
    Reserve(Option<u64>),
    /// Concurrency: acquire a new lease.
    Acquire,
    /// Concurrency: release the lease taken this many acquisitions ago.
    Release(usize),
}

#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub(crate) dt: u64,
    pub(crate) cost: u64,
    pub(crate) ask: Ask,
}

fn us(duration: std::time::Duration) -> u64 {
    crate::clock::micros(duration)
}

/// Start of every trace: an arbitrary instant that is not window-aligned.
pub(crate) const START: u64 = 1_700_000_000_123_457;

pub(crate) struct Harness<'a> {
    limit: &'a Limit,
    state: Option<State>,
    expires: u64,
    now: u64,
    leases: Vec<(String, u64, u64)>,
    taken: usize,
    admissions: Vec<Admission>,
    /// The state may be dropped once it has expired (false for a token
    /// bucket starting below capacity, whose fresh state differs).
    full_when_fresh: bool,
}

impl<'a> Harness<'a> {
    /// The harness of `limit` that admitted `admissions`, to check bounds
    /// over them.
    pub(crate) fn of_admissions(limit: &'a Limit, admissions: Vec<Admission>) -> Self {
        Self {
            admissions,
            ..Self::new(limit, true)
        }
    }

    fn new(limit: &'a Limit, full_when_fresh: bool) -> Self {
        Self {
            limit,
            state: None,
            expires: 0,
            now: START,
            leases: Vec::new(),
            taken: 0,
            admissions: Vec::new(),
            full_when_fresh,
        }
    }

    fn decide<'l>(&self, state: Option<&State>, now: u64, action: Action<'l>, cost: u64) -> super::Step<Change<'l>> {
        self.limit.supports(action, cost).expect("valid action");
        self.limit.decide(state, now, action, cost)
    }

    fn peek(&self, state: Option<&State>, now: u64) -> Decision {
        let step = self.decide(state, now, Action::Check, 0);
        self.assert_unchanged(state, step.change.as_ref(), now, "(f) a peek changed the state");
        step.decision
    }

    /// Nothing changed: no change, or (a token bucket starting below
    /// capacity, on first touch) a stored state that decides exactly as the
    /// absent one did at that instant.
    fn assert_unchanged(&self, before: Option<&State>, after: Option<&Change<'_>>, now: u64, what: &str) {
        let Some(after) = after else { return };
        assert!(before.is_none(), "{what}");
        let Change::Put(after) = after else {
            panic!("{what}: {after:?}")
        };
        let fresh = self.limit.decide(None, now, Action::Check, 0).decision;
        let stored = self.limit.decide(Some(after), now, Action::Check, 0).decision;
        assert_eq!(fresh, stored, "{what}");
    }

    /// (d): exactly `remaining` unit requests fit at `now`, then one is denied.
    fn assert_remaining_is_exact(&self, state: Option<State>, decision: &Decision) {
        let mut state = state;
        for taken in 0..decision.remaining {
            let lease = format!("probe-{taken}");
            let action = self.unit_action(&lease);
            let step = self.decide(state.as_ref(), self.now, action, 1);
            assert!(
                step.decision.allowed,
                "(d) unit {taken} of remaining {} was denied",
                decision.remaining
            );
            commit(&mut state, step.change);
        }
        let lease = "probe-last".to_owned();
        let step = self.decide(state.as_ref(), self.now, self.unit_action(&lease), 1);
        assert!(
            !step.decision.allowed,
            "(d) more than remaining {} admitted",
            decision.remaining
        );
    }

    fn unit_action<'l>(&self, lease: &'l str) -> Action<'l> {
        if self.limit.is_concurrency() {
            Action::Acquire {
                lease: Some(lease),
                max_wait: None,
            }
        } else {
            Action::Check
        }
    }

    #[allow(clippy::too_many_lines)]
    fn run(&mut self, step: &Step) {
        self.now += step.dt;
        if self.now >= self.expires {
            self.state = None;
        }
        self.leases.retain(|&(_, expires, _)| expires > self.now);
        let lease_name = format!("lease-{}", self.taken);
        let release_name;
        let action = match step.ask {
            Ask::Check => Action::Check,
            Ask::Reserve(max_wait) => Action::Reserve(max_wait),
            Ask::Acquire => Action::Acquire {
                lease: Some(&lease_name),
                max_wait: None,
            },
            Ask::Release(back) => {
                let index = self.taken.saturating_sub(back + 1);
                release_name = format!("lease-{index}");
                Action::Release(&release_name)
            }
        };
        let cost = if matches!(step.ask, Ask::Release(_)) {
            0
        } else {
            step.cost
        };

        let before = self.peek(self.state.as_ref(), self.now);
        let result = self.decide(self.state.as_ref(), self.now, action, cost);
        let decision = result.decision.clone();
        assert_eq!(decision.limit, self.limit.capacity());

        if decision.allowed {
            assert_eq!(decision.retry_after, Some(std::time::Duration::ZERO));
        } else {
            // (c) a denial changes nothing.
            self.assert_unchanged(
                self.state.as_ref(),
                result.change.as_ref(),
                self.now,
                "(c) a denied request changed the state",
            );
            assert_eq!(
                decision.remaining, before.remaining,
                "(c) a denial reported another remaining"
            );
            assert_eq!(decision.wait, std::time::Duration::ZERO);
            match decision.retry_after {
                // (b) waiting retry_after suffices, one microsecond less does not.
                Some(retry_after) => {
                    let retry_after = us(retry_after);
                    // What the store holds after the denial (a first touch may anchor a level).
                    let mut basis = self.state.clone();
                    commit(&mut basis, result.change.clone());
                    let later = self.decide(basis.as_ref(), self.now + retry_after, action, cost);
                    assert!(
                        later.decision.allowed,
                        "(b) denied again after retry_after {retry_after} us: {step:?}"
                    );
                    assert!(retry_after > 0, "denied with a zero retry_after");
                    let earlier = self.decide(basis.as_ref(), self.now + retry_after - 1, action, cost);
                    assert!(
                        !earlier.decision.allowed,
                        "(b) retry_after {retry_after} us is longer than needed"
                    );
                }
                None => assert!(cost > self.limit.capacity(), "never admissible, yet cost {cost} fits"),
            }
        }
        if cost == 0 && !matches!(step.ask, Ask::Release(_)) {
            self.assert_unchanged(
                self.state.as_ref(),
                result.change.as_ref(),
                self.now,
                "(f) a zero-cost request changed the state",
            );
        }

        let mut state = self.state.clone();
        let mut expires = self.expires;
        if let Some(change) = result.change {
            let ttl = us(decision.reset_after);
            commit(&mut state, Some(change));
            state = state.filter(|_| ttl > 0);
            expires = self.now + ttl;
        }
        if decision.allowed && cost > 0 {
            self.admissions.push(Admission {
                at: self.now,
                cost,
                departs: self.now + us(decision.wait),
            });
            if matches!(step.ask, Ask::Acquire) {
                self.leases
                    .push((lease_name.clone(), self.now + self.limit_ttl(), cost));
                self.taken += 1;
            }
        }
        if let Ask::Release(back) = step.ask {
            let index = self.taken.saturating_sub(back + 1);
            let name = format!("lease-{index}");
            self.leases.retain(|(id, _, _)| *id != name);
        }

        // (d) remaining is exact, at the same instant.
        self.assert_remaining_is_exact(state.clone(), &decision);

        // (e) after reset_after the limit is full again, and not a microsecond before.
        let reset_after = us(decision.reset_after);
        if self.full_when_fresh {
            let at_reset = self.peek(state.as_ref(), self.now + reset_after);
            assert_eq!(
                at_reset.remaining,
                self.limit.capacity(),
                "(e) not full after reset_after"
            );
            assert_eq!(
                at_reset.reset_after,
                std::time::Duration::ZERO,
                "(e) reset_after not reached"
            );
            if reset_after > 0 {
                let before_reset = self.peek(state.as_ref(), self.now + reset_after - 1);
                assert!(
                    before_reset.reset_after > std::time::Duration::ZERO,
                    "(e) reset_after is longer than needed"
                );
            }
        }
        self.state = state;
        self.expires = expires;

        // Concurrency: what is in flight never exceeds the limit.
        let in_flight: u64 = self.leases.iter().map(|&(_, _, cost)| cost).sum();
        assert!(
            in_flight <= self.limit.capacity(),
            "in flight {in_flight} over the limit"
        );
    }

    fn limit_ttl(&self) -> u64 {
        match self.limit.kind() {
            super::registry::Kind::Concurrency(p) => p.ttl,
            _ => 0,
        }
    }

    /// (a): for every pair of admissions, the cost admitted between them
    /// (both ends included) is within `bound(first, last)`.
    pub(crate) fn assert_bound(&self, bound: impl Fn(u64, u64) -> u128) {
        let admissions = &self.admissions;
        for i in 0..admissions.len() {
            let mut total: u128 = 0;
            for j in i..admissions.len() {
                total += u128::from(admissions[j].cost);
                let allowed = bound(admissions[i].at, admissions[j].at);
                assert!(
                    total <= allowed,
                    "(a) {total} admitted in [{}, {}] (+{} us), bound {allowed}",
                    admissions[i].at,
                    admissions[j].at,
                    admissions[j].at - admissions[i].at
                );
            }
        }
    }
}

/// Commits `change` to `state`, the state it was decided on, as a store does.
pub(crate) fn commit(state: &mut Option<State>, change: Option<Change<'_>>) {
    match (change, state.as_mut()) {
        (None, _) => {}
        (Some(change), Some(state)) => change.apply(state),
        (Some(change), None) => *state = Some(change.into_state().expect("a change made of no state is a state")),
    }
}

pub(crate) fn steps(
    window: u64,
    max_cost: u64,
    asks: impl Strategy<Value = Ask> + Clone,
) -> impl Strategy<Value = Vec<Step>> {
    let dt = prop_oneof![
        3 => Just(0u64),
        3 => 0..=window / 4 + 1,
        2 => 0..=window * 2 + 1,
        1 => Just(window),
        1 => 0..=window * 20,
    ];
    let cost = prop_oneof![6 => Just(1u64), 2 => 0..=max_cost, 1 => Just(0u64)];
    prop::collection::vec(
        (dt, cost, asks).prop_map(|(dt, cost, ask)| Step { dt, cost, ask }),
        1..60,
    )
}

pub(crate) fn checks() -> impl Strategy<Value = Ask> + Clone {
    Just(Ask::Check)
}

fn run<'a>(limit: &'a Limit, steps: &[Step], full_when_fresh: bool) -> Harness<'a> {
    let mut harness = Harness::new(limit, full_when_fresh);
    for step in steps {
        harness.run(step);
    }
    harness
}

/// `floor(elapsed · rate / period)` without overflow.
pub(crate) fn refilled(elapsed: u64, rate: u64, period: u64) -> u128 {
    u128::from(elapsed) * u128::from(rate) / u128::from(period)
}

pub(crate) fn ms(value: u64) -> std::time::Duration {
    std::time::Duration::from_millis(value)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn fixed_window_properties(limit in 1u64..20, window_ms in 1u64..2_000, trace in steps(2_000_000, 25, checks())) {
        let window = window_ms * 1_000;
        let algorithm = Limit::fixed_window(limit, ms(window_ms)).unwrap();
        let trace: Vec<Step> = trace.into_iter().map(|s| Step { dt: s.dt * window / 2_000_000, ..s }).collect();
        let harness = run(&algorithm, &trace, true);
        harness.assert_bound(|a, b| u128::from(limit) * u128::from(b / window - a / window + 1));
    }

    #[test]
    fn sliding_window_properties(limit in 1u64..20, buckets in 1u64..12, sub_ms in 1u64..200, trace in steps(1_000_000, 25, checks())) {
        let window = buckets * sub_ms * 1_000;
        let algorithm = Limit::sliding_window(limit, ms(buckets * sub_ms), buckets).unwrap();
        let trace: Vec<Step> = trace.into_iter().map(|s| Step { dt: s.dt * window / 1_000_000, ..s }).collect();
        let harness = run(&algorithm, &trace, true);
        harness.assert_bound(|a, b| u128::from(limit) * u128::from((b - a + 1).div_ceil(window + 1)));
    }

    #[test]
    fn sliding_log_properties(limit in 1u64..20, window_ms in 1u64..2_000, trace in steps(1_000_000, 25, checks())) {
        let window = window_ms * 1_000;
        let algorithm = Limit::sliding_log(limit, ms(window_ms)).unwrap();
        let trace: Vec<Step> = trace.into_iter().map(|s| Step { dt: s.dt * window / 1_000_000, ..s }).collect();
        let harness = run(&algorithm, &trace, true);
        harness.assert_bound(|a, b| u128::from(limit) * u128::from((b - a + 1).div_ceil(window)));
    }

    #[test]
    fn token_bucket_smooth_properties(capacity in 1u64..20, refill in 1u64..10, interval_us in 1u64..3_000_000, trace in steps(1_000_000, 25, checks())) {
        let algorithm = crate::LimitSpec::TokenBucket(crate::TokenBucketSpec {
            capacity, refill, interval: std::time::Duration::from_micros(interval_us), mode: crate::Refill::Smooth, initial: None, max_debt: None,
        }).build().unwrap();
        let harness = run(&algorithm, &trace, true);
        harness.assert_bound(|a, b| u128::from(capacity) + refilled(b - a, refill, interval_us));
    }

    #[test]
    fn token_bucket_interval_properties(capacity in 1u64..20, refill in 1u64..10, interval_ms in 1u64..2_000, trace in steps(1_000_000, 25, checks())) {
        let interval = interval_ms * 1_000;
        let algorithm = crate::LimitSpec::TokenBucket(crate::TokenBucketSpec {
            capacity, refill, interval: ms(interval_ms), mode: crate::Refill::Interval, initial: None, max_debt: None,
        }).build().unwrap();
        let harness = run(&algorithm, &trace, true);
        harness.assert_bound(|a, b| u128::from(capacity) + u128::from(refill) * u128::from(b / interval - a / interval));
    }

    #[test]
    fn token_bucket_initial_is_never_more_than_full(capacity in 2u64..20, initial_part in 0u64..100, refill in 1u64..10, interval_us in 1u64..3_000_000, mode_interval: bool, trace in steps(1_000_000, 25, checks())) {
        let initial = capacity * initial_part / 100;
        let mode = if mode_interval { crate::Refill::Interval } else { crate::Refill::Smooth };
        let algorithm = crate::LimitSpec::TokenBucket(crate::TokenBucketSpec {
            capacity, refill, interval: std::time::Duration::from_micros(interval_us), mode, initial: Some(initial), max_debt: None,
        }).build().unwrap();
        let harness = run(&algorithm, &trace, false);
        let boundaries = |a: u64, b: u64| u128::from(refill) * u128::from(b / interval_us - a / interval_us);
        harness.assert_bound(|a, b| u128::from(capacity) + if mode_interval { boundaries(a, b) } else { refilled(b - a, refill, interval_us) });
    }

    #[test]
    fn gcra_properties(rate in 1u64..50, period_us in 1u64..5_000_000, burst in 1u64..20, trace in steps(1_000_000, 25, checks())) {
        let algorithm = Limit::gcra(rate, std::time::Duration::from_micros(period_us), burst).unwrap();
        let harness = run(&algorithm, &trace, true);
        harness.assert_bound(|a, b| u128::from(burst) + refilled(b - a, rate, period_us));
    }

    #[test]
    fn leaky_bucket_properties(rate in 1u64..50, period_us in 1u64..5_000_000, capacity in 1u64..20,
        trace in steps(1_000_000, 25, prop_oneof![Just(Ask::Check), (proptest::option::of(0u64..2_000_000)).prop_map(Ask::Reserve)])) {
        let algorithm = Limit::leaky_bucket(rate, std::time::Duration::from_micros(period_us), capacity).unwrap();
        let harness = run(&algorithm, &trace, true);
        harness.assert_bound(|a, b| u128::from(capacity) + refilled(b - a, rate, period_us));
        // Departures keep order and are spaced by the outlet time of the one ahead
        // (departures are rounded up to the microsecond, hence the + 1).
        for pair in harness.admissions.windows(2) {
            let (first, next) = (pair[0], pair[1]);
            prop_assert!(next.departs >= first.departs);
            prop_assert!(
                u128::from(next.departs - first.departs + 1) * u128::from(rate) >= u128::from(first.cost) * u128::from(period_us),
                "departures {} then {} closer than {} units allow", first.departs, next.departs, first.cost
            );
        }
    }

    #[test]
    fn reservation_properties(rate in 1u64..50, period_us in 1u64..5_000_000, max_burst in 0u64..20, initial_part in 0u64..=100,
        trace in steps(1_000_000, 25, prop_oneof![3 => Just(Ask::Check), 1 => (proptest::option::of(0u64..2_000_000)).prop_map(Ask::Reserve)])) {
        let initial = max_burst * initial_part / 100;
        let algorithm = crate::LimitSpec::Reservation(crate::ReservationSpec {
            rate, period: std::time::Duration::from_micros(period_us), max_burst, initial: Some(initial),
        }).build().unwrap();
        let harness = run(&algorithm, &trace, initial == max_burst);
        // Grants are spaced like departures: each grant moment (request + wait)
        // follows the previous by the debt the previous one took on.
        let max_cost = harness.admissions.iter().map(|a| a.cost).max().unwrap_or(0);
        let mut checked = harness.admissions.clone();
        checked.retain(|a| a.departs == a.at);
        let grants = Harness { admissions: checked, ..Harness::new(&algorithm, true) };
        grants.assert_bound(|a, b| u128::from(max_burst) + u128::from(max_cost) + refilled(b - a, rate, period_us));
    }

    #[test]
    fn concurrency_properties(limit in 1u64..10, ttl_ms in 1u64..1_000,
        trace in steps(500_000, 12, prop_oneof![3 => Just(Ask::Acquire), 2 => (0usize..4).prop_map(Ask::Release)])) {
        let algorithm = Limit::concurrency(limit, ms(ttl_ms)).unwrap();
        let trace: Vec<Step> = trace.into_iter().map(|s| Step { dt: s.dt * ttl_ms / 500, ..s }).collect();
        run(&algorithm, &trace, true);
    }
}

/// Records ([`Action::Record`]): usage that already happened.
mod records {
    use proptest::prelude::*;

    use super::{commit, ms, START};
    use crate::algorithm::{Action, Limit, State};
    use crate::decision::Decision;

    /// Runs `action` for `cost` on `state` at `now`, committing its change.
    fn run(limit: &Limit, state: &mut Option<State>, now: u64, action: Action<'_>, cost: u64) -> Decision {
        limit.supports(action, cost).expect("valid action");
        let step = limit.decide(state.as_ref(), now, action, cost);
        commit(state, step.change);
        step.decision
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Every recorded unit is counted, fitting or not: a window's count
        /// is what its checks admitted plus everything recorded.
        #[test]
        fn recorded_units_are_never_lost(limit in 1u64..50, asks in prop::collection::vec((any::<bool>(), 0u64..80), 1..30)) {
            let window = Limit::fixed_window(limit, ms(60_000)).unwrap();
            let mut state = None;
            let mut counted = 0;
            for (record, cost) in asks {
                let action = if record { Action::Record } else { Action::Check };
                let decision = run(&window, &mut state, START, action, cost);
                // Either fits when count + cost <= limit; only a record counts when not.
                prop_assert_eq!(decision.allowed, counted + cost <= limit);
                if record || decision.allowed {
                    counted += cost;
                }
                prop_assert_eq!(decision.remaining, limit.saturating_sub(counted));
            }
            let count = match &state {
                Some(State::FixedWindow(state)) => state.count,
                None => 0,
                other => panic!("{other:?}"),
            };
            prop_assert_eq!(count, counted);
        }

        /// After a debt of `debt` units (a record that did not fit), the
        /// next admission waits exactly the refill time of the debt and of
        /// itself — one microsecond less is refused; and a limit that records its
        /// overage refuses a check alone.
        #[test]
        fn after_debt_the_next_admission_waits_for_the_debt(
            rate in 1u64..50,
            period_us in 1u64..5_000_000,
            burst in 1u64..20,
            debt in 1u64..40,
            cost in 1u64..5,
            bucket: bool,
        ) {
            let limit = if bucket {
                Limit::token_bucket(burst, rate, std::time::Duration::from_micros(period_us)).unwrap()
            } else {
                Limit::gcra(rate, std::time::Duration::from_micros(period_us), burst).unwrap()
            };
            prop_assume!(cost <= burst);
            let mut state = None;
            let recorded = run(&limit, &mut state, START, Action::Record, burst + debt);
            prop_assert!(!recorded.allowed, "the record did not fit");
            let denied = run(&limit, &mut state, START, Action::Check, cost);
            prop_assert!(!denied.allowed);
            let expected = (debt + cost) * period_us;
            let wait = expected.div_ceil(rate);
            prop_assert_eq!(denied.retry_after, Some(std::time::Duration::from_micros(wait)));
            let early = run(&limit, &mut state.clone(), START + wait - 1, Action::Check, cost);
            prop_assert!(!early.allowed, "one microsecond early");
            let on_time = run(&limit, &mut state, START + wait, Action::Check, cost);
            prop_assert!(on_time.allowed, "waiting retry_after succeeds");

            // A limit recording its overage refuses a check as any limit
            // does (the policy records it: `policy::decide`'s tests).
            let recording = limit.clone().recording_overage().unwrap();
            let mut checked = None;
            run(&recording, &mut checked, START, Action::Record, burst);
            let refused = recording.decide(checked.as_ref(), START, Action::Check, debt);
            prop_assert!(!refused.decision.allowed && refused.change.is_none(), "a check alone changes nothing");
        }

        /// With `max_debt`, a record leaves at most that much debt: the next
        /// admission waits the refill time of the cap, not of the overspend.
        #[test]
        fn debt_is_capped_by_max_debt(
            rate in 1u64..50,
            period_us in 1u64..5_000_000,
            burst in 1u64..20,
            cap in 0u64..10,
            debt in 10u64..40,
            bucket: bool,
        ) {
            let period = std::time::Duration::from_micros(period_us);
            let limit = if bucket {
                crate::LimitSpec::TokenBucket(crate::TokenBucketSpec {
                    capacity: burst, refill: rate, interval: period, mode: crate::Refill::Smooth, initial: None,
                    max_debt: Some(cap),
                })
            } else {
                crate::LimitSpec::Gcra(crate::GcraSpec { rate, period, burst, max_debt: Some(cap) })
            }
            .build()
            .unwrap();
            let mut state = None;
            run(&limit, &mut state, START, Action::Record, burst + debt);
            let denied = run(&limit, &mut state, START, Action::Check, 1);
            let wait = ((cap + 1) * period_us).div_ceil(rate);
            prop_assert_eq!(denied.retry_after, Some(std::time::Duration::from_micros(wait)));
        }
    }
}
