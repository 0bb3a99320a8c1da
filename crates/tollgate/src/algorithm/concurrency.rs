//! Concurrency limiter: at most `limit` units in flight.
//!
//! `acquire` takes a lease of `cost` units named by the caller; `release`
//! returns it. A lease also ends by itself `ttl` after it was taken, so a
//! holder that crashed cannot leak capacity forever. Acquiring with the name
//! of a live lease renews it (new ttl, new cost).
//!
//! Leases are kept in order of expiry and by name, with the units they hold
//! in all, so an acquire, a release or a renewal costs O(log n) in the leases
//! held, plus the expired leases it drops (in Redis at most `TRIM_STEP` a
//! call: the rest stay, counted as ended, for later calls); a denial's
//! `retry_after` walks the soonest-to-expire leases only until enough units
//! are freed.
//!
//! **Bound:** at every instant, the leases that have neither been released
//! nor expired hold at most `limit` units.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::core::{at_least_one, edit, positive, Action, Algorithm, Edit, Step, Update};
#[cfg(feature = "engine")]
use super::core::{in_set_order, Encoded, Loaded, Members, Scores, SortedSet, Value, TRIM_STEP};
use crate::decision::Decision;
use crate::duration::serde_text;
use crate::error::{Error, Result};

/// At most `limit` units in flight; a lease ends by itself after `ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencySpec {
    /// Units held at once by live leases.
    pub limit: u64,
    /// How long a lease lives unless released.
    #[serde(with = "serde_text")]
    pub ttl: Duration,
}

/// The member scored minus the units held in total.
#[cfg(feature = "engine")]
const TOTAL: &[u8] = b"\0n";
/// The prefix of the member scored minus a lease's units, when other than one.
#[cfg(feature = "engine")]
const COST: &[u8] = b"\0c";
/// The units of the ended leases a fetch left unread (a figure, scored
/// minus them; see `encoding::DERIVED`).
#[cfg(feature = "engine")]
const ENDED: &[u8] = b"\0=e";
#[cfg(feature = "engine")]
use super::encoding::EXACT;

/// Parameters of a concurrency limiter, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency {
    pub(crate) limit: u64,
    pub(crate) ttl: u64,
}

/// The leases in flight (and those expired since the last acquire or release).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConcurrencyState {
    /// `(when it ends by itself, µs since the epoch; order taken)` → the
    /// lease's name and the units it holds, soonest to expire first.
    by_expiry: BTreeMap<(u64, u64), (Arc<str>, u64)>,
    /// The name the caller gave each lease → its key in `by_expiry`.
    by_name: HashMap<Arc<str>, (u64, u64), foldhash::fast::RandomState>,
    /// Units held by all the leases above.
    held: u64,
    /// Leases taken so far, to order those that end at the same instant.
    taken: u64,
    /// Units of leases that have ended but are still in a Redis key, unread
    /// (a call reads at most `TRIM_STEP` ended leases): what "\0n" counts
    /// beyond `held`. Zero in the memory store, which holds every lease.
    ended_left: u64,
}

/// What an acquire or a release does to the leases: drop those expired at
/// `now`, end lease `id`, and (an acquire) take it again for `cost` units
/// until `expires`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseChange<'a> {
    now: u64,
    id: &'a str,
    take: Option<(u64, u64)>,
}

impl ConcurrencyState {
    /// Leases live at `now`: their key, name and units, soonest to expire first.
    fn live(&self, now: u64) -> impl DoubleEndedIterator<Item = (&(u64, u64), &(Arc<str>, u64))> {
        self.by_expiry.range((now + 1, 0)..)
    }

    /// Units held by the leases live at `now`.
    fn in_flight(&self, now: u64) -> u64 {
        let expired: u64 = self.by_expiry.range(..(now + 1, 0)).map(|(_, (_, cost))| cost).sum();
        self.held - expired
    }

    /// The key of lease `id` if it is live at `now`.
    fn live_key(&self, id: &str, now: u64) -> Option<(u64, u64)> {
        self.by_name.get(id).copied().filter(|&(expires, _)| expires > now)
    }

    /// Units held by lease `id` if it is live at `now`.
    fn held_by(&self, id: &str, now: u64) -> u64 {
        self.live_key(id, now).map_or(0, |key| self.by_expiry[&key].1)
    }

    /// Ends lease `id`, if held, giving back its name.
    fn remove(&mut self, id: &str) -> Option<Arc<str>> {
        let key = self.by_name.remove(id)?;
        let (name, cost) = self.by_expiry.remove(&key)?;
        self.held -= cost;
        Some(name)
    }

    /// Commits an acquire or a release.
    pub(crate) fn apply(&mut self, change: LeaseChange<'_>) {
        while let Some(entry) = self.by_expiry.first_entry() {
            if entry.key().0 > change.now {
                break;
            }
            let (name, cost) = entry.remove();
            self.by_name.remove(&name);
            self.held -= cost;
        }
        let name = self.remove(change.id);
        if let Some((expires, cost)) = change.take {
            let name = name.unwrap_or_else(|| Arc::from(change.id));
            let key = (expires, self.taken);
            self.taken += 1;
            self.by_expiry.insert(key, (name.clone(), cost));
            self.by_name.insert(name, key);
            self.held += cost;
        }
    }
}

impl Edit<ConcurrencyState> for LeaseChange<'_> {
    fn apply(self, state: &mut ConcurrencyState) {
        state.apply(self);
    }
}

impl Concurrency {
    /// µs until the last of the leases live at `now` other than `except` ends.
    fn reset_after(state: Option<&ConcurrencyState>, now: u64, except: Option<&str>) -> u64 {
        state
            .and_then(|state| state.live(now).rev().find(|(_, (name, _))| Some(&**name) != except))
            .map_or(0, |((expires, _), _)| expires - now)
    }

    /// Units that must end before `cost` more fit, when `held_by_others`
    /// are held by the leases other than the one renewed (and they do not fit).
    fn needed(&self, held_by_others: u64, cost: u64) -> u64 {
        held_by_others + cost - self.limit
    }

    /// Takes (or renews) lease `id` for `cost` units if they fit; `id` may be
    /// `None` only for a peek (`cost == 0`).
    pub(crate) fn acquire<'a>(
        &self,
        state: Option<&ConcurrencyState>,
        now: u64,
        cost: u64,
        id: Option<&'a str>,
    ) -> Step<LeaseChange<'a>> {
        // What is held now, as a peek reports it.
        let in_flight = state.map_or(0, |state| state.in_flight(now));
        let remaining = self.limit.saturating_sub(in_flight);
        let reset_after = Self::reset_after(state, now, None);
        // Renewing a lease first gives back the units it holds.
        let renewed = state.zip(id).map_or(0, |(state, id)| state.held_by(id, now));
        let held_by_others = in_flight - renewed;
        if cost > self.limit {
            return Step::unchanged(Decision::deny(self.limit, remaining, None, reset_after));
        }
        if cost > self.limit.saturating_sub(held_by_others) {
            // Leases end soonest-first: wait until enough units have expired.
            let needed = self.needed(held_by_others, cost);
            let mut freed = 0;
            let retry_after = state.and_then(|state| {
                state
                    .live(now)
                    .filter(|(_, (name, _))| Some(&**name) != id)
                    .find(|(_, &(_, cost))| {
                        freed += cost;
                        freed >= needed
                    })
                    .map(|((expires, _), _)| expires - now)
            });
            return Step::unchanged(Decision::deny(self.limit, remaining, retry_after, reset_after));
        }
        let Some(id) = id.filter(|_| cost > 0) else {
            return Step::unchanged(Decision::allow(self.limit, remaining, reset_after, 0));
        };
        let expires = now + self.ttl;
        let decision = Decision::allow(
            self.limit,
            self.limit - held_by_others - cost,
            Self::reset_after(state, now, Some(id)).max(self.ttl),
            0,
        );
        let take = Some((expires, cost));
        Step::changed(decision, LeaseChange { now, id, take })
    }

    /// Ends lease `id` (a lease that is unknown or already expired is fine).
    pub(crate) fn release<'a>(&self, state: Option<&ConcurrencyState>, now: u64, id: &'a str) -> Step<LeaseChange<'a>> {
        let in_flight = state.map_or(0, |state| state.in_flight(now) - state.held_by(id, now));
        let decision = Decision::allow(
            self.limit,
            self.limit.saturating_sub(in_flight),
            Self::reset_after(state, now, Some(id)),
            0,
        );
        Step::changed(decision, LeaseChange { now, id, take: None })
    }
}

impl Algorithm for Concurrency {
    type Spec = ConcurrencySpec;
    type State = ConcurrencyState;
    type Stored = Box<ConcurrencyState>;
    type Edit<'a> = LeaseChange<'a>;

    const NAME: &'static str = "concurrency";
    #[cfg(feature = "engine")]
    const ID: u8 = 8;
    const LEASES: bool = true;

    fn build(spec: &ConcurrencySpec) -> Result<Self> {
        Ok(Self {
            limit: at_least_one(spec.limit, "limit")?,
            ttl: positive(spec.ttl, "ttl")?,
        })
    }

    fn capacity(&self) -> u64 {
        self.limit
    }

    fn available(&self, state: Option<&ConcurrencyState>, now: u64) -> u64 {
        self.limit.saturating_sub(state.map_or(0, |state| state.in_flight(now)))
    }

    /// Leases only: no `check` (or `acquire` without a lease) of a positive
    /// cost (and, as every limit that does not shape, no `reserve`).
    fn supports(&self, action: Action<'_>, cost: u64) -> Result<()> {
        match action {
            Action::Check | Action::Acquire { lease: None, .. } if cost > 0 => Err(Error::invalid_argument(
                "a concurrency limit is taken with acquire (and given back with release), not check",
            )),
            Action::Record => Err(Error::invalid_argument(
                "a concurrency limit counts requests in flight: it cannot record usage that already happened",
            )),
            _ => Ok(()),
        }
    }

    #[inline]
    fn decide<'a>(
        &self,
        state: Option<&ConcurrencyState>,
        now: u64,
        action: Action<'a>,
        cost: u64,
    ) -> Step<Update<Box<ConcurrencyState>, LeaseChange<'a>>> {
        let step = match action {
            Action::Release(lease) | Action::Refund { lease: Some(lease), .. } => self.release(state, now, lease),
            Action::Acquire { lease, .. } => self.acquire(state, now, cost, lease),
            // Without a lease, a refund gives nothing back, and a record is
            // refused by `supports`: a peek.
            Action::Refund { lease: None, .. } | Action::Record => self.acquire(state, now, 0, None),
            Action::Check | Action::Reserve(_) => self.acquire(state, now, cost, None),
        };
        edit(state, step)
    }

    #[cfg(feature = "engine")]
    fn params(&self) -> impl IntoIterator<Item = u64> {
        [self.limit, self.ttl]
    }

    /// `[limit, ttl in µs]`, not yet validated.
    #[cfg(feature = "engine")]
    fn spec_of(params: &[u64]) -> Option<ConcurrencySpec> {
        let &[limit, ttl] = params else {
            return None;
        };
        Some(ConcurrencySpec {
            limit,
            ttl: Duration::from_micros(ttl),
        })
    }

    /// The members a decision reads: "\0n"; the oldest leases that have
    /// ended, at most `TRIM_STEP` (a write trims them), and past those the
    /// units of the others, counted (`ENDED`); the lease named, if in the
    /// set; the two live leases that end last (a `reset_after`, the lease
    /// named left out); on a denial, the live leases soonest to end until
    /// enough units are freed. Each lease read with its "\0c" member, when
    /// it has one. O(log n + `TRIM_STEP` + leases walked) when every lease
    /// holds one unit (the ended are then counted by `ZCOUNT`), as the Lua
    /// version reads it; see [`ended_beyond`] otherwise.
    #[cfg(feature = "engine")]
    fn fetch(&self, set: &mut dyn SortedSet, key: &[u8], now: u64, action: Action<'_>, cost: u64) -> Option<Members> {
        if !set.is_sorted_set(key) {
            return None;
        }
        let mut members = Members::with_capacity(8);
        let Some(total) = set.score(key, TOTAL) else {
            // Another algorithm's set: no state.
            return Some(members);
        };
        members.push((TOTAL.to_vec(), total));
        let now_score = i64::try_from(now).unwrap_or(i64::MAX);
        let id = match action {
            Action::Acquire { lease, .. } => lease,
            Action::Release(lease) | Action::Refund { lease: Some(lease), .. } => Some(lease),
            _ => None,
        };
        // Whether any lease holds other than one unit ("\0n" the only
        // negative score otherwise): when none does, no "\0c" member is
        // looked up.
        let costly = set.count(key, Scores::below(0)) > 1;
        // The oldest leases that have ended, at most TRIM_STEP (a write
        // trims them).
        let ended_range = Scores::between(0, now_score);
        let (mut read, mut read_units, mut named_read, mut last_read) = (0, 0, false, None);
        set.scan(key, ended_range, false, &mut |name, ends, score| {
            let units = if costly {
                lease(&mut members, name, ends, score)
            } else {
                members.push((name.to_vec(), ends));
                1
            };
            read_units += units;
            named_read |= id.is_some_and(|id| id.as_bytes() == name);
            last_read = Some((ends, name.to_vec()));
            read += 1;
            read < TRIM_STEP as u64
        });
        let mut unread = 0;
        if read == TRIM_STEP as u64 {
            // Perhaps more have ended than one call trims: the others are
            // counted, not read ("\0n" the only negative score: every lease
            // holds one unit, and the count is their units).
            let rest = set.count(key, ended_range) - read;
            unread = if costly {
                let held = total.unsigned_abs().saturating_sub(read_units);
                ended_beyond(set, key, now_score, rest, held, last_read.as_ref())
            } else {
                rest
            };
            // The lease named, ended and unread: read too (an acquire
            // replaces it, a release drops it), so its units leave the unread.
            if let Some(id) = id.filter(|_| !named_read && unread > 0) {
                let named = set.score(key, id.as_bytes());
                if let Some(ends) = named.filter(|&ends| ends > 0 && ends <= now_score) {
                    let units = lease(&mut members, id.as_bytes(), ends, &mut |member| set.score(key, member));
                    unread = unread.saturating_sub(units);
                    read_units += units;
                }
            }
            if unread > 0 {
                members.push((ENDED.to_vec(), 0_i64.saturating_sub_unsigned(unread)));
            }
        }
        let in_flight = total.unsigned_abs().saturating_sub(read_units + unread);
        let mut renewed = 0;
        if let Some(id) = id {
            if let Some(ends) = set.score(key, id.as_bytes()).filter(|&ends| ends > now_score) {
                renewed = lease(&mut members, id.as_bytes(), ends, &mut |member| set.score(key, member));
            }
        }
        let mut last = 0;
        set.scan(key, Scores::above(now_score), true, &mut |name, ends, score| {
            lease(&mut members, name, ends, score);
            last += 1;
            last < 2
        });
        let held_by_others = in_flight.saturating_sub(renewed);
        let cost = action.check_cost(cost);
        if !matches!(action, Action::Release(_))
            && cost <= self.limit
            && cost > self.limit.saturating_sub(held_by_others)
        {
            let needed = self.needed(held_by_others, cost);
            let mut freed = 0;
            set.scan(key, Scores::above(now_score), false, &mut |name, ends, score| {
                let units = lease(&mut members, name, ends, score);
                if id.is_none_or(|id| id.as_bytes() != name) {
                    freed += units;
                }
                freed < needed
            });
        }
        Some(in_set_order(members))
    }

    /// A sorted set: each lease's name scored by when it ends, "\0n" scored
    /// minus the units held, "\0c<name>" minus a lease's units when other
    /// than one. As the Lua reads it: the leases are the positive scores;
    /// those that have ended leave the state and the total; a set without
    /// "\0n", one whose total is then none left, or a key of another kind is
    /// none.
    ///
    /// The Lua keeps no order of taking: leases that end at one instant are
    /// in the set's order (their names' bytes), so they are numbered in that
    /// order, and `taken` goes on after them. Which of them comes first
    /// changes no decision (a `retry_after` or `reset_after` is the instant
    /// they share), so leases taken later need no other order. `held` is the
    /// Lua's total; one below the leases' units (which no engine writes) is
    /// raised to them, as the Rust bookkeeping needs. A name that is not
    /// UTF-8 (no caller can give one) makes the set none.
    #[cfg(feature = "engine")]
    fn load(&self, value: &Value, now: u64) -> Loaded<Box<ConcurrencyState>> {
        let Value::Zset(members) = value else {
            return Loaded::None;
        };
        let Some(&(_, total)) = members.iter().find(|(member, _)| member == TOTAL) else {
            return Loaded::None;
        };
        // The units of ended leases left unread: "\0n" counts them.
        let unread = members
            .iter()
            .find(|(member, _)| member == ENDED)
            .map_or(0, |&(_, units)| units.unsigned_abs());
        let costs: HashMap<&[u8], i64, foldhash::fast::RandomState> = members
            .iter()
            .filter_map(|(member, score)| Some((member.strip_prefix(COST)?, *score)))
            .collect();
        let mut total = -i128::from(total) - i128::from(unread);
        let mut state = ConcurrencyState::default();
        let mut live: u64 = 0;
        for (member, score) in members {
            if *score <= 0 || member == TOTAL {
                continue;
            }
            let cost = match costs.get(member.as_slice()) {
                Some(&cost) if cost <= 0 => cost.unsigned_abs(),
                Some(_) => return Loaded::None,
                None => 1,
            };
            let ends = score.unsigned_abs();
            if ends <= now {
                total -= i128::from(cost);
                continue;
            }
            let (Ok(name), Some(units)) = (
                std::str::from_utf8(member),
                live.checked_add(cost).filter(|&units| units < EXACT),
            ) else {
                return Loaded::None;
            };
            live = units;
            let name: Arc<str> = Arc::from(name);
            let key = (ends, state.taken);
            state.taken += 1;
            state.by_expiry.insert(key, (name.clone(), cost));
            state.by_name.insert(name, key);
        }
        match u64::try_from(total) {
            Ok(total) if total < EXACT && (total > 0 || unread > 0) => {
                // Every lease read has ended and more are left unread: a
                // state holding none, which keeps counting them (a write
                // trims the read, the rest go with later calls).
                state.held = total.max(live);
                state.ended_left = unread;
                Loaded::State(Box::new(state))
            }
            _ => Loaded::None,
        }
    }

    /// A lease's ttl while ended leases are left unread.
    #[cfg(feature = "engine")]
    fn backlog(&self, state: &ConcurrencyState, _now: u64) -> u64 {
        if state.ended_left > 0 {
            self.ttl
        } else {
            0
        }
    }

    /// "\0n" scored minus the units held, each lease scored by when it ends,
    /// and "\0c<name>" for each lease holding other than one unit: what the
    /// Lua `store` leaves. There is no expiry member: the key's own expiry
    /// is the writer's, so `expires` is not written.
    #[cfg(feature = "engine")]
    fn encode(&self, state: &ConcurrencyState, _expires: u64) -> Encoded {
        let mut members = Vec::with_capacity(2 * state.by_expiry.len() + 1);
        let units = state.held.saturating_add(state.ended_left);
        members.push((TOTAL.to_vec(), 0_i64.saturating_sub_unsigned(units)));
        for (&(ends, _), (name, cost)) in &state.by_expiry {
            members.push((name.as_bytes().to_vec(), i64::try_from(ends).unwrap_or(i64::MAX)));
            if *cost != 1 {
                members.push(([COST, name.as_bytes()].concat(), 0_i64.saturating_sub_unsigned(*cost)));
            }
        }
        Encoded::Zset(members)
    }
}

/// Reads the lease `name` scored `ends` into `members`, with its "\0c"
/// member when it has one; gives its units.
#[cfg(feature = "engine")]
fn lease(members: &mut Members, name: &[u8], ends: i64, score: &mut dyn FnMut(&[u8]) -> Option<i64>) -> u64 {
    members.push((name.to_vec(), ends));
    let member = [COST, name].concat();
    match score(&member) {
        Some(units) => {
            members.push((member, units));
            units.unsigned_abs()
        }
        None => 1,
    }
}

/// The units of the `rest` ended leases after `last_read` (the last of
/// those a fetch read), when some lease holds other than one unit: exact,
/// by the shortest of three walks. Those leases themselves; the live ones,
/// whose units `held` (what the set holds beyond the leases read) less
/// theirs leaves; or the leases of other than one unit, whose extra units
/// count when they ended after `last_read`. O(min of the three): bounded
/// when any of them is short, linear in the shortest when more than
/// `TRIM_STEP` ended, live and multi-unit leases all meet.
#[cfg(feature = "engine")]
fn ended_beyond(
    set: &mut dyn SortedSet,
    key: &[u8],
    now_score: i64,
    rest: u64,
    held: u64,
    last_read: Option<&(i64, Vec<u8>)>,
) -> u64 {
    if rest == 0 {
        return 0;
    }
    let after_read = |ends: i64, name: &[u8]| last_read.is_none_or(|(at, last)| (ends, name) > (*at, last.as_slice()));
    let units_of = |score: &mut dyn FnMut(&[u8]) -> Option<i64>, name: &[u8]| {
        score(&[COST, name].concat()).map_or(1, i64::unsigned_abs)
    };
    let live = set.count(key, Scores::above(now_score));
    let costly = set.count(key, Scores::below(0)).saturating_sub(1);
    let mut sum = 0;
    if live <= rest && live <= costly {
        set.scan(key, Scores::above(now_score), false, &mut |name, _, score| {
            sum += units_of(score, name);
            true
        });
        held.saturating_sub(sum)
    } else if costly <= rest {
        set.scan(key, Scores::below(0), false, &mut |member, cost, score| {
            if let Some(name) = member.strip_prefix(COST) {
                if score(name).is_some_and(|ends| ends > 0 && ends <= now_score && after_read(ends, name)) {
                    sum += cost.unsigned_abs().saturating_sub(1);
                }
            }
            true
        });
        rest + sum
    } else {
        // From the last read on (those of its instant but not after it skipped).
        let from = last_read.map_or(Scores::between(0, now_score), |&(at, _)| Scores {
            from: Some((at, true)),
            to: Some((now_score, true)),
        });
        set.scan(key, from, false, &mut |name, ends, score| {
            if after_read(ends, name) {
                sum += units_of(score, name);
            }
            true
        });
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_000_000_000;

    fn acquire(limit: &Concurrency, state: &mut ConcurrencyState, now: u64, cost: u64, id: &str) -> Decision {
        let step = limit.acquire(Some(state), now, cost, Some(id));
        if let Some(change) = step.change {
            state.apply(change);
        }
        step.decision
    }

    fn release(limit: &Concurrency, state: &mut ConcurrencyState, now: u64, id: &str) -> Decision {
        let step = limit.release(Some(state), now, id);
        if let Some(change) = step.change {
            state.apply(change);
        }
        step.decision
    }

    /// The leases held, as `(name, expires, cost)`, soonest to expire first;
    /// checks that the two indexes and the total agree.
    fn leases(state: &ConcurrencyState) -> Vec<(String, u64, u64)> {
        let leases: Vec<(String, u64, u64)> = state
            .by_expiry
            .iter()
            .map(|(&(expires, _), (name, cost))| (name.to_string(), expires, *cost))
            .collect();
        assert_eq!(state.by_name.len(), leases.len());
        for (name, expires, _) in &leases {
            assert_eq!(state.by_name.get(name.as_str()).map(|key| key.0), Some(*expires));
        }
        assert_eq!(state.held, leases.iter().map(|&(_, _, cost)| cost).sum::<u64>());
        leases
    }

    #[test]
    fn renewal_release_and_expiry_with_costs() {
        let limit = Concurrency { limit: 10, ttl: 1_000 };
        let mut state = ConcurrencyState::default();
        assert!(acquire(&limit, &mut state, T0, 3, "a").allowed);
        assert!(acquire(&limit, &mut state, T0 + 100, 4, "b").allowed);
        let decision = acquire(&limit, &mut state, T0 + 200, 2, "c");
        assert_eq!(decision.remaining, 1);
        assert_eq!(decision.reset_after.as_micros(), 1_000);

        // Renewing "a" with 4 units: its 3 are given back first.
        let decision = acquire(&limit, &mut state, T0 + 300, 4, "a");
        assert!(decision.allowed);
        assert_eq!(decision.remaining, 0);
        assert_eq!(
            leases(&state),
            [
                ("b".to_owned(), T0 + 1_100, 4),
                ("c".to_owned(), T0 + 1_200, 2),
                ("a".to_owned(), T0 + 1_300, 4),
            ]
        );

        // 3 more units: "b" (4) must end first; 5 more: "b" and "c" (6).
        let denied = limit.acquire(Some(&state), T0 + 400, 3, Some("d")).decision;
        assert_eq!(denied.retry_after.unwrap().as_micros(), 700);
        assert_eq!(denied.reset_after.as_micros(), 900);
        let denied = limit.acquire(Some(&state), T0 + 400, 5, Some("d")).decision;
        assert_eq!(denied.retry_after.unwrap().as_micros(), 800);
        // Renewing "c" for 6: its own 2 do not count, "b" must end.
        let denied = limit.acquire(Some(&state), T0 + 400, 6, Some("c")).decision;
        assert_eq!(denied.retry_after.unwrap().as_micros(), 700);
        // Renewing "a" for 10 needs all the others gone.
        let denied = limit.acquire(Some(&state), T0 + 400, 10, Some("a")).decision;
        assert_eq!(denied.retry_after.unwrap().as_micros(), 800);

        // Releasing "c" frees its 2 units; releasing it again changes nothing.
        let decision = release(&limit, &mut state, T0 + 500, "c");
        assert_eq!(decision.remaining, 2);
        assert_eq!(decision.reset_after.as_micros(), 800);
        assert_eq!(release(&limit, &mut state, T0 + 500, "c"), decision);
        assert_eq!(leases(&state).len(), 2);

        // At T0 + 1_100 "b" has expired; it counts for nothing but stays
        // until an acquire or a release drops it.
        assert_eq!(limit.available(Some(&state), T0 + 1_099), 2);
        assert_eq!(limit.available(Some(&state), T0 + 1_100), 6);
        assert!(!limit.acquire(Some(&state), T0 + 1_100, 7, Some("d")).decision.allowed);
        assert_eq!(leases(&state).len(), 2);
        let decision = acquire(&limit, &mut state, T0 + 1_100, 6, "d");
        assert_eq!(decision.remaining, 0);
        assert_eq!(decision.reset_after.as_micros(), 1_000);
        assert_eq!(
            leases(&state),
            [("a".to_owned(), T0 + 1_300, 4), ("d".to_owned(), T0 + 2_100, 6)]
        );

        // An expired lease released late frees nothing more.
        let decision = release(&limit, &mut state, T0 + 1_300, "a");
        assert_eq!(decision.remaining, 4);
        assert_eq!(leases(&state), [("d".to_owned(), T0 + 2_100, 6)]);
        // The last one gone: nothing left to say.
        let decision = release(&limit, &mut state, T0 + 1_400, "d");
        assert_eq!(decision.remaining, 10);
        assert_eq!(decision.reset_after.as_micros(), 0);
        assert!(leases(&state).is_empty());
    }

    #[test]
    fn many_leases_held() {
        const HELD: u64 = 50_000;
        let limit = Concurrency {
            limit: 2 * HELD,
            ttl: 10 * HELD,
        };
        let mut state = ConcurrencyState::default();
        // Lease i, of 1 unit (2 for every tenth), taken at T0 + i.
        let cost = |i: u64| if i.is_multiple_of(10) { 2 } else { 1 };
        for i in 0..HELD {
            assert!(acquire(&limit, &mut state, T0 + i, cost(i), &format!("lease-{i}")).allowed);
        }
        let now = T0 + HELD;
        assert_eq!(limit.available(Some(&state), now), 2 * HELD - 55_000);
        // 50 000 more units need 5 000 to be freed: leases 0..=4_544 hold
        // 4_545 + 455 = 5_000.
        let denied = limit.acquire(Some(&state), now, HELD, Some("big")).decision;
        assert_eq!(
            now + denied.retry_after.unwrap().as_micros() as u64,
            T0 + 4_544 + 10 * HELD
        );
        // Renewing and releasing in the middle of the crowd.
        assert!(acquire(&limit, &mut state, now, 5, "lease-20001").allowed);
        assert_eq!(limit.available(Some(&state), now), 2 * HELD - 55_000 - 4);
        let decision = release(&limit, &mut state, now, "lease-30000");
        assert_eq!(decision.remaining, 2 * HELD - 55_000 - 4 + 2);
        assert_eq!(leases(&state).len() as u64, HELD - 1);
        // Half of them expire (not the renewed one): the next acquire drops those.
        let later = T0 + 10 * HELD + HELD / 2;
        let live = leases(&state)
            .iter()
            .filter(|&&(_, expires, _)| expires > later)
            .count();
        let held: u64 = leases(&state).iter().filter(|l| l.1 > later).map(|l| l.2).sum();
        assert_eq!(limit.available(Some(&state), later), 2 * HELD - held);
        let decision = acquire(&limit, &mut state, later, 1, "late");
        assert_eq!(decision.remaining, 2 * HELD - held - 1);
        let left = leases(&state);
        assert_eq!(left.len(), live + 1);
        assert!(left.iter().all(|&(_, expires, _)| expires > later));
    }
}

#[cfg(all(test, feature = "engine"))]
mod engine_tests {
    use super::*;
    use crate::algorithm::testing::{self, from_params, known, written_zset as written};

    const T0: u64 = 1_700_000_000_000_000;

    /// 10 units at once, leases of 1 000 µs.
    fn limit() -> Concurrency {
        from_params(&[10, 1_000]).unwrap()
    }

    /// What a load of `value` at `now` gives: a state or none.
    fn read(value: &Value, now: u64) -> Option<Box<ConcurrencyState>> {
        known(limit().load(value, now))
    }

    /// An acquire of `lease`, waiting for nothing.
    fn acquire(lease: &str) -> Action<'_> {
        Action::Acquire {
            lease: Some(lease),
            max_wait: None,
        }
    }

    /// Runs `action` and commits it, as a store does.
    fn run(state: &mut Option<Box<ConcurrencyState>>, now: u64, action: Action<'_>, cost: u64) -> Decision {
        testing::run(&limit(), state, now, action, cost)
    }

    /// Decisions of every kind at `now`, and the units available.
    fn probes(state: Option<&ConcurrencyState>, now: u64) -> (Vec<Decision>, u64) {
        let limit = limit();
        let mut decisions = Vec::new();
        for lease in ["a", "b", "c", "new"] {
            for cost in [1, 2, 5, 10, 11] {
                decisions.push(limit.decide(state, now, acquire(lease), cost).decision);
            }
            decisions.push(limit.decide(state, now, Action::Release(lease), 0).decision);
        }
        decisions.push(limit.decide(state, now, Action::Check, 0).decision);
        (decisions, limit.available(state, now))
    }

    /// The leases as `(name, ends, units)`, in order of ending, and the total.
    fn leases(state: &ConcurrencyState) -> (Vec<(String, u64, u64)>, u64) {
        let leases = state
            .by_expiry
            .iter()
            .map(|(&(ends, _), (name, cost))| (name.to_string(), ends, *cost))
            .collect();
        (leases, state.held)
    }

    #[test]
    fn a_written_state_reads_back_deciding_the_same() {
        let mut state = None;
        let steps = [
            (T0, acquire("a"), 3),
            (T0 + 100, acquire("b"), 1),
            (T0 + 100, acquire("c"), 2),
            (T0 + 200, acquire("a"), 1),
            (T0 + 300, Action::Release("b"), 0),
            (T0 + 1_150, acquire("b"), 4),
            (
                T0 + 1_200,
                Action::Refund {
                    at: T0,
                    lease: Some("b"),
                },
                4,
            ),
        ];
        for (at, action, cost) in steps {
            let decision = run(&mut state, at, action, cost);
            assert!(decision.allowed, "at {at}");
            let state = state.as_deref().unwrap();
            let value = written(limit().encode(state, 0));
            for now in [at, at + 1, at + 799, at + 800, at + 900, at + 1_000] {
                let loaded = read(&value, now);
                assert_eq!(
                    probes(loaded.as_deref(), now),
                    probes(Some(state), now),
                    "written at {at}, read at {now}"
                );
            }
        }
    }

    #[test]
    fn ties_decide_alike_whatever_their_order() {
        // Three leases ending at one instant, taken in the reverse of their
        // names' order: read back, they are in their names' order.
        let mut state = None;
        for (lease, cost) in [("c", 1), ("b", 4), ("a", 2)] {
            run(&mut state, T0, acquire(lease), cost);
        }
        let state = state.unwrap();
        let loaded = read(&written(limit().encode(&state, 0)), T0 + 10).unwrap();
        assert_eq!(
            leases(&loaded).0.iter().map(|l| l.0.as_str()).collect::<String>(),
            "abc"
        );
        assert_eq!(probes(Some(&loaded), T0 + 10), probes(Some(&state), T0 + 10));
    }

    #[test]
    fn a_set_as_the_lua_leaves_it_reads_as_the_lua_reads_it() {
        let now = T0 + 600;
        // "a" ended at T0 + 500: the Lua trims it (and its unit) on load.
        let value = Value::Zset(vec![
            (b"\0n".to_vec(), -6),
            (b"\0cb".to_vec(), -3),
            (b"\0cc".to_vec(), -2),
            (b"a".to_vec(), (T0 + 500).cast_signed()),
            (b"b".to_vec(), (T0 + 900).cast_signed()),
            (b"c".to_vec(), (T0 + 1_200).cast_signed()),
        ]);
        let loaded = read(&value, now).unwrap();
        assert_eq!(
            leases(&loaded),
            (vec![("b".to_owned(), T0 + 900, 3), ("c".to_owned(), T0 + 1_200, 2)], 5)
        );
        assert_eq!(limit().available(Some(&loaded), now), 5);
        // Renewing "c" for one unit: its "\0c" member goes, the total is 4.
        let mut state = Some(loaded);
        run(&mut state, now, acquire("c"), 1);
        assert_eq!(
            written(limit().encode(state.as_deref().unwrap(), 0)),
            Value::Zset(vec![
                (b"\0n".to_vec(), -4),
                (b"\0cb".to_vec(), -3),
                (b"b".to_vec(), (T0 + 900).cast_signed()),
                (b"c".to_vec(), (T0 + 1_600).cast_signed()),
            ])
        );
        // Every lease ended: none.
        assert_eq!(read(&value, T0 + 1_200), None);
        // Another algorithm's value: none.
        let log = Value::Zset(vec![
            (b"\0x".to_vec(), -(T0 + 1_000).cast_signed()),
            (b"\0b".to_vec(), 0),
            (b"1".to_vec(), 1),
        ]);
        for other in [
            log,
            Value::String(b"f10:2".to_vec()),
            Value::Hash(Vec::new()),
            Value::Other,
        ] {
            assert_eq!(read(&other, now), None);
        }
    }

    #[test]
    fn params_come_back() {
        let limit = limit();
        let params: Vec<u64> = limit.params().into_iter().collect();
        assert_eq!(from_params(&params), Some(limit));
        assert_eq!(from_params::<Concurrency>(&[10, 1_000, 1]), None);
        assert_eq!(from_params::<Concurrency>(&[10, 0]), None);
    }
}
