//! Token bucket with reservation: borrow now, the next caller waits (Guava's
//! `SmoothBursty`).
//!
//! Up to `max_burst` permits are stored while idle, at `rate` per `period`. A
//! request is granted at the next free moment — at once when nothing is owed —
//! and takes its permits from the store, borrowing what is missing; the debt
//! pushes the next free moment later, so the *next* caller pays. `reserve`
//! returns the `wait` until the request's moment, or denies (changing nothing)
//! when that wait would exceed `max_wait`; `check` is `reserve` with
//! `max_wait = 0`.
//!
//! One number holds it all: the instant the store is full again. Stored
//! permits are `max_burst` minus what lies between now and that instant; past
//! `max_burst`, the rest is debt. With no debt one more request always fits,
//! so `limit` (the most unit requests at once) is `max_burst + 1`, and any
//! cost can be granted; only a cost too large to compute exactly (over 2^52
//! ticks) is never admitted.
//!
//! **Bound:** over any interval `[a, b]`, requests granted without waiting
//! carry at most `max_burst + rate · (b − a) / period` units plus the cost of
//! the last one.

use std::convert::Infallible;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::core::{
    at_least_one, at_most, positive, record_whole, refund_whole, report, Action, Algorithm, Step, Update,
};
#[cfg(feature = "engine")]
use super::core::{Encoded, Loaded, Value};
#[cfg(feature = "engine")]
use super::encoding::TatEncoding;
use super::rate::{Rate, Tat, MAX_TICKS};
use crate::decision::Decision;
use crate::duration::serde_text;
use crate::error::{Error, Result};

/// How the state is kept in Redis, as the Lua version keeps it.
#[cfg(feature = "engine")]
const TAT: TatEncoding = TatEncoding {
    tag: b"r",
    packed: false,
};
/// `rate` permits per `period`, storing up to `max_burst`; `initial` defaults to `max_burst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReservationSpec {
    /// Permits per `period`.
    pub rate: u64,
    /// The period of `rate`.
    #[serde(with = "serde_text")]
    pub period: Duration,
    /// Permits stored while idle.
    pub max_burst: u64,
    /// Stored permits of a key with no state (default `max_burst`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial: Option<u64>,
}

/// Parameters of a reservation limiter, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    pub(crate) rate: u64,
    pub(crate) period: u64,
    pub(crate) max_burst: u64,
    pub(crate) initial: u64,
    pub(crate) ticks: Rate,
}

/// The instant the permit store is full again (past `max_burst`: debt).
pub type ReservationState = Tat;

impl Reservation {
    /// Ticks missing from a full store at `now` (beyond `max_burst`: debt).
    fn missing(&self, state: Option<&ReservationState>, now: u64) -> u64 {
        match state {
            Some(full_at) => full_at.backlog(now, self.ticks),
            None => (self.max_burst - self.initial) * self.ticks.unit,
        }
    }

    fn remaining(&self, missing: u64) -> u64 {
        let stored = (self.max_burst * self.ticks.unit).checked_sub(missing);
        stored.map_or(0, |stored| self.ticks.units(stored) + 1)
    }

    /// Grants `cost` permits at the next free moment if that is within
    /// `max_wait` (`None`: any wait).
    pub(crate) fn reserve(
        &self,
        state: Option<&ReservationState>,
        now: u64,
        cost: u64,
        max_wait: Option<u64>,
    ) -> Step<ReservationState> {
        let ticks = self.ticks;
        let limit = self.max_burst + 1;
        let full = self.max_burst * ticks.unit;
        let missing = self.missing(state, now);
        let remaining = self.remaining(missing);
        let Some(cost_ticks) = ticks.ticks(cost) else {
            return Step::unchanged(Decision::deny(limit, remaining, None, ticks.micros(missing)));
        };
        let debt = missing.saturating_sub(full);
        let wait = ticks.micros(debt);
        let too_late = max_wait.map_or(0, |max_wait| {
            debt.saturating_sub(max_wait.saturating_mul(ticks.per_micro))
        });
        // Debt is capped at MAX_TICKS so every sum stays exact below 2^53.
        let missing_after = missing + cost_ticks;
        let over_cap = missing_after.saturating_sub(full + MAX_TICKS);
        if too_late > 0 || over_cap > 0 {
            let retry_after = ticks.micros(too_late.max(over_cap));
            return Step::unchanged(Decision::deny(
                limit,
                remaining,
                Some(retry_after),
                ticks.micros(missing),
            ));
        }
        let decision = Decision::allow(limit, self.remaining(missing_after), ticks.micros(missing_after), wait);
        if cost == 0 {
            return Step::unchanged(decision);
        }
        Step::changed(decision, Tat::after(now, missing_after, ticks))
    }

    /// Gives back `cost` permits (a reservation cancelled): the permits
    /// missing from a full store shrink by them. The new state, or `None`
    /// when nothing changes.
    pub(crate) fn refunded(&self, state: Option<&ReservationState>, now: u64, cost: u64) -> Option<ReservationState> {
        Tat::refunded(state, now, cost, self.ticks, u64::MAX)
    }
}

impl Algorithm for Reservation {
    type Spec = ReservationSpec;
    type State = ReservationState;
    type Stored = ReservationState;
    type Edit<'a> = Infallible;

    const NAME: &'static str = "reservation";
    #[cfg(feature = "engine")]
    const ID: u8 = 5;
    const REFUNDS_ADD_UP: bool = true;
    const SHAPING: bool = true;

    fn build(spec: &ReservationSpec) -> Result<Self> {
        let rate = at_least_one(spec.rate, "rate")?;
        let period = positive(spec.period, "period")?;
        if spec.max_burst > MAX_TICKS {
            return Err(Error::invalid_limit(format!("max_burst must be at most {MAX_TICKS}")));
        }
        let initial = at_most(spec.initial, spec.max_burst, "initial", "max_burst")?;
        let ticks = Rate::new(rate, period, spec.max_burst, ["rate", "period", "max_burst"])?;
        Ok(Self {
            rate,
            period,
            max_burst: spec.max_burst,
            initial,
            ticks,
        })
    }

    fn capacity(&self) -> u64 {
        self.max_burst + 1
    }

    /// Any cost when nothing is owed.
    fn available(&self, state: Option<&ReservationState>, now: u64) -> u64 {
        if self.missing(state, now) <= self.max_burst * self.ticks.unit {
            u64::MAX
        } else {
            0
        }
    }

    #[inline]
    fn decide(
        &self,
        state: Option<&ReservationState>,
        now: u64,
        action: Action<'_>,
        cost: u64,
    ) -> Step<Update<ReservationState, Infallible>> {
        let step = match action {
            // A release only reports: it is never denied and never waits.
            Action::Release(_) => report(self.reserve(state, now, 0, None)),
            Action::Refund { .. } => refund_whole(self, state, now, self.refunded(state, now, cost)),
            // `check` on a borrowing limit waits for nothing.
            Action::Check => self.reserve(state, now, cost, Some(0)),
            Action::Reserve(max_wait) | Action::Acquire { max_wait, .. } => self.reserve(state, now, cost, max_wait),
            // Spent already: borrowed whatever the wait, which the next
            // caller pays; they fit when a check would have admitted them.
            Action::Record => record_whole(
                |state, cost| self.reserve(state, now, cost, Some(0)),
                state,
                cost,
                || {
                    // Past the cap on debt (2^52 ticks) nothing more is owed.
                    let step = self.reserve(state, now, cost, None);
                    step.change
                        .unwrap_or_else(|| Tat::after(now, self.missing(state, now), self.ticks))
                },
            ),
        };
        step.map(Update::Put)
    }

    #[cfg(feature = "engine")]
    fn params(&self) -> impl IntoIterator<Item = u64> {
        [self.max_burst, self.initial, self.ticks.unit, self.ticks.per_micro]
    }

    #[cfg(feature = "engine")]
    fn spec_of(params: &[u64]) -> Option<Self::Spec> {
        let &[max_burst, initial, unit, per_micro] = params else {
            return None;
        };
        // The rate comes back reduced: `per_micro` per `unit` µs.
        Some(ReservationSpec {
            max_burst,
            initial: Some(initial),
            rate: per_micro,
            period: Duration::from_micros(unit),
        })
    }

    #[cfg(feature = "engine")]
    fn load(&self, value: &Value, now: u64) -> Loaded<ReservationState> {
        TAT.load(value, now)
    }

    #[cfg(feature = "engine")]
    fn encode(&self, state: &ReservationState, _: u64) -> Encoded {
        TAT.encode(*state, self.ticks.per_micro)
    }
}
