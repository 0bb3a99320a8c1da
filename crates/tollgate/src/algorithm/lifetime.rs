//! How long a limit's state matters: what tells whether a store that
//! forgets everything on restart (a Redis that persists nothing) loses
//! something worth keeping.

use std::time::Duration;

use super::calendar::Period;
use super::registry::LimitSpec;

impl LimitSpec {
    /// How long one subject's state under this limit can carry
    /// information: left untouched that long, the limit is as if never
    /// used (its window has passed, its bucket has refilled, its leases
    /// have ended). A window's length (a calendar window's period, a year
    /// at most); the time a bucket or GCRA takes to refill what it holds
    /// at its rate; a concurrency lease's ttl. Debt recorded past the limit
    /// lasts longer.
    pub fn state_lasts(&self) -> Duration {
        const DAY: u64 = 86_400;
        fn refill(units: u64, rate: u64, period: Duration) -> Duration {
            // Whole units: exactness is not the point, the order of magnitude is.
            period.saturating_mul(u32::try_from(units.div_ceil(rate.max(1))).unwrap_or(u32::MAX))
        }
        match self {
            Self::FixedWindow(spec) => spec.window.unwrap_or_else(|| {
                Duration::from_secs(match spec.calendar {
                    Some(Period::Day) => DAY,
                    Some(Period::Week) => 7 * DAY,
                    Some(Period::Month) => 31 * DAY,
                    Some(Period::Year) | None => 366 * DAY,
                })
            }),
            Self::SlidingWindow(spec) => spec.window,
            Self::SlidingLog(spec) => spec.window,
            Self::TokenBucket(spec) => refill(spec.capacity, spec.refill, spec.interval),
            Self::Reservation(spec) => refill(spec.max_burst, spec.rate, spec.period),
            Self::LeakyBucket(spec) => refill(spec.capacity, spec.rate, spec.period),
            Self::Gcra(spec) => refill(spec.burst, spec.rate, spec.period),
            Self::Concurrency(spec) => spec.ttl,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::Limit;

    #[test]
    fn state_lasts_a_window_or_the_time_to_refill() {
        let day = Duration::from_secs(86_400);
        let lasts = |json: &str| Limit::from_json(json).unwrap().spec().state_lasts();
        assert_eq!(lasts(r#"{"algorithm":"fixed_window","limit":5,"window":"1d"}"#), day);
        assert_eq!(
            lasts(r#"{"algorithm":"fixed_window","limit":5,"calendar":"month"}"#),
            31 * day
        );
        assert_eq!(
            lasts(r#"{"algorithm":"sliding_log","limit":5,"window":"1h"}"#),
            Duration::from_secs(3600)
        );
        assert_eq!(
            lasts(r#"{"algorithm":"token_bucket","capacity":1000,"refill":10,"interval":"1h"}"#),
            100 * Duration::from_secs(3600)
        );
        assert_eq!(
            lasts(r#"{"algorithm":"gcra","rate":10,"period":"1s","burst":20}"#),
            Duration::from_secs(2)
        );
        assert_eq!(
            lasts(r#"{"algorithm":"concurrency","limit":5,"ttl":"30s"}"#),
            Duration::from_secs(30)
        );
    }
}
