//! Concurrency limiter: at most `limit` units in flight.
//!
//! `acquire` takes a lease of `cost` units named by the caller; `release`
//! returns it. A lease also ends by itself `ttl` after it was taken, so a
//! holder that crashed cannot leak capacity forever. Acquiring with the name
//! of a live lease renews it (new ttl, new cost).
//!
//! **Bound:** at every instant, the leases that have neither been released
//! nor expired hold at most `limit` units.

use super::Step;
use crate::decision::Decision;

/// Parameters of a concurrency limiter, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency {
    pub(crate) limit: u64,
    pub(crate) ttl: u64,
}

/// One lease in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseEntry {
    /// The name the caller gave the lease.
    pub id: String,
    /// When the lease ends by itself, µs since the epoch.
    pub expires: u64,
    /// Units it holds.
    pub cost: u64,
}

/// The leases in flight, in order of expiry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConcurrencyState {
    /// Live leases, soonest to expire first.
    pub leases: Vec<LeaseEntry>,
}

impl Concurrency {
    /// Leases still live at `now` other than `except`, and the units they hold.
    fn live(state: Option<&ConcurrencyState>, now: u64, except: Option<&str>) -> (Vec<LeaseEntry>, u64) {
        let leases: Vec<LeaseEntry> = state
            .map(|state| {
                state
                    .leases
                    .iter()
                    .filter(|lease| lease.expires > now && Some(lease.id.as_str()) != except)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let in_flight = leases.iter().map(|lease| lease.cost).sum();
        (leases, in_flight)
    }

    fn reset_after(leases: &[LeaseEntry], now: u64) -> u64 {
        leases.iter().map(|lease| lease.expires - now).max().unwrap_or(0)
    }

    /// Units that could be acquired now.
    pub(crate) fn available(&self, state: Option<&ConcurrencyState>, now: u64) -> u64 {
        self.limit.saturating_sub(Self::live(state, now, None).1)
    }

    /// Takes (or renews) lease `id` for `cost` units if they fit; `id` may be
    /// `None` only for a peek (`cost == 0`).
    pub(crate) fn acquire(
        &self,
        state: Option<&ConcurrencyState>,
        now: u64,
        cost: u64,
        id: Option<&str>,
    ) -> Step<ConcurrencyState> {
        // What is held now, as a peek reports it.
        let (held, in_flight) = Self::live(state, now, None);
        let remaining = self.limit.saturating_sub(in_flight);
        let reset_after = Self::reset_after(&held, now);
        // Renewing a lease first gives back the units it holds.
        let (mut leases, held_by_others) = Self::live(state, now, id);
        if cost > self.limit {
            return Step::unchanged(Decision::deny(self.limit, remaining, None, reset_after));
        }
        if cost > self.limit.saturating_sub(held_by_others) {
            // Leases end soonest-first: wait until enough units have expired.
            let needed = held_by_others + cost - self.limit;
            let mut freed = 0;
            let mut retry_after = None;
            for lease in &leases {
                freed += lease.cost;
                if freed >= needed {
                    retry_after = Some(lease.expires - now);
                    break;
                }
            }
            return Step::unchanged(Decision::deny(self.limit, remaining, retry_after, reset_after));
        }
        let Some(id) = id.filter(|_| cost > 0) else {
            return Step::unchanged(Decision::allow(self.limit, remaining, reset_after, 0));
        };
        let expires = now + self.ttl;
        let at = leases.partition_point(|lease| lease.expires <= expires);
        leases.insert(
            at,
            LeaseEntry {
                id: id.to_owned(),
                expires,
                cost,
            },
        );
        let decision = Decision::allow(
            self.limit,
            self.limit - held_by_others - cost,
            Self::reset_after(&leases, now),
            0,
        );
        Step::changed(decision, ConcurrencyState { leases })
    }

    /// Ends lease `id` (a lease that is unknown or already expired is fine).
    pub(crate) fn release(&self, state: Option<&ConcurrencyState>, now: u64, id: &str) -> Step<ConcurrencyState> {
        let (leases, in_flight) = Self::live(state, now, Some(id));
        let decision = Decision::allow(
            self.limit,
            self.limit.saturating_sub(in_flight),
            Self::reset_after(&leases, now),
            0,
        );
        Step::changed(decision, ConcurrencyState { leases })
    }
}
