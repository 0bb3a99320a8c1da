//! A store that survives its backend: a deadline on every call, a circuit
//! breaker, a policy for faults, and a deny cache.
//!
//! [`ResilientStore`] wraps any [`Store`] (in practice a [`RedisStore`]):
//!
//! - every call has a deadline (default 100 ms);
//! - after `failures` consecutive faults (default 5) the breaker opens: the
//!   store is not called for a back-off (100 ms, doubling up to 500 ms), then
//!   one call probes it; a success closes the breaker, a failure opens it
//!   again. A dead store costs microseconds per decision, not the deadline;
//! - a fault (an error, a missed deadline, an open breaker) is answered by
//!   the [`OnStoreError`] policy: the error itself, admit, deny, or decide on
//!   an in-process [`MemoryStore`] that enforces each limit until the store
//!   answers again;
//! - a denial with a finite `retry_after` is remembered (the deny cache, off
//!   unless asked for) and answered again, without calling the store, until
//!   `retry_after` has passed.
//!
//! Every [`Outcome`] says which [`Path`] decided it; [`ResilientStore::stats`]
//! counts them. Invalid arguments are errors whatever the policy.
//!
//! The store may also be built before its backend answers
//! ([`ResilientStore::connecting`]): a task connects in the background,
//! retrying with a back-off, and until it succeeds every call is a fault
//! that the breaker and the policy answer, so a service starts while Redis
//! is down and moves to it as soon as it answers.
//!
//! [`RedisStore`]: crate::RedisStore

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

mod breaker;
mod deny_cache;

use self::breaker::Breaker;
use self::deny_cache::DenyCache;
use super::{MemoryStore, Spread, Store};
use crate::clock::{Clock as _, Sleep, SystemClock};
use crate::decision::{Decision, Outcome, Path};
use crate::error::{Error, ErrorKind, Result};
use crate::policy::Policy;
use crate::request::{Op, Request};
use crate::subject::Subject;

/// What a decision is when the store fails (an error, a missed deadline, an
/// open breaker).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnStoreError {
    /// The caller sees the error (`serve` answers UNAVAILABLE / 503).
    #[default]
    Error,
    /// Admit: availability over enforcement.
    Open,
    /// Deny: enforcement over availability.
    Closed,
    /// Decide on an in-process memory store, which enforces each limit per
    /// process until the store answers again.
    Local,
}

impl OnStoreError {
    /// The policy's name: `error`, `open`, `closed` or `local`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Open => "open",
            Self::Closed => "closed",
            Self::Local => "local",
        }
    }
}

impl fmt::Display for OnStoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OnStoreError {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        match text {
            "error" => Ok(Self::Error),
            "open" => Ok(Self::Open),
            "closed" => Ok(Self::Closed),
            "local" => Ok(Self::Local),
            other => Err(Error::invalid_argument(format!(
                "on_store_error \"{other}\" is not one of error, open, closed, local"
            ))),
        }
    }
}

/// Decisions by path, and faults, since the store was built.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResilienceStats {
    /// Decided by the store.
    pub store: u64,
    /// Decided by the local memory store (policy `local`).
    pub local: u64,
    /// Decided by the policy (`open` admitted, `closed` denied).
    pub policy: u64,
    /// Answered from the deny cache.
    pub deny_cache: u64,
    /// Faults: errors and missed deadlines of the store, and decisions made
    /// while the breaker was open.
    pub faults: u64,
    /// Times the breaker opened.
    pub breaker_opened: u64,
    /// True while the breaker is open (the store is not called).
    pub breaker_open: bool,
}

/// Opens the store behind a [`ResilientStore::connecting`], once per attempt.
pub type StoreConnector<S> = Box<dyn FnMut() -> Pin<Box<dyn Future<Output = Result<S>> + Send>> + Send>;

/// The longest wait between two attempts to connect.
const MAX_CONNECT_BACKOFF: Duration = Duration::from_secs(1);

/// Where the store comes from.
enum Source<S> {
    /// Given, connected.
    Ready(S),
    /// Opened in the background.
    Connect(StoreConnector<S>),
}

impl<S> fmt::Debug for Source<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ready(_) => "Ready",
            Self::Connect(_) => "Connect",
        })
    }
}

/// Options for a [`ResilientStore`].
#[derive(Debug)]
pub struct ResilientStoreBuilder<S> {
    store: Source<S>,
    on_error: OnStoreError,
    timeout: Duration,
    failures: u64,
    backoff: Duration,
    max_backoff: Duration,
    deny_cache: usize,
}

impl<S: Store> ResilientStoreBuilder<S> {
    /// What a decision is when the store fails (default
    /// [`OnStoreError::Error`]).
    #[must_use]
    pub fn on_error(mut self, on_error: OnStoreError) -> Self {
        self.on_error = on_error;
        self
    }

    /// The deadline of every call to the store (default 100 ms).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Consecutive faults that open the breaker (default 5; at least 1).
    #[must_use]
    pub fn failures(mut self, failures: u64) -> Self {
        self.failures = failures.max(1);
        self
    }

    /// How long the breaker stays open before it probes the store, at first
    /// and at most: each failed probe doubles it (default 100 ms and 500 ms).
    #[must_use]
    pub fn backoff(mut self, first: Duration, most: Duration) -> Self {
        self.backoff = first;
        self.max_backoff = most.max(first);
        self
    }

    /// Remember up to `entries` denials (one per subject and policy) and answer them
    /// again until their `retry_after` has passed; 0 (the default) turns the
    /// cache off.
    ///
    /// Denials are remembered for policies without a concurrency limit (a
    /// release frees a lease before its `retry_after`) and for requests at
    /// the store's time. The store would answer the same until then, as long
    /// as nothing gives capacity back early: a reset through this store
    /// forgets the subject's denial, a reset by another process does not.
    #[must_use]
    pub fn deny_cache(mut self, entries: usize) -> Self {
        self.deny_cache = entries;
        self
    }

    /// The store. A store still [`connecting`](ResilientStore::connecting)
    /// starts its connecting task on the current Tokio runtime.
    pub fn build(self) -> ResilientStore<S> {
        let (store, connect) = match self.store {
            Source::Ready(store) => (OnceLock::from(store), None),
            Source::Connect(connect) => (OnceLock::new(), Some(connect)),
        };
        let store = ResilientStore {
            inner: Arc::new(Inner {
                store,
                connect_error: Mutex::new(None),
                on_error: self.on_error,
                timeout: self.timeout,
                breaker: Breaker::new(self.failures, self.backoff, self.max_backoff),
                local: MemoryStore::new(),
                denials: (self.deny_cache > 0).then(|| DenyCache::new(self.deny_cache)),
                counts: Counts::default(),
                log: FaultLog::default(),
            }),
        };
        if let Some(connect) = connect {
            tokio::spawn(connect_in_background(Arc::downgrade(&store.inner), connect));
        }
        store
    }
}

/// Connects `inner`'s store with `connect`, retrying with a back-off until
/// it succeeds or the store is dropped.
async fn connect_in_background<S: Store>(inner: std::sync::Weak<Inner<S>>, mut connect: StoreConnector<S>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let result = connect().await;
        let Some(inner) = inner.upgrade() else { return };
        match result {
            Ok(store) => {
                let _ = inner.store.set(store);
                *inner.connect_error.lock() = None;
                tracing::info!("store connected");
                return;
            }
            Err(error) => {
                let first = inner.connect_error.lock().replace(error.to_string()).is_none();
                if first {
                    tracing::warn!(%error, "cannot connect to the store yet; retrying in the background");
                }
            }
        }
        drop(inner);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_CONNECT_BACKOFF);
    }
}

/// A [`Store`] with a deadline, a circuit breaker, a failure policy and a
/// deny cache in front of another; see the module docs. Cheap to clone.
pub struct ResilientStore<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for ResilientStore<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S> fmt::Debug for ResilientStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResilientStore")
            .field("on_error", &self.inner.on_error)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

struct Inner<S> {
    /// Set once connected (at once, unless built with
    /// [`ResilientStore::connecting`]).
    store: OnceLock<S>,
    /// The last failed attempt to connect, while not connected.
    connect_error: Mutex<Option<String>>,
    on_error: OnStoreError,
    timeout: Duration,
    breaker: Breaker,
    local: MemoryStore,
    denials: Option<DenyCache>,
    counts: Counts,
    log: FaultLog,
}

#[derive(Default)]
struct Counts {
    store: AtomicU64,
    local: AtomicU64,
    policy: AtomicU64,
    deny_cache: AtomicU64,
    faults: AtomicU64,
}

impl<S: Store> ResilientStore<S> {
    /// Options for a resilient store in front of `store`.
    pub fn builder(store: S) -> ResilientStoreBuilder<S> {
        Self::builder_of(Source::Ready(store))
    }

    /// Options for a resilient store in front of the store `connect` opens:
    /// built at once, it connects in the background (retrying with a
    /// back-off of up to a second) and treats every call before then as a
    /// fault, which the breaker and the failure policy answer.
    pub fn connecting(connect: StoreConnector<S>) -> ResilientStoreBuilder<S> {
        Self::builder_of(Source::Connect(connect))
    }

    fn builder_of(store: Source<S>) -> ResilientStoreBuilder<S> {
        ResilientStoreBuilder {
            store,
            on_error: OnStoreError::default(),
            timeout: Duration::from_millis(100),
            failures: 5,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(500),
            deny_cache: 0,
        }
    }

    /// The store behind, once connected.
    pub fn store(&self) -> Option<&S> {
        self.inner.store.get()
    }

    /// `call`'s answer, or a timeout once the deadline has passed.
    async fn within_deadline<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        let deadline = self.inner.timeout;
        tokio::time::timeout(deadline, call).await.unwrap_or_else(|_| {
            Err(Error::new(
                ErrorKind::Timeout,
                format!("store: no answer within the deadline ({deadline:?})"),
            ))
        })
    }

    /// The store behind, or the fault of calling it before it is connected.
    fn connected(&self) -> Result<&S> {
        self.inner.store.get().ok_or_else(|| {
            let cause = self.inner.connect_error.lock().clone();
            Error::new(
                ErrorKind::Store,
                match cause {
                    Some(cause) => format!("store not connected yet: {cause}"),
                    None => "store not connected yet".to_owned(),
                },
            )
        })
    }

    /// The failure policy.
    pub fn on_error(&self) -> OnStoreError {
        self.inner.on_error
    }

    /// Decisions by path and faults so far.
    pub fn stats(&self) -> ResilienceStats {
        let counts = &self.inner.counts;
        ResilienceStats {
            store: counts.store.load(Ordering::Relaxed),
            local: counts.local.load(Ordering::Relaxed),
            policy: counts.policy.load(Ordering::Relaxed),
            deny_cache: counts.deny_cache.load(Ordering::Relaxed),
            faults: counts.faults.load(Ordering::Relaxed),
            breaker_opened: self.inner.breaker.opened.load(Ordering::Relaxed),
            breaker_open: self.inner.breaker.is_open(),
        }
    }

    /// Runs `decision` on the store within the deadline, unless the breaker
    /// is open; a store not yet connected is a fault.
    async fn call<'a, F, Fut>(&'a self, decision: F) -> Result<Outcome>
    where
        F: FnOnce(&'a S) -> Fut,
        Fut: Future<Output = Result<Outcome>>,
    {
        let inner = &self.inner;
        if !inner.breaker.admits() {
            return Err(Error::new(
                ErrorKind::Store,
                "store unavailable: the circuit breaker is open after consecutive faults",
            ));
        }
        let result = match self.connected() {
            Ok(store) => self.within_deadline(decision(store)).await,
            Err(fault) => Err(fault),
        };
        match &result {
            Ok(_) => {
                if inner.breaker.succeeded() {
                    tracing::info!("store answers again: the circuit breaker is closed");
                }
            }
            // A record counted but not made durable: the store answered (its
            // replicas did not), so the breaker, which spares it for every
            // limit, neither opens nor closes; the failure policy answers.
            Err(error) if error.is_invalid() || error.kind() == ErrorKind::NotDurable => {}
            Err(_) => {
                if let Some(backoff) = inner.breaker.failed() {
                    tracing::warn!(
                        ?backoff,
                        "circuit breaker open: the store is skipped until a probe succeeds"
                    );
                }
            }
        }
        result
    }

    /// The failure policy's decision after `fault`; `local` is the
    /// in-process store's.
    async fn fallback(
        &self,
        policy: &Policy,
        request: &Request,
        fault: Error,
        local: impl Future<Output = Result<Outcome>>,
    ) -> Result<Outcome> {
        let inner = &self.inner;
        inner.counts.faults.fetch_add(1, Ordering::Relaxed);
        inner.log.fault(&fault, inner.on_error);
        match inner.on_error {
            OnStoreError::Error => Err(fault),
            OnStoreError::Local => {
                let mut outcome = local.await?;
                outcome.path = Path::Local;
                inner.counts.local.fetch_add(1, Ordering::Relaxed);
                Ok(outcome)
            }
            OnStoreError::Open | OnStoreError::Closed => {
                let allowed = inner.on_error == OnStoreError::Open;
                let retry_after = inner.breaker.until_probe().max(Duration::from_millis(1));
                let decisions = policy.limits().enumerate().map(|(index, (_, limit))| {
                    let capacity = limit.capacity();
                    if allowed {
                        let remaining = capacity.saturating_sub(request.cost_of(index));
                        Decision::allow(capacity, remaining, 0, 0)
                    } else {
                        let mut decision = Decision::deny(capacity, 0, None, 0);
                        decision.retry_after = Some(retry_after);
                        decision
                    }
                });
                let now = request.now.unwrap_or_else(|| SystemClock.now()).as_micros();
                let mut outcome = policy.outcome(&request.op, allowed, request.units(), now, decisions);
                outcome.path = Path::Policy;
                inner.counts.policy.fetch_add(1, Ordering::Relaxed);
                Ok(outcome)
            }
        }
    }
}

impl<S: Store> Store for ResilientStore<S> {
    /// The store's own check, within the deadline (not counted by the
    /// breaker); a store not yet connected fails it.
    async fn ping(&self) -> Result<()> {
        let store = self.connected()?;
        self.within_deadline(store.ping()).await
    }

    async fn decide(&self, subject: &Subject, policy: &Policy, request: &Request) -> Result<Outcome> {
        policy.validate(request)?;
        let inner = &self.inner;
        if let Some(denials) = &inner.denials {
            if let Some(outcome) = denials.answer(subject, policy, request) {
                inner.counts.deny_cache.fetch_add(1, Ordering::Relaxed);
                return Ok(outcome);
            }
        }
        match self.call(|store| store.decide(subject, policy, request)).await {
            Ok(outcome) => {
                inner.counts.store.fetch_add(1, Ordering::Relaxed);
                if let Some(denials) = &inner.denials {
                    denials.remember(subject, policy, request, &outcome);
                }
                Ok(outcome)
            }
            Err(error) if error.is_invalid() => Err(error),
            Err(fault) => {
                let local = inner.local.decide(subject, policy, request);
                self.fallback(policy, request, fault, local).await
            }
        }
    }

    /// The inner store's spread decision, behind the same deadline, breaker
    /// and failure policy. Limits all of one subject (a gateway request of
    /// one descriptor) are that subject's decision, deny cache included.
    async fn decide_spread(&self, spread: &Spread, op: Op) -> Result<Outcome> {
        let (subjects, policy, request) = (spread.subjects(), spread.policy(), &spread.request(op.clone()));
        if let Some(first) = subjects.first() {
            if subjects.iter().all(|subject| subject == first) {
                return self.decide(first, policy, request).await;
            }
        }
        // Refused here, so that no failure policy answers an invalid request.
        policy.validate(request)?;
        let inner = &self.inner;
        match self.call(|store| store.decide_spread(spread, op.clone())).await {
            Ok(outcome) => {
                inner.counts.store.fetch_add(1, Ordering::Relaxed);
                Ok(outcome)
            }
            Err(error) if error.is_invalid() => Err(error),
            Err(fault) => {
                let local = inner.local.decide_spread(spread, op);
                self.fallback(policy, request, fault, local).await
            }
        }
    }

    async fn reset(&self, subject: &Subject, policy: &Policy) -> Result<()> {
        if let Some(denials) = &self.inner.denials {
            denials.forget(subject, policy);
        }
        self.inner.local.reset_now(subject, policy);
        let store = self.connected()?;
        self.within_deadline(store.reset(subject, policy)).await
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        match self.inner.store.get() {
            Some(store) => store.sleep(duration),
            None => Box::pin(tokio::time::sleep(duration)),
        }
    }
}

/// Faults are logged at most once a second, with how many were not.
#[derive(Default)]
struct FaultLog {
    /// When the last line was written, and the faults not logged since.
    state: Mutex<Option<(Instant, u64)>>,
}

impl FaultLog {
    fn fault(&self, fault: &Error, on_error: OnStoreError) {
        let mut state = self.state.lock();
        let now = Instant::now();
        match &mut *state {
            Some((last, unlogged)) if now.duration_since(*last) < Duration::from_secs(1) => *unlogged += 1,
            _ => {
                let unlogged = (*state).map_or(0, |(_, unlogged)| unlogged);
                *state = Some((now, 0));
                drop(state);
                tracing::warn!(error = %fault, on_store_error = %on_error, unlogged, "store fault");
            }
        }
    }
}
