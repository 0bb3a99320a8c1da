//! Token bucket without borrowing: a request takes `cost` tokens or is denied.
//!
//! The bucket holds up to `capacity` tokens and gains `refill` tokens per
//! `interval`: continuously in `smooth` mode (exact, in ticks — see
//! [`rate`](super::rate)), or in whole amounts at epoch-aligned interval
//! boundaries in `interval` mode. A key with no state holds `initial` tokens;
//! a bucket that is full again carries no information and its state is
//! dropped, so with `initial < capacity` an idle key starts again at
//! `initial` (never more than the steady state would give). Such a bucket
//! starts refilling from the first request that touches it: that request
//! stores the level even when it is denied or a peek, since without it the
//! bucket would have no instant to refill from. The stored level is the one
//! the request saw, so nothing is consumed.
//!
//! **Bound:** over any interval `[a, b]` the admitted cost is at most
//! `capacity + refill · (b − a) / interval` (smooth), or
//! `capacity + refill · (number of interval boundaries in (a, b])` (interval).

use std::convert::Infallible;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[cfg(feature = "engine")]
use super::core::debt_cells;
use super::core::{
    at_least_one, at_most, max_debt, positive, record_whole, refilled, refund_whole, Action, Algorithm, Step, Update,
};
#[cfg(feature = "engine")]
use super::encoding::{numbers, other_state, Encoded, Loaded, TatEncoding, Value};
use super::rate::{Rate, Tat, MAX_TICKS};
use crate::decision::Decision;
use crate::duration::serde_text;
use crate::error::Result;

/// How a smooth bucket's instant is kept in Redis, as the Lua version keeps it.
#[cfg(feature = "engine")]
const TAT: TatEncoding = TatEncoding {
    tag: b"s",
    packed: false,
};
/// How a token bucket refills.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Refill {
    /// Continuously: `refill / interval` tokens per microsecond, exactly.
    #[default]
    Smooth,
    /// `refill` whole tokens at each multiple of `interval` since the epoch.
    Interval,
}

/// `capacity` tokens, `refill` more per `interval`; `initial` defaults to `capacity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBucketSpec {
    /// The most tokens the bucket holds.
    pub capacity: u64,
    /// Tokens gained per `interval`.
    pub refill: u64,
    /// The refill period.
    #[serde(with = "serde_text")]
    pub interval: Duration,
    /// Continuous ([`Refill::Smooth`], the default) or whole amounts at interval boundaries.
    #[serde(default)]
    pub mode: Refill,
    /// Tokens of a key with no state (default `capacity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial: Option<u64>,
    /// The most tokens of debt usage recorded past the limit may leave
    /// (absent: as much as exact arithmetic allows, 2^52 ticks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_debt: Option<u64>,
}

/// Parameters of a token bucket, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    pub(crate) capacity: u64,
    pub(crate) refill: u64,
    pub(crate) interval: u64,
    pub(crate) mode: Refill,
    pub(crate) initial: u64,
    /// The smooth refill as ticks (capacity checked to fit).
    pub(crate) rate: Rate,
    /// The most debt, in ticks of `rate` (interval mode: whole tokens of it).
    pub(crate) max_debt: u64,
}

/// The bucket's level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenBucketState {
    /// Smooth mode: the instant the bucket is full again.
    Smooth(Tat),
    /// Interval mode: whole tokens as of the interval starting at `boundary`.
    Interval {
        /// Tokens in the bucket; below zero after a record, by the debt.
        tokens: i64,
        /// When the interval those tokens were counted in began, µs since
        /// the epoch (an instant, not an index, so that a limit redefined
        /// with another interval reads it as a time all the same).
        boundary: u64,
    },
}

impl TokenBucket {
    /// Smooth mode: ticks missing from a full bucket at `now`.
    fn deficit(&self, state: Option<&TokenBucketState>, now: u64) -> u64 {
        match state {
            // Beyond `capacity` after a record, by the debt.
            Some(TokenBucketState::Smooth(full_at)) => full_at.backlog(now, self.rate),
            _ => (self.capacity - self.initial) * self.rate.unit,
        }
    }

    /// Interval mode: tokens at `now`, and the start of the interval they
    /// are counted in (`now`'s, or a newer one already counted).
    fn tokens(&self, state: Option<&TokenBucketState>, now: u64) -> (i64, u64) {
        let boundary = now - now % self.interval;
        match state {
            Some(&TokenBucketState::Interval { tokens, boundary: then }) if then <= boundary => {
                let intervals = (boundary - then) / self.interval;
                let refill = intervals.saturating_mul(self.refill).min(MAX_TICKS * 2).cast_signed();
                (tokens.saturating_add(refill).min(self.capacity.cast_signed()), boundary)
            }
            // Counted in a newer interval (the clock went back): no refill, keep its boundary.
            Some(&TokenBucketState::Interval { tokens, boundary: then }) => (tokens, then),
            _ => (self.initial.cast_signed(), boundary),
        }
    }

    /// Takes `cost` tokens if the bucket holds them.
    pub(crate) fn check(&self, state: Option<&TokenBucketState>, now: u64, cost: u64) -> Step<TokenBucketState> {
        match self.mode {
            Refill::Smooth => self.check_smooth(state, now, cost),
            Refill::Interval => self.check_interval(state, now, cost),
        }
    }

    /// A decision that consumes nothing: it changes no state, except that a
    /// bucket starting below capacity stores its level on first touch.
    fn first_touch(
        &self,
        state: Option<&TokenBucketState>,
        decision: Decision,
        level: TokenBucketState,
    ) -> Step<TokenBucketState> {
        if state.is_none() && self.initial < self.capacity {
            Step::changed(decision, level)
        } else {
            Step::unchanged(decision)
        }
    }

    fn check_smooth(&self, state: Option<&TokenBucketState>, now: u64, cost: u64) -> Step<TokenBucketState> {
        let rate = self.rate;
        let capacity = self.capacity * rate.unit;
        let deficit = self.deficit(state, now);
        let remaining = rate.units(capacity.saturating_sub(deficit));
        let level = TokenBucketState::Smooth(Tat::after(now, deficit, rate));
        let untouched = |decision| self.first_touch(state, decision, level);
        if cost > self.capacity {
            return untouched(Decision::deny(self.capacity, remaining, None, rate.micros(deficit)));
        }
        let deficit_after = deficit + cost * rate.unit;
        if deficit_after > capacity {
            let retry_after = rate.micros(deficit_after - capacity);
            return untouched(Decision::deny(
                self.capacity,
                remaining,
                Some(retry_after),
                rate.micros(deficit),
            ));
        }
        let decision = Decision::allow(
            self.capacity,
            rate.units(capacity - deficit_after),
            rate.micros(deficit_after),
            0,
        );
        if cost == 0 {
            return untouched(decision);
        }
        Step::changed(decision, TokenBucketState::Smooth(Tat::after(now, deficit_after, rate)))
    }

    fn check_interval(&self, state: Option<&TokenBucketState>, now: u64, cost: u64) -> Step<TokenBucketState> {
        let (tokens, boundary) = self.tokens(state, now);
        // The first boundary at which `missing` tokens have been added back.
        let after_refill = |missing: u64| {
            if missing == 0 {
                0
            } else {
                boundary + missing.div_ceil(self.refill) * self.interval - now
            }
        };
        // Tokens missing to `wanted` (a debt counts too).
        let missing = |wanted: u64, tokens: i64| wanted.saturating_add_signed(tokens.saturating_neg());
        let reset_after = |tokens: i64| after_refill(missing(self.capacity, tokens));
        let untouched = |decision| self.first_touch(state, decision, TokenBucketState::Interval { tokens, boundary });
        let held = tokens.max(0).cast_unsigned();
        if cost > self.capacity {
            return untouched(Decision::deny(self.capacity, held, None, reset_after(tokens)));
        }
        // In debt, a peek too is refused until the refill has paid it back.
        if cost.cast_signed() > tokens {
            return untouched(Decision::deny(
                self.capacity,
                held,
                Some(after_refill(missing(cost, tokens))),
                reset_after(tokens),
            ));
        }
        let tokens = tokens - cost.cast_signed();
        let decision = Decision::allow(self.capacity, held - cost, reset_after(tokens), 0);
        if cost == 0 {
            return untouched(decision);
        }
        Step::changed(decision, TokenBucketState::Interval { tokens, boundary })
    }

    /// The level `state` holds at `now` with `cost` more tokens taken,
    /// whether or not they were there: a debt the refill pays back. Debt is
    /// capped at `MAX_TICKS` ticks (or tokens) so that every sum stays exact.
    fn forced(&self, state: Option<&TokenBucketState>, now: u64, cost: u64) -> TokenBucketState {
        match self.mode {
            Refill::Smooth => {
                let rate = self.rate;
                let most = self.capacity * rate.unit + self.max_debt;
                let deficit = self.deficit(state, now).saturating_add(cost.saturating_mul(rate.unit));
                TokenBucketState::Smooth(Tat::after(now, deficit.min(most), rate))
            }
            Refill::Interval => {
                let (tokens, boundary) = self.tokens(state, now);
                let least = -((self.max_debt / self.rate.unit).cast_signed());
                let tokens = tokens.saturating_sub(cost.min(MAX_TICKS * 2).cast_signed()).max(least);
                TokenBucketState::Interval { tokens, boundary }
            }
        }
    }

    pub(crate) fn refunded(&self, state: Option<&TokenBucketState>, now: u64, cost: u64) -> Option<TokenBucketState> {
        match (self.mode, state?) {
            (Refill::Smooth, TokenBucketState::Smooth(full_at)) => {
                let full = self.capacity * self.rate.unit;
                Tat::refunded(Some(full_at), now, cost, self.rate, full + MAX_TICKS).map(TokenBucketState::Smooth)
            }
            (Refill::Interval, TokenBucketState::Interval { .. }) if cost > 0 => {
                let (tokens, boundary) = self.tokens(state, now);
                let cost = cost.min(MAX_TICKS * 2).cast_signed();
                Some(TokenBucketState::Interval {
                    tokens: tokens.saturating_add(cost).min(self.capacity.cast_signed()),
                    boundary,
                })
            }
            _ => None,
        }
    }
}

impl Algorithm for TokenBucket {
    type Spec = TokenBucketSpec;
    type State = TokenBucketState;
    type Stored = TokenBucketState;
    type Edit<'a> = Infallible;

    const NAME: &'static str = "token_bucket";
    #[cfg(feature = "engine")]
    const ID: u8 = 4;
    const REFUNDS_ADD_UP: bool = true;
    const LEASABLE: bool = true;

    fn build(spec: &TokenBucketSpec) -> Result<Self> {
        let capacity = at_least_one(spec.capacity, "capacity")?;
        let refill = at_least_one(spec.refill, "refill")?;
        let interval = positive(spec.interval, "interval")?;
        let initial = at_most(spec.initial, capacity, "initial", "capacity")?;
        let rate = Rate::new(refill, interval, capacity, ["refill", "interval", "capacity"])?;
        let max_debt = max_debt(spec.max_debt, rate)?;
        Ok(Self {
            capacity,
            refill,
            interval,
            mode: spec.mode,
            initial,
            rate,
            max_debt,
        })
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    /// What `elapsed` µs refilled: smoothly, `refill` per `interval`
    /// rounded up; by intervals, one boundary more than the intervals
    /// elapsed may have been crossed.
    fn lapsed(&self, units: u64, elapsed: u64) -> u64 {
        let lapsed = match self.mode {
            Refill::Smooth => refilled(elapsed, self.refill, self.interval),
            Refill::Interval => (elapsed / self.interval + 1).saturating_mul(self.refill),
        };
        lapsed.min(units)
    }

    fn available(&self, state: Option<&TokenBucketState>, now: u64) -> u64 {
        match self.mode {
            Refill::Smooth => self
                .rate
                .units((self.capacity * self.rate.unit).saturating_sub(self.deficit(state, now))),
            Refill::Interval => self.tokens(state, now).0.max(0).cast_unsigned(),
        }
    }

    #[inline]
    fn decide(
        &self,
        state: Option<&TokenBucketState>,
        now: u64,
        action: Action<'_>,
        cost: u64,
    ) -> Step<Update<TokenBucketState, Infallible>> {
        match action {
            Action::Refund { .. } => refund_whole(self, state, now, self.refunded(state, now, cost)),
            Action::Record => record_whole(
                |state, cost| self.check(state, now, cost),
                state,
                cost,
                || self.forced(state, now, cost),
            ),
            _ => self.check(state, now, action.check_cost(cost)),
        }
        .map(Update::Put)
    }

    /// The mode is 1 for interval refill, 0 for smooth.
    #[cfg(feature = "engine")]
    fn params(&self) -> impl IntoIterator<Item = u64> {
        [
            self.capacity,
            self.refill,
            self.interval,
            u64::from(self.mode == Refill::Interval),
            self.initial,
            self.rate.unit,
            self.rate.per_micro,
            self.max_debt,
        ]
    }

    #[cfg(feature = "engine")]
    fn spec_of(params: &[u64]) -> Option<Self::Spec> {
        let &[capacity, refill, interval, interval_mode, initial, unit, _, max_debt] = params else {
            return None;
        };
        Some(TokenBucketSpec {
            capacity,
            refill,
            interval: Duration::from_micros(interval),
            mode: if interval_mode == 1 {
                Refill::Interval
            } else {
                Refill::Smooth
            },
            initial: Some(initial),
            max_debt: debt_cells(max_debt, unit),
        })
    }

    /// Smooth mode keeps `s<at>[:<frac>]`, interval mode
    /// `i<tokens>:<boundary>:<expires>`; a live state of the other mode (the
    /// limit was redefined) is read as it is, as the memory store holds it.
    #[cfg(feature = "engine")]
    fn load(&self, value: &Value, now: u64) -> Loaded<TokenBucketState> {
        let Some(text) = value.as_string() else {
            return Loaded::None;
        };
        if let Some(level) = text.strip_prefix(b"i") {
            // A debt is a negative level: "i-<tokens>:…".
            let (sign, level) = match level.strip_prefix(b"-") {
                Some(debt) => (-1, debt),
                None => (1, level),
            };
            return match numbers::<3>(level) {
                Some([tokens, boundary, expires]) if expires > now && tokens <= MAX_TICKS * 2 => {
                    let tokens = sign * tokens.cast_signed();
                    Loaded::State(TokenBucketState::Interval { tokens, boundary })
                }
                Some(_) => Loaded::None,
                None if self.mode == Refill::Smooth => Loaded::None,
                None => other_state(text),
            };
        }
        TAT.load(value, now).map(TokenBucketState::Smooth)
    }

    #[cfg(feature = "engine")]
    fn encode(&self, state: &TokenBucketState, expires: u64) -> Encoded {
        match *state {
            TokenBucketState::Smooth(full_at) => TAT.encode(full_at, self.rate.per_micro),
            TokenBucketState::Interval { tokens, boundary } => {
                let mut digits = itoa::Buffer::new();
                let mut out = b"i".to_vec();
                out.extend_from_slice(digits.format(tokens).as_bytes());
                for n in [boundary, expires] {
                    out.push(b':');
                    out.extend_from_slice(digits.format(n).as_bytes());
                }
                Encoded::String(out)
            }
        }
    }
}
