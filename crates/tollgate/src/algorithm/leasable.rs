//! Test support for leases over any leasable algorithm: each one's stated
//! bound on what it admits over a span, and a strategy of one limit of
//! each, so that a store's lease tests never name an algorithm.

use std::time::Duration;

use proptest::prelude::*;

use super::properties::refilled;
use super::{Limit, LimitSpec, Refill, TokenBucketSpec};

/// The most a limit admits between two instants (absolute µs, both
/// included), before a lease's stretch: each algorithm's stated bound.
pub(crate) fn stated_bound(limit: &Limit, a: u64, b: u64) -> u128 {
    let micros = |duration: Duration| u64::try_from(duration.as_micros()).unwrap();
    match limit.spec() {
        LimitSpec::FixedWindow(spec) => {
            let window = micros(spec.window.expect("an epoch window"));
            u128::from(spec.limit) * u128::from(b / window - a / window + 1)
        }
        LimitSpec::SlidingWindow(spec) => {
            u128::from(spec.limit) * u128::from((b - a + 1).div_ceil(micros(spec.window) + 1))
        }
        LimitSpec::SlidingLog(spec) => u128::from(spec.limit) * u128::from((b - a + 1).div_ceil(micros(spec.window))),
        LimitSpec::TokenBucket(spec) => {
            let interval = micros(spec.interval);
            u128::from(spec.capacity)
                + match spec.mode {
                    Refill::Interval => u128::from(spec.refill) * u128::from(b / interval - a / interval),
                    Refill::Smooth => refilled(b - a, spec.refill, interval),
                }
        }
        LimitSpec::Gcra(spec) => u128::from(spec.burst) + refilled(b - a, spec.rate, micros(spec.period)),
        other => unreachable!("not leasable: {other:?}"),
    }
}

/// One leasable limit of each algorithm, with its time scale (µs: its
/// window, interval or emission interval).
pub(crate) fn any_leasable() -> impl Strategy<Value = (Limit, u64)> {
    let window = (1u64..60, 1u64..2_000).prop_map(|(limit, ms)| {
        (
            Limit::fixed_window(limit, Duration::from_millis(ms)).unwrap(),
            ms * 1_000,
        )
    });
    let sliding = (1u64..60, 1u64..12, 1u64..200).prop_map(|(limit, buckets, sub_ms)| {
        let window = buckets * sub_ms * 1_000;
        (
            Limit::sliding_window(limit, Duration::from_micros(window), buckets).unwrap(),
            window,
        )
    });
    let log = (1u64..60, 1u64..2_000).prop_map(|(limit, ms)| {
        (
            Limit::sliding_log(limit, Duration::from_millis(ms)).unwrap(),
            ms * 1_000,
        )
    });
    let bucket =
        (1u64..60, 1u64..10, 1u64..3_000_000, any::<bool>()).prop_map(|(capacity, refill, interval, whole)| {
            let spec = TokenBucketSpec {
                capacity,
                refill,
                interval: Duration::from_micros(interval),
                mode: if whole { Refill::Interval } else { Refill::Smooth },
                initial: None,
                max_debt: None,
            };
            (LimitSpec::TokenBucket(spec).build().unwrap(), interval)
        });
    let gcra = (1u64..50, 1u64..5_000_000, 1u64..60).prop_map(|(rate, period, burst)| {
        (
            Limit::gcra(rate, Duration::from_micros(period), burst).unwrap(),
            (period / rate).max(1),
        )
    });
    prop_oneof![window, sliding, log, bucket, gcra]
}
