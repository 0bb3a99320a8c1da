//! Leases on hot keys: a process takes blocks of units from a shared limit
//! and hands them out to its own requests (see [`LeasedStore`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::Store;
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::decision::{Decision, Outcome, Path};
use crate::error::Result;
use crate::policy::{Op, Policy, Request};
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
///   ended leases (when the store runs under a Tokio runtime and requests
///   carry no explicit `now`), and for every key at
///   [`LeasedStore::close`] (and, best effort, when the last clone drops).
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
    inner: S,
    shared: Arc<Shared>,
    /// False: every decision goes to the store as it is ([`LeasedStore::leasing`]).
    leasing: bool,
}

impl<S: Store> Clone for LeasedStore<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            leasing: self.leasing,
        }
    }
}

struct Shared {
    /// Blocks by subject and limit names.
    entries: Mutex<HashMap<String, Arc<Entry>>>,
    /// The time of requests without an explicit `now`.
    clock: Arc<dyn Clock>,
    /// Calls made to the store on behalf of leased checks.
    calls: AtomicU64,
    /// Leased checks decided.
    decisions: AtomicU64,
    /// The task giving back ended leases has started.
    sweeper_started: std::sync::atomic::AtomicBool,
}

/// The block of one subject's leased policy.
struct Entry {
    /// The subject and policy the block was taken for (to give it back).
    subject: Subject,
    policy: Policy,
    block: Mutex<Block>,
    /// One task at a time calls the store for this key; the others wait for
    /// the block it brings.
    calling: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct Block {
    /// Units taken from the store and not yet handed out.
    units: u64,
    /// The store's instant the units were taken at, which their refund names.
    taken_at: Timestamp,
    /// The store itself granted them (not a failure policy or the local
    /// fallback, whose units must not be given back to the store).
    refundable: bool,
    /// When the lease ends (this store's time): units still here then go back.
    until: Timestamp,
    /// The store's answer to the last call, from which local answers are made.
    last: Option<Outcome>,
    /// This store's time of the last call, and the units handed out since.
    called_at: Option<Timestamp>,
    used: u64,
    /// How long the last call took (zero for requests with an explicit
    /// `now`): the server may have counted the units that much later.
    rtt: Duration,
    /// The size of the last block asked for.
    size: u64,
    /// A denial answered here until this instant (this store's time).
    denied_until: Option<Timestamp>,
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
            shared: Arc::new(Shared {
                entries: Mutex::new(HashMap::new()),
                clock: Arc::new(clock),
                calls: AtomicU64::new(0),
                decisions: AtomicU64::new(0),
                sweeper_started: std::sync::atomic::AtomicBool::new(false),
            }),
            leasing: !inner.in_process(),
            inner,
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
        &self.inner
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
        let entries: Vec<Arc<Entry>> = self.shared.entries.lock().drain().map(|(_, entry)| entry).collect();
        for entry in entries {
            let _calling = entry.calling.lock().await;
            let held = entry.block.lock().take_held();
            give_back(&self.inner, &self.shared, &entry, held, now).await;
        }
    }

    /// The entry of `subject` under `policy`. A policy redefined under the
    /// same names (a configuration reloaded) starts a new entry: the old
    /// block's units lapse (under-admission only), since they were taken
    /// under other limits.
    fn entry(&self, subject: &Subject, policy: &Policy) -> Arc<Entry> {
        let fresh = || {
            Arc::new(Entry {
                subject: subject.clone(),
                policy: policy.clone(),
                block: Mutex::new(Block::default()),
                calling: tokio::sync::Mutex::new(()),
            })
        };
        let mut entries = self.shared.entries.lock();
        let entry = entries.entry(entry_key(subject, policy)).or_insert_with(fresh);
        if entry.policy != *policy {
            *entry = fresh();
        }
        Arc::clone(entry)
    }

    /// A leased check of `request.cost` units at `now`.
    async fn check(&self, subject: &Subject, policy: &Policy, request: &Request, lease: Duration) -> Result<Outcome> {
        self.shared.decisions.fetch_add(1, Ordering::Relaxed);
        let cost = request.cost;
        let now = request.now.unwrap_or_else(|| self.shared.clock.now());
        let entry = self.entry(subject, policy);
        if let Some(answer) = entry.block.lock().answer(cost, now) {
            return Ok(answer);
        }
        let _calling = entry.calling.lock().await;
        // The time after waiting for another task's call: a block's lease
        // is never stretched by the wait.
        let now = request.now.unwrap_or_else(|| self.shared.clock.now());
        // Another task may have brought a block meanwhile.
        let (size, ended) = {
            let mut block = entry.block.lock();
            if let Some(answer) = block.answer(cost, now) {
                return Ok(answer);
            }
            (block.next_size(cost, now, lease), block.take_held())
        };
        // What is left (an ended lease, or too few units) goes back first.
        give_back(&self.inner, &self.shared, &entry, ended, request.now).await;
        let mut take = Request::new(Op::CheckAtMost, size);
        take.now = request.now;
        self.shared.calls.fetch_add(1, Ordering::Relaxed);
        let taken = self.inner.decide(subject, policy, &take).await?;
        let rtt = match request.now {
            Some(_) => Duration::ZERO,
            None => Duration::from_micros(self.shared.clock.now().as_micros().saturating_sub(now.as_micros())),
        };
        if taken.decision.allowed && taken.granted < cost {
            // Too little left for this request: give it back (if the store
            // granted it) and decide the request exactly, as without a lease.
            let partial = (taken.path == Path::Store).then_some(Held {
                units: taken.granted,
                taken_at: taken.decided_at,
                called_at: now,
                rtt,
            });
            give_back(&self.inner, &self.shared, &entry, partial, request.now).await;
            self.shared.calls.fetch_add(1, Ordering::Relaxed);
            let exact = self.inner.decide(subject, policy, request).await?;
            entry.block.lock().record(&exact, cost, 0, now, lease, rtt);
            return Ok(exact);
        }
        let held = taken.granted.saturating_sub(cost);
        let mut block = entry.block.lock();
        block.record(&taken, size, held, now, lease, rtt);
        if !taken.decision.allowed {
            return Ok(taken);
        }
        block.used = cost;
        drop(block);
        self.sweep_in_background(request.now.is_none(), lease);
        let mut answer = taken;
        answer.granted = cost;
        add_remaining(&mut answer, held);
        Ok(answer)
    }

    /// Starts, once, the task that gives back ended leases (for requests
    /// timed by this store's clock, under a Tokio runtime).
    fn sweep_in_background(&self, timed_here: bool, lease: Duration) {
        if !timed_here || self.shared.sweeper_started.swap(true, Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.shared.sweeper_started.store(false, Ordering::Relaxed);
            return;
        };
        let shared = Arc::downgrade(&self.shared);
        let inner = self.inner.clone();
        runtime.spawn(sweep(shared, inner, lease));
    }
}

/// Gives what `held` holds back to the store, less what may have lapsed
/// since it was taken (a bucket or a TAT refilled meanwhile: giving that
/// back would admit it twice). `now`: the request's explicit instant, if
/// any. A fault drops the units: they lapse.
async fn give_back<S: Store>(inner: &S, shared: &Shared, entry: &Entry, held: Option<Held>, now: Option<Timestamp>) {
    let Some(held) = held else { return };
    let here = now.unwrap_or_else(|| shared.clock.now());
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
    shared.calls.fetch_add(1, Ordering::Relaxed);
    if let Err(error) = inner.decide(&entry.subject, &entry.policy, &refund).await {
        tracing::debug!(%error, units, "lease: a refund failed; the units lapse");
    }
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

/// Every half lease, gives back what ended leases hold and forgets idle
/// keys; stops when the last clone of the store is gone.
async fn sweep<S: Store>(shared: Weak<Shared>, inner: S, lease: Duration) {
    let period = (lease / 2).max(Duration::from_millis(1));
    loop {
        tokio::time::sleep(period).await;
        let Some(shared) = shared.upgrade() else { return };
        let now = shared.clock.now();
        let ended: Vec<(Arc<Entry>, Held)> = {
            let mut entries = shared.entries.lock();
            let mut ended = Vec::new();
            entries.retain(|_, entry| {
                // A task is calling the store for it: its block is coming.
                if entry.calling.try_lock().is_err() {
                    return true;
                }
                let mut block = entry.block.lock();
                if block.until > now {
                    return true;
                }
                if let Some(held) = block.take_held() {
                    ended.push((Arc::clone(entry), held));
                }
                // Idle for a lease: forgotten (its rate with it).
                block.denied_until.is_some_and(|until| until > now)
            });
            ended
        };
        for (entry, held) in ended {
            give_back(&inner, &shared, &entry, Some(held), None).await;
        }
    }
}

impl Block {
    /// The answer to a check of `cost` at `now` from what is held: units of
    /// an unended lease, or a remembered denial. `None`: the store decides.
    fn answer(&mut self, cost: u64, now: Timestamp) -> Option<Outcome> {
        let last = self.last.as_ref()?;
        // The last answer, as time has moved on since.
        let since = |mut answer: Outcome| {
            let elapsed = Duration::from_micros(now.as_micros().saturating_sub(last.decided_at.as_micros()));
            for decision in decisions(&mut answer) {
                decision.reset_after = decision.reset_after.saturating_sub(elapsed);
            }
            answer.path = Path::Leased;
            answer.decided_at = now;
            answer
        };
        if cost > 0 && self.units >= cost && now < self.until {
            self.units -= cost;
            self.used += cost;
            let mut answer = since(last.clone());
            answer.granted = cost;
            set_remaining(&mut answer, last, self.units);
            return Some(answer);
        }
        let until = self.denied_until.filter(|until| now < *until)?;
        // Denied (or the limit spent at the last call) until then.
        let left = Duration::from_micros(until.as_micros() - now.as_micros());
        let mut denied = since(last.clone());
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
        Some(denied)
    }

    /// The size of the next block for a request of `cost` at `now`: about
    /// what this process used over one lease, at most twice the last block,
    /// at most a `SHARE`th of the limit's capacity, and at least `cost`.
    fn next_size(&self, cost: u64, now: Timestamp, lease: Duration) -> u64 {
        let by_rate = match self.called_at {
            Some(called) if now > called => {
                let elapsed = u128::from(now.as_micros() - called.as_micros());
                let lease = lease.as_micros();
                u64::try_from(u128::from(self.used) * lease / elapsed).unwrap_or(u64::MAX)
            }
            // No history, or a burst within one microsecond: grow.
            _ => u64::MAX,
        };
        let grown = self.size.saturating_mul(2).max(1);
        // A share of the limit's capacity (its burst, its window's count).
        let left = self
            .last
            .as_ref()
            .map_or(u64::MAX, |last| (last.decision.limit / SHARE).max(1));
        by_rate.min(grown).min(left).max(cost)
    }

    /// The units held, taken out to give back (`None`: none).
    fn take_held(&mut self) -> Option<Held> {
        let units = std::mem::take(&mut self.units);
        (units > 0 && self.refundable).then(|| Held {
            units,
            taken_at: self.taken_at,
            called_at: self.called_at.unwrap_or(self.taken_at),
            rtt: self.rtt,
        })
    }

    /// Keeps the store's answer `outcome` to a call made at `now` that took
    /// `rtt`, holding `held` units until one lease later; a denial is
    /// remembered until its `retry_after`.
    fn record(&mut self, outcome: &Outcome, asked: u64, held: u64, now: Timestamp, lease: Duration, rtt: Duration) {
        self.units = held;
        self.rtt = rtt;
        self.refundable = outcome.path == Path::Store;
        self.taken_at = outcome.decided_at;
        self.until = now.after(lease);
        self.called_at = Some(now);
        self.used = 0;
        self.size = asked.max(1);
        self.denied_until = if outcome.decision.allowed {
            // Granted less than asked: the limit is spent for now. Further
            // requests are denied here until what was missing could have
            // come back (a bucket's refill of it; a window's share of its
            // reset), so that the next block is worth its call.
            (outcome.granted < asked).then(|| {
                let decision = &outcome.decision;
                let missing = u128::from(asked - outcome.granted);
                let micros = decision.reset_after.as_micros() * missing / u128::from(decision.limit.max(1));
                now.after(Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX)))
            })
        } else {
            outcome.decision.retry_after.map(|retry| now.after(retry))
        };
        self.last = Some(outcome.clone());
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

/// `answer`'s remaining: what the store said after the last call, plus the
/// units still held.
fn set_remaining(answer: &mut Outcome, last: &Outcome, held: u64) {
    answer.decision.remaining = last.decision.remaining.saturating_add(held);
    for ((_, decision), (_, was)) in answer.limits.iter_mut().zip(&last.limits) {
        decision.remaining = was.remaining.saturating_add(held);
    }
}

impl<S: Store> Store for LeasedStore<S> {
    async fn ping(&self) -> Result<()> {
        self.inner.ping().await
    }

    async fn decide(&self, subject: &Subject, policy: &Policy, request: &Request) -> Result<Outcome> {
        match policy.lease() {
            Some(lease) if self.leasing && request.op == Op::Check && request.costs.is_empty() && request.cost > 0 => {
                policy.validate(request)?;
                self.check(subject, policy, request, lease).await
            }
            _ => self.inner.decide(subject, policy, request).await,
        }
    }

    /// One subject and one leased limit (a gateway request of one
    /// descriptor) is a leased check; anything else goes to the store as it
    /// is (a block per descriptor, all or nothing, is not leased).
    async fn decide_spread(&self, subjects: &[Subject], policy: &Policy, request: &Request) -> Result<Outcome> {
        match subjects {
            [subject] if policy.len() == 1 && request.costs.len() <= 1 => {
                let mut single = request.clone();
                single.cost = request.cost_of(0);
                single.costs.clear();
                self.decide(subject, policy, &single).await
            }
            _ => self.inner.decide_spread(subjects, policy, request).await,
        }
    }

    async fn reset(&self, subject: &Subject, policy: &Policy) -> Result<()> {
        // What the block holds goes with the state it came from.
        self.shared.entries.lock().remove(&entry_key(subject, policy));
        self.inner.reset(subject, policy).await
    }

    fn sleep(&self, duration: Duration) -> crate::clock::Sleep {
        self.inner.sleep(duration)
    }

    fn in_process(&self) -> bool {
        self.inner.in_process()
    }
}

impl<S: Store> Drop for LeasedStore<S> {
    fn drop(&mut self) {
        // The last clone: what the blocks hold goes back from a task of the
        // runtime, if there is one (else it lapses: `close` is the sure way).
        if Arc::strong_count(&self.shared) > 1 {
            return;
        }
        let ended: Vec<(Arc<Entry>, Held)> = self
            .shared
            .entries
            .lock()
            .drain()
            .filter_map(|(_, entry)| {
                let held = entry.block.lock().take_held();
                held.map(|held| (entry, held))
            })
            .collect();
        if ended.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (inner, shared) = (self.inner.clone(), Arc::clone(&self.shared));
        runtime.spawn(async move {
            for (entry, held) in ended {
                give_back(&inner, &shared, &entry, Some(held), None).await;
            }
        });
    }
}

#[cfg(test)]
mod tests;
