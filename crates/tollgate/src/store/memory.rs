//! The embedded store: state in this process, sharded.
//!
//! Subjects are spread over shards by hash, each behind its own mutex, so
//! threads deciding for different subjects rarely meet and there is no global
//! lock on the decision path; all limits of one subject live in one shard, so
//! a policy is decided under one lock. Inside a shard one hash table holds a
//! slot per `(subject, limit name)`, so a subject with very many limits (a
//! server domain with a limit per descriptor) costs no more per lookup than a
//! subject with one. A decision holds one shard lock for a few hundred
//! nanoseconds at most. State that carries no information any more (a full
//! bucket, a past window) is dropped as soon as a decision notices, and each
//! shard sweeps out expired entries when it has doubled in size or a second
//! has passed since its last sweep, so memory stays bounded by live keys.

use std::hash::BuildHasher as _;
use std::sync::Arc;
use std::time::Duration;

use hashbrown::hash_table::{Entry, HashTable};
use parking_lot::Mutex;

use super::Store;
use crate::algorithm::State;
use crate::clock::{micros, Clock, Sleep, SystemClock};
use crate::decision::Outcome;
use crate::error::Result;
use crate::policy::{Policy, Request};
use crate::subject::Subject;

type Hasher = foldhash::fast::RandomState;

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
struct Padded(Mutex<Shard>);

struct Shard {
    slots: HashTable<Slot>,
    next_sweep: u64,
    sweep_above: usize,
}

impl Slot {
    fn new(subject: &str, name: &str, hash: u64, state: State, expires: u64) -> Self {
        Self {
            key: [subject.as_bytes(), name.as_bytes()].concat().into_boxed_slice(),
            split: subject.len(),
            hash,
            state,
            expires,
        }
    }

    #[inline]
    fn is(&self, subject: &str, name: &str) -> bool {
        self.split == subject.len()
            && self.key.len() == subject.len() + name.len()
            && same(&self.key[..self.split], subject.as_bytes())
            && same(&self.key[self.split..], name.as_bytes())
    }

    fn put(&mut self, state: State, expires: u64) {
        self.state = state;
        self.expires = expires;
    }
}

/// Equal bytes, compared inline: keys are short, and a call to `memcmp`
/// costs more than the comparison.
#[inline]
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (mut a_words, mut b_words) = (a.chunks_exact(8), b.chunks_exact(8));
    let words_equal = a_words.by_ref().zip(b_words.by_ref()).all(|(x, y)| {
        u64::from_ne_bytes(x.try_into().unwrap_or_default()) == u64::from_ne_bytes(y.try_into().unwrap_or_default())
    });
    words_equal && a_words.remainder().iter().zip(b_words.remainder()).all(|(x, y)| x == y)
}

/// The state of one limit of one subject.
struct Slot {
    /// The subject's key, then the limit's name.
    key: Box<[u8]>,
    /// Where the name starts in `key`.
    split: usize,
    /// The hash of `(subject, name)`, kept for rehashing.
    hash: u64,
    state: State,
    /// When the state stops carrying information, µs since the epoch.
    expires: u64,
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
                        Padded(Mutex::new(Shard {
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

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        let hash = self.inner.hasher.hash_one(key);
        // The high bits pick the shard; the map inside uses all of them.
        let index = (hash >> 32) as usize & (self.inner.shards.len() - 1);
        &self.inner.shards[index].0
    }

    fn now(&self, request: &Request) -> u64 {
        request.now.unwrap_or_else(|| self.inner.clock.now()).as_micros()
    }

    fn slot_hash(&self, subject: &str, name: &str) -> u64 {
        self.inner.hasher.hash_one((subject, name))
    }

    /// Decides without waiting: the memory store never blocks on I/O.
    ///
    /// # Errors
    ///
    /// An operation the policy's limits do not support.
    pub fn decide_now(&self, subject: &Subject, policy: &Policy, request: &Request) -> Result<Outcome> {
        let now = self.now(request);
        let key = subject.as_key();
        let mut shard = self.shard(key).lock();
        shard.sweep_if_due(now, self.inner.sweep_every);
        if let Some((name, _)) = policy.limits().next().filter(|_| policy.len() == 1) {
            return self.decide_one(&mut shard, key, name, policy, request, now);
        }
        let mut inline: [Option<&State>; 4] = [None; 4];
        let mut spilled: Vec<Option<&State>>;
        let states: &mut [Option<&State>] = if policy.len() <= inline.len() {
            &mut inline[..policy.len()]
        } else {
            spilled = vec![None; policy.len()];
            &mut spilled
        };
        for ((name, _), state) in policy.limits().zip(states.iter_mut()) {
            *state = shard
                .slots
                .find(self.slot_hash(key, name), |slot| slot.is(key, name))
                .filter(|slot| slot.expires > now)
                .map(|slot| &slot.state);
        }
        let mut writes = Vec::new();
        let outcome = policy.decide(states, now, request, |index, state, ttl| {
            writes.push((index, state, ttl));
        })?;
        for (index, state, ttl) in writes {
            let name = policy.limits().nth(index).map_or("", |(name, _)| name);
            let hash = self.slot_hash(key, name);
            let entry = shard.slots.entry(hash, |slot| slot.is(key, name), |slot| slot.hash);
            match (entry, ttl) {
                // A state with nothing left to say is dropped at once.
                (Entry::Occupied(slot), 0) => {
                    slot.remove();
                }
                (Entry::Occupied(mut slot), _) => slot.get_mut().put(state, now + ttl),
                (Entry::Vacant(_), 0) => {}
                (Entry::Vacant(vacant), _) => {
                    vacant.insert(Slot::new(key, name, hash, state, now + ttl));
                }
            }
        }
        Ok(outcome)
    }

    /// A policy of one limit: one lookup, and the state updated in place.
    #[inline]
    fn decide_one(
        &self,
        shard: &mut Shard,
        key: &str,
        name: &str,
        policy: &Policy,
        request: &Request,
        now: u64,
    ) -> Result<Outcome> {
        let hash = self.slot_hash(key, name);
        let mut write = None;
        if let Some(slot) = shard.slots.find_mut(hash, |slot| slot.is(key, name)) {
            let state = (slot.expires > now).then_some(&slot.state);
            let outcome = policy.decide(&[state], now, request, |_, state, ttl| write = Some((state, ttl)))?;
            match write {
                Some((state, ttl)) if ttl > 0 => slot.put(state, now + ttl),
                // A state with nothing left to say is dropped at once.
                Some(_) => {
                    if let Ok(slot) = shard.slots.find_entry(hash, |slot| slot.is(key, name)) {
                        slot.remove();
                    }
                }
                None => {}
            }
            return Ok(outcome);
        }
        let outcome = policy.decide(&[None], now, request, |_, state, ttl| write = Some((state, ttl)))?;
        if let Some((state, ttl)) = write.filter(|&(_, ttl)| ttl > 0) {
            shard
                .slots
                .insert_unique(hash, Slot::new(key, name, hash, state, now + ttl), |slot| slot.hash);
        }
        Ok(outcome)
    }

    /// Forgets `subject`'s state for every limit of `policy`.
    pub fn reset_now(&self, subject: &Subject, policy: &Policy) {
        let key = subject.as_key();
        let mut shard = self.shard(key).lock();
        for (name, _) in policy.limits() {
            let found = shard
                .slots
                .find_entry(self.slot_hash(key, name), |slot| slot.is(key, name));
            if let Ok(slot) = found {
                slot.remove();
            }
        }
    }

    /// How many `(subject, limit)` states the store holds, expired or not.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|shard| shard.0.lock().slots.len()).sum()
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
    /// Sweeps when a period has passed or the shard has doubled since the last sweep.
    fn sweep_if_due(&mut self, now: u64, every: u64) {
        if now >= self.next_sweep || self.slots.len() > self.sweep_above {
            self.sweep(now, every);
        }
    }

    fn sweep(&mut self, now: u64, every: u64) {
        self.slots.retain(|slot| slot.expires > now);
        self.next_sweep = now.saturating_add(every);
        self.sweep_above = (self.slots.len() * 2).max(64);
    }
}

impl Store for MemoryStore {
    async fn decide(&self, subject: &Subject, policy: &Policy, request: &Request) -> Result<Outcome> {
        self.decide_now(subject, policy, request)
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
