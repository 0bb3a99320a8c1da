//! One subject's limits in this process: the path without a key.
//!
//! A [`DirectLimiter`] holds the state of one policy for one subject (a
//! whole service's limit, one client's connection): no key to hash, no
//! table to look it up in. A policy of one limit whose algorithm decides on
//! a state of one word (the library's guide says which do) keeps that word
//! in an atomic, updated by compare-and-swap: no lock is taken, and a
//! denial writes nothing. Any other policy keeps its states behind one
//! lock, held for a decision as a memory store shard's is. The decisions are the
//! memory store's, made by the same policy code on the same states.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::algorithm::{Change, State, WordKernel};
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::decision::{Decision, Outcome};
use crate::error::Result;
use crate::policy::Policy;
use crate::request::{Op, Request};

/// One policy's state for one subject, in this process; see the module docs.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{DirectLimiter, Limit};
///
/// let limiter = DirectLimiter::new(Limit::gcra(100, Duration::from_secs(1), 10)?);
/// assert!(limiter.check(1)?.allowed);
/// # Ok::<(), tollgate::Error>(())
/// ```
pub struct DirectLimiter {
    policy: Policy,
    clock: Arc<dyn Clock>,
    cell: Cell,
    /// Whether a refused check counts its cost ([`Policy::records_overage`]).
    records_overage: bool,
}

/// Where the states live.
enum Cell {
    /// The state of a limit offering a one-word kernel, as that word
    /// (zero: none).
    Word(WordKernel, AtomicU64),
    /// Each limit's state, in the policy's order.
    Locked(spin::mutex::SpinMutex<Vec<Held>, spin::relax::Yield>),
}

/// A limit's state and when it stops carrying information (µs).
#[derive(Default)]
struct Held {
    state: Option<State>,
    expires: u64,
}

impl Held {
    /// The state, unless it has expired by `now`.
    fn live(&self, now: u64) -> Option<&State> {
        self.state.as_ref().filter(|_| self.expires > now)
    }

    /// Commits `change`, decided on this state (none when it had expired),
    /// until `ttl` µs after `now`; none once it has nothing left to say.
    fn commit(&mut self, change: Change<'_>, ttl: u64, now: u64) {
        if ttl == 0 {
            *self = Self::default();
            return;
        }
        // Decided on none (or on an expired state, read as none), the
        // change is a whole new state, which `apply` puts in place.
        match &mut self.state {
            Some(state) => change.apply(state),
            state => *state = change.into_state(),
        }
        self.expires = now + ttl;
    }
}

impl DirectLimiter {
    /// The limiter of `policy` (a [`Limit`](crate::Limit) or a
    /// [`Policy`]) on the system clock.
    pub fn new(policy: impl Into<Policy>) -> Self {
        Self::with_clock(policy, SystemClock)
    }

    /// The limiter of `policy` on `clock` (a
    /// [`ManualClock`](crate::ManualClock) in tests).
    pub fn with_clock(policy: impl Into<Policy>, clock: impl Clock) -> Self {
        let policy = policy.into();
        let cell = match policy.kernel() {
            Some(kernel) => Cell::Word(*kernel, AtomicU64::new(0)),
            None => Cell::Locked(spin::mutex::SpinMutex::new(
                (0..policy.len()).map(|_| Held::default()).collect(),
            )),
        };
        Self {
            records_overage: policy.records_overage(),
            policy,
            clock: Arc::new(clock),
            cell,
        }
    }

    /// The policy it decides.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Checks `cost` units now.
    ///
    /// # Errors
    ///
    /// As [`DirectLimiter::decide_now`].
    #[inline]
    pub fn check(&self, cost: u64) -> Result<Decision> {
        self.check_at(cost, self.clock.now())
    }

    /// Checks `cost` units at `now` (tests, simulations, replays), as
    /// [`DirectLimiter::decide_now`] decides a check at that instant. A
    /// limit with a one-word kernel that does not record its overage is
    /// checked on its word at once, without a request or an outcome to build.
    ///
    /// # Errors
    ///
    /// As [`DirectLimiter::decide_now`].
    #[inline]
    pub fn check_at(&self, cost: u64, now: Timestamp) -> Result<Decision> {
        match &self.cell {
            Cell::Word(kernel, word) if !self.records_overage => Ok(check_word(kernel, word, now.as_micros(), cost)),
            _ => self.check_request(cost, now),
        }
    }

    /// [`DirectLimiter::check_at`] as a request; out of line, so that
    /// `decide_now` keeps its inlining where a caller calls it alone.
    #[inline(never)]
    fn check_request(&self, cost: u64, now: Timestamp) -> Result<Decision> {
        self.decide_now(&Request::new(Op::Check, cost).at(now))
            .map(|outcome| outcome.decision)
    }

    /// Decides `request` (any operation, at its `now` or the clock's), all
    /// or nothing over the policy's limits, as a
    /// [`MemoryStore`](crate::MemoryStore) decides it for one subject.
    ///
    /// # Errors
    ///
    /// An operation the policy's limits do not support.
    #[inline]
    pub fn decide_now(&self, request: &Request) -> Result<Outcome> {
        self.policy.validate(request)?;
        let now = request.now.unwrap_or_else(|| self.clock.now()).as_micros();
        match &self.cell {
            Cell::Word(kernel, word) => Ok(self.decide_word(kernel, word, request, now)),
            Cell::Locked(held) => Ok(self.decide_locked(&mut held.lock(), request, now)),
        }
    }

    /// A limit with a one-word kernel: the word read, decided on, and
    /// swapped for the new one if no other decision swapped it meanwhile
    /// (else decided again on that one).
    #[inline]
    fn decide_word(&self, kernel: &WordKernel, word: &AtomicU64, request: &Request, now: u64) -> Outcome {
        loop {
            // A word whose instant has passed says nothing, like none at all.
            let seen = word.load(Ordering::Acquire);
            let mut lost = false;
            let outcome = self.policy.decide_word(kernel, seen, now, request, |new| {
                lost = !swapped(word, seen, Some(new));
            });
            if !lost {
                return outcome;
            }
        }
    }

    /// Any other policy, under its lock.
    fn decide_locked(&self, held: &mut [Held], request: &Request, now: u64) -> Outcome {
        if let [one] = held {
            let mut write = None;
            let outcome = self
                .policy
                .decide_validated(&[one.live(now)], now, request, |_, change, ttl| {
                    write = Some((change, ttl));
                });
            if let Some((change, ttl)) = write {
                one.commit(change, ttl, now);
            }
            return outcome;
        }
        let states: Vec<Option<&State>> = held.iter().map(|held| held.live(now)).collect();
        let mut writes = Vec::new();
        let outcome = self
            .policy
            .decide_validated(&states, now, request, |index, change, ttl| {
                writes.push((index, change, ttl));
            });
        for (index, change, ttl) in writes {
            held[index].commit(change, ttl, now);
        }
        outcome
    }

    /// Forgets every limit's state.
    pub fn reset(&self) {
        match &self.cell {
            Cell::Word(_, word) => word.store(0, Ordering::Release),
            Cell::Locked(held) => held.lock().iter_mut().for_each(|held| *held = Held::default()),
        }
    }
}

/// Whether `word`, seen holding `seen`, now holds `change` (a decision that
/// changed nothing has nothing to swap).
#[inline]
fn swapped(word: &AtomicU64, seen: u64, change: Option<u64>) -> bool {
    change.is_none_or(|new| {
        word.compare_exchange_weak(seen, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    })
}

/// A check of `cost` units by `kernel` on the state in `word`.
#[inline]
fn check_word(kernel: &WordKernel, word: &AtomicU64, now: u64, cost: u64) -> Decision {
    loop {
        let seen = word.load(Ordering::Acquire);
        let step = kernel.check(seen, now, cost);
        if swapped(word, seen, step.change) {
            return step.decision;
        }
    }
}

impl std::fmt::Debug for DirectLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectLimiter")
            .field("policy", &self.policy)
            .field("lock_free", &matches!(self.cell, Cell::Word(..)))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
