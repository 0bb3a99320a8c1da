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

use super::core::{at_least_one, positive, record_whole, refund_whole, Action, Algorithm, Step, Update};
#[cfg(feature = "engine")]
use super::core::{Encoded, Loaded, Value};
#[cfg(feature = "engine")]
use super::encoding::{number, text};
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

#[cfg(feature = "engine")]
use super::encoding::EXACT;

/// The number in `text` when Lua holds it exactly.
#[cfg(feature = "engine")]
fn exact(text: &[u8]) -> Option<u64> {
    number(text).filter(|&n| n < EXACT)
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
        // Over when total + cost > limit: a peek too, once usage recorded
        // above the limit has left nothing.
        if total.saturating_add(cost) > self.limit {
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
        self.add(&mut counts, now, cost);
        let decision = Decision::allow(self.limit, remaining - cost, self.reset_after(&counts, now), 0);
        Step::changed(decision, SlidingWindowState { counts })
    }

    /// Counts `cost` units in now's sub-interval.
    fn add(&self, counts: &mut Vec<(u64, u64)>, now: u64, cost: u64) {
        let index = now - now % self.sub();
        // Kept in order of index, even when the clock went back.
        let at = counts.partition_point(|&(counted, _)| counted <= index);
        match at.checked_sub(1).map(|last| &mut counts[last]) {
            Some((counted, count)) if *counted == index => *count = count.saturating_add(cost),
            _ => counts.insert(at, (index, cost)),
        }
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
    #[cfg(feature = "engine")]
    const ID: u8 = 2;
    const LEASABLE: bool = true;

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

    /// Refunds give back to the count of the sub-interval holding `at`, and add up.
    fn refund_key(&self, at: u64) -> Option<u64> {
        Some(at - at % self.sub())
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
        match action {
            Action::Refund { at, .. } => refund_whole(self, state, now, self.refunded(state, now, at, cost)),
            Action::Record => record_whole(
                |state, cost| self.check(state, now, cost),
                state,
                cost,
                || {
                    let (mut counts, _) = self.live(state, now);
                    self.add(&mut counts, now, cost);
                    SlidingWindowState { counts }
                },
            ),
            _ => self.check(state, now, action.check_cost(cost)),
        }
        .map(Update::Put)
    }

    #[cfg(feature = "engine")]
    fn params(&self) -> impl IntoIterator<Item = u64> {
        [self.limit, self.window, self.buckets]
    }

    /// `[limit, window in µs, buckets]`, not yet validated.
    #[cfg(feature = "engine")]
    fn spec_of(params: &[u64]) -> Option<SlidingWindowSpec> {
        let &[limit, window, buckets] = params else {
            return None;
        };
        Some(SlidingWindowSpec {
            limit,
            window: Duration::from_micros(window),
            buckets,
        })
    }

    /// A hash of sub-interval start → count, and "x": the instant the state
    /// says nothing more. Counts that have left the window for these
    /// parameters are skipped (the next write drops them); a hash whose "x"
    /// is missing or has passed, or with no live count, is none, and so is a
    /// hash of other fields or a key of another type. Starts written twice
    /// ("7" and "07") are one sub-interval, their counts summed, as the Lua
    /// sums them; a zero count (never written) is kept, as the Lua keeps it.
    #[cfg(feature = "engine")]
    fn load(&self, value: &Value, now: u64) -> Loaded<SlidingWindowState> {
        let Value::Hash(fields) = value else {
            return Loaded::None;
        };
        let mut expires = None;
        let mut counts = Vec::with_capacity(fields.len());
        for (field, value) in fields {
            if field == b"x" {
                expires = number(value);
                continue;
            }
            let (Some(start), Some(count)) = (exact(field), exact(value)) else {
                return Loaded::None;
            };
            if self.leaves(start) > now {
                counts.push((start, count));
            }
        }
        if counts.is_empty() || expires.is_none_or(|expires| expires <= now) {
            return Loaded::None;
        }
        counts.sort_unstable();
        counts.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1 += later.1;
            }
            same
        });
        let total = counts.iter().try_fold(0, |total: u64, &(_, count)| {
            total.checked_add(count).filter(|&n| n < EXACT)
        });
        match total {
            Some(_) => Loaded::State(SlidingWindowState { counts }),
            None => Loaded::None,
        }
    }

    /// Every count, and "x" = `expires`: what the Lua `store` leaves once it
    /// has dropped the counts that left the window.
    #[cfg(feature = "engine")]
    fn encode(&self, state: &SlidingWindowState, expires: u64) -> Encoded {
        let mut fields = Vec::with_capacity(state.counts.len() + 1);
        fields.extend(state.counts.iter().map(|&(start, count)| (text(start), text(count))));
        fields.push((b"x".to_vec(), text(expires)));
        Encoded::Hash(fields)
    }
}

#[cfg(all(test, feature = "engine"))]
mod engine_tests {
    use super::*;
    use crate::algorithm::testing::{self, from_params, known};
    use crate::decision::Decision;

    const T0: u64 = 1_700_000_000_000_000;

    /// 10 per 1 000 µs in sub-intervals of 100 µs: a count leaves 1 100 µs
    /// after its sub-interval starts.
    fn limit() -> SlidingWindow {
        from_params(&[10, 1_000, 10]).unwrap()
    }

    /// The hash Redis holds once `encoded` is written.
    fn written(encoded: Encoded) -> Value {
        match encoded {
            Encoded::Hash(fields) => Value::Hash(fields),
            other => panic!("not a hash: {other:?}"),
        }
    }

    /// A hash of `(start, count)` fields and "x" = `expires`.
    fn hash(fields: &[(u64, u64)], expires: u64) -> Value {
        let mut fields: Vec<_> = fields
            .iter()
            .map(|&(start, count)| (text(start), text(count)))
            .collect();
        fields.push((b"x".to_vec(), text(expires)));
        Value::Hash(fields)
    }

    /// What a load of `value` at `now` gives: a state or none.
    fn read(value: &Value, now: u64) -> Option<SlidingWindowState> {
        known(limit().load(value, now))
    }

    /// Decisions of every kind at `now`, and the units available.
    fn probes(state: Option<&SlidingWindowState>, now: u64) -> (Vec<Decision>, u64) {
        testing::window_probes(&limit(), state, now, (T0 + 250, 2))
    }

    #[test]
    fn a_written_state_reads_back_deciding_the_same() {
        let limit = limit();
        let mut state = None;
        for (at, cost) in [
            (T0, 2),
            (T0 + 250, 3),
            (T0 + 260, 1),
            (T0 + 900, 2),
            (T0 + 1_150, 1),
            (T0 + 1_300, 4),
        ] {
            let step = limit.decide(state.as_ref(), at, Action::Check, cost);
            assert!(step.decision.allowed, "at {at}");
            let Some(Update::Put(new)) = step.change else {
                panic!("no change at {at}");
            };
            let expires = at + step.decision.reset_after.as_micros() as u64;
            let value = written(limit.encode(&new, expires));
            for now in [at, at + 99, at + 100, at + 700, expires - 1] {
                let loaded = read(&value, now);
                assert_eq!(
                    probes(loaded.as_ref(), now),
                    probes(Some(&new), now),
                    "written at {at}, read at {now}"
                );
            }
            assert_eq!(limit.load(&value, expires), Loaded::None);
            state = Some(new);
        }
    }

    #[test]
    fn a_hash_as_the_lua_leaves_it_reads_as_the_lua_reads_it() {
        let now = T0 + 1_050;
        // The count of T0 - 100 left at T0 + 1_000; the Lua leaves it until
        // the next write.
        let value = hash(&[(T0 + 500, 4), (T0 - 100, 2), (T0, 3)], T0 + 1_600);
        let loaded = read(&value, now).unwrap();
        assert_eq!(loaded.counts, [(T0, 3), (T0 + 500, 4)]);
        assert_eq!(limit().available(Some(&loaded), now), 3);
        // A write after an admission leaves the live counts, the new one and "x".
        let step = limit().decide(Some(&loaded), now, Action::Check, 1);
        let Some(Update::Put(new)) = step.change else {
            panic!("denied");
        };
        assert_eq!(
            limit().encode(&new, T0 + 2_100),
            Encoded::Hash(vec![
                (text(T0), text(3u64)),
                (text(T0 + 500), text(4u64)),
                (text(T0 + 1_000), text(1u64)),
                (b"x".to_vec(), text(T0 + 2_100)),
            ])
        );
        // "x" passed or missing, no live count: none.
        assert_eq!(read(&hash(&[(T0, 3)], now), now), None);
        assert_eq!(read(&Value::Hash(vec![(text(T0), text(3u64))]), now), None);
        assert_eq!(read(&hash(&[(T0 - 100, 2)], T0 + 1_600), now), None);
        // Another algorithm's value, or a hash of other fields: none.
        let log = Value::Zset(vec![(b"\0x".to_vec(), -1), (b"\0b".to_vec(), 0), (text(T0), 1)]);
        for other in [
            Value::String(b"f10:2".to_vec()),
            Value::String(b"hello".to_vec()),
            log,
            Value::Other,
        ] {
            assert_eq!(read(&other, now), None);
        }
        let mut odd = hash(&[(T0, 3)], T0 + 1_600);
        if let Value::Hash(fields) = &mut odd {
            fields.push((b"name".to_vec(), b"bob".to_vec()));
        }
        assert_eq!(read(&odd, now), None);
    }

    #[test]
    fn params_come_back() {
        let limit = limit();
        let params: Vec<u64> = limit.params().into_iter().collect();
        assert_eq!(from_params(&params), Some(limit));
        assert_eq!(from_params::<SlidingWindow>(&[10, 1_000]), None);
        assert_eq!(from_params::<SlidingWindow>(&[10, 1_001, 10]), None);
    }
}
