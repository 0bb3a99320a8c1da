//! Sliding log: exact, one entry per admitted unit in the last `window`.
//!
//! Entries admitted at the same microsecond share one `(instant, units)`
//! pair, so the state holds at most `limit` pairs. Exact, at O(limit) memory.
//!
//! **Bound:** any half-open interval `[t, t + window)` admits at most `limit`
//! units.

use super::Step;
use crate::decision::Decision;

/// Parameters of a sliding log, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLog {
    pub(crate) limit: u64,
    pub(crate) window: u64,
}

/// The admissions still inside the window.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlidingLogState {
    /// `(instant in µs, units admitted then)`, oldest first.
    pub entries: Vec<(u64, u64)>,
}

impl SlidingLog {
    /// Entries still counting at `now` (admitted after `now - window`), and their sum.
    fn live(&self, state: Option<&SlidingLogState>, now: u64) -> (Vec<(u64, u64)>, u64) {
        let entries: Vec<(u64, u64)> = state
            .map(|state| {
                state
                    .entries
                    .iter()
                    .copied()
                    .filter(|&(at, _)| at + self.window > now)
                    .collect()
            })
            .unwrap_or_default();
        let total = entries.iter().map(|&(_, units)| units).sum();
        (entries, total)
    }

    fn reset_after(&self, entries: &[(u64, u64)], now: u64) -> u64 {
        entries.last().map_or(0, |&(at, _)| at + self.window - now)
    }

    /// Units that would be admitted now.
    pub(crate) fn available(&self, state: Option<&SlidingLogState>, now: u64) -> u64 {
        self.limit.saturating_sub(self.live(state, now).1)
    }

    /// Admits `cost` units if the log has room.
    pub(crate) fn check(&self, state: Option<&SlidingLogState>, now: u64, cost: u64) -> Step<SlidingLogState> {
        let (mut entries, total) = self.live(state, now);
        let remaining = self.limit.saturating_sub(total);
        if cost > self.limit {
            return Step::unchanged(Decision::deny(
                self.limit,
                remaining,
                None,
                self.reset_after(&entries, now),
            ));
        }
        if cost > remaining {
            // The oldest entries leave first: wait until enough units have left.
            let needed = total + cost - self.limit;
            let mut freed = 0;
            let mut retry_after = None;
            for &(at, units) in &entries {
                freed += units;
                if freed >= needed {
                    retry_after = Some(at + self.window - now);
                    break;
                }
            }
            return Step::unchanged(Decision::deny(
                self.limit,
                remaining,
                retry_after,
                self.reset_after(&entries, now),
            ));
        }
        if cost == 0 {
            return Step::unchanged(Decision::allow(
                self.limit,
                remaining,
                self.reset_after(&entries, now),
                0,
            ));
        }
        // Kept in order of time, even when the clock went back.
        let at = entries.partition_point(|&(at, _)| at <= now);
        match at.checked_sub(1).map(|last| &mut entries[last]) {
            Some((instant, units)) if *instant == now => *units += cost,
            _ => entries.insert(at, (now, cost)),
        }
        let decision = Decision::allow(self.limit, remaining - cost, self.reset_after(&entries, now), 0);
        Step::changed(decision, SlidingLogState { entries })
    }
}
