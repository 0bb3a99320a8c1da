//! Where a shard keeps each limit's state, handed to the policy to decide
//! on and commit to in place ([`Slots`]).
//!
//! A state that is one instant ([`Limit::keeps_instants`]) lives in a table
//! of 40-byte slots, so that many keys stay in the CPU's caches; any other
//! in a table of 64-byte slots with its expiry. A key lives in one table at
//! most. A policy of one limit finds its slot once and commits to it
//! through the same entry; a policy of several finds each slot as the
//! decision reads it.

use hashbrown::hash_table::{AbsentEntry, HashTable, OccupiedEntry};

use super::key::{key_hash, Key, Place};
use super::{Hasher, Shard};
use crate::algorithm::rate::Tat;
use crate::algorithm::{Change, Limit, State};
use crate::policy::{Policy, Slots};

const _: () = assert!(size_of::<InstantSlot>() == 40);
const _: () = assert!(size_of::<Slot>() == 64);

/// The state of one limit of one subject, when it is not an instant.
pub(super) struct Slot {
    pub(super) key: Key,
    state: State,
    /// When the state stops carrying information, µs since the epoch.
    pub(super) expires: u64,
}

impl Slot {
    /// The state, unless it has lapsed by `now`.
    #[inline]
    fn live(&self, now: u64) -> Option<&State> {
        (self.expires > now).then_some(&self.state)
    }

    /// Commits `change`, decided on this slot's state (or on none, when it
    /// had lapsed), until `expires`.
    fn commit(&mut self, change: Change<'_>, expires: u64) {
        change.apply(&mut self.state);
        self.expires = expires;
    }
}

/// The state of one limit of one subject that is one instant.
pub(super) struct InstantSlot {
    /// The instant's whole microseconds.
    at: u64,
    /// The fraction of a microsecond past `at`, in ticks (below 2^52),
    /// with the [tag](Limit::tag) of the limit's algorithm in its top byte:
    /// the instant of another algorithm (the limit was redefined) is no
    /// state of this one.
    fraction: u64,
    pub(super) key: Key,
}

/// The bits of [`InstantSlot::fraction`] below the tag.
const FRACTION: u64 = (1 << 56) - 1;

impl InstantSlot {
    fn new(instant: Tat, tag: u8, key: Key) -> Self {
        let mut slot = Self {
            at: 0,
            fraction: 0,
            key,
        };
        slot.set(instant, tag);
        slot
    }

    fn set(&mut self, instant: Tat, tag: u8) {
        self.at = instant.at;
        self.fraction = instant.frac | u64::from(tag) << 56;
    }

    /// The state of `limit` this slot holds: none when it has passed by
    /// `now` or is another algorithm's.
    #[inline]
    fn state(&self, limit: &Limit, now: u64) -> Option<State> {
        let instant = Tat {
            at: self.at,
            frac: self.fraction & FRACTION,
        };
        let tag = (self.fraction >> 56) as u8;
        (tag == limit.tag() && self.expires() > now)
            .then(|| limit.state_at(instant))
            .flatten()
    }

    /// When the instant stops carrying information: once it has passed.
    pub(super) fn expires(&self) -> u64 {
        self.at + u64::from(self.fraction & FRACTION > 0)
    }
}

/// The instant a change made of an instant state leaves.
#[inline]
fn instant_of(change: Change<'_>) -> Option<Tat> {
    change.into_state().as_ref().and_then(State::instant)
}

/// A slot found by its entry, or the table to put one in.
type Found<'s, T> = Option<Result<OccupiedEntry<'s, T>, AbsentEntry<'s, T>>>;

/// The one limit of a policy, whose state is an instant.
pub(super) struct OneInstant<'s, 'p> {
    found: Found<'s, InstantSlot>,
    /// The limit's tag.
    tag: u8,
    /// The instant as its limit's state, unless it has passed.
    state: Option<State>,
    /// The other table, where an earlier definition of the limit may have
    /// left a state.
    slots: &'s mut HashTable<Slot>,
    place: Place<'p>,
    hasher: Hasher,
}

impl<'s, 'p> OneInstant<'s, 'p> {
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    pub(super) fn find(shard: &'s mut Shard, place: Place<'p>, limit: &Limit, hasher: Hasher, now: u64) -> Self {
        let Shard { instants, slots, .. } = shard;
        let found = instants.find_entry(place.hash, |slot| place.holds(&slot.key));
        let state = found.as_ref().ok().and_then(|slot| slot.get().state(limit, now));
        Self {
            found: Some(found),
            tag: limit.tag(),
            state,
            slots,
            place,
            hasher,
        }
    }
}

impl Slots for OneInstant<'_, '_> {
    #[inline]
    fn state(&self, _: usize) -> Option<&State> {
        self.state.as_ref()
    }

    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    fn commit(&mut self, _: usize, change: Change<'_>, ttl: u64) {
        let Some(instant) = instant_of(change) else {
            return;
        };
        match self.found.take() {
            // A passed instant says nothing, like none: it stays until the
            // next sweep.
            Some(Ok(mut slot)) => slot.get_mut().set(instant, self.tag),
            Some(Err(absent)) => {
                // A key lives in one table at most: a state an earlier
                // definition of the limit left in the other goes.
                let place = self.place;
                remove(self.slots, place.hash, |slot| place.holds(&slot.key));
                if ttl == 0 {
                    return;
                }
                let slot = InstantSlot::new(instant, self.tag, Key::new(place.key, place.name));
                let hasher = self.hasher;
                absent
                    .into_table()
                    .insert_unique(place.hash, slot, |slot| key_hash(hasher, &slot.key));
            }
            _ => {}
        }
    }
}

/// The one limit of a policy, whose state is not an instant.
pub(super) struct OneSlot<'s, 'p> {
    found: Found<'s, Slot>,
    instants: &'s mut HashTable<InstantSlot>,
    place: Place<'p>,
    hasher: Hasher,
    now: u64,
}

impl<'s, 'p> OneSlot<'s, 'p> {
    #[inline]
    pub(super) fn find(shard: &'s mut Shard, place: Place<'p>, hasher: Hasher, now: u64) -> Self {
        let Shard { instants, slots, .. } = shard;
        let found = slots.find_entry(place.hash, |slot| place.holds(&slot.key));
        Self {
            found: Some(found),
            instants,
            place,
            hasher,
            now,
        }
    }
}

impl Slots for OneSlot<'_, '_> {
    #[inline]
    fn state(&self, _: usize) -> Option<&State> {
        match &self.found {
            Some(Ok(slot)) => slot.get().live(self.now),
            _ => None,
        }
    }

    #[inline]
    fn commit(&mut self, _: usize, change: Change<'_>, ttl: u64) {
        let now = self.now;
        match self.found.take() {
            // A state with nothing left to say is dropped at once.
            Some(Ok(slot)) if ttl == 0 => drop(slot.remove()),
            Some(Ok(mut slot)) => slot.get_mut().commit(change, now + ttl),
            Some(Err(absent)) => {
                // A key lives in one table at most: a state an earlier
                // definition of the limit left in the other goes.
                let place = self.place;
                remove(self.instants, place.hash, |slot| place.holds(&slot.key));
                if ttl == 0 {
                    return;
                }
                // A change decided on no state is a whole new state.
                let Some(state) = change.into_state() else {
                    debug_assert!(false, "an edit of a state that is not stored");
                    return;
                };
                let slot = Slot {
                    key: Key::new(place.key, place.name),
                    state,
                    expires: now + ttl,
                };
                let hasher = self.hasher;
                absent
                    .into_table()
                    .insert_unique(place.hash, slot, |slot| key_hash(hasher, &slot.key));
            }
            _ => {}
        }
    }
}

/// The limits of a policy of several, for one subject: each slot found as
/// the decision reads it; instants copied out first, as their limits'
/// states.
pub(super) struct Many<'s, 'p> {
    pub(super) shard: &'s mut Shard,
    pub(super) policy: &'p Policy,
    pub(super) subject_hash: u64,
    pub(super) key: &'p str,
    /// Each limit's instant as its state (none for the other limits).
    pub(super) instants: &'s [Option<State>],
    pub(super) hasher: Hasher,
    pub(super) now: u64,
}

impl Many<'_, '_> {
    /// Where limit `index` lives, and the limit.
    fn place(&self, index: usize) -> (Place<'_>, &Limit) {
        let (name, name_hash, limit) = self.policy.hashed_limit(index);
        (Place::of(self.subject_hash, self.key, name, name_hash), limit)
    }
}

impl Slots for Many<'_, '_> {
    fn state(&self, index: usize) -> Option<&State> {
        let (place, limit) = self.place(index);
        if limit.keeps_instants() {
            return self.instants[index].as_ref();
        }
        self.shard
            .slots
            .find(place.hash, |slot| place.holds(&slot.key))
            .and_then(|slot| slot.live(self.now))
    }

    fn commit(&mut self, index: usize, change: Change<'_>, ttl: u64) {
        let (name, name_hash, limit) = self.policy.hashed_limit(index);
        let place = Place::of(self.subject_hash, self.key, name, name_hash);
        put(self.shard, self.hasher, place, limit, change, ttl, self.now);
    }
}

/// Each of `policy`'s limits that keeps instants, its instant in `shard`
/// for the subject `key` (hashed to `subject_hash`) as its state, unless it
/// has passed by `now`.
pub(super) fn instants_of(
    shard: &Shard,
    policy: &Policy,
    subject_hash: u64,
    key: &str,
    now: u64,
    instants: &mut [Option<State>],
) {
    for ((name, name_hash, limit), state) in policy.hashed_limits().zip(instants) {
        if limit.keeps_instants() {
            let place = Place::of(subject_hash, key, name, name_hash);
            *state = shard
                .instants
                .find(place.hash, |slot| place.holds(&slot.key))
                .and_then(|slot| slot.state(limit, now));
        }
    }
}

/// Commits `change` to `limit`'s state at `place`, for `ttl` µs (none:
/// drops it), in the table of its kind of state.
fn put(shard: &mut Shard, hasher: Hasher, place: Place<'_>, limit: &Limit, change: Change<'_>, ttl: u64, now: u64) {
    if limit.keeps_instants() {
        if let Ok(mut slot) = shard.instants.find_entry(place.hash, |slot| place.holds(&slot.key)) {
            if ttl == 0 {
                slot.remove();
            } else if let Some(instant) = instant_of(change) {
                slot.get_mut().set(instant, limit.tag());
            }
            return;
        }
    } else if let Ok(mut slot) = shard.slots.find_entry(place.hash, |slot| place.holds(&slot.key)) {
        if ttl == 0 {
            slot.remove();
        } else {
            slot.get_mut().commit(change, now + ttl);
        }
        return;
    }
    put_new(shard, hasher, place, limit.tag(), change, ttl, now);
}

/// [`put`] for a key its table does not hold. A key lives in one table at
/// most, so a state left in the other by an earlier definition of the
/// limit is dropped.
fn put_new(shard: &mut Shard, hasher: Hasher, place: Place<'_>, tag: u8, change: Change<'_>, ttl: u64, now: u64) {
    // A change decided on no state is a whole new state.
    let Some(state) = change.into_state() else {
        debug_assert!(false, "an edit of a state that is not stored");
        return;
    };
    let Place { hash, key, name } = place;
    let is = |slot_key: &Key| place.holds(slot_key);
    let rehash = |slot_key: &Key| key_hash(hasher, slot_key);
    let Shard { instants, slots, .. } = shard;
    if let Some(instant) = state.instant() {
        remove(slots, hash, |slot| is(&slot.key));
        if ttl > 0 {
            let slot = InstantSlot::new(instant, tag, Key::new(key, name));
            instants.insert_unique(hash, slot, |slot| rehash(&slot.key));
        }
        return;
    }
    remove(instants, hash, |slot| is(&slot.key));
    if ttl > 0 {
        let slot = Slot {
            key: Key::new(key, name),
            state,
            expires: now + ttl,
        };
        slots.insert_unique(hash, slot, |slot| rehash(&slot.key));
    }
}

/// Removes the entry `is` finds, if any.
pub(super) fn remove<T>(table: &mut HashTable<T>, hash: u64, is: impl Fn(&T) -> bool) {
    if let Ok(entry) = table.find_entry(hash, is) {
        entry.remove();
    }
}
