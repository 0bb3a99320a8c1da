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
mod tests;

#[cfg(all(test, feature = "engine"))]
mod engine_tests;
