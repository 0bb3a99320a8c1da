//! The embedded store: state in this process, sharded.
//!
//! Subjects are spread over shards by hash, each behind its own lock, so
//! threads deciding for different subjects rarely meet and there is no global
//! lock on the decision path; all limits of one subject live in one shard, so
//! a policy is decided under one lock. Inside a shard, hash tables hold a slot
//! per `(subject, limit name)`, so a subject with very many limits (a server
//! domain with a limit per descriptor) costs no more per lookup than a subject
//! with one. Every algorithm's states share that one table of 64-byte slots;
//! a policy whose limit offers a one-word kernel (see `Policy::kernel`) is
//! decided on its slot's word in place, any other by the policy's general
//! step. A decision holds one shard lock for well under a microsecond.
//!
//! State that carries no information any more (a full bucket, a past window)
//! is dropped as soon as a decision notices, and each shard sweeps out expired
//! entries when it has doubled in size or a second has passed since its last
//! sweep, so memory stays bounded by live keys.

use std::hash::BuildHasher as _;
use std::sync::Arc;
use std::time::Duration;

use hashbrown::hash_table::HashTable;

use super::listing::{take_step, Position, SubjectPage};
use super::Store;
use crate::algorithm::{Change, State, WordKernel};
use crate::clock::{micros, Clock, Sleep, SystemClock, Timestamp};
use crate::decision::{Decision, Outcome};
use crate::error::Result;
use crate::policy::{name_hash, Policy};
use crate::request::{Op, Request};
use crate::subject::{subject_parts, Subject, SubjectPattern};

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
    /// The states of every limit of every subject of the shard.
    slots: HashTable<Slot>,
    next_sweep: u64,
    sweep_above: usize,
}

/// Bytes of a key kept inline; longer keys go to the heap.
const INLINE: usize = 21;

/// The bytes of `(subject, limit name)`, in 24 bytes: inline when short (an
/// IPv4 address and a short limit name fit), so that a lookup reads one
/// cache line, else behind one pointer.
enum Key {
    Inline { len: u8, split: u8, bytes: [u8; INLINE] },
    Heap { split: u16, bytes: Box<[u8]> },
}

const _: () = assert!(size_of::<Key>() == 24);
const _: () = assert!(size_of::<Slot>() == 64);

impl Key {
    fn new(subject: &str, name: &str) -> Self {
        let len = subject.len() + name.len();
        if let (Ok(short), Ok(split)) = (u8::try_from(len), u8::try_from(subject.len())) {
            if len <= INLINE {
                let mut bytes = [0; INLINE];
                bytes[..subject.len()].copy_from_slice(subject.as_bytes());
                bytes[subject.len()..len].copy_from_slice(name.as_bytes());
                return Self::Inline {
                    len: short,
                    split,
                    bytes,
                };
            }
        }
        Self::Heap {
            // Subject encodings are at most `MAX_KEY_LEN` (200) bytes.
            split: u16::try_from(subject.len()).unwrap_or(u16::MAX),
            bytes: [subject.as_bytes(), name.as_bytes()].concat().into_boxed_slice(),
        }
    }

    /// The subject's bytes and the name's.
    #[inline]
    fn parts(&self) -> (&[u8], &[u8]) {
        match self {
            Self::Inline { len, split, bytes } => bytes[..usize::from(*len)].split_at(usize::from(*split)),
            Self::Heap { split, bytes } => bytes.split_at(usize::from(*split)),
        }
    }

    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    fn is(&self, subject: &str, name: &str) -> bool {
        let (key_subject, key_name) = self.parts();
        same(key_subject, subject.as_bytes()) && same(key_name, name.as_bytes())
    }
}

/// Where one limit of one subject lives: the subject's key, the limit's
/// name, and the hash of both.
#[derive(Clone, Copy)]
struct Place<'a> {
    hash: u64,
    key: &'a str,
    name: &'a str,
}

impl Place<'_> {
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    fn holds(&self, key: &Key) -> bool {
        key.is(self.key, self.name)
    }
}

/// Equal bytes, compared inline: keys are short, and a call to `memcmp`
/// costs more than the comparison.
#[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
#[inline(always)]
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

/// The state of one limit of one subject, on a cache line of its own: a
/// lookup compares the key and reads or writes the state in one line (at
/// 8-byte alignment most slots would straddle two).
#[repr(align(64))]
struct Slot {
    key: Key,
    state: State,
    /// When the state stops carrying information, µs since the epoch.
    expires: u64,
}

impl Slot {
    /// Commits `change`, decided on this slot's state (or on none, when it
    /// had expired), until `expires`.
    fn commit(&mut self, change: Change<'_>, expires: u64) {
        change.apply(&mut self.state);
        self.expires = expires;
    }

    /// Decides a policy of one limit offering `kernel` (the request
    /// validated) on this slot's word `seen` ([`Slot::word`]), committing
    /// the new word in place. A word whose instant has passed says nothing,
    /// like no state at all: it stays until the next sweep.
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    fn decide_word(&mut self, kernel: &WordKernel, seen: u64, policy: &Policy, request: &Request, now: u64) -> Outcome {
        policy.decide_word(kernel, seen, now, request, |new| self.put_word(kernel, new))
    }

    /// The kernel's word in this slot: zero when the slot's state has
    /// expired; none when it holds a live state the word cannot express (a
    /// limit of the same name decided another way, or a GCRA instant with a
    /// fraction of a microsecond), which only the general step reads right.
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    fn word(&mut self, kernel: &WordKernel, now: u64) -> Option<u64> {
        let expired = self.expires <= now;
        match kernel.word_mut(&mut self.state) {
            Some(word) => Some(*word),
            None if expired => Some(0),
            None => None,
        }
    }

    /// Puts `new` in this slot's word: in place when it holds one.
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    fn put_word(&mut self, kernel: &WordKernel, new: u64) {
        match kernel.word_mut(&mut self.state) {
            Some(word) => *word = new,
            None => self.state = kernel.state(new),
        }
        self.expires = kernel.expires(new);
    }

    /// [`Slot::decide_word`] for a check alone: the decision, the outcome
    /// left unbuilt.
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    fn check_word(&mut self, kernel: &WordKernel, seen: u64, now: u64, cost: u64) -> Decision {
        let step = kernel.check(seen, now, cost);
        if let Some(new) = step.change {
            self.put_word(kernel, new);
        }
        step.decision
    }
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

    fn now(&self, request: &Request) -> u64 {
        request.now.unwrap_or_else(|| self.inner.clock.now()).as_micros()
    }

    /// Where `name` (hashed to `name_hash`) of the subject `key` (hashed to
    /// `subject_hash`) lives.
    #[inline]
    fn place<'a>(subject_hash: u64, key: &'a str, name: &'a str, name_hash: u64) -> Place<'a> {
        Place {
            hash: slot_hash(subject_hash, name_hash),
            key,
            name,
        }
    }

    fn key_hash(&self, key: &Key) -> u64 {
        let (subject, name) = key.parts();
        slot_hash(self.inner.hasher.hash_one(subject), name_hash(name))
    }

    /// Decides without waiting: the memory store never blocks on I/O.
    ///
    /// # Errors
    ///
    /// An operation the policy's limits do not support.
    #[inline]
    pub fn decide_now(&self, subject: &Subject, policy: &Policy, request: &Request) -> Result<Outcome> {
        policy.validate(request)?;
        Ok(self.decide_validated(subject, policy, request))
    }

    /// [`MemoryStore::decide_now`] for a request already validated. Out of
    /// line and infallible, so that the outcome is written once, in place.
    fn decide_validated(&self, subject: &Subject, policy: &Policy, request: &Request) -> Outcome {
        let now = self.now(request);
        let key = subject.as_key();
        let subject_hash = self.subject_hash(key);
        let shard = self.shard(subject_hash);
        let single = policy.hashed_limits().next().filter(|_| policy.len() == 1);
        let mut shard = shard.lock();
        shard.sweep_if_due(now, self.inner.sweep_every);
        if let Some((name, name_hash, _)) = single {
            let place = Self::place(subject_hash, key, name, name_hash);
            if let Some(kernel) = policy.kernel() {
                match shard.slots.find_mut(place.hash, |slot| place.holds(&slot.key)) {
                    Some(slot) => {
                        if let Some(seen) = slot.word(kernel, now) {
                            return slot.decide_word(kernel, seen, policy, request, now);
                        }
                    }
                    None => return self.decide_new(&mut shard, place, policy, request, now),
                }
            }
            return self.decide_one(&mut shard, place, policy, request, now);
        }
        self.decide_many(&mut shard, subject_hash, key, policy, request, now)
    }

    /// The shard of the subject `key`, locked (and swept when due), with
    /// the subject's hash.
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    fn lock_shard(&self, key: &str, now: u64) -> (u64, spin::mutex::SpinMutexGuard<'_, Shard>) {
        let subject_hash = self.subject_hash(key);
        let mut shard = self.shard(subject_hash).lock();
        shard.sweep_if_due(now, self.inner.sweep_every);
        (subject_hash, shard)
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
    /// instant. A policy with a one-word kernel that does not record its
    /// overage is checked on its word in place, without a request or an
    /// outcome to build.
    ///
    /// # Errors
    ///
    /// As [`MemoryStore::decide_now`].
    #[inline]
    pub fn check_at(&self, subject: &Subject, policy: &Policy, cost: u64, now: Timestamp) -> Result<Decision> {
        if let Some(kernel) = policy.check_kernel() {
            return Ok(self.check_word(subject, policy, kernel, cost, now.as_micros()));
        }
        self.check_request(subject, policy, cost, now)
    }

    /// A check of `cost` units of `policy`'s one limit, decided by its
    /// `kernel`, for `subject`: on its word in place.
    fn check_word(&self, subject: &Subject, policy: &Policy, kernel: &WordKernel, cost: u64, now: u64) -> Decision {
        let key = subject.as_key();
        let (subject_hash, mut shard) = self.lock_shard(key, now);
        let (name, name_hash) = policy.first_name();
        let place = Self::place(subject_hash, key, name, name_hash);
        let request = || Request::new(Op::Check, cost).at(Timestamp::from_micros(now));
        match shard.slots.find_mut(place.hash, |slot| place.holds(&slot.key)) {
            Some(slot) => match slot.word(kernel, now) {
                Some(seen) => slot.check_word(kernel, seen, now, cost),
                None => self.decide_one(&mut shard, place, policy, &request(), now).decision,
            },
            None => self.decide_new(&mut shard, place, policy, &request(), now).decision,
        }
    }

    /// [`MemoryStore::check_at`] as a request; out of line, and without
    /// calling `decide_now`, so that `decide_now` keeps its one caller in
    /// this crate (the async store) and its inlining there.
    #[inline(never)]
    fn check_request(&self, subject: &Subject, policy: &Policy, cost: u64, now: Timestamp) -> Result<Decision> {
        let request = Request::new(Op::Check, cost).at(now);
        policy.validate(&request)?;
        Ok(self.decide_validated(subject, policy, &request).decision)
    }

    /// A policy of one limit without a one-word kernel: one lookup, and the
    /// state updated in place by the general step.
    #[inline(never)]
    fn decide_one(&self, shard: &mut Shard, place: Place<'_>, policy: &Policy, request: &Request, now: u64) -> Outcome {
        let Some(slot) = shard.slots.find_mut(place.hash, |slot| place.holds(&slot.key)) else {
            return self.decide_new(shard, place, policy, request, now);
        };
        let state = (slot.expires > now).then_some(&slot.state);
        let mut write = None;
        let outcome = policy.decide_validated(&[state], now, request, |_, change, ttl| write = Some((change, ttl)));
        match write {
            Some((change, ttl)) if ttl > 0 => slot.commit(change, now + ttl),
            // A state with nothing left to say is dropped at once.
            Some(_) => remove(&mut shard.slots, place.hash, |slot| place.holds(&slot.key)),
            None => {}
        }
        outcome
    }

    /// A policy of one limit whose table holds no state for it.
    #[inline(never)]
    fn decide_new(&self, shard: &mut Shard, place: Place<'_>, policy: &Policy, request: &Request, now: u64) -> Outcome {
        let mut write = None;
        let outcome = policy.decide_validated(&[None], now, request, |_, change, ttl| write = Some((change, ttl)));
        if let Some((change, ttl)) = write {
            self.put_new(shard, place, change, ttl, now);
        }
        outcome
    }

    /// A policy of several limits, all-or-nothing under the write lock.
    #[inline(never)]
    fn decide_many(
        &self,
        shard: &mut Shard,
        subject_hash: u64,
        key: &str,
        policy: &Policy,
        request: &Request,
        now: u64,
    ) -> Outcome {
        const INLINE_LIMITS: usize = 4;
        let count = policy.len();
        let mut inline: [Option<&State>; INLINE_LIMITS] = [None; INLINE_LIMITS];
        let mut spilled: Vec<Option<&State>>;
        let states: &mut [Option<&State>] = if count <= INLINE_LIMITS {
            &mut inline[..count]
        } else {
            spilled = vec![None; count];
            &mut spilled
        };
        for ((name, name_hash, _), state) in policy.hashed_limits().zip(states.iter_mut()) {
            let place = Self::place(subject_hash, key, name, name_hash);
            *state = shard
                .slots
                .find(place.hash, |slot| place.holds(&slot.key))
                .filter(|slot| slot.expires > now)
                .map(|slot| &slot.state);
        }
        let mut writes = Vec::new();
        let outcome = policy.decide_validated(states, now, request, |index, change, ttl| {
            writes.push((index, change, ttl));
        });
        for (index, change, ttl) in writes {
            if let Some((name, name_hash, _)) = policy.hashed_limits().nth(index) {
                self.put(shard, Self::place(subject_hash, key, name, name_hash), change, ttl, now);
            }
        }
        outcome
    }

    /// Commits `change` to the state of `(key, name)` it was decided on, for
    /// `ttl` µs (none: drops it).
    fn put(&self, shard: &mut Shard, place: Place<'_>, change: Change<'_>, ttl: u64, now: u64) {
        if let Ok(mut slot) = shard.slots.find_entry(place.hash, |slot| place.holds(&slot.key)) {
            if ttl == 0 {
                slot.remove();
            } else {
                slot.get_mut().commit(change, now + ttl);
            }
            return;
        }
        self.put_new(shard, place, change, ttl, now);
    }

    /// [`MemoryStore::put`] for a key the table does not hold.
    fn put_new(&self, shard: &mut Shard, place: Place<'_>, change: Change<'_>, ttl: u64, now: u64) {
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
        shard
            .slots
            .insert_unique(place.hash, slot, |slot| self.key_hash(&slot.key));
    }

    /// Forgets `subject`'s state for every limit of `policy`.
    pub fn reset_now(&self, subject: &Subject, policy: &Policy) {
        let key = subject.as_key();
        let subject_hash = self.subject_hash(key);
        let mut shard = self.shard(subject_hash).lock();
        for (name, name_hash, _) in policy.hashed_limits() {
            let place = Self::place(subject_hash, key, name, name_hash);
            remove(&mut shard.slots, place.hash, |slot| place.holds(&slot.key));
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

    /// The subjects that fit `pattern` this store holds a live state for
    /// under the limit `name`, a page of at most `limit` from `cursor` (a
    /// page's [`SubjectPage::cursor`]; none: from the start). A page looks
    /// through whole shards, under each one's lock in turn, until it has
    /// looked at 10 000 states (or found `limit`): about as
    /// much work at a million states as at ten thousand. A state written
    /// while the listing goes on may be left out.
    ///
    /// # Errors
    ///
    /// A cursor this store did not give.
    pub fn subjects(
        &self,
        pattern: &SubjectPattern,
        name: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<SubjectPage> {
        let mut at = Position::parse(cursor)?;
        let now = self.inner.clock.now().as_micros();
        let shards = &self.inner.shards;
        let mut page = SubjectPage::default();
        let mut examined = 0;
        while examined < EXAMINED_PER_PAGE {
            let Some(shard) = usize::try_from(at.step).ok().and_then(|index| shards.get(index)) else {
                return Ok(page);
            };
            let fitting = {
                let shard = shard.0.lock();
                examined += shard.slots.len();
                shard.subjects(pattern, name.as_bytes(), now)
            };
            if let Some(next) = take_step(&mut page.subjects, fitting, at, limit) {
                page.cursor = Some(next.cursor());
                return Ok(page);
            }
            at = Position {
                step: at.step + 1,
                skip: 0,
            };
            if page.subjects.len() == limit {
                break;
            }
        }
        page.cursor = (usize::try_from(at.step).unwrap_or(usize::MAX) < shards.len()).then(|| at.cursor());
        Ok(page)
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

/// The hash of a slot: its subject's (which also picks the shard), mixed
/// with its name's, which the policy keeps, so that a lookup hashes only
/// the subject.
#[inline]
fn slot_hash(subject_hash: u64, name_hash: u64) -> u64 {
    subject_hash ^ name_hash.rotate_left(23)
}

/// Removes the entry `is` finds, if any.
fn remove<T>(table: &mut HashTable<T>, hash: u64, is: impl Fn(&T) -> bool) {
    if let Ok(entry) = table.find_entry(hash, is) {
        entry.remove();
    }
}

/// States a page of [`MemoryStore::subjects`] looks at before it ends (it
/// ends with the shard it is in).
pub const EXAMINED_PER_PAGE: usize = 10_000;

impl Shard {
    /// The subjects fitting `pattern` with a live state under `name`, in
    /// the table's order (the same from one call to the next while nothing
    /// is written).
    fn subjects(&self, pattern: &SubjectPattern, name: &[u8], now: u64) -> Vec<Vec<String>> {
        let fits = |key: &Key| {
            let (subject, key_name) = key.parts();
            if key_name != name {
                return None;
            }
            let subject = std::str::from_utf8(subject).ok()?;
            pattern.matches(subject).then(|| subject_parts(subject)).flatten()
        };
        self.slots
            .iter()
            .filter(|slot| slot.expires > now)
            .filter_map(|slot| fits(&slot.key))
            .collect()
    }

    /// True when a period has passed or the shard has doubled since the last sweep.
    fn sweep_due(&self, now: u64) -> bool {
        now >= self.next_sweep || self.slots.len() > self.sweep_above
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
        let held = self.slots.len();
        self.slots.retain(|slot| slot.expires > now);
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

#[cfg(test)]
mod tests;
