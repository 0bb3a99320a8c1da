//! Sliding log: exact, one entry per admitted unit in the last `window`.
//!
//! Entries admitted at the same microsecond share one entry, so the state
//! holds at most `limit` entries. Exact, at O(limit) memory. Each entry keeps
//! the running sum of the units admitted through it, so the live total, the
//! entries that have left the window and `retry_after` are all found by
//! binary search, and an admission drops the entries that have left and
//! appends one: a decision costs O(log n) in the entries held, plus the
//! entries it drops.
//!
//! When the clock goes back (`now` before the newest entry), an admission is
//! stamped at the newest entry's instant rather than slotted in among older
//! ones: the log stays in order of time, and the units leave the window a
//! little later than they would have, never earlier.
//!
//! **Bound:** any half-open interval `[t, t + window)` admits at most `limit`
//! units.

use std::collections::VecDeque;
use std::time::Duration;

use super::core::{at_least_one, edit, positive, Action, Algorithm, Edit, Step, Update, WindowSpec};
use crate::decision::Decision;
use crate::error::Result;

/// Parameters of a sliding log, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLog {
    pub(crate) limit: u64,
    pub(crate) window: u64,
}

/// The admissions still inside the window (and those that have left it
/// since the last admission).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlidingLogState {
    /// `(instant in µs, units admitted through that instant)`, oldest first,
    /// one per instant. The running sum wraps around; only its differences
    /// count, and those never exceed a limit.
    entries: VecDeque<(u64, u64)>,
    /// The running sum before the oldest entry.
    base: u64,
}

/// An edit of the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogChange {
    /// An admission: drop the `expired` oldest entries and add `units` at
    /// `at` (merged into the newest entry when it is at `at`).
    Admit { expired: usize, at: u64, units: u64 },
    /// A refund: take `units` out of entry `index` (dropping it when that
    /// empties it) and so out of every later total.
    Refund { index: usize, units: u64 },
}

impl SlidingLogState {
    /// Units admitted from the oldest entry through entry `index`.
    fn through(&self, index: usize) -> u64 {
        self.entries[index].1.wrapping_sub(self.base)
    }

    /// Units admitted before entry `index`.
    fn before(&self, index: usize) -> u64 {
        index.checked_sub(1).map_or(0, |last| self.through(last))
    }

    /// Commits an edit.
    pub(crate) fn apply(&mut self, change: LogChange) {
        let (expired, at, units) = match change {
            LogChange::Admit { expired, at, units } => (expired, at, units),
            LogChange::Refund { index, units } => {
                let emptied = self.through(index) - self.before(index) == units;
                for (_, sum) in self.entries.range_mut(index..) {
                    *sum = sum.wrapping_sub(units);
                }
                if emptied {
                    self.entries.remove(index);
                }
                return;
            }
        };
        if expired > 0 {
            self.base = self.entries[expired - 1].1;
            self.entries.drain(..expired);
        }
        match self.entries.back_mut() {
            Some((newest, sum)) if *newest == at => *sum = sum.wrapping_add(units),
            newest => {
                let sum = newest.map_or(self.base, |&mut (_, sum)| sum).wrapping_add(units);
                self.entries.push_back((at, sum));
            }
        }
    }
}

impl Edit<SlidingLogState> for LogChange {
    fn apply(self, state: &mut SlidingLogState) {
        state.apply(self);
    }
}

/// The log as one decision sees it.
struct Live<'a> {
    state: &'a SlidingLogState,
    /// How many of the oldest entries have left the window.
    expired: usize,
    /// Units admitted before the first live entry.
    gone: u64,
    /// Units of the live entries.
    total: u64,
}

impl SlidingLog {
    /// The entries still counting at `now` (admitted after `now - window`).
    fn live<'a>(&self, state: &'a SlidingLogState, now: u64) -> Live<'a> {
        let expired = state.entries.partition_point(|&(at, _)| at + self.window <= now);
        let gone = state.before(expired);
        let total = state.before(state.entries.len()) - gone;
        Live {
            state,
            expired,
            gone,
            total,
        }
    }

    fn reset_after(&self, live: Option<&Live<'_>>, now: u64) -> u64 {
        live.filter(|live| live.total > 0)
            .and_then(|live| live.state.entries.back())
            .map_or(0, |&(at, _)| at + self.window - now)
    }

    /// When `needed` more of the live units have left the window.
    fn retry_after(&self, live: &Live<'_>, needed: u64, now: u64) -> Option<u64> {
        let target = live.gone + needed;
        let state = live.state;
        let index = state
            .entries
            .partition_point(|&(_, sum)| sum.wrapping_sub(state.base) < target);
        state.entries.get(index).map(|&(at, _)| at + self.window - now)
    }

    /// Admits `cost` units if the log has room.
    pub(crate) fn check(&self, state: Option<&SlidingLogState>, now: u64, cost: u64) -> Step<LogChange> {
        let live = state.map(|state| self.live(state, now));
        let total = live.as_ref().map_or(0, |live| live.total);
        let reset_after = self.reset_after(live.as_ref(), now);
        let remaining = self.limit.saturating_sub(total);
        if cost > self.limit {
            return Step::unchanged(Decision::deny(self.limit, remaining, None, reset_after));
        }
        if cost > remaining {
            // The oldest entries leave first: wait until enough units have left.
            let needed = total + cost - self.limit;
            let retry_after = live.and_then(|live| self.retry_after(&live, needed, now));
            return Step::unchanged(Decision::deny(self.limit, remaining, retry_after, reset_after));
        }
        if cost == 0 {
            return Step::unchanged(Decision::allow(self.limit, remaining, reset_after, 0));
        }
        // Kept in order of time: when the clock went back, at the newest instant.
        let newest = live.as_ref().and_then(|live| live.state.entries.back());
        let at = newest.map_or(now, |&(newest, _)| newest.max(now));
        let change = LogChange::Admit {
            expired: live.as_ref().map_or(0, |live| live.expired),
            at,
            units: cost,
        };
        let decision = Decision::allow(self.limit, remaining - cost, at + self.window - now, 0);
        Step::changed(decision, change)
    }

    /// Gives back units admitted at `at`: they leave the entry stamped `at`,
    /// while it counts, and every later total drops by them. (An admission
    /// made after the clock went back is stamped at the newest entry's
    /// instant: its refund finds no entry at `at` and gives nothing back.)
    /// Costs O(log n + entries newer than `at`). Reports as a peek after.
    pub(crate) fn refund(&self, state: Option<&SlidingLogState>, now: u64, at: u64, cost: u64) -> Step<LogChange> {
        let peek = || self.check(state, now, 0);
        let Some(state) = state.filter(|_| cost > 0) else {
            return peek();
        };
        let index = state.entries.partition_point(|&(stamp, _)| stamp < at);
        match state.entries.get(index) {
            Some(&(stamp, _)) if stamp == at && stamp + self.window > now => {}
            _ => return peek(),
        }
        let units = state.through(index) - state.before(index);
        let removed = units.min(cost);
        let total = self.live(state, now).total - removed;
        let last = state.entries.len() - 1;
        let newest = if removed == units && index == last {
            index.checked_sub(1).map(|before| state.entries[before].0)
        } else {
            Some(state.entries[last].0)
        };
        let reset_after = match newest {
            Some(newest) if total > 0 => newest + self.window - now,
            _ => 0,
        };
        let decision = Decision::allow(self.limit, self.limit.saturating_sub(total), reset_after, 0);
        Step::changed(decision, LogChange::Refund { index, units: removed })
    }
}

impl Algorithm for SlidingLog {
    type Spec = WindowSpec;
    type State = SlidingLogState;
    type Stored = Box<SlidingLogState>;
    type Edit<'a> = LogChange;

    const NAME: &'static str = "sliding_log";
    #[cfg(feature = "redis")]
    const ID: u8 = 3;

    fn build(spec: &WindowSpec) -> Result<Self> {
        Ok(Self {
            limit: at_least_one(spec.limit, "limit")?,
            window: positive(spec.window, "window")?,
        })
    }

    fn capacity(&self) -> u64 {
        self.limit
    }

    fn window(&self) -> Option<Duration> {
        Some(Duration::from_micros(self.window))
    }

    fn available(&self, state: Option<&SlidingLogState>, now: u64) -> u64 {
        let total = state.map_or(0, |state| self.live(state, now).total);
        self.limit.saturating_sub(total)
    }

    #[inline]
    fn decide(
        &self,
        state: Option<&SlidingLogState>,
        now: u64,
        action: Action<'_>,
        cost: u64,
    ) -> Step<Update<Box<SlidingLogState>, LogChange>> {
        let step = match action {
            Action::Refund { at, .. } => self.refund(state, now, at, cost),
            _ => self.check(state, now, action.check_cost(cost)),
        };
        edit(state, step)
    }

    #[cfg(feature = "redis")]
    fn script_params(&self) -> impl IntoIterator<Item = u64> {
        [self.limit, self.window]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_000_000_000;

    /// Runs a check and commits it, as a store does.
    fn check(log: &SlidingLog, state: &mut SlidingLogState, now: u64, cost: u64) -> Decision {
        let step = log.check(Some(state), now, cost);
        if let Some(change) = step.change {
            state.apply(change);
        }
        step.decision
    }

    /// The entries as `(instant, units)` pairs.
    fn entries(state: &SlidingLogState) -> Vec<(u64, u64)> {
        (0..state.entries.len())
            .map(|index| (state.entries[index].0, state.through(index) - state.before(index)))
            .collect()
    }

    #[test]
    fn admissions_at_one_instant_merge() {
        let log = SlidingLog {
            limit: 10,
            window: 1_000,
        };
        let mut state = SlidingLogState::default();
        check(&log, &mut state, T0, 2);
        check(&log, &mut state, T0, 3);
        check(&log, &mut state, T0 + 1, 1);
        assert_eq!(entries(&state), [(T0, 5), (T0 + 1, 1)]);
    }

    #[test]
    fn an_earlier_clock_stamps_at_the_newest_instant() {
        let log = SlidingLog {
            limit: 10,
            window: 1_000,
        };
        let mut state = SlidingLogState::default();
        check(&log, &mut state, T0, 1);
        check(&log, &mut state, T0 + 500, 2);
        // The clock goes back 300 µs: the entry joins the newest one.
        let decision = check(&log, &mut state, T0 + 200, 3);
        assert!(decision.allowed);
        assert_eq!(decision.remaining, 4);
        assert_eq!(decision.reset_after.as_micros(), 1_300);
        assert_eq!(entries(&state), [(T0, 1), (T0 + 500, 5)]);
        // Those units leave with the newest entry, not 300 µs before it.
        assert_eq!(log.available(Some(&state), T0 + 1_000), 5);
        assert_eq!(log.available(Some(&state), T0 + 1_499), 5);
        assert_eq!(log.available(Some(&state), T0 + 1_500), 10);
        // Back again, the oldest entry still live: the newest grows, nothing
        // is slotted in before it.
        check(&log, &mut state, T0 + 100, 1);
        assert_eq!(entries(&state), [(T0, 1), (T0 + 500, 6)]);
        // Forward again: the oldest has left, a new entry follows the newest.
        check(&log, &mut state, T0 + 1_200, 1);
        assert_eq!(entries(&state), [(T0 + 500, 6), (T0 + 1_200, 1)]);
    }

    #[test]
    fn entries_that_left_the_window_are_dropped_on_admission() {
        let log = SlidingLog {
            limit: 100,
            window: 1_000,
        };
        let mut state = SlidingLogState::default();
        for i in 0..10 {
            check(&log, &mut state, T0 + i * 100, i + 1);
        }
        // At T0 + 1_450 the entries at T0 .. T0 + 400 have left.
        assert_eq!(log.available(Some(&state), T0 + 1_450), 100 - (6 + 7 + 8 + 9 + 10));
        // A peek and a denial keep them; an admission drops them.
        check(&log, &mut state, T0 + 1_450, 0);
        check(&log, &mut state, T0 + 1_450, 100);
        assert_eq!(state.entries.len(), 10);
        check(&log, &mut state, T0 + 1_450, 1);
        assert_eq!(
            entries(&state),
            [
                (T0 + 500, 6),
                (T0 + 600, 7),
                (T0 + 700, 8),
                (T0 + 800, 9),
                (T0 + 900, 10),
                (T0 + 1_450, 1)
            ]
        );
        // Everything gone: the next admission leaves one entry.
        let decision = check(&log, &mut state, T0 + 10_000, 4);
        assert_eq!(decision.remaining, 96);
        assert_eq!(entries(&state), [(T0 + 10_000, 4)]);
    }

    #[test]
    fn a_log_of_fifty_thousand_live_entries_decides_exactly() {
        const LIVE: u64 = 50_000;
        // One entry every 2 µs, unit costs but every tenth entry weighs 3.
        let log = SlidingLog {
            limit: 70_000,
            window: 2 * LIVE,
        };
        let weight = |i: u64| if i.is_multiple_of(10) { 3 } else { 1 };
        let mut state = SlidingLogState::default();
        for i in 0..LIVE {
            let decision = check(&log, &mut state, T0 + 2 * i, weight(i));
            assert!(decision.allowed, "entry {i}");
        }
        let held: u64 = (0..LIVE).map(weight).sum();
        assert_eq!(held, 60_000);
        let now = T0 + 2 * LIVE - 1;
        assert_eq!(log.available(Some(&state), now), 10_000);
        // 20 000 more need 10 000 units to leave: entries 0..=7_499 hold
        // 750 · 3 + 6_750 = 9_000 units, and entries 7_500..=8_333 hold
        // 84 · 3 + 750 = 1_002 more, 1_000 of them through entry 8_331.
        let denied = check(&log, &mut state, now, 20_000);
        assert!(!denied.allowed);
        assert_eq!(denied.remaining, 10_000);
        let retry_after = denied.retry_after.unwrap().as_micros() as u64;
        assert_eq!(now + retry_after, T0 + 2 * 8_331 + 2 * LIVE);
        assert_eq!(
            denied.reset_after.as_micros() as u64,
            T0 + 2 * (LIVE - 1) + 2 * LIVE - now
        );
        assert_eq!(state.entries.len() as u64, LIVE, "a denial changed the log");
        // One microsecond early is not enough; retry_after is.
        assert!(!log.check(Some(&state), now + retry_after - 1, 20_000).decision.allowed);
        let later = check(&log, &mut state, now + retry_after, 20_000);
        assert!(later.allowed);
        assert_eq!(later.remaining, 0);
        // 8_332 entries left the window, one was added.
        assert_eq!(state.entries.len() as u64, LIVE - 8_332 + 1);
        // Sliding on: each admission drops one entry and adds one.
        for i in 0..1_000 {
            let at = now + retry_after + 2 + 2 * i;
            let freed = weight(8_332 + i);
            let decision = check(&log, &mut state, at, freed);
            assert!(decision.allowed, "slide {i}");
            assert_eq!(decision.remaining, 0, "slide {i}");
        }
        assert_eq!(state.entries.len() as u64, LIVE - 8_332 + 1);
    }

    #[test]
    fn retry_after_counts_units_not_entries() {
        let log = SlidingLog {
            limit: 10,
            window: 1_000,
        };
        let mut state = SlidingLogState::default();
        check(&log, &mut state, T0, 4);
        check(&log, &mut state, T0 + 10, 4);
        check(&log, &mut state, T0 + 20, 2);
        // 5 more need 5 to leave: the first two entries.
        let decision = log.check(Some(&state), T0 + 30, 5).decision;
        assert_eq!(decision.retry_after.unwrap().as_micros(), 1_010 - 30);
        // 4 need exactly the first.
        let decision = log.check(Some(&state), T0 + 30, 4).decision;
        assert_eq!(decision.retry_after.unwrap().as_micros(), 1_000 - 30);
        // More than the limit: never.
        assert_eq!(log.check(Some(&state), T0 + 30, 11).decision.retry_after, None);
    }
}
