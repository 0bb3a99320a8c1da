//! One subject's limits in this process: the path without a key.
//!
//! A [`DirectLimiter`] holds the state of one policy for one subject (a
//! whole service's limit, one client's connection): no key to hash, no
//! table to look it up in. A policy of one limit whose state is one
//! instant on whole microseconds (a GCRA, leaky bucket or reservation of
//! 100 per second, not 7) keeps it in one atomic word, updated by
//! compare-and-swap: no lock is taken, and a denial writes nothing. Any other policy keeps its states behind one lock,
//! held for a decision as a memory store shard's is. The decisions are the
//! memory store's, made by the same policy code on the same states.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::algorithm::rate::Tat;
use crate::algorithm::{Change, State};
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::decision::{Decision, Outcome};
use crate::error::Result;
use crate::policy::{Ask, CheckOf, Policy, Request, Slots};

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
}

/// Where the states live.
enum Cell {
    /// The instant of a single limit whose state is one on whole
    /// microseconds, µs since the epoch (zero: none).
    Instant(AtomicU64),
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
        let (_, _, first) = policy.hashed_limit(0);
        let cell = if policy.len() == 1 && first.keeps_instants() && first.whole_micros() {
            Cell::Instant(AtomicU64::new(0))
        } else {
            Cell::Locked(spin::mutex::SpinMutex::new(
                (0..policy.len()).map(|_| Held::default()).collect(),
            ))
        };
        Self {
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
    /// [`DirectLimiter::decide_now`] decides a check at that instant,
    /// without a request or an outcome to build.
    ///
    /// # Errors
    ///
    /// As [`DirectLimiter::decide_now`].
    #[inline]
    pub fn check_at(&self, cost: u64, now: Timestamp) -> Result<Decision> {
        self.policy.validate_check(cost)?;
        Ok(self.decide_in(CheckOf(cost), now.as_micros()))
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
        Ok(self.decide_in(request, now))
    }

    /// Answers `ask` at `now`. An instant in one word is read, decided on,
    /// and swapped for the new one if no other decision swapped it
    /// meanwhile (else decided again on that one): no lock, and a denial
    /// writes nothing. Any other policy decides under its lock.
    #[allow(clippy::inline_always)] // the direct limiter's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    fn decide_in<A: Ask>(&self, ask: A, now: u64) -> A::Answer {
        match &self.cell {
            Cell::Instant(word) => loop {
                let seen = word.load(Ordering::Acquire);
                let mut slot = Word::new(&self.policy, seen, now);
                let answer = ask.answer(&self.policy, &mut slot, now);
                let swapped = slot.new.is_none_or(|new| {
                    word.compare_exchange_weak(seen, new, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                });
                if swapped {
                    return answer;
                }
            },
            Cell::Locked(held) => ask.answer(
                &self.policy,
                &mut Locked {
                    held: &mut held.lock(),
                    now,
                },
                now,
            ),
        }
    }

    /// Forgets every limit's state.
    pub fn reset(&self) {
        match &self.cell {
            Cell::Instant(word) => word.store(0, Ordering::Release),
            Cell::Locked(held) => held.lock().iter_mut().for_each(|held| *held = Held::default()),
        }
    }
}

/// The instant of a single limit in one word, as seen, and the word a
/// decision leaves (`None`: unchanged).
struct Word {
    state: Option<State>,
    new: Option<u64>,
}

impl Word {
    /// The word `seen` as the policy's one limit's state at `now`: none
    /// when zero or passed.
    #[inline]
    fn new(policy: &Policy, seen: u64, now: u64) -> Self {
        let (_, _, limit) = policy.hashed_limit(0);
        let state = (seen > now)
            .then(|| limit.state_at(Tat { at: seen, frac: 0 }))
            .flatten();
        Self { state, new: None }
    }
}

impl Slots for Word {
    #[inline]
    fn state(&self, _: usize) -> Option<&State> {
        self.state.as_ref()
    }

    #[inline]
    fn commit(&mut self, _: usize, change: Change<'_>, _: u64) {
        // Whole microseconds: no fraction to keep.
        self.new = change
            .into_state()
            .as_ref()
            .and_then(State::instant)
            .map(|instant| instant.at);
    }
}

/// Each limit's state under the lock, at `now`.
struct Locked<'h> {
    held: &'h mut [Held],
    now: u64,
}

impl Slots for Locked<'_> {
    #[inline]
    fn state(&self, index: usize) -> Option<&State> {
        self.held[index].live(self.now)
    }

    #[inline]
    fn commit(&mut self, index: usize, change: Change<'_>, ttl: u64) {
        self.held[index].commit(change, ttl, self.now);
    }
}

impl std::fmt::Debug for DirectLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectLimiter")
            .field("policy", &self.policy)
            .field("lock_free", &matches!(self.cell, Cell::Instant(_)))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::clock::ManualClock;
    use crate::{Limit, MemoryStore, Op, Subject};

    const T0: u64 = 1_700_000_000_123_457;

    /// The policies compared: the lock-free GCRA (also recording its
    /// overage), a GCRA whose interval is not whole microseconds, the other
    /// algorithms, and a policy of two.
    fn policies() -> Vec<Policy> {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        vec![
            Policy::single(Limit::gcra(10, s(1), 3).unwrap()),
            Policy::single(Limit::gcra(10, s(1), 3).unwrap().recording_overage().unwrap()),
            Policy::single(Limit::gcra(7, s(1), 2).unwrap()),
            Policy::single(Limit::token_bucket(5, 2, s(1)).unwrap()),
            Policy::single(Limit::fixed_window(4, ms(700)).unwrap()),
            Policy::single(Limit::sliding_window(6, s(1), 10).unwrap()),
            Policy::single(Limit::reservation(4, s(1), 2).unwrap()),
            Policy::single(Limit::sliding_log(5, ms(900)).unwrap()),
            Policy::single(Limit::leaky_bucket(3, s(1), 4).unwrap()),
            Policy::single(Limit::concurrency(3, ms(500)).unwrap()),
            Policy::new([
                ("per_second", Limit::gcra(5, s(1), 5).unwrap()),
                ("per_window", Limit::fixed_window(8, s(2)).unwrap()),
            ])
            .unwrap(),
        ]
    }

    /// The request of step `ask` (0–5) weighing `cost`, at `now`.
    fn request(ask: u8, cost: u64, now: u64, lease: u8) -> Request {
        let op = match ask {
            0 | 1 => Op::Check,
            2 => Op::Record,
            3 => Op::Reserve {
                max_wait: Some(Duration::from_millis(300)),
            },
            4 => Op::Acquire {
                lease: format!("lease-{lease}"),
                max_wait: None,
            },
            _ => Op::Release {
                lease: format!("lease-{lease}"),
            },
        };
        Request::new(op, cost).at(Timestamp::from_micros(now))
    }

    proptest! {
        /// Whatever the policy and the requests, a direct limiter decides
        /// as a memory store does for one subject, outcome for outcome.
        #[test]
        fn decides_as_the_memory_store_does(
            policy in 0..11usize,
            steps in proptest::collection::vec((0u64..400_000, 0u8..6, 0u64..5, 0u8..3), 1..40),
        ) {
            let policy = &policies()[policy];
            let direct = DirectLimiter::with_clock(policy.clone(), ManualClock::new(Timestamp::EPOCH));
            let store = MemoryStore::with_clock(ManualClock::new(Timestamp::EPOCH));
            let subject = Subject::new("one");
            let mut now = T0;
            for (dt, ask, cost, lease) in steps {
                now += dt;
                let request = request(ask, cost, now, lease);
                // Outcomes, or the errors' messages (an operation refused).
                let expected = store.decide_now(&subject, policy, &request).map_err(|error| error.to_string());
                if ask == 0 {
                    // A check by `check_at`: the decision of the same outcome.
                    let got = direct.check_at(cost, Timestamp::from_micros(now)).map_err(|error| error.to_string());
                    prop_assert_eq!(got, expected.map(|outcome| outcome.decision), "check at {}", now);
                    continue;
                }
                let got = direct.decide_now(&request).map_err(|error| error.to_string());
                prop_assert_eq!(got, expected, "{:?} at {}", request.op, now);
            }
        }
    }

    #[test]
    fn a_single_instant_on_whole_microseconds_is_lock_free_and_others_are_not() {
        let lock_free = |policy: &Policy| matches!(DirectLimiter::new(policy.clone()).cell, Cell::Instant(_));
        let found: Vec<bool> = policies().iter().map(lock_free).collect();
        // GCRA of 10 a second (recording its overage or not) and the
        // reservation of 4 a second; not GCRA of 7 a second, nor the leaky
        // bucket of 3, nor any state that is not an instant, nor a policy
        // of two limits.
        let expected = [true, true, false, false, false, false, true, false, false, false, false];
        assert_eq!(found, expected);
    }

    #[test]
    fn reset_forgets_every_state() {
        for policy in policies() {
            let direct = DirectLimiter::with_clock(policy.clone(), ManualClock::new(Timestamp::from_micros(T0)));
            let fresh = direct.decide_now(&request(0, 0, T0, 0)).unwrap();
            let spent = if policy.has_concurrency() {
                request(4, 1, T0, 0)
            } else {
                request(0, 1, T0, 0)
            };
            assert!(direct.decide_now(&spent).unwrap().decision.allowed);
            assert_ne!(direct.decide_now(&request(0, 0, T0, 0)).unwrap(), fresh);
            direct.reset();
            assert_eq!(direct.decide_now(&request(0, 0, T0, 0)).unwrap(), fresh, "{policy:?}");
        }
    }

    /// Eight threads on one lock-free limit admit exactly its burst.
    #[test]
    fn threads_racing_admit_exactly_the_burst() {
        let direct = DirectLimiter::with_clock(
            Limit::gcra(1, Duration::from_secs(3600), 1000).unwrap(),
            ManualClock::new(Timestamp::from_micros(T0)),
        );
        let admitted: u64 = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| (0..1000).filter(|_| direct.check(1).unwrap().allowed).count() as u64))
                .collect();
            threads.into_iter().map(|thread| thread.join().unwrap()).sum()
        });
        assert_eq!(admitted, 1000);
    }
}
