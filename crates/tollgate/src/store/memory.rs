//! The embedded store: state in this process, sharded.
//!
//! Keys are spread over shards by hash, each behind its own mutex, so threads
//! deciding for different subjects rarely meet and there is no global lock on
//! the decision path. A decision holds one shard lock for a few hundred
//! nanoseconds at most. State that carries no information any more (a full
//! bucket, a past window) is dropped as soon as a decision notices, and each
//! shard sweeps out expired entries when it has doubled in size or a second
//! has passed since its last sweep, so memory stays bounded by live keys.

use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::sync::Arc;
use std::time::Duration;

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
    shards: Box<[Mutex<Shard>]>,
    hasher: Hasher,
    clock: Arc<dyn Clock>,
    sweep_every: u64,
}

struct Shard {
    subjects: HashMap<Box<str>, Vec<Slot>, Hasher>,
    next_sweep: u64,
    sweep_above: usize,
}

/// The state of one limit of one subject.
struct Slot {
    name: Box<str>,
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
                        Mutex::new(Shard {
                            subjects: HashMap::with_hasher(hasher),
                            next_sweep: 0,
                            sweep_above: 64,
                        })
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
        &self.inner.shards[index]
    }

    fn now(&self, request: &Request) -> u64 {
        request.now.unwrap_or_else(|| self.inner.clock.now()).as_micros()
    }

    /// Decides without waiting: the memory store never blocks on I/O.
    ///
    /// # Errors
    ///
    /// An operation the policy's limits do not support.
    pub fn decide_now(&self, subject: &Subject, policy: &Policy, request: &Request) -> Result<Outcome> {
        let now = self.now(request);
        let mut shard = self.shard(subject.as_key()).lock();
        shard.sweep_if_due(now, self.inner.sweep_every);
        let slots = shard.subjects.get(subject.as_key());
        let mut inline: [Option<&State>; 4] = [None; 4];
        let mut spilled: Vec<Option<&State>>;
        let states: &mut [Option<&State>] = if policy.len() <= inline.len() {
            &mut inline[..policy.len()]
        } else {
            spilled = vec![None; policy.len()];
            &mut spilled
        };
        if let Some(slots) = slots {
            for ((name, _), state) in policy.limits().zip(states.iter_mut()) {
                *state = slots
                    .iter()
                    .find(|slot| &*slot.name == name && slot.expires > now)
                    .map(|slot| &slot.state);
            }
        }
        let decided = policy.decide(states, now, &request.op, request.cost)?;
        if !decided.writes.is_empty() {
            shard.write(subject.as_key(), policy, now, decided.writes);
        }
        Ok(decided.outcome)
    }

    /// Forgets `subject`'s state for every limit of `policy`.
    pub fn reset_now(&self, subject: &Subject, policy: &Policy) {
        let mut shard = self.shard(subject.as_key()).lock();
        if let Some(slots) = shard.subjects.get_mut(subject.as_key()) {
            slots.retain(|slot| policy.limits().all(|(name, _)| name != &*slot.name));
            if slots.is_empty() {
                shard.subjects.remove(subject.as_key());
            }
        }
    }

    /// How many `(subject, limit)` states the store holds, expired or not.
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|shard| shard.lock().subjects.values().map(Vec::len).sum::<usize>())
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
            shard.lock().sweep(now, self.inner.sweep_every);
        }
    }
}

impl Shard {
    fn sweep_if_due(&mut self, now: u64, every: u64) {
        if now >= self.next_sweep || self.subjects.len() > self.sweep_above {
            self.sweep(now, every);
        }
    }

    fn sweep(&mut self, now: u64, every: u64) {
        self.subjects.retain(|_, slots| {
            slots.retain(|slot| slot.expires > now);
            !slots.is_empty()
        });
        self.next_sweep = now.saturating_add(every);
        self.sweep_above = (self.subjects.len() * 2).max(64);
    }

    /// Stores the states a decision changed; a state with nothing left to say
    /// (`ttl == 0`) is dropped.
    fn write(&mut self, key: &str, policy: &Policy, now: u64, writes: Vec<(usize, State, u64)>) {
        if !self.subjects.contains_key(key) {
            self.subjects.insert(key.into(), Vec::with_capacity(policy.len()));
        }
        let Some(slots) = self.subjects.get_mut(key) else {
            return;
        };
        for (index, state, ttl) in writes {
            let name = policy.limits().nth(index).map_or("", |(name, _)| name);
            let found = slots.iter().position(|slot| &*slot.name == name);
            match (found, ttl) {
                (Some(at), 0) => {
                    slots.swap_remove(at);
                }
                (Some(at), _) => {
                    slots[at].state = state;
                    slots[at].expires = now + ttl;
                }
                (None, 0) => {}
                (None, _) => slots.push(Slot {
                    name: name.into(),
                    state,
                    expires: now + ttl,
                }),
            }
        }
        if slots.is_empty() {
            self.subjects.remove(key);
        }
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
