//! GCRA, the Generic Cell Rate Algorithm: one theoretical arrival time (TAT)
//! per key.
//!
//! Cells are spaced by the emission interval `T = period / rate`; the
//! tolerance `τ = (burst − 1) · T` lets `burst` cells through at once. A
//! request of `cost` cells conforms when `max(TAT, now) + cost · T − now ≤ τ + T`.
//! `T` is kept exact in ticks (see [`rate`](super::rate)), so 7 per second
//! admits exactly 7 cells per second forever, with no drift.
//!
//! **Bound:** over any interval `[a, b]` the admitted cost is at most
//! `burst + rate · (b − a) / period`.

use std::convert::Infallible;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[cfg(feature = "engine")]
use super::core::debt_cells;
use super::core::{
    at_least_one, max_debt, positive, record_whole, refilled, refund_whole, Action, Algorithm, Step, Update,
};
#[cfg(feature = "engine")]
use super::core::{Encoded, Loaded, Value};
#[cfg(feature = "engine")]
use super::encoding::TatEncoding;
use super::rate::{Rate, Tat};
use crate::decision::Decision;
use crate::duration::serde_text;
use crate::error::Result;

/// How the state is kept in Redis, as the Lua version keeps it.
#[cfg(feature = "engine")]
const TAT: TatEncoding = TatEncoding { tag: b"", packed: true };
/// `rate` cells per `period`, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcraSpec {
    /// Cells per `period`.
    pub rate: u64,
    /// The period of `rate`.
    #[serde(with = "serde_text")]
    pub period: Duration,
    /// Cells admitted at once.
    pub burst: u64,
    /// The most cells of debt usage recorded past the limit may leave
    /// (absent: as much as exact arithmetic allows, 2^52 ticks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_debt: Option<u64>,
}

/// Parameters of a GCRA limit, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    pub(crate) rate: u64,
    pub(crate) period: u64,
    pub(crate) burst: u64,
    /// `emission_interval = rate.unit` ticks; a microsecond is `rate.per_micro` ticks.
    pub(crate) ticks: Rate,
    /// The most debt, in ticks past the horizon.
    pub(crate) max_debt: u64,
}

/// The theoretical arrival time of the next conforming cell.
pub type GcraState = Tat;

impl Gcra {
    /// `τ + T`: how far ahead of `now` the TAT may run, in ticks.
    fn horizon(&self) -> u64 {
        let emission_interval = self.ticks.unit;
        let tolerance = (self.burst - 1) * emission_interval;
        tolerance + emission_interval
    }

    /// Admits `cost` cells if they conform.
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    pub(crate) fn check(&self, state: Option<&GcraState>, now: u64, cost: u64) -> Step<GcraState> {
        let ticks = self.ticks;
        // How far the TAT runs ahead of now, in ticks (max(TAT, now) − now);
        // beyond the horizon after a record, by the debt.
        let ahead = state.map_or(0, |tat| tat.backlog(now, ticks));
        self.check_ahead(ahead, cost, |new_ahead| Tat::after(now, new_ahead, ticks))
    }

    /// [`Gcra::check`] of a TAT `ahead` ticks ahead of now; `change(ahead)`
    /// is the new state of a TAT `ahead` ticks ahead of now.
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    fn check_ahead<C>(&self, ahead: u64, cost: u64, change: impl FnOnce(u64) -> C) -> Step<C> {
        let ticks = self.ticks;
        let horizon = self.horizon();
        let remaining = || ticks.units(horizon.saturating_sub(ahead));
        if cost > self.burst {
            return Step::unchanged(Decision::deny(self.burst, remaining(), None, ticks.micros(ahead)));
        }
        let new_ahead = ahead + cost * ticks.unit;
        if new_ahead > horizon {
            let retry_after = ticks.micros(new_ahead - horizon);
            return Step::unchanged(Decision::deny(
                self.burst,
                remaining(),
                Some(retry_after),
                ticks.micros(ahead),
            ));
        }
        let decision = Decision::allow(self.burst, ticks.units(horizon - new_ahead), ticks.micros(new_ahead), 0);
        if cost == 0 {
            return Step::unchanged(decision);
        }
        Step::changed(decision, change(new_ahead))
    }

    /// True when every TAT of this limit falls on a whole microsecond (its
    /// emission interval is whole microseconds): one word holds it, the
    /// instant in µs since the epoch (zero: no state).
    pub(crate) fn whole_micros(&self) -> bool {
        self.ticks.per_micro == 1
    }

    /// [`Gcra::check`] on a TAT held as one word ([`Gcra::whole_micros`]).
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    pub(crate) fn check_word(&self, word: u64, now: u64, cost: u64) -> Step<u64> {
        // A tick is a microsecond: the word runs `word − now` ticks ahead.
        self.check_ahead(word.saturating_sub(now), cost, |new_ahead| now + new_ahead)
    }

    /// The decision of `action` on a TAT held as one word, with the new
    /// word when it changes.
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    pub(crate) fn step_word(&self, word: u64, now: u64, action: Action<'_>, cost: u64) -> Step<u64> {
        match action {
            Action::Refund { .. } | Action::Record => self
                .decide(word_tat(word).as_ref(), now, action, cost)
                .map(|update| update.into_whole().at),
            _ => self.check_word(word, now, action.check_cost(cost)),
        }
    }

    /// [`Algorithm::available`] on a TAT held as one word.
    pub(crate) fn available_word(&self, word: u64, now: u64) -> u64 {
        self.available(word_tat(word).as_ref(), now)
    }

    /// Gives back `cost` cells: the TAT moves back by their emission time,
    /// never behind `now`. The new state, or `None` when nothing changes.
    pub(crate) fn refunded(&self, state: Option<&GcraState>, now: u64, cost: u64) -> Option<GcraState> {
        Tat::refunded(state, now, cost, self.ticks, u64::MAX)
    }
}

/// The TAT a word holds (zero: none).
#[inline]
fn word_tat(word: u64) -> Option<Tat> {
    (word > 0).then_some(Tat { at: word, frac: 0 })
}

impl Algorithm for Gcra {
    type Spec = GcraSpec;
    type State = GcraState;
    type Stored = GcraState;
    type Edit<'a> = Infallible;

    const NAME: &'static str = "gcra";
    #[cfg(feature = "engine")]
    const ID: u8 = 7;
    const REFUNDS_ADD_UP: bool = true;
    const LEASABLE: bool = true;

    fn build(spec: &GcraSpec) -> Result<Self> {
        let rate = at_least_one(spec.rate, "rate")?;
        let period = positive(spec.period, "period")?;
        let burst = at_least_one(spec.burst, "burst")?;
        let ticks = Rate::new(rate, period, burst, ["rate", "period", "burst"])?;
        let max_debt = max_debt(spec.max_debt, ticks)?;
        Ok(Self {
            rate,
            period,
            burst,
            ticks,
            max_debt,
        })
    }

    fn capacity(&self) -> u64 {
        self.burst
    }

    /// What `elapsed` µs refilled: `rate` cells per `period`, rounded up.
    fn lapsed(&self, units: u64, elapsed: u64) -> u64 {
        refilled(elapsed, self.rate, self.period).min(units)
    }

    fn available(&self, state: Option<&GcraState>, now: u64) -> u64 {
        let ahead = state.map_or(0, |tat| tat.backlog(now, self.ticks));
        self.ticks.units(self.horizon().saturating_sub(ahead))
    }

    #[inline]
    fn decide(
        &self,
        state: Option<&GcraState>,
        now: u64,
        action: Action<'_>,
        cost: u64,
    ) -> Step<Update<GcraState, Infallible>> {
        match action {
            Action::Refund { .. } => refund_whole(self, state, now, self.refunded(state, now, cost)),
            // Debt: the TAT runs past the horizon by the overspend.
            Action::Record => record_whole(
                |state, cost| self.check(state, now, cost),
                state,
                cost,
                || {
                    let ahead = state.map_or(0, |tat| tat.backlog(now, self.ticks));
                    let most = self.horizon() + self.max_debt;
                    let ahead = ahead.saturating_add(cost.saturating_mul(self.ticks.unit)).min(most);
                    Tat::after(now, ahead, self.ticks)
                },
            ),
            _ => self.check(state, now, action.check_cost(cost)),
        }
        .map(Update::Put)
    }

    #[cfg(feature = "engine")]
    fn params(&self) -> impl IntoIterator<Item = u64> {
        [self.burst, self.ticks.unit, self.ticks.per_micro, self.max_debt]
    }

    #[cfg(feature = "engine")]
    fn spec_of(params: &[u64]) -> Option<Self::Spec> {
        let &[burst, unit, per_micro, max_debt] = params else {
            return None;
        };
        // The rate comes back reduced: `per_micro` per `unit` µs.
        Some(GcraSpec {
            burst,
            rate: per_micro,
            period: Duration::from_micros(unit),
            max_debt: debt_cells(max_debt, unit),
        })
    }

    #[cfg(feature = "engine")]
    fn load(&self, value: &Value, now: u64) -> Loaded<GcraState> {
        TAT.load(value, now)
    }

    #[cfg(feature = "engine")]
    fn encode(&self, state: &GcraState, _: u64) -> Encoded {
        TAT.encode(*state, self.ticks.per_micro)
    }
}
