//! Sliding window counter: `limit` units per `window`, counted in `buckets`
//! epoch-aligned sub-intervals.
//!
//! The count is the sum over every sub-interval that overlaps the last
//! `window` — including the oldest one, which overlaps only in part. Admitted
//! units therefore count for a little longer than `window` (up to one
//! sub-interval more), which makes the bound exact; the state is at most
//! `buckets + 1` counters.
//!
//! **Bound:** any interval of length `window` (both ends included) admits at
//! most `limit` units.

use std::convert::Infallible;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::core::{at_least_one, positive, refund_whole, Action, Algorithm, Step, Update};
use crate::decision::Decision;
use crate::duration::serde_text;
use crate::error::{Error, Result};

/// The most sub-intervals a sliding window may have.
pub const MAX_BUCKETS: u64 = 1_000;

/// `limit` units per `window`, counted in `buckets` sub-intervals (default 10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlidingWindowSpec {
    /// Units admitted in any window.
    pub limit: u64,
    /// The window's length.
    #[serde(with = "serde_text")]
    pub window: Duration,
    /// Sub-intervals the window is counted in (default 10, at most 1000).
    #[serde(default = "default_buckets")]
    pub buckets: u64,
}

fn default_buckets() -> u64 {
    10
}

/// Parameters of a sliding window counter, validated (`window` is a multiple
/// of `buckets`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    pub(crate) limit: u64,
    pub(crate) window: u64,
    pub(crate) buckets: u64,
}

/// Counts of the sub-intervals that still overlap the window.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlidingWindowState {
    /// `(start of the sub-interval in µs since the epoch, units admitted in
    /// it)`, oldest first, no zero counts. Starts are instants, not indexes,
    /// so that a limit redefined with other sub-intervals reads them as times
    /// all the same.
    pub counts: Vec<(u64, u64)>,
}

impl SlidingWindow {
    fn sub(&self) -> u64 {
        self.window / self.buckets
    }

    /// The live counts at `now`, oldest first, and their sum.
    fn live(&self, state: Option<&SlidingWindowState>, now: u64) -> (Vec<(u64, u64)>, u64) {
        let counts: Vec<(u64, u64)> = state
            .map(|state| {
                state
                    .counts
                    .iter()
                    .copied()
                    .filter(|&(start, _)| self.leaves(start) > now)
                    .collect()
            })
            .unwrap_or_default();
        let total = counts.iter().map(|&(_, count)| count).sum();
        (counts, total)
    }

    /// When the units of the sub-interval starting at `start` stop counting.
    fn leaves(&self, start: u64) -> u64 {
        start.saturating_add((self.buckets + 1) * self.sub())
    }

    fn reset_after(&self, counts: &[(u64, u64)], now: u64) -> u64 {
        counts.last().map_or(0, |&(index, _)| self.leaves(index) - now)
    }

    /// Admits `cost` units if the window has room.
    pub(crate) fn check(&self, state: Option<&SlidingWindowState>, now: u64, cost: u64) -> Step<SlidingWindowState> {
        let (mut counts, total) = self.live(state, now);
        let remaining = self.limit.saturating_sub(total);
        if cost > self.limit {
            return Step::unchanged(Decision::deny(
                self.limit,
                remaining,
                None,
                self.reset_after(&counts, now),
            ));
        }
        if cost > remaining {
            // Oldest sub-intervals leave first: wait until enough have gone.
            let needed = total + cost - self.limit;
            let mut freed = 0;
            let mut retry_after = None;
            for &(index, count) in &counts {
                freed += count;
                if freed >= needed {
                    retry_after = Some(self.leaves(index) - now);
                    break;
                }
            }
            return Step::unchanged(Decision::deny(
                self.limit,
                remaining,
                retry_after,
                self.reset_after(&counts, now),
            ));
        }
        if cost == 0 {
            return Step::unchanged(Decision::allow(
                self.limit,
                remaining,
                self.reset_after(&counts, now),
                0,
            ));
        }
        let index = now - now % self.sub();
        // Kept in order of index, even when the clock went back.
        let at = counts.partition_point(|&(counted, _)| counted <= index);
        match at.checked_sub(1).map(|last| &mut counts[last]) {
            Some((counted, count)) if *counted == index => *count += cost,
            _ => counts.insert(at, (index, cost)),
        }
        let decision = Decision::allow(self.limit, remaining - cost, self.reset_after(&counts, now), 0);
        Step::changed(decision, SlidingWindowState { counts })
    }

    /// Gives back units taken at `at` from the count of the sub-interval
    /// holding `at`, while it counts. The new state, or `None` when nothing
    /// changes.
    pub(crate) fn refunded(
        &self,
        state: Option<&SlidingWindowState>,
        now: u64,
        at: u64,
        cost: u64,
    ) -> Option<SlidingWindowState> {
        if cost == 0 {
            return None;
        }
        let (mut counts, _) = self.live(state, now);
        let index = at - at % self.sub();
        let position = counts.iter().position(|&(start, _)| start == index)?;
        let left = counts[position].1.saturating_sub(cost);
        if left == 0 {
            counts.remove(position);
        } else {
            counts[position].1 = left;
        }
        Some(SlidingWindowState { counts })
    }
}

impl Algorithm for SlidingWindow {
    type Spec = SlidingWindowSpec;
    type State = SlidingWindowState;
    type Stored = SlidingWindowState;
    type Edit<'a> = Infallible;

    const NAME: &'static str = "sliding_window";
    #[cfg(feature = "redis")]
    const ID: u8 = 2;

    fn build(spec: &SlidingWindowSpec) -> Result<Self> {
        let limit = at_least_one(spec.limit, "limit")?;
        let window = positive(spec.window, "window")?;
        let buckets = at_least_one(spec.buckets, "buckets")?;
        if buckets > MAX_BUCKETS {
            return Err(Error::invalid_limit(format!("buckets must be at most {MAX_BUCKETS}")));
        }
        if window % buckets != 0 {
            return Err(Error::invalid_limit(format!(
                "window ({window} us) must be a whole number of microseconds per bucket ({buckets} buckets)"
            )));
        }
        Ok(Self { limit, window, buckets })
    }

    fn capacity(&self) -> u64 {
        self.limit
    }

    fn window(&self) -> Option<Duration> {
        Some(Duration::from_micros(self.window))
    }

    fn available(&self, state: Option<&SlidingWindowState>, now: u64) -> u64 {
        self.limit.saturating_sub(self.live(state, now).1)
    }

    #[inline]
    fn decide(
        &self,
        state: Option<&SlidingWindowState>,
        now: u64,
        action: Action<'_>,
        cost: u64,
    ) -> Step<Update<SlidingWindowState, Infallible>> {
        if let Action::Refund { at, .. } = action {
            return refund_whole(self, state, now, self.refunded(state, now, at, cost)).map(Update::Put);
        }
        self.check(state, now, action.check_cost(cost)).map(Update::Put)
    }

    #[cfg(feature = "redis")]
    fn script_params(&self) -> impl IntoIterator<Item = u64> {
        [self.limit, self.window, self.buckets]
    }
}
