//! Leaky bucket as a shaping queue.
//!
//! Admitted requests leave through one outlet at `rate` units per `period`:
//! each departs at `max(now, drained)`, where `drained` is when the requests
//! queued ahead of it have left, and then occupies the outlet for
//! `cost · period / rate`. The caller is told to `wait` until its departure.
//! `capacity` bounds the units in the bucket — queued or leaving — so a
//! request is denied when it would overfill it; with `capacity = 1` nothing
//! ever queues and `wait` is always zero.
//!
//! **Bound:** over any interval `[a, b]` the admitted cost is at most
//! `capacity + rate · (b − a) / period`; departures are spaced by the outlet
//! time of the request ahead, so departures in `[a, b]` carry at most
//! `rate · (b − a) / period` units plus one request's cost.

use std::convert::Infallible;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::core::{at_least_one, positive, record_whole, refund_whole, report, Action, Algorithm, Step, Update};
#[cfg(feature = "engine")]
use super::core::{Encoded, Loaded, Value};
#[cfg(feature = "engine")]
use super::encoding::TatEncoding;
use super::rate::{Rate, Tat, MAX_TICKS};
use crate::decision::Decision;
use crate::duration::serde_text;
use crate::error::Result;

/// How the state is kept in Redis, as the Lua version keeps it.
#[cfg(feature = "engine")]
const TAT: TatEncoding = TatEncoding {
    tag: b"l",
    packed: false,
};
/// Draining `rate` units per `period`, holding at most `capacity` units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeakyBucketSpec {
    /// Units leaving per `period`.
    pub rate: u64,
    /// The period of `rate`.
    #[serde(with = "serde_text")]
    pub period: Duration,
    /// The most units in the bucket, queued or leaving.
    pub capacity: u64,
}

/// Parameters of a leaky bucket, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeakyBucket {
    pub(crate) rate: u64,
    pub(crate) period: u64,
    pub(crate) capacity: u64,
    pub(crate) ticks: Rate,
}

/// The instant the queue will have drained.
pub type LeakyBucketState = Tat;

impl LeakyBucket {
    /// Queues `cost` units if they fit and would depart within `max_wait`
    /// (`None`: any wait).
    pub(crate) fn reserve(
        &self,
        state: Option<&LeakyBucketState>,
        now: u64,
        cost: u64,
        max_wait: Option<u64>,
    ) -> Step<LeakyBucketState> {
        let ticks = self.ticks;
        let capacity = self.capacity * ticks.unit;
        // Beyond the capacity after a record, by the overflow.
        let queued = state.map_or(0, |drained| drained.backlog(now, ticks));
        let remaining = ticks.units(capacity.saturating_sub(queued));
        if cost > self.capacity {
            return Step::unchanged(Decision::deny(self.capacity, remaining, None, ticks.micros(queued)));
        }
        let departure = ticks.micros(queued);
        let queued_after = queued + cost * ticks.unit;
        let overfull = queued_after.saturating_sub(capacity);
        let too_late = max_wait.map_or(0, |max_wait| {
            queued.saturating_sub(max_wait.saturating_mul(ticks.per_micro))
        });
        if overfull > 0 || too_late > 0 {
            let retry_after = ticks.micros(overfull.max(too_late));
            return Step::unchanged(Decision::deny(
                self.capacity,
                remaining,
                Some(retry_after),
                ticks.micros(queued),
            ));
        }
        let decision = Decision::allow(
            self.capacity,
            ticks.units(capacity - queued_after),
            ticks.micros(queued_after),
            departure,
        );
        if cost == 0 {
            return Step::unchanged(decision);
        }
        Step::changed(decision, Tat::after(now, queued_after, ticks))
    }

    /// Gives back `cost` units: they leave the queue. The new state, or
    /// `None` when nothing changes.
    pub(crate) fn refunded(&self, state: Option<&LeakyBucketState>, now: u64, cost: u64) -> Option<LeakyBucketState> {
        Tat::refunded(state, now, cost, self.ticks, u64::MAX)
    }
}

impl Algorithm for LeakyBucket {
    type Spec = LeakyBucketSpec;
    type State = LeakyBucketState;
    type Stored = LeakyBucketState;
    type Edit<'a> = Infallible;

    const NAME: &'static str = "leaky_bucket";
    #[cfg(feature = "engine")]
    const ID: u8 = 6;
    const REFUNDS_ADD_UP: bool = true;
    const SHAPING: bool = true;

    fn build(spec: &LeakyBucketSpec) -> Result<Self> {
        let rate = at_least_one(spec.rate, "rate")?;
        let period = positive(spec.period, "period")?;
        let capacity = at_least_one(spec.capacity, "capacity")?;
        let ticks = Rate::new(rate, period, capacity, ["rate", "period", "capacity"])?;
        Ok(Self {
            rate,
            period,
            capacity,
            ticks,
        })
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn available(&self, state: Option<&LeakyBucketState>, now: u64) -> u64 {
        let queued = state.map_or(0, |drained| drained.backlog(now, self.ticks));
        self.ticks
            .units((self.capacity * self.ticks.unit).saturating_sub(queued))
    }

    #[inline]
    fn decide(
        &self,
        state: Option<&LeakyBucketState>,
        now: u64,
        action: Action<'_>,
        cost: u64,
    ) -> Step<Update<LeakyBucketState, Infallible>> {
        let step = match action {
            // A release only reports: it is never denied and never waits.
            Action::Release(_) => report(self.reserve(state, now, 0, None)),
            Action::Refund { .. } => refund_whole(self, state, now, self.refunded(state, now, cost)),
            // `check` on a shaping limit waits for anything.
            Action::Check => self.reserve(state, now, cost, None),
            Action::Reserve(max_wait) | Action::Acquire { max_wait, .. } => self.reserve(state, now, cost, max_wait),
            // Spent already: queued even beyond the capacity, which delays
            // whoever comes next by the overflow.
            Action::Record => record_whole(
                |state, cost| self.reserve(state, now, cost, None),
                state,
                cost,
                || {
                    let ticks = self.ticks;
                    let queued = state.map_or(0, |drained| drained.backlog(now, ticks));
                    let most = self.capacity * ticks.unit + MAX_TICKS;
                    Tat::after(
                        now,
                        queued.saturating_add(cost.saturating_mul(ticks.unit)).min(most),
                        ticks,
                    )
                },
            ),
        };
        step.map(Update::Put)
    }

    #[cfg(feature = "engine")]
    fn params(&self) -> impl IntoIterator<Item = u64> {
        [self.capacity, self.ticks.unit, self.ticks.per_micro]
    }

    #[cfg(feature = "engine")]
    fn spec_of(params: &[u64]) -> Option<Self::Spec> {
        let &[capacity, unit, per_micro] = params else {
            return None;
        };
        // The rate comes back reduced: `per_micro` per `unit` µs.
        Some(LeakyBucketSpec {
            capacity,
            rate: per_micro,
            period: Duration::from_micros(unit),
        })
    }

    #[cfg(feature = "engine")]
    fn load(&self, value: &Value, now: u64) -> Loaded<LeakyBucketState> {
        TAT.load(value, now)
    }

    #[cfg(feature = "engine")]
    fn encode(&self, state: &LeakyBucketState, _: u64) -> Encoded {
        TAT.encode(*state, self.ticks.per_micro)
    }
}
