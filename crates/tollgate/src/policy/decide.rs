//! The one decision: a policy's limits decided all-or-nothing on the states
//! a store hands over, each change written back where the store keeps it.
//!
//! Every store decides here: the memory store on its shard's slots,
//! [`DirectLimiter`](crate::DirectLimiter) on its own, the Redis module on
//! the states it loaded from the keyspace. A store says where each limit's
//! state is and how a change to it is committed ([`Slots`]); what is asked
//! is an [`Ask`]: a check of a cost, answered with its [`Decision`] alone,
//! or any [`Request`], answered with an [`Outcome`]. The Lua function
//! `decide` in the Redis store's script mirrors this module.

use super::{Op, Policy, Request};
use crate::algorithm::{Action, Change, Limit, State, Step};
use crate::clock::{micros, Timestamp};
use crate::decision::{Decision, Outcome, Path};

/// Where a store keeps the states of one subject's limits, in the
/// policy's order.
pub(crate) trait Slots {
    /// Limit `index`'s state, unless none is held or it has lapsed.
    fn state(&self, index: usize) -> Option<&State>;

    /// Commits `change`, decided on [`Slots::state`]`(index)`, to carry
    /// information for `ttl` µs (zero: none; the state may be dropped).
    fn commit(&mut self, index: usize, change: Change<'_>, ttl: u64);
}

/// What a caller asks of a policy, and the answer it gets.
pub(crate) trait Ask: Copy {
    /// The answer.
    type Answer;

    /// Decides on the states in `slots` at `now` (µs since the epoch),
    /// committing what changed; the ask is already validated.
    fn answer(self, policy: &Policy, slots: &mut impl Slots, now: u64) -> Self::Answer;
}

/// A check of this many units, answered with its decision alone: what
/// `check` and `check_at` ask, with no request or outcome to build.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CheckOf(pub u64);

impl Ask for CheckOf {
    type Answer = Decision;

    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    fn answer(self, policy: &Policy, slots: &mut impl Slots, now: u64) -> Decision {
        let Self(cost) = self;
        if let [(_, limit)] = policy.limits.as_slice() {
            let (step, _) = step(limit, slots.state(0), now, Action::Check, cost);
            return commit(slots, 0, step);
        }
        policy.decide(slots, now, &Request::new(Op::Check, cost)).decision
    }
}

impl Ask for &Request {
    type Answer = Outcome;

    #[inline]
    fn answer(self, policy: &Policy, slots: &mut impl Slots, now: u64) -> Outcome {
        policy.decide(slots, now, self)
    }
}

/// One limit's step for `action` of `cost` units on `state`, and whether it
/// admits: a check it refuses is recorded instead when the limit records
/// its overage (the step then counts the cost; the request stays refused).
#[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
#[inline(always)]
fn step<'a>(limit: &Limit, state: Option<&State>, now: u64, action: Action<'a>, cost: u64) -> (Step<Change<'a>>, bool) {
    let step = limit.decide(state, now, action, cost);
    let allowed = step.decision.allowed;
    if !allowed && action == Action::Check && limit.records_overage() {
        return (limit.decide(state, now, Action::Record, cost), false);
    }
    (step, allowed)
}

/// Commits `step`'s change to limit `index`, if it made one, for as long as
/// its decision says the state carries information; its decision.
#[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
#[inline(always)]
fn commit(slots: &mut impl Slots, index: usize, step: Step<Change<'_>>) -> Decision {
    if let Some(change) = step.change {
        slots.commit(index, change, micros(step.decision.reset_after));
    }
    step.decision
}

impl Policy {
    /// Decides `request` (validated) over every limit, all-or-nothing, on
    /// the states in `slots`, committing each change.
    #[inline]
    fn decide(&self, slots: &mut impl Slots, now: u64, request: &Request) -> Outcome {
        let op = &request.op;
        let action = Self::action(op);
        if let [(_, limit)] = self.limits.as_slice() {
            let state = slots.state(0);
            let cost = resolved_cost(request, || limit.available(state, now));
            let (step, allowed) = step(limit, state, now, action, request.cost_of_resolved(0, cost));
            let decision = commit(slots, 0, step);
            return self.outcome(op, allowed, cost, now, std::iter::once(decision));
        }
        self.decide_each(slots, now, request)
    }

    /// [`Policy::decide`] for a policy of several limits; out of line, so
    /// that a single limit's decision is made in place.
    #[inline(never)]
    fn decide_each(&self, slots: &mut impl Slots, now: u64, request: &Request) -> Outcome {
        let op = &request.op;
        let action = Self::action(op);
        let cost = resolved_cost(request, || {
            (0..self.limits.len())
                .map(|index| self.limits[index].1.available(slots.state(index), now))
                .min()
                .unwrap_or(0)
        });
        let mut steps = Vec::with_capacity(self.limits.len());
        for (index, (_, limit)) in self.limits.iter().enumerate() {
            steps.push(limit.decide(slots.state(index), now, action, request.cost_of_resolved(index, cost)));
        }
        let allowed = steps.iter().all(|step| step.decision.allowed);
        if !allowed && !matches!(op, Op::Record | Op::Refund { .. }) {
            // Nothing is consumed: limits that would have admitted report as
            // a peek; a refusing one that records its overage counts it.
            for (index, ((_, limit), step)) in self.limits.iter().zip(&mut steps).enumerate() {
                if step.decision.allowed {
                    *step = limit.decide(slots.state(index), now, action, 0);
                } else if limit.records_overage() && action == Action::Check {
                    let cost = request.cost_of_resolved(index, cost);
                    *step = limit.decide(slots.state(index), now, Action::Record, cost);
                }
            }
        }
        // What changed: everything when allowed; when denied, only levels
        // stored on first touch (they consume nothing) and recorded overage.
        let decisions: Vec<Decision> = steps
            .into_iter()
            .enumerate()
            .map(|(index, step)| commit(slots, index, step))
            .collect();
        self.outcome(op, allowed, cost, now, decisions.into_iter())
    }

    /// Assembles the outcome of `op` from each limit's decision (in the
    /// policy's order), made at `now` (µs since the epoch): `allowed`
    /// whether it was admitted, `cost` the units decided on.
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    pub(crate) fn outcome(
        &self,
        op: &Op,
        allowed: bool,
        cost: u64,
        now: u64,
        decisions: impl ExactSizeIterator<Item = Decision>,
    ) -> Outcome {
        let lease = match op {
            Op::Acquire { lease, .. } if allowed && self.has_concurrency() => Some(lease.clone()),
            _ => None,
        };
        // A record counts, and a refund gives back, whatever the limits say after.
        let granted = if allowed || matches!(op, Op::Record | Op::Refund { .. }) {
            cost
        } else {
            0
        };
        let mut decisions = decisions;
        if !self.named && decisions.len() == 1 {
            if let Some(decision) = decisions.next() {
                return Outcome {
                    decision,
                    granted,
                    lease,
                    limits: Vec::new(),
                    path: Path::Store,
                    decided_at: Timestamp::from_micros(now),
                };
            }
        }
        self.outcome_of_each(granted, lease, now, decisions)
    }

    /// [`Policy::outcome`] listing each limit's decision; out of line, so
    /// that the single limit's outcome above is built in place.
    #[inline(never)]
    fn outcome_of_each(
        &self,
        granted: u64,
        lease: Option<String>,
        now: u64,
        decisions: impl Iterator<Item = Decision>,
    ) -> Outcome {
        let limits: Vec<(String, Decision)> = self
            .limits
            .iter()
            .map(|(name, _)| name.clone())
            .zip(decisions)
            .collect();
        Outcome {
            decision: most_restrictive(&limits),
            granted,
            lease,
            limits: if self.named { limits } else { Vec::new() },
            path: Path::Store,
            decided_at: Timestamp::from_micros(now),
        }
    }
}

/// The cost of `request`, with `check_at_most` resolved against
/// `available()`, the least any limit has: as much of the cost as is
/// available, or one unit when nothing is, so that the denial says when one
/// will be.
fn resolved_cost(request: &Request, available: impl FnOnce() -> u64) -> u64 {
    if !matches!(request.op, Op::CheckAtMost) {
        return request.cost;
    }
    let available = available();
    if available == 0 && request.cost > 0 {
        1
    } else {
        available.min(request.cost)
    }
}

/// The most restrictive decision ([`Decision::most_restrictive`]), with
/// `wait` the longest of all when it admits.
fn most_restrictive(decisions: &[(String, Decision)]) -> Decision {
    let index = Decision::most_restrictive(decisions.iter().map(|(_, decision)| decision)).unwrap_or(0);
    let mut chosen = decisions[index].1.clone();
    if chosen.allowed {
        chosen.wait = decisions
            .iter()
            .map(|(_, decision)| decision.wait)
            .max()
            .unwrap_or_default();
    }
    chosen
}

/// States held by a test, one per limit: a change is applied in place, a
/// state with nothing left to say dropped.
#[cfg(test)]
impl<const N: usize> Slots for [Option<State>; N] {
    fn state(&self, index: usize) -> Option<&State> {
        self[index].as_ref()
    }

    fn commit(&mut self, index: usize, change: Change<'_>, ttl: u64) {
        let state = &mut self[index];
        match state {
            _ if ttl == 0 => *state = None,
            Some(state) => change.apply(state),
            none => *none = change.into_state(),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::Ask as _;
    use crate::algorithm::properties::{checks, commit, ms, refilled, steps, Admission, Harness, START};
    use crate::algorithm::{Action, Limit, State};
    use crate::policy::{Op, Policy, Request};

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
                policy.validate(&request).unwrap();
                let outcome = (&request).answer(&policy, &mut states, now);
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
            let mut held = [recorded.clone()];
            let outcome = (&request).answer(&policy, &mut held, START);
            let [checked] = held;
            let record = limit.decide(recorded.as_ref(), START, Action::Record, debt);
            commit(&mut recorded, record.change);
            prop_assert!(!outcome.decision.allowed);
            prop_assert_eq!(outcome.granted, 0);
            prop_assert_eq!(checked, recorded);
        }
    }
}
