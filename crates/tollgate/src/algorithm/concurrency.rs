//! Concurrency limiter: at most `limit` units in flight.
//!
//! `acquire` takes a lease of `cost` units named by the caller; `release`
//! returns it. A lease also ends by itself `ttl` after it was taken, so a
//! holder that crashed cannot leak capacity forever. Acquiring with the name
//! of a live lease renews it (new ttl, new cost).
//!
//! Leases are kept in order of expiry and by name, with the units they hold
//! in all, so an acquire, a release or a renewal costs O(log n) in the leases
//! held, plus the expired leases it drops; a denial's `retry_after` walks the
//! soonest-to-expire leases only until enough units are freed.
//!
//! **Bound:** at every instant, the leases that have neither been released
//! nor expired hold at most `limit` units.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::core::{at_least_one, edit, positive, Action, Algorithm, Edit, Step, Update};
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
            let needed = held_by_others + cost - self.limit;
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
    #[cfg(feature = "redis")]
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
            // Without a lease, a refund gives nothing back: a peek.
            Action::Refund { lease: None, .. } => self.acquire(state, now, 0, None),
            Action::Check | Action::Reserve(_) => self.acquire(state, now, cost, None),
        };
        edit(state, step)
    }

    #[cfg(feature = "redis")]
    fn script_params(&self) -> impl IntoIterator<Item = u64> {
        [self.limit, self.ttl]
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
