//! Exact integer rates: `rate` units per `period` microseconds.
//!
//! A rate like 7 per second has an emission interval of 142 857.142… µs, which
//! no integer count of microseconds holds. Instead of rounding (and drifting),
//! time and cost are measured in *ticks*: one unit of cost weighs
//! `unit = period / g` ticks and one microsecond drains `per_micro = rate / g`
//! ticks, where `g = gcd(rate, period)`. Every quantity is then an integer, the
//! same in Rust and in Redis's Lua (which holds integers exactly below 2^53).

use crate::duration::MAX_MICROS;
use crate::error::{Error, Result};

/// The largest tick count a limit may hold; sums of two stay below 2^53.
pub(crate) const MAX_TICKS: u64 = 1 << 52;

/// A rate as integer ticks; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rate {
    /// Ticks one unit of cost weighs.
    pub unit: u64,
    /// Ticks that drain (or refill) per microsecond.
    pub per_micro: u64,
}

impl Rate {
    /// `rate` per `period` µs, both already checked positive; `capacity` units
    /// must fit in [`MAX_TICKS`]. The field names go into the error message.
    pub fn new(rate: u64, period: u64, capacity: u64, fields: [&str; 3]) -> Result<Self> {
        let g = gcd(rate, period);
        let rate = Self {
            unit: period / g,
            per_micro: rate / g,
        };
        let [rate_field, period_field, capacity_field] = fields;
        if period > MAX_MICROS || rate.ticks(capacity).is_none_or(|ticks| ticks > MAX_TICKS) {
            return Err(Error::invalid_limit(format!(
                "{capacity_field} × {period_field} / {rate_field} is too large to compute exactly \
                 (lower {capacity_field} or {period_field}, or raise {rate_field})"
            )));
        }
        Ok(rate)
    }

    /// Ticks that `units` of cost weigh, or `None` past [`MAX_TICKS`].
    pub fn ticks(self, units: u64) -> Option<u64> {
        units.checked_mul(self.unit).filter(|&ticks| ticks <= MAX_TICKS)
    }

    /// Whole microseconds needed to drain `ticks` (rounded up).
    #[inline]
    pub fn micros(self, ticks: u64) -> u64 {
        // Most rates divide their period: a tick is then a microsecond, and
        // the division is skipped.
        if self.per_micro == 1 {
            ticks
        } else {
            ticks.div_ceil(self.per_micro)
        }
    }

    /// Whole units in `ticks` (rounded down).
    #[inline]
    pub fn units(self, ticks: u64) -> u64 {
        // Less than one unit (a denial's room, often) needs no division.
        if ticks < self.unit {
            0
        } else {
            ticks / self.unit
        }
    }
}

/// A theoretical instant with sub-microsecond precision: `at + frac / per_micro`.
///
/// GCRA calls it the TAT; the token bucket the instant it is full again; the
/// leaky bucket the instant its queue has drained. What lies between now and
/// that instant, in ticks, is the *backlog*.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tat {
    /// Whole microseconds since the Unix epoch.
    pub at: u64,
    /// The fraction of a microsecond past `at`, in ticks (`< per_micro`).
    pub frac: u64,
}

impl Tat {
    /// Ticks between `now` and this instant; zero once it has passed.
    #[inline]
    pub(crate) fn backlog(self, now: u64, rate: Rate) -> u64 {
        if self.at < now {
            0
        } else {
            (self.at - now).saturating_mul(rate.per_micro).saturating_add(self.frac)
        }
    }

    /// The instant `backlog` ticks after `now`.
    #[inline]
    pub(crate) fn after(now: u64, backlog: u64, rate: Rate) -> Self {
        if rate.per_micro == 1 {
            return Self {
                at: now + backlog,
                frac: 0,
            };
        }
        Self {
            at: now + backlog / rate.per_micro,
            frac: backlog % rate.per_micro,
        }
    }

    /// What a refund of `cost` units leaves of `tat`: the backlog, as the
    /// algorithm reads it (at most `most` ticks), moved back by their ticks,
    /// never behind `now`. `None` when it gives nothing back (no cost, or
    /// the instant has passed: nothing is owed).
    pub(crate) fn refunded(tat: Option<&Self>, now: u64, cost: u64, rate: Rate, most: u64) -> Option<Self> {
        let backlog = tat?.backlog(now, rate).min(most);
        if backlog == 0 || cost == 0 {
            return None;
        }
        let backlog = backlog.saturating_sub(cost.saturating_mul(rate.unit));
        Some(Self::after(now, backlog, rate))
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIELDS: [&str; 3] = ["rate", "period", "burst"];

    #[test]
    fn seven_per_second_is_exact() {
        let rate = Rate::new(7, 1_000_000, 1, FIELDS).unwrap();
        assert_eq!((rate.unit, rate.per_micro), (1_000_000, 7));
        // Seven units take exactly one second to drain, not 7 × 142 857 µs.
        assert_eq!(rate.micros(rate.ticks(7).unwrap()), 1_000_000);
        assert_eq!(rate.micros(rate.ticks(1).unwrap()), 142_858);
    }

    #[test]
    fn common_factors_are_removed() {
        let rate = Rate::new(100_000, 1_000_000, 1, FIELDS).unwrap();
        assert_eq!((rate.unit, rate.per_micro), (10, 1));
    }

    #[test]
    fn too_large_is_refused_with_the_fields() {
        let error = Rate::new(1, 86_400_000_000, 1_000_000, FIELDS).unwrap_err();
        assert!(error.to_string().starts_with("burst × period / rate is too large"));
    }

    #[test]
    fn tat_round_trips_the_backlog() {
        let rate = Rate::new(7, 1_000_000, 10, FIELDS).unwrap();
        let tat = Tat::after(500, 3_000_001, rate);
        assert_eq!(tat.backlog(500, rate), 3_000_001);
        assert_eq!(tat.backlog(tat.at + 1, rate), 0);
    }
}
