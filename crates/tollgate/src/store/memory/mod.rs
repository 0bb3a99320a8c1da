//! The embedded store: state in this process, sharded.
//!
//! Subjects are spread over shards by hash, each behind its own lock, so
//! threads deciding for different subjects rarely meet and there is no global
//! lock on the decision path; all limits of one subject live in one shard, so
//! a policy is decided under one lock. Inside a shard, hash tables hold a slot
//! per `(subject, limit name)`, so a subject with very many limits (a server
//! domain with a limit per descriptor) costs no more per lookup than a subject
//! with one. States that are one instant (GCRA's, a leaky bucket's, a
//! reservation's TAT) have a table of their own with 40-byte slots, so that
//! many keys stay in the CPU's caches. The policy decides on the slots in
//! place ([`held`]); a decision holds one shard lock for well under a
//! microsecond.
//!
//! State that carries no information any more (a full bucket, a past window)
//! is dropped as soon as a decision notices, and each shard sweeps out expired
//! entries when it has doubled in size or a second has passed since its last
//! sweep, so memory stays bounded by live keys.

mod held;
mod key;

use std::hash::BuildHasher as _;
use std::sync::Arc;
use std::time::Duration;

use hashbrown::hash_table::HashTable;

use self::held::{remove, InstantSlot, Many, OneInstant, OneSlot, Slot};
use self::key::Place;
use super::Store;
use crate::algorithm::State;
use crate::clock::{micros, Clock, Sleep, SystemClock, Timestamp};
use crate::decision::{Decision, Outcome};
use crate::error::Result;
use crate::policy::{Ask, CheckOf, Policy, Request};
use crate::subject::Subject;

type Hasher = foldhash::fast::RandomState;

/// A shard's lock. A decision holds it for tens of nanoseconds and never
/// across I/O: a waiter spins, yielding its thread between tries, and the
/// holder releases it with a plain store, where a parking mutex releases
/// with a locked read-modify-write (3–4 ns of a keyed check, measured).
type ShardLock = spin::mutex::SpinMutex<Shard, spin::relax::Yield>;

/// The in-process store; cheap to clone (clones share state).
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[Padded]>,
    hasher: Hasher,
    clock: Arc<dyn Clock>,
    sweep_every: u64,
}

/// A shard on cache lines of its own, so threads on different shards do not
/// invalidate each other's lines.
#[repr(align(128))]
struct Padded(ShardLock);

struct Shard {
    /// The states that are one instant.
    instants: HashTable<InstantSlot>,
    /// Every other state.
    slots: HashTable<Slot>,
    next_sweep: u64,
    sweep_above: usize,
}

/// Options for a [`MemoryStore`].
#[derive(Default)]
pub struct MemoryStoreBuilder {
    clock: Option<Arc<dyn Clock>>,
    shards: Option<usize>,
    sweep_every: Option<Duration>,
}

impl MemoryStoreBuilder {
    /// The clock to decide by (default: [`SystemClock`]).
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// How many shards (default: 64; rounded up to a power of two).
    #[must_use]
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// How often each shard sweeps out expired state at the latest, when it
    /// is used at all (default: 1 s).
    #[must_use]
    pub fn sweep_every(mut self, period: Duration) -> Self {
        self.sweep_every = Some(period);
        self
    }

    /// The store.
    pub fn build(self) -> MemoryStore {
        let shards = self.shards.unwrap_or(64).max(1).next_power_of_two();
        let hasher = Hasher::default();
        MemoryStore {
            inner: Arc::new(Inner {
                shards: (0..shards)
                    .map(|_| {
                        Padded(ShardLock::new(Shard {
                            instants: HashTable::new(),
                            slots: HashTable::new(),
                            next_sweep: 0,
                            sweep_above: 64,
                        }))
                    })
                    .collect(),
                hasher,
                clock: self.clock.unwrap_or_else(|| Arc::new(SystemClock)),
                sweep_every: micros(self.sweep_every.unwrap_or(Duration::from_secs(1))),
            }),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store on the system clock.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A store on `clock` (a [`ManualClock`](crate::ManualClock) in tests).
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::builder().clock(clock).build()
    }

    /// Options: clock, shards, sweep period.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder::default()
    }

    /// The hash of a subject's key, which picks its shard.
    fn subject_hash(&self, key: &str) -> u64 {
        self.inner.hasher.hash_one(key.as_bytes())
    }

    fn shard(&self, subject_hash: u64) -> &ShardLock {
        // The high bits pick the shard; the tables inside use all of them.
        let index = (subject_hash >> 32) as usize & (self.inner.shards.len() - 1);
        &self.inner.shards[index].0
    }

    /// Decides without waiting: the memory store never blocks on I/O.
    ///
    /// # Errors
    ///
    /// An operation the policy's limits do not support.
    #[inline]
    pub fn decide_now(&self, subject: &Subject, policy: &Policy, request: &Request) -> Result<Outcome> {
        policy.validate(request)?;
        let now = request.now.unwrap_or_else(|| self.inner.clock.now());
        Ok(self.decide_in(subject, policy, request, now.as_micros()))
    }

    /// Checks `cost` units for `subject` now, on the store's clock: the
    /// decision of [`MemoryStore::decide_now`]'s check.
    ///
    /// # Errors
    ///
    /// As [`MemoryStore::decide_now`].
    #[inline]
    pub fn check(&self, subject: &Subject, policy: &Policy, cost: u64) -> Result<Decision> {
        self.check_at(subject, policy, cost, self.inner.clock.now())
    }

    /// Checks `cost` units for `subject` at `now` (tests, simulations,
    /// replays): the decision of [`MemoryStore::decide_now`]'s check at that
    /// instant, without a request or an outcome to build.
    ///
    /// # Errors
    ///
    /// As [`MemoryStore::decide_now`].
    #[inline]
    pub fn check_at(&self, subject: &Subject, policy: &Policy, cost: u64, now: Timestamp) -> Result<Decision> {
        policy.validate_check(cost)?;
        Ok(self.decide_in(subject, policy, CheckOf(cost), now.as_micros()))
    }

    /// Answers `ask` for `subject` at `now`: the subject's shard locked
    /// (and swept when due), its limits' slots found and handed to the
    /// policy, which decides and commits in place.
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    fn decide_in<A: Ask>(&self, subject: &Subject, policy: &Policy, ask: A, now: u64) -> A::Answer {
        let key = subject.as_key();
        let subject_hash = self.subject_hash(key);
        let mut shard = self.shard(subject_hash).lock();
        shard.sweep_if_due(now, self.inner.sweep_every);
        let hasher = self.inner.hasher;
        if policy.len() > 1 {
            return Self::decide_many(&mut shard, hasher, subject_hash, key, policy, ask, now);
        }
        let (name, name_hash, limit) = policy.hashed_limit(0);
        let place = Place::of(subject_hash, key, name, name_hash);
        if limit.keeps_instants() {
            ask.answer(
                policy,
                &mut OneInstant::find(&mut shard, place, limit, hasher, now),
                now,
            )
        } else {
            ask.answer(policy, &mut OneSlot::find(&mut shard, place, hasher, now), now)
        }
    }

    /// [`MemoryStore::decide_in`] for a policy of several limits; out of
    /// line, so that a single limit's decision stays small.
    #[inline(never)]
    fn decide_many<A: Ask>(
        shard: &mut Shard,
        hasher: Hasher,
        subject_hash: u64,
        key: &str,
        policy: &Policy,
        ask: A,
        now: u64,
    ) -> A::Answer {
        const INLINE_LIMITS: usize = 4;
        let count = policy.len();
        let mut inline: [Option<State>; INLINE_LIMITS] = Default::default();
        let mut spilled: Vec<Option<State>>;
        let instants: &mut [Option<State>] = if count <= INLINE_LIMITS {
            &mut inline[..count]
        } else {
            spilled = vec![None; count];
            &mut spilled
        };
        held::instants_of(shard, policy, subject_hash, key, now, instants);
        let mut many = Many {
            shard,
            policy,
            subject_hash,
            key,
            instants,
            hasher,
            now,
        };
        ask.answer(policy, &mut many, now)
    }

    /// Forgets `subject`'s state for every limit of `policy`.
    pub fn reset_now(&self, subject: &Subject, policy: &Policy) {
        let key = subject.as_key();
        let subject_hash = self.subject_hash(key);
        let mut shard = self.shard(subject_hash).lock();
        for (name, name_hash, _) in policy.hashed_limits() {
            let place = Place::of(subject_hash, key, name, name_hash);
            remove(&mut shard.slots, place.hash, |slot| place.holds(&slot.key));
            remove(&mut shard.instants, place.hash, |slot| place.holds(&slot.key));
        }
    }

    /// How many `(subject, limit)` states the store holds, expired or not.
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|shard| {
                let shard = shard.0.lock();
                shard.slots.len() + shard.instants.len()
            })
            .sum()
    }

    /// True when the store holds no state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every state that has expired by the store's clock.
    pub fn evict_expired(&self) {
        self.evict_expired_at(self.inner.clock.now().as_micros());
    }

    /// Drops every state that has expired by `now` (µs since the epoch).
    pub fn evict_expired_at(&self, now: u64) {
        for shard in &*self.inner.shards {
            shard.0.lock().sweep(now, self.inner.sweep_every);
        }
    }
}

impl Shard {
    /// True when a period has passed or the shard has doubled since the last sweep.
    fn sweep_due(&self, now: u64) -> bool {
        now >= self.next_sweep || self.slots.len() + self.instants.len() > self.sweep_above
    }

    fn sweep_if_due(&mut self, now: u64, every: u64) {
        if self.sweep_due(now) {
            self.sweep(now, every);
        }
    }

    /// Drops the states that carry nothing any more. The next sweep by size
    /// comes when the shard has doubled from what it held before this one,
    /// not from what is left: keys whose state lapses between their visits
    /// (a limit well under its rate) would otherwise be dropped and put back
    /// over and over, each sweep leaving the shard nearly empty.
    #[inline(never)]
    fn sweep(&mut self, now: u64, every: u64) {
        let held = self.slots.len() + self.instants.len();
        self.slots.retain(|slot| slot.expires > now);
        self.instants.retain(|slot| slot.expires() > now);
        self.next_sweep = now.saturating_add(every);
        self.sweep_above = (held * 2).max(64);
    }
}

impl Store for MemoryStore {
    async fn decide(&self, subject: &Subject, policy: &Policy, request: &Request) -> Result<Outcome> {
        self.decide_now(subject, policy, request)
    }

    fn in_process(&self) -> bool {
        true
    }

    async fn reset(&self, subject: &Subject, policy: &Policy) -> Result<()> {
        self.reset_now(subject, policy);
        Ok(())
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        self.inner.clock.sleep(duration)
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.inner.shards.len())
            .finish_non_exhaustive()
    }
}
