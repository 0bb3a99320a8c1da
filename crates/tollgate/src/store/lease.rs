//! Leases on hot keys: a process takes blocks of units from a shared limit
//! and hands them out to its own requests (see [`LeasedStore`]).
//!
//! A key's [`Block`] is a small state machine (new, holding, denying,
//! drained) kept between calls to the store; whatever a block holds when
//! its lease ends, the store closes or its last clone drops goes back
//! through one path ([`Shared::give_back_all`]). Ended leases are swept by
//! one task per lease length, at half that length.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::{Spread, Store};
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::decision::{Decision, Outcome, Path};
use crate::error::Result;
use crate::policy::Policy;
use crate::request::{Op, Request};
use crate::subject::Subject;

/// A block is never more than this fraction (1 / `SHARE`) of the limit's
/// capacity, so that four processes or more share a burst.
pub(crate) const SHARE: u64 = 4;

/// A [`Store`] that decides checks on leased limits from blocks of units
/// taken from `S`. Cheap to clone: clones share the blocks.
///
/// One key lives on one Redis server, and every decision on it is a call to
/// that server: a global limit, a tenant's quota or one busy client is
/// capped by one single-threaded server however large the Cluster. A limit
/// that carries a lease ([`Limit::with_lease`](crate::Limit::with_lease),
/// `"lease": "50ms"` in JSON) is decided here instead, for plain checks:
///
/// - **A block in one call.** When the process holds no units, one
///   [`Op::CheckAtMost`] takes a block from the store (the units this
///   request needs, and more); later requests take from the block without a
///   call. Units are taken before they are used, so the shared limit is
///   **never over-admitted**.
/// - **The time shift.** A unit may be used up to one lease after the store
///   counted it: the block's lease ends one lease duration after the call
///   was sent, and what is left of it then goes back ([`Op::Refund`], less
///   what a bucket or a TAT refilled meanwhile, which would otherwise be
///   admitted twice). So each algorithm's bound holds over any interval
///   stretched by one lease: at most `limit` per aligned window and lease
///   for a fixed window, `limit` in any `window` + lease for a sliding log,
///   `capacity` (`burst`) plus what refills in the interval + lease for a
///   token bucket (GCRA).
/// - **Blocks that adapt.** A block is about what this process used over
///   one lease duration (its own recent rate; at most twice the last block),
///   never more than a quarter of the limit's capacity (its burst, its
///   window's count), and never more than the limit has left (what
///   `check_at_most` grants). A process with a low rate takes single units,
///   each decided exactly as without a lease.
/// - **Near the limit.** A call granted less than it asked for has found
///   the limit spent: this process then denies its requests itself (after
///   using what it got) until the missing units could have come back — a
///   bucket's refill of them, a window's share of its reset — so that its
///   next call is worth a block, and a saturated hot key costs a few calls
///   per block rather than one per request. Under-admission, never over.
/// - **Denials.** A denial is answered again here, without a call, until its
///   `retry_after` has passed: until the next block could be taken.
/// - **Giving back.** What a block holds when its lease ends goes back to
///   the store: at the next decision on that key, from a task that sweeps
///   ended leases every half lease (one task per lease length, when the
///   store runs under a Tokio runtime and requests carry no explicit
///   `now`), and for every key at [`LeasedStore::close`] (and, best effort,
///   when the last clone drops).
///   A refund the store fails to take is dropped: the units lapse, which
///   under-admits, never over-admits.
/// - **Store faults.** Over a [`ResilientStore`](crate::ResilientStore), a
///   block comes from whatever answers: the store, or while it fails its
///   failure policy (an error, `open`, `closed`, the `local` fallback). Units
///   the store did not grant are used but never given back to it: they
///   lapse with their lease.
/// - **Gateways.** [`Store::decide_spread`] of one subject and one leased
///   limit (a request of one descriptor) is leased; a request of several
///   descriptors goes to the store as it is.
///
/// Everything else — other operations, per-limit costs, policies without a
/// lease, spread decisions of several descriptors — goes to the store as it
/// is; so does everything over a store in this process (the memory store):
/// there a lease would add its time shift and save nothing, so a
/// [`Limiter`](crate::Limiter) over `LeasedStore<MemoryStore>` decides
/// exactly as over the memory store.
pub struct LeasedStore<S: Store> {
    shared: Arc<Shared<S>>,
    /// False: every decision goes to the store as it is ([`LeasedStore::leasing`]).
    leasing: bool,
}

impl<S: Store> Clone for LeasedStore<S> {
    fn clone(&self) -> Self {
        self.shared.handles.fetch_add(1, Ordering::Relaxed);
        Self {
            shared: Arc::clone(&self.shared),
            leasing: self.leasing,
        }
    }
}

/// What the clones of a [`LeasedStore`] share, and its sweepers reach
/// through a [`Weak`] reference.
struct Shared<S> {
    /// The store leases are taken from.
    inner: S,
    entries: Mutex<Entries>,
    /// The time of requests without an explicit `now`.
    clock: Box<dyn Clock>,
    /// Calls made to the store on behalf of leased checks.
    calls: AtomicU64,
    /// Leased checks decided.
    decisions: AtomicU64,
    /// Clones of the `LeasedStore` alive. Not `Arc::strong_count`: a
    /// sweeper holds a reference while it sweeps, and the last clone
    /// dropped meanwhile must still give back.
    handles: AtomicUsize,
}

/// The blocks, and the lease lengths a sweeper runs for: under one lock, so
/// that a sweeper stopping (no key of its length left) and a check starting
/// one (its key just added) cannot miss each other.
#[derive(Default)]
struct Entries {
    /// Blocks by subject and limit names.
    by_key: HashMap<String, Arc<Entry>>,
    /// The lease lengths whose sweeper runs.
    swept: HashSet<Duration>,
}

/// The block of one subject's leased policy.
struct Entry {
    /// The subject and policy the block is taken for (to give it back).
    subject: Subject,
    policy: Policy,
    /// The policy's lease: how long a block is held, and which sweeper
    /// gives it back.
    lease: Duration,
    block: Mutex<Block>,
    /// One task at a time calls the store for this key; the others wait for
    /// the block it brings.
    calling: tokio::sync::Mutex<()>,
}

/// A key's block between calls to the store. Every state but the first
/// keeps the last call, from which local answers and the next block's size
/// are made.
#[derive(Debug, Default)]
enum Block {
    /// No call yet: the store decides.
    #[default]
    New,
    /// Units taken and not yet handed out (never zero): they answer checks
    /// until the lease ends, and go back then. `spent_until`: the call found
    /// the limit spent (it granted less than asked), so a check these units
    /// cannot answer is denied here until then.
    Holding {
        call: Call,
        units: u64,
        spent_until: Option<Timestamp>,
    },
    /// Nothing held; checks are denied here until `until` (a denial's
    /// `retry_after`, or the limit found spent).
    Denying { call: Call, until: Timestamp },
    /// Nothing held, nothing denied: the store decides.
    Drained(Call),
}

/// A call to the store for a block.
#[derive(Debug)]
struct Call {
    /// The store's answer. Its instant is the one the units were taken at,
    /// which their refund names; its path says whether the store granted
    /// them (a failure policy's or the local fallback's units must not be
    /// given back to the store).
    answer: Outcome,
    /// This store's time of the call.
    at: Timestamp,
    /// How long the call took (zero for requests with an explicit `now`):
    /// the server may have counted the units that much later.
    rtt: Duration,
    /// When its lease ends (this store's time): units still held then go
    /// back.
    ends: Timestamp,
    /// The size of the block asked for, and the units handed out since.
    size: u64,
    used: u64,
}

/// What a block held when its lease ended (or it had too few units): to
/// give back.
struct Held {
    units: u64,
    taken_at: Timestamp,
    called_at: Timestamp,
    rtt: Duration,
}

/// What a [`LeasedStore`] has done: store calls against decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseStats {
    /// Leased checks decided.
    pub decisions: u64,
    /// Calls to the store they took (blocks, refunds, exact checks).
    pub calls: u64,
}

impl<S: Store> LeasedStore<S> {
    /// Leases on `inner`, timed by the system clock (a request's explicit
    /// `now` takes precedence).
    pub fn new(inner: S) -> Self {
        Self::with_clock(inner, SystemClock)
    }

    /// Leases on `inner`, timed by `clock` where a request has no `now`.
    pub fn with_clock(inner: S, clock: impl Clock) -> Self {
        Self {
            leasing: !inner.in_process(),
            shared: Arc::new(Shared {
                inner,
                entries: Mutex::default(),
                clock: Box::new(clock),
                calls: AtomicU64::new(0),
                decisions: AtomicU64::new(0),
                handles: AtomicUsize::new(1),
            }),
        }
    }

    /// Leases or not. By default a store shared with other processes is
    /// leased from and one in this process ([`Store::in_process`]: the
    /// memory store) is not: a lease would add its time shift and save
    /// nothing. `true` leases from any store (`tollgate simulate`, which
    /// shows what a leasing process answers whatever the store).
    #[must_use]
    pub fn leasing(mut self, on: bool) -> Self {
        self.leasing = on;
        self
    }

    /// The store leases are taken from.
    pub fn inner(&self) -> &S {
        &self.shared.inner
    }

    /// Leased checks decided and the store calls they took.
    pub fn stats(&self) -> LeaseStats {
        LeaseStats {
            decisions: self.shared.decisions.load(Ordering::Relaxed),
            calls: self.shared.calls.load(Ordering::Relaxed),
        }
    }

    /// Gives back every unused unit of every block (at `now`, else this
    /// store's time): call it before the process stops.
    pub async fn close(&self, now: Option<Timestamp>) {
        self.shared.close(now).await;
    }

    /// The entry of `subject` under `policy`, leased for `lease`. A policy
    /// redefined under the same names (a configuration reloaded) starts a
    /// new entry: the old block's units lapse (under-admission only), since
    /// they were taken under other limits.
    fn entry(&self, subject: &Subject, policy: &Policy, lease: Duration) -> Arc<Entry> {
        let fresh = || {
            Arc::new(Entry {
                subject: subject.clone(),
                policy: policy.clone(),
                lease,
                block: Mutex::new(Block::New),
                calling: tokio::sync::Mutex::new(()),
            })
        };
        let mut entries = self.shared.entries.lock();
        let entry = entries.by_key.entry(entry_key(subject, policy)).or_insert_with(fresh);
        if entry.policy != *policy {
            *entry = fresh();
        }
        Arc::clone(entry)
    }

    /// A leased check of `request.units()` units of `subject` under `policy`.
    async fn check(&self, subject: &Subject, policy: &Policy, request: &Request, lease: Duration) -> Result<Outcome> {
        let entry = self.entry(subject, policy, lease);
        self.check_entry(&entry, request).await
    }

    /// A leased check of `request.units()` units on `entry`'s block (its
    /// subject and policy are the request's). The caller holds `entry`, so
    /// no sweep forgets it before its block is recorded.
    async fn check_entry(&self, entry: &Entry, request: &Request) -> Result<Outcome> {
        let shared = &*self.shared;
        shared.decisions.fetch_add(1, Ordering::Relaxed);
        let cost = request.units();
        let now = request.now.unwrap_or_else(|| shared.clock.now());
        if let Some(answer) = entry.block.lock().answer(cost, now) {
            return Ok(answer);
        }
        let _calling = entry.calling.lock().await;
        // The time after waiting for another task's call: a block's lease
        // is never stretched by the wait.
        let now = request.now.unwrap_or_else(|| shared.clock.now());
        // Another task may have brought a block meanwhile.
        let (size, ended) = {
            let mut block = entry.block.lock();
            if let Some(answer) = block.answer(cost, now) {
                return Ok(answer);
            }
            (block.next_size(cost, now, entry.lease), block.take_held())
        };
        // What is left (an ended lease, or too few units) goes back first.
        if let Some(held) = ended {
            shared.give_back(entry, held, request.now).await;
        }
        let mut take = Request::new(Op::CheckAtMost, size);
        take.now = request.now;
        shared.calls.fetch_add(1, Ordering::Relaxed);
        let taken = shared.inner.decide(&entry.subject, &entry.policy, &take).await?;
        let rtt = match request.now {
            Some(_) => Duration::ZERO,
            None => Duration::from_micros(shared.clock.now().as_micros().saturating_sub(now.as_micros())),
        };
        if taken.decision.allowed && taken.granted < cost {
            // Too little left for this request: give it back (if the store
            // granted it) and decide the request exactly, as without a lease.
            if taken.path == Path::Store {
                let partial = Held {
                    units: taken.granted,
                    taken_at: taken.decided_at,
                    called_at: now,
                    rtt,
                };
                shared.give_back(entry, partial, request.now).await;
            }
            shared.calls.fetch_add(1, Ordering::Relaxed);
            let exact = shared.inner.decide(&entry.subject, &entry.policy, request).await?;
            let call = Call::new(exact.clone(), cost, now, entry.lease, rtt);
            *entry.block.lock() = Block::after(call, 0);
            return Ok(exact);
        }
        let held = taken.granted.saturating_sub(cost);
        let mut call = Call::new(taken.clone(), size, now, entry.lease, rtt);
        if taken.decision.allowed {
            call.used = cost;
        }
        *entry.block.lock() = Block::after(call, held);
        // Closed or reset while this call was under way: the map no longer
        // holds the entry, so no sweep and no close would give the block
        // back. (A close waits for this call before it takes the block; a
        // refund to a reset state gives back nothing that was not taken.)
        if !shared.holds(entry) {
            let orphaned = entry.block.lock().take_held();
            if let Some(orphaned) = orphaned {
                shared.give_back(entry, orphaned, request.now).await;
            }
        }
        if !taken.decision.allowed {
            return Ok(taken);
        }
        if request.now.is_none() {
            self.sweep_in_background(entry.lease);
        }
        let mut answer = taken;
        answer.granted = cost;
        add_remaining(&mut answer, held);
        Ok(answer)
    }

    /// Starts the sweeper of blocks leased for `lease`, unless it runs (for
    /// requests timed by this store's clock, under a Tokio runtime).
    fn sweep_in_background(&self, lease: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.shared.entries.lock().swept.insert(lease) {
            runtime.spawn(sweep(Arc::downgrade(&self.shared), lease));
        }
    }
}

impl<S: Store> Shared<S> {
    /// True while the map holds `entry` (not closed, reset or replaced).
    fn holds(&self, entry: &Entry) -> bool {
        let key = entry_key(&entry.subject, &entry.policy);
        self.entries
            .lock()
            .by_key
            .get(&key)
            .is_some_and(|held| std::ptr::eq(Arc::as_ptr(held), entry))
    }

    /// Gives back every unused unit of every block (at `now`, else this
    /// store's time), and forgets the blocks.
    async fn close(&self, now: Option<Timestamp>) {
        let entries: Vec<Arc<Entry>> = self.entries.lock().by_key.drain().map(|(_, entry)| entry).collect();
        let mut ended = Vec::with_capacity(entries.len());
        for entry in entries {
            let held = {
                // A call in flight brings a block: wait for it.
                let _calling = entry.calling.lock().await;
                entry.block.lock().take_held()
            };
            ended.extend(held.map(|held| (entry, held)));
        }
        self.give_back_all(ended, now).await;
    }

    /// One sweep, at `now`, of the blocks leased for `lease`: gives back
    /// what the ended ones hold and forgets idle keys. False when no key of
    /// that lease is left: its sweeper then stops (the next block of that
    /// lease starts one again).
    async fn sweep(&self, lease: Duration, now: Timestamp) -> bool {
        let (ended, left) = {
            let mut entries = self.entries.lock();
            let mut ended = Vec::new();
            let mut left = false;
            entries.by_key.retain(|_, entry| {
                if entry.lease != lease {
                    return true;
                }
                let keep = sweep_entry(entry, now, &mut ended);
                left |= keep;
                keep
            });
            if !left {
                entries.swept.remove(&lease);
            }
            (ended, left)
        };
        self.give_back_all(ended, None).await;
        left
    }

    /// Gives back what `ended` holds, key after key: the one way blocks go
    /// back when the store closes, its last clone drops or a sweep finds
    /// their lease ended. `now`: an explicit instant, if any.
    async fn give_back_all(&self, ended: Vec<(Arc<Entry>, Held)>, now: Option<Timestamp>) {
        for (entry, held) in ended {
            self.give_back(&entry, held, now).await;
        }
    }

    /// Gives what `held` holds back to the store, less what may have lapsed
    /// since it was taken (a bucket or a TAT refilled meanwhile: giving that
    /// back would admit it twice). `now`: the request's explicit instant, if
    /// any. A fault drops the units: they lapse.
    async fn give_back(&self, entry: &Entry, held: Held, now: Option<Timestamp>) {
        let here = now.unwrap_or_else(|| self.clock.now());
        let elapsed = Duration::from_micros(here.as_micros().saturating_sub(held.called_at.as_micros())) + held.rtt;
        let lapsed = entry
            .policy
            .limits()
            .map(|(_, limit)| limit.lapsed(held.units, elapsed))
            .max()
            .unwrap_or(0);
        let units = held.units - lapsed.min(held.units);
        if units == 0 {
            return;
        }
        let mut refund = Request::new(
            Op::Refund {
                at: held.taken_at,
                lease: None,
            },
            units,
        );
        refund.now = now;
        self.calls.fetch_add(1, Ordering::Relaxed);
        // Boxed: the type of the store's future stays out of `close`'s, which
        // `Drop` spawns (without the box, a crate spawning it for a deep
        // store, `AnyStore` over Redis, overflows the compiler's query depth).
        let refunded: std::pin::Pin<Box<dyn std::future::Future<Output = Result<Outcome>> + Send + '_>> =
            Box::pin(self.inner.decide(&entry.subject, &entry.policy, &refund));
        if let Err(error) = refunded.await {
            tracing::debug!(%error, units, "lease: a refund failed; the units lapse");
        }
    }
}

/// Whether a sweep at `now` keeps `entry` (its map's reference), after
/// taking into `ended` what its ended lease holds.
fn sweep_entry(entry: &Arc<Entry>, now: Timestamp, ended: &mut Vec<(Arc<Entry>, Held)>) -> bool {
    // A check holds it (references are taken under the map's lock, which
    // the sweep holds): it may be calling the store, or about to, and it
    // records its block here. Forgotten, that block would never go back.
    if Arc::strong_count(entry) > 1 {
        return true;
    }
    let mut block = entry.block.lock();
    if block.call().is_some_and(|call| now < call.ends) {
        return true;
    }
    if let Some(held) = block.take_held() {
        ended.push((Arc::clone(entry), held));
    }
    // Idle for a lease: forgotten (its rate with it).
    block.denies(now)
}

/// The key of `subject`'s block under `policy`: the subject and the limits'
/// names, as the store's own keys are made.
fn entry_key(subject: &Subject, policy: &Policy) -> String {
    let mut key = String::with_capacity(subject.as_key().len() + 16 * policy.len());
    key.push_str(subject.as_key());
    for (name, _) in policy.limits() {
        key.push('\0');
        key.push_str(name);
    }
    key
}

/// The sweeper of the blocks leased for `lease`: every half lease, gives
/// back what ended leases hold and forgets idle keys; stops when no key of
/// that lease is left or the last clone of the store is gone.
///
/// One sweeper per lease length, rather than one for all at the shortest
/// lease: each block goes back within half its own lease, as with a single
/// lease, and a key with a long lease does not wake a task every few
/// milliseconds because another has a short one. Policies carry few
/// distinct leases, and a sweeper with no key left stops, so the tasks stay
/// few.
async fn sweep<S: Store>(shared: Weak<Shared<S>>, lease: Duration) {
    let period = (lease / 2).max(Duration::from_millis(1));
    loop {
        tokio::time::sleep(period).await;
        let Some(shared) = shared.upgrade() else { return };
        let now = shared.clock.now();
        if !shared.sweep(lease, now).await {
            return;
        }
    }
}

impl Block {
    /// The block after `call`, holding `units` of it.
    fn after(call: Call, units: u64) -> Self {
        let denied_until = call.denied_until();
        if units > 0 {
            Self::Holding {
                call,
                units,
                spent_until: denied_until,
            }
        } else {
            Self::idle(call, denied_until)
        }
    }

    /// The block after `call` once it holds nothing: denying until
    /// `denied_until`, if any.
    fn idle(call: Call, denied_until: Option<Timestamp>) -> Self {
        match denied_until {
            Some(until) => Self::Denying { call, until },
            None => Self::Drained(call),
        }
    }

    /// The last call to the store, if any.
    fn call(&self) -> Option<&Call> {
        match self {
            Self::New => None,
            Self::Holding { call, .. } | Self::Denying { call, .. } | Self::Drained(call) => Some(call),
        }
    }

    /// True when checks holding nothing are denied here at `now`.
    fn denies(&self, now: Timestamp) -> bool {
        matches!(self, Self::Denying { until, .. } if now < *until)
    }

    /// The answer to a check of `cost` at `now` from what is held: units of
    /// an unended lease, or a remembered denial. `None`: the store decides.
    fn answer(&mut self, cost: u64, now: Timestamp) -> Option<Outcome> {
        if let Self::Holding { call, units, .. } = self {
            if cost > 0 && *units >= cost && now < call.ends {
                *units -= cost;
                call.used += cost;
                let mut answer = call.aged(now);
                answer.granted = cost;
                add_remaining(&mut answer, *units);
                if *units == 0 {
                    // All handed out: nothing is left to give back.
                    self.take_held();
                }
                return Some(answer);
            }
        }
        let (call, until) = match self {
            Self::Holding {
                call,
                spent_until: Some(until),
                ..
            }
            | Self::Denying { call, until } => (call, *until),
            _ => return None,
        };
        (now < until).then(|| call.denial(now, until))
    }

    /// The size of the next block for a request of `cost` at `now`: about
    /// what this process used over one lease, at most twice the last block,
    /// at most a `SHARE`th of the limit's capacity, and at least `cost`.
    fn next_size(&self, cost: u64, now: Timestamp, lease: Duration) -> u64 {
        // No call yet: the request's own cost.
        let Some(call) = self.call() else { return cost };
        let by_rate = if now > call.at {
            let elapsed = u128::from(now.as_micros() - call.at.as_micros());
            u64::try_from(u128::from(call.used) * lease.as_micros() / elapsed).unwrap_or(u64::MAX)
        } else {
            // A burst within one microsecond: grow.
            u64::MAX
        };
        let grown = call.size.saturating_mul(2);
        // A share of the limit's capacity (its burst, its window's count).
        let share = (call.answer.decision.limit / SHARE).max(1);
        by_rate.min(grown).min(share).max(cost)
    }

    /// The units held, taken out to give back (`None`: none, or none the
    /// store granted: those lapse). The block then holds nothing.
    fn take_held(&mut self) -> Option<Held> {
        match std::mem::take(self) {
            Self::Holding {
                call,
                units,
                spent_until,
            } => {
                let held = (units > 0 && call.answer.path == Path::Store).then_some(Held {
                    units,
                    taken_at: call.answer.decided_at,
                    called_at: call.at,
                    rtt: call.rtt,
                });
                *self = Self::idle(call, spent_until);
                held
            }
            other => {
                *self = other;
                None
            }
        }
    }
}

impl Call {
    /// The store's `answer` to a call for `size` units made at `now` that
    /// took `rtt`, for a lease of `lease`; nothing handed out yet.
    fn new(answer: Outcome, size: u64, now: Timestamp, lease: Duration, rtt: Duration) -> Self {
        Self {
            answer,
            at: now,
            rtt,
            ends: now.after(lease),
            size: size.max(1),
            used: 0,
        }
    }

    /// Until when checks are denied here after this call: a denial until
    /// its `retry_after`. A grant of less than asked has found the limit
    /// spent: until what was missing could have come back (a bucket's
    /// refill of it; a window's share of its reset), so that the next block
    /// is worth its call.
    fn denied_until(&self) -> Option<Timestamp> {
        let decision = &self.answer.decision;
        if !decision.allowed {
            return decision.retry_after.map(|retry| self.at.after(retry));
        }
        let granted = self.answer.granted;
        (granted < self.size).then(|| {
            let missing = u128::from(self.size - granted);
            let micros = decision.reset_after.as_micros() * missing / u128::from(decision.limit.max(1));
            self.at
                .after(Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX)))
        })
    }

    /// The store's answer as time has moved on to `now`, answered here.
    fn aged(&self, now: Timestamp) -> Outcome {
        let mut answer = self.answer.clone();
        let elapsed = Duration::from_micros(now.as_micros().saturating_sub(self.answer.decided_at.as_micros()));
        for decision in decisions(&mut answer) {
            decision.reset_after = decision.reset_after.saturating_sub(elapsed);
        }
        answer.path = Path::Leased;
        answer.decided_at = now;
        // The store reported its crossings once, with its own answer.
        answer.crossed.clear();
        answer
    }

    /// A denial at `now`, answered here until `until` (the limit spent, or
    /// the store's denial remembered).
    fn denial(&self, now: Timestamp, until: Timestamp) -> Outcome {
        let left = Duration::from_micros(until.as_micros() - now.as_micros());
        let mut denied = self.aged(now);
        denied.granted = 0;
        for decision in decisions(&mut denied) {
            decision.allowed = false;
            decision.remaining = 0;
            decision.wait = Duration::ZERO;
            decision.retry_after = Some(
                decision
                    .retry_after
                    .filter(|retry| !retry.is_zero())
                    .map_or(left, |retry| retry.min(left)),
            );
        }
        denied
    }
}

/// The policy's decision and each limit's, to adjust alike.
fn decisions(outcome: &mut Outcome) -> impl Iterator<Item = &mut Decision> {
    std::iter::once(&mut outcome.decision).chain(outcome.limits.iter_mut().map(|(_, decision)| decision))
}

/// Adds `held` units (taken, not yet used) to what `outcome` says remains.
fn add_remaining(outcome: &mut Outcome, held: u64) {
    for decision in decisions(outcome) {
        decision.remaining = decision.remaining.saturating_add(held);
    }
}

impl<S: Store> Store for LeasedStore<S> {
    async fn ping(&self) -> Result<()> {
        self.shared.inner.ping().await
    }

    async fn decide(&self, subject: &Subject, policy: &Policy, request: &Request) -> Result<Outcome> {
        match policy.lease() {
            Some(lease)
                if self.leasing && request.op == Op::Check && request.cost.each().is_none() && request.units() > 0 =>
            {
                policy.validate(request)?;
                self.check(subject, policy, request, lease).await
            }
            _ => self.shared.inner.decide(subject, policy, request).await,
        }
    }

    /// One subject and one leased limit (a gateway request of one
    /// descriptor) is a leased check; anything else goes to the store as it
    /// is (a block per descriptor, all or nothing, is not leased).
    async fn decide_spread(&self, spread: &Spread, op: Op) -> Result<Outcome> {
        match spread.subjects() {
            [subject] => self.decide(subject, spread.policy(), &spread.request(op)).await,
            _ => self.shared.inner.decide_spread(spread, op).await,
        }
    }

    async fn reset(&self, subject: &Subject, policy: &Policy) -> Result<()> {
        // What the block holds goes with the state it came from.
        self.shared.entries.lock().by_key.remove(&entry_key(subject, policy));
        self.shared.inner.reset(subject, policy).await
    }

    fn sleep(&self, duration: Duration) -> crate::clock::Sleep {
        self.shared.inner.sleep(duration)
    }

    fn in_process(&self) -> bool {
        self.shared.inner.in_process()
    }
}

impl<S: Store> Drop for LeasedStore<S> {
    fn drop(&mut self) {
        // The last clone (a sweeper's passing reference is none): what the
        // blocks hold goes back from a task of the runtime, if there is one
        // (else it lapses: `close` is the sure way).
        if self.shared.handles.fetch_sub(1, Ordering::AcqRel) > 1 || self.shared.entries.lock().by_key.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = Arc::clone(&self.shared);
        runtime.spawn(async move { shared.close(None).await });
    }
}

#[cfg(test)]
mod tests;
