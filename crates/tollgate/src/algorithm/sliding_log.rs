//! Sliding log: exact, one entry per admitted unit in the last `window`.
//!
//! Entries admitted at the same microsecond share one entry, so the state
//! holds at most `limit` entries. Exact, at O(limit) memory. Each entry keeps
//! the running sum of the units admitted through it, so the live total, the
//! entries that have left the window and `retry_after` are all found by
//! binary search, and an admission drops the oldest entries that have left
//! (at most `TRIM_STEP` of them; the rest stay, known to have left, for
//! later admissions) and appends one: a decision costs O(log n) in the
//! entries held, plus the entries it drops.
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

use super::core::{at_least_one, edit, positive, Action, Algorithm, Edit, Step, Update, WindowSpec, TRIM_STEP};
#[cfg(feature = "engine")]
use super::core::{in_set_order, Encoded, Loaded, Members, Scores, SortedSet, Value};
#[cfg(feature = "engine")]
use super::encoding::{number, text};
use crate::decision::Decision;
use crate::error::Result;

/// The member scored minus the instant the log says nothing more (first).
#[cfg(feature = "engine")]
const EXPIRES: &[u8] = b"\0x";
/// The member scored with the base (second).
#[cfg(feature = "engine")]
const BASE: &[u8] = b"\0b";
#[cfg(feature = "engine")]
use super::encoding::EXACT;

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
    /// Entries stamped before this instant (µs; 0: none) have left
    /// whatever the window: a Redis key keeps them when its log lapsed
    /// whole (its "\0x" passed), to trim them in steps, and no longer
    /// window redefined later counts them again. The memory store, which
    /// drops a log that lapses, never sets it.
    dead_before: u64,
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
        let expired = state
            .entries
            .partition_point(|&(at, _)| at < state.dead_before || at + self.window <= now);
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

    /// Units of the `total` live that must leave the window before `cost`
    /// more fit (when they do not).
    fn needed(&self, total: u64, cost: u64) -> u64 {
        total + cost - self.limit
    }

    /// The units that must leave before a request fits, for every request a
    /// decision of `cost` may look at: a check of it, of one unit (what
    /// `check_at_most` asks when nothing is left) or of none (a peek), and
    /// a record of the first two (a refused check that records its
    /// overage). The entries where a denial's `retry_after` lands.
    #[cfg(feature = "engine")]
    fn retry_targets(&self, total: u64, cost: u64) -> impl Iterator<Item = u64> + '_ {
        [cost, 1, 0]
            .into_iter()
            .filter(move |&cost| total.saturating_add(cost) > self.limit)
            .flat_map(move |cost| {
                let record = (cost > 0 && cost <= self.limit).then(|| self.needed(total + cost, cost));
                [Some(self.needed(total, cost)), record]
            })
            .flatten()
            .filter(move |&needed| needed <= total)
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
        // Over when total + cost > limit: a peek too, once usage recorded
        // above the limit has left nothing.
        if total.saturating_add(cost) > self.limit {
            // The oldest entries leave first: wait until enough units have left.
            let needed = self.needed(total, cost);
            let retry_after = live.and_then(|live| self.retry_after(&live, needed, now));
            return Step::unchanged(Decision::deny(self.limit, remaining, retry_after, reset_after));
        }
        if cost == 0 {
            return Step::unchanged(Decision::allow(self.limit, remaining, reset_after, 0));
        }
        let (at, change) = Self::admission(live.as_ref(), now, cost);
        let decision = Decision::allow(self.limit, remaining - cost, at + self.window - now, 0);
        Step::changed(decision, change)
    }

    /// The instant `cost` units logged at `now` are stamped at, and the
    /// change that logs them. Kept in order of time: when the clock went
    /// back, at the newest instant.
    ///
    /// The oldest entries that have left the window go with it, at most
    /// `TRIM_STEP` of them, even when every entry has left (the rest stay,
    /// known to have left, for later admissions): as the Lua library and
    /// the module trim, so that every engine holds the same entries, which
    /// a limit redefined with a longer window may count again, and no call
    /// frees a whole set.
    fn admission(live: Option<&Live<'_>>, now: u64, cost: u64) -> (u64, LogChange) {
        let newest = live.and_then(|live| live.state.entries.back());
        let at = newest.map_or(now, |&(newest, _)| newest.max(now));
        let expired = live.map_or(0, |live| live.expired.min(TRIM_STEP));
        (
            at,
            LogChange::Admit {
                expired,
                at,
                units: cost,
            },
        )
    }

    /// Logs `cost` units that were already spent, whether or not they fit
    /// (a check when they do). Over the limit, the decision is a check of
    /// the same cost on the log with them in it, found without building it.
    pub(crate) fn record(&self, state: Option<&SlidingLogState>, now: u64, cost: u64) -> Step<LogChange> {
        let step = self.check(state, now, cost);
        // A record of nothing is a peek.
        if step.decision.allowed || cost == 0 {
            return step;
        }
        let live = state.map(|state| self.live(state, now));
        let total = live.as_ref().map_or(0, |live| live.total);
        let (at, change) = Self::admission(live.as_ref(), now, cost);
        // A request of `cost` after them waits until enough units have
        // left: the logged ones first, then these.
        let retry_after = (cost <= self.limit).then(|| {
            let needed = self.needed(total + cost, cost);
            live.as_ref()
                .filter(|_| needed <= total)
                .and_then(|live| self.retry_after(live, needed, now))
                .unwrap_or(at + self.window - now)
        });
        let decision = Decision::deny(self.limit, 0, retry_after, at + self.window - now);
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
            Some(&(stamp, _)) if stamp == at && stamp >= state.dead_before && stamp + self.window > now => {}
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

impl SlidingLog {
    /// Whether an entry stamped `at` has left at `now`: the window has
    /// passed it, or it is stamped before `dead_before` (a log that lapsed).
    #[cfg(feature = "engine")]
    fn left(&self, at: u64, dead_before: u64, now: u64) -> bool {
        at < dead_before || at.saturating_add(self.window) <= now
    }

    /// The last entry that has left the window at `now`: at or after `gone`
    /// (which has left), found by bisection over the totals up to `live`
    /// (the newest's, which has not). Totals and instants rise together, so
    /// the first entry scored `mid` or more tells which side of `mid` the
    /// last that left is on. O(log(live − gone)) reads of one member: at
    /// most 64.
    #[cfg(feature = "engine")]
    fn last_gone(
        &self,
        set: &mut dyn SortedSet,
        key: &[u8],
        now: u64,
        mut gone: (Vec<u8>, i64),
        live: i64,
        dead_before: u64,
    ) -> (Vec<u8>, i64) {
        // `gone` has left; the first entry scored `high` or more has not.
        let mut high = live;
        while high.saturating_sub(gone.1) > 1 {
            let mid = gone.1 + (high - gone.1) / 2;
            let mut probe = Members::new();
            set.read_into(key, Scores::from(mid), false, 1, &mut probe);
            match probe.pop() {
                Some(entry) if number(&entry.0).is_some_and(|at| self.left(at, dead_before, now)) => gone = entry,
                _ => high = mid,
            }
        }
        gone
    }
}

impl Algorithm for SlidingLog {
    type Spec = WindowSpec;
    type State = SlidingLogState;
    type Stored = Box<SlidingLogState>;
    type Edit<'a> = LogChange;

    const NAME: &'static str = "sliding_log";
    #[cfg(feature = "engine")]
    const ID: u8 = 3;
    const LEASABLE: bool = true;

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
            Action::Record => self.record(state, now, cost),
            _ => self.check(state, now, action.check_cost(cost)),
        };
        edit(state, step)
    }

    #[cfg(feature = "engine")]
    fn params(&self) -> impl IntoIterator<Item = u64> {
        [self.limit, self.window]
    }

    /// `[limit, window in µs]`, not yet validated.
    #[cfg(feature = "engine")]
    fn spec_of(params: &[u64]) -> Option<WindowSpec> {
        WindowSpec::from_params(params)
    }

    /// The members a decision reads: "\0x" and "\0b"; the newest entry;
    /// from the front, the entries that have left the window, at most
    /// `TRIM_STEP + 1` (the first `TRIM_STEP` are what an admission trims),
    /// and the first live one, or, past those, the last entry that has left,
    /// found by bisection; the entries a denial's `retry_after` lands on; for
    /// a refund, the entry refunded, the one before it and every later one
    /// (whose totals drop). O(log² n + `TRIM_STEP` + entries refunded
    /// through), as the Lua version reads it.
    #[cfg(feature = "engine")]
    fn fetch(&self, set: &mut dyn SortedSet, key: &[u8], now: u64, action: Action<'_>, cost: u64) -> Option<Members> {
        if !set.is_sorted_set(key) {
            return None;
        }
        let mut members = Members::with_capacity(8);
        // "\0x" (whose name says since when entries are dead, when it says;
        // once it has passed, every entry is), "\0b", then from the front
        // the entries that have left, at most TRIM_STEP + 1, and the first
        // live one.
        let (mut walked, mut dead_before) = (0, 0);
        set.scan(key, Scores::ALL, false, &mut |member, score, _| {
            members.push((member.to_vec(), score));
            match members.len() {
                1 => match dead_since(member) {
                    Some(_) if -i128::from(score) <= i128::from(now) => {
                        dead_before = u64::MAX;
                        true
                    }
                    Some(dead) => {
                        dead_before = dead;
                        true
                    }
                    None => false,
                },
                2 => member == BASE,
                _ if number(member).is_some_and(|at| self.left(at, dead_before, now)) => {
                    walked += 1;
                    walked <= TRIM_STEP
                }
                _ => false,
            }
        });
        if members.len() < 3 || dead_since(&members[0].0).is_none() || members[1].0 != BASE {
            // No entry, or another algorithm's set: no state.
            return Some(members);
        }
        // The newest: once it has left, every entry has (the last that
        // left; the state holds none live, and a write trims a step).
        set.read_into(key, Scores::ALL, true, 1, &mut members);
        let (newest, newest_total) = &members[members.len() - 1];
        let newest_total = *newest_total;
        if number(newest).is_none_or(|at| self.left(at, dead_before, now)) {
            return Some(in_set_order(members));
        }
        // The last that left ("\0b" when none has): the last read, or past
        // more than one admission trims, found by bisection.
        let mut base = members[1 + walked].1;
        if walked > TRIM_STEP {
            let last_gone = self.last_gone(set, key, now, members[1 + walked].clone(), newest_total, dead_before);
            base = last_gone.1;
            members.push(last_gone);
        }
        // The live units: the newest total less the last that left.
        let total = newest_total.wrapping_sub(base).cast_unsigned();
        for needed in self.retry_targets(total, action.check_cost(cost)) {
            let reaching = Scores::from(base.wrapping_add_unsigned(needed));
            set.read_into(key, reaching, false, 1, &mut members);
        }
        if let Action::Refund { at, .. } = action {
            // A refund of units that have left gives nothing back (a peek).
            if !self.left(at, dead_before, now) {
                if let Some(own) = set.score(key, &text(at)) {
                    set.read_into(key, Scores::from(own), false, usize::MAX, &mut members);
                    set.read_into(key, Scores::below(own), true, 1, &mut members);
                }
            }
        }
        Some(in_set_order(members))
    }

    /// A sorted set: "\0x" scored minus the instant the log says nothing
    /// more, "\0b" scored with the base, then one member per instant (µs as
    /// text) scored with the running total. The entries read that have left
    /// the window stay in the state, as the memory store holds them until an
    /// admission trims at most `TRIM_STEP` of them (those not read lie
    /// between them and the last that left, which is read: the totals are
    /// running sums, so the state decides as the whole log does). A log
    /// whose "\0x" has passed lapsed: every entry in it is dead, whatever the
    /// window (the memory store dropped it), and "\0x" is written again
    /// named "\0x<instant>", before which entries are dead, until they are
    /// trimmed in steps. A log of no entry, or a set or key of another kind,
    /// is none. Scores are the totals as they are, read as `u64` two's
    /// complement, so that a log begun by either engine keeps its numbers
    /// (only differences count). A log out of order (instants or totals not
    /// rising, which no engine writes) is none.
    #[cfg(feature = "engine")]
    fn load(&self, value: &Value, now: u64) -> Loaded<Box<SlidingLogState>> {
        let Value::Zset(members) = value else {
            return Loaded::None;
        };
        let [(expiry, until), (base, base_total), logged @ ..] = members.as_slice() else {
            return Loaded::None;
        };
        let Some(mut dead_before) = dead_since(expiry).filter(|_| base == BASE) else {
            return Loaded::None;
        };
        let base = base_total.cast_unsigned();
        let mut entries = VecDeque::with_capacity(logged.len());
        let mut newest = None;
        for (member, total) in logged {
            let Some(at) = number(member).filter(|&at| at < EXACT && newest < Some(at)) else {
                return Loaded::None;
            };
            newest = Some(at);
            entries.push_back((at, total.cast_unsigned()));
        }
        // Units through each live entry: rising from the base, none empty.
        let mut through = 0;
        for &(_, total) in &entries {
            let next = total.wrapping_sub(base);
            if next <= through || next >= EXACT {
                return Loaded::None;
            }
            through = next;
        }
        let Some(newest) = newest else {
            return Loaded::None;
        };
        if -i128::from(*until) <= i128::from(now) {
            // The log lapsed: every entry is dead, to be trimmed in steps.
            dead_before = newest + 1;
        }
        Loaded::State(Box::new(SlidingLogState {
            entries,
            base,
            dead_before,
        }))
    }

    /// A window while more than a step of entries that left are in the
    /// state (a refund left none live): the rest go in steps.
    #[cfg(feature = "engine")]
    fn backlog(&self, state: &SlidingLogState, now: u64) -> u64 {
        if self.live(state, now).expired > TRIM_STEP {
            self.window
        } else {
            0
        }
    }

    /// "\0x" scored minus `expires`, "\0b" the base, and every entry held:
    /// what the Lua `store` leaves once it has trimmed what the admission
    /// drops.
    #[cfg(feature = "engine")]
    fn encode(&self, state: &SlidingLogState, expires: u64) -> Encoded {
        let mut members = Vec::with_capacity(state.entries.len() + 2);
        let mut expiry = EXPIRES.to_vec();
        if state.dead_before > 0 {
            expiry.extend_from_slice(&text(state.dead_before));
        }
        members.push((expiry, 0_i64.saturating_sub_unsigned(expires)));
        members.push((BASE.to_vec(), state.base.cast_signed()));
        members.extend(state.entries.iter().map(|&(at, total)| (text(at), total.cast_signed())));
        Encoded::Zset(members)
    }
}

/// Since when the log's entries are dead (0: none), from the name of its
/// first member: "\0x", or "\0x" and that instant; `None`: not a log.
#[cfg(feature = "engine")]
fn dead_since(member: &[u8]) -> Option<u64> {
    match member.strip_prefix(EXPIRES)? {
        [] => Some(0),
        instant => number(instant),
    }
}

#[cfg(test)]
mod tests;

#[cfg(all(test, feature = "engine"))]
mod engine_tests;
