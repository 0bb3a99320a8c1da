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

use super::core::{at_least_one, at_most, positive, refund_whole, Action, Algorithm, Step, Update};
#[cfg(feature = "engine")]
use super::encoding::{numbers, other_state, Encoded, Loaded, TatEncoding, Value};
use super::rate::{Rate, Tat};
use crate::decision::Decision;
use crate::duration::serde_text;
use crate::error::Result;

/// How a smooth bucket's instant is kept in Redis, as the Lua twin keeps it.
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
}

/// The bucket's level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenBucketState {
    /// Smooth mode: the instant the bucket is full again.
    Smooth(Tat),
    /// Interval mode: whole tokens as of the interval starting at `boundary`.
    Interval {
        /// Tokens in the bucket.
        tokens: u64,
        /// When the interval those tokens were counted in began, µs since
        /// the epoch (an instant, not an index, so that a limit redefined
        /// with another interval reads it as a time all the same).
        boundary: u64,
    },
}

impl TokenBucket {
    /// Smooth mode: ticks missing from a full bucket at `now`.
    fn deficit(&self, state: Option<&TokenBucketState>, now: u64) -> u64 {
        let capacity = self.capacity * self.rate.unit;
        match state {
            Some(TokenBucketState::Smooth(full_at)) => full_at.backlog(now, self.rate).min(capacity),
            _ => (self.capacity - self.initial) * self.rate.unit,
        }
    }

    /// Interval mode: tokens at `now`, and the start of the interval they
    /// are counted in (`now`'s, or a newer one already counted).
    fn tokens(&self, state: Option<&TokenBucketState>, now: u64) -> (u64, u64) {
        let boundary = now - now % self.interval;
        match state {
            Some(&TokenBucketState::Interval { tokens, boundary: then }) if then <= boundary => {
                let intervals = (boundary - then) / self.interval;
                let refilled = intervals.saturating_mul(self.refill).saturating_add(tokens);
                (refilled.min(self.capacity), boundary)
            }
            // Counted in a newer interval (the clock went back): no refill, keep its boundary.
            Some(&TokenBucketState::Interval { tokens, boundary: then }) => (tokens, then),
            _ => (self.initial, boundary),
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
        let remaining = rate.units(capacity - deficit);
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
        let reset_after = |tokens: u64| after_refill(self.capacity.saturating_sub(tokens));
        let untouched = |decision| self.first_touch(state, decision, TokenBucketState::Interval { tokens, boundary });
        if cost > self.capacity {
            return untouched(Decision::deny(self.capacity, tokens, None, reset_after(tokens)));
        }
        if cost > tokens {
            return untouched(Decision::deny(
                self.capacity,
                tokens,
                Some(after_refill(cost - tokens)),
                reset_after(tokens),
            ));
        }
        let tokens = tokens - cost;
        let decision = Decision::allow(self.capacity, tokens, reset_after(tokens), 0);
        if cost == 0 {
            return untouched(decision);
        }
        Step::changed(decision, TokenBucketState::Interval { tokens, boundary })
    }

    /// Gives back `cost` tokens, up to a full bucket. The new state, or
    /// `None` when nothing changes (no level is stored for a bucket that has
    /// none, or one of the other mode).
    pub(crate) fn refunded(&self, state: Option<&TokenBucketState>, now: u64, cost: u64) -> Option<TokenBucketState> {
        match (self.mode, state?) {
            (Refill::Smooth, TokenBucketState::Smooth(full_at)) => {
                let full = self.capacity * self.rate.unit;
                Tat::refunded(Some(full_at), now, cost, self.rate, full).map(TokenBucketState::Smooth)
            }
            (Refill::Interval, TokenBucketState::Interval { .. }) if cost > 0 => {
                let (tokens, boundary) = self.tokens(state, now);
                Some(TokenBucketState::Interval {
                    tokens: tokens.saturating_add(cost).min(self.capacity),
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

    fn build(spec: &TokenBucketSpec) -> Result<Self> {
        let capacity = at_least_one(spec.capacity, "capacity")?;
        let refill = at_least_one(spec.refill, "refill")?;
        let interval = positive(spec.interval, "interval")?;
        let initial = at_most(spec.initial, capacity, "initial", "capacity")?;
        let rate = Rate::new(refill, interval, capacity, ["refill", "interval", "capacity"])?;
        Ok(Self {
            capacity,
            refill,
            interval,
            mode: spec.mode,
            initial,
            rate,
        })
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn available(&self, state: Option<&TokenBucketState>, now: u64) -> u64 {
        match self.mode {
            Refill::Smooth => self
                .rate
                .units(self.capacity * self.rate.unit - self.deficit(state, now)),
            Refill::Interval => self.tokens(state, now).0,
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
        if let Action::Refund { .. } = action {
            return refund_whole(self, state, now, self.refunded(state, now, cost)).map(Update::Put);
        }
        self.check(state, now, action.check_cost(cost)).map(Update::Put)
    }

    /// The mode is 1 for interval refill, 0 for smooth.
    #[cfg(feature = "engine")]
    fn script_params(&self) -> impl IntoIterator<Item = u64> {
        [
            self.capacity,
            self.refill,
            self.interval,
            u64::from(self.mode == Refill::Interval),
            self.initial,
            self.rate.unit,
            self.rate.per_micro,
        ]
    }

    #[cfg(feature = "engine")]
    fn script_spec(params: &[u64]) -> Option<Self::Spec> {
        let &[capacity, refill, interval, interval_mode, initial, _, _] = params else {
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
            return match numbers::<3>(level) {
                Some([tokens, boundary, expires]) if expires > now => {
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
                for (at, n) in [tokens, boundary, expires].into_iter().enumerate() {
                    if at > 0 {
                        out.push(b':');
                    }
                    out.extend_from_slice(digits.format(n).as_bytes());
                }
                Encoded::String(out)
            }
        }
    }
}
