//! The API a service calls: a [`Limiter`] is one policy over one store.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::decision::{Decision, Outcome};
use crate::error::Result;
use crate::overrides::PolicyOverrides;
use crate::policy::Policy;
use crate::request::{Op, Request};
use crate::settling::Settling;
use crate::store::{MemoryStore, Store};
use crate::subject::Subject;

/// A policy over a store: `check`, `reserve`, `acquire`, `reset` for any subject.
///
/// Cheap to clone (the policy is shared); generic over the store so that a
/// `RedisStore` plugs in unchanged.
#[derive(Debug, Clone)]
pub struct Limiter<S = MemoryStore> {
    store: S,
    policy: Arc<Policy>,
    /// Policies in place of `policy` for some subjects.
    overrides: Option<Arc<PolicyOverrides>>,
    /// Settlements' refunds under way, shared by the clones.
    settling: Arc<Settling>,
}

/// What [`Limiter::acquire`] got.
#[derive(Debug)]
#[must_use = "dropping a granted permit releases its lease at once"]
pub enum Acquired<S: Store = MemoryStore> {
    /// Admitted (after waiting out `decision.wait`, already done).
    Granted(Permit<S>),
    /// Not admitted within the timeout.
    Denied(Decision),
}

impl<S: Store> Acquired<S> {
    /// True when the request was admitted.
    pub fn is_granted(&self) -> bool {
        matches!(self, Self::Granted(_))
    }

    /// The decision that settled it.
    pub fn decision(&self) -> &Decision {
        match self {
            Self::Granted(permit) => &permit.decision,
            Self::Denied(decision) => decision,
        }
    }
}

/// An admitted `acquire`: for concurrency limits it holds a lease, released
/// by [`Permit::release`] or on drop.
#[derive(Debug)]
pub struct Permit<S: Store = MemoryStore> {
    decision: Decision,
    lease: Option<Lease<S>>,
}

impl<S: Store> Permit<S> {
    /// The decision that admitted the request.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The lease's name, when the policy holds a concurrency limit.
    pub fn lease(&self) -> Option<&str> {
        self.lease.as_ref().map(|lease| lease.id.as_str())
    }

    /// Gives the lease back now and returns the limit's state after it.
    ///
    /// # Errors
    ///
    /// A store fault (the lease then ends at its ttl).
    pub async fn release(mut self) -> Result<Option<Decision>> {
        match self.lease.take() {
            Some(mut lease) => {
                lease.released = true;
                lease.limiter.release(&lease.subject, &lease.id).await.map(Some)
            }
            None => Ok(None),
        }
    }
}

/// What [`Limiter::estimate`] got.
#[derive(Debug)]
#[must_use = "an admitted estimate is settled with the actual cost (dropped, it stays at the estimate)"]
pub enum Estimated<S: Store = MemoryStore> {
    /// Admitted: the estimate is taken; settle it with the actual cost.
    Admitted(Settlement<S>),
    /// Refused: nothing is taken.
    Denied(Decision),
}

impl<S: Store> Estimated<S> {
    /// True when the request was admitted.
    pub fn is_admitted(&self) -> bool {
        matches!(self, Self::Admitted(_))
    }

    /// The decision on the estimate.
    pub fn decision(&self) -> &Decision {
        match self {
            Self::Admitted(settlement) => &settlement.decision,
            Self::Denied(decision) => decision,
        }
    }
}

/// An admitted request whose cost is known only later (an LLM completion's
/// tokens): its estimate is taken; [`Settlement::settle`] gives back the
/// unused part or records the excess, in one store call. Dropped unsettled,
/// it stays at the estimate (nothing to do).
#[derive(Debug)]
pub struct Settlement<S: Store = MemoryStore> {
    limiter: Limiter<S>,
    subject: Subject,
    estimate: u64,
    /// When the estimate was taken (the store's instant): a refund gives
    /// back units taken then.
    taken_at: Timestamp,
    decision: Decision,
}

impl<S: Store> Settlement<S> {
    /// The decision that admitted the estimate.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The units taken up front.
    pub fn estimate(&self) -> u64 {
        self.estimate
    }

    /// Settles with `actual` units: below the estimate the rest is given
    /// back ([`Op::Refund`] of the units taken at the estimate's instant:
    /// windows give back while they still count them, buckets and TATs up
    /// to full); above it the excess is recorded ([`Op::Record`]: counted
    /// whether or not it fits). Returns the limits as they stand after; at
    /// exactly the estimate nothing is asked of the store, and the answer
    /// is the admitting decision.
    ///
    /// # Errors
    ///
    /// A store fault (the estimate then stays taken).
    pub async fn settle(self, actual: u64) -> Result<Decision> {
        if actual == self.estimate {
            return Ok(self.decision);
        }
        self.limiter
            .settle(&self.subject, self.taken_at, self.estimate, actual)
            .await
    }
}

#[derive(Debug)]
struct Lease<S: Store> {
    limiter: Limiter<S>,
    subject: Subject,
    id: String,
    released: bool,
}

impl<S: Store> Drop for Lease<S> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Release in the background; without a runtime the ttl ends the lease.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let limiter = self.limiter.clone();
            let subject = self.subject.clone();
            let id = std::mem::take(&mut self.id);
            runtime.spawn(async move {
                let _ = limiter.release(&subject, &id).await;
            });
        }
    }
}

impl Limiter<MemoryStore> {
    /// A limiter on a fresh in-process store.
    pub fn in_memory(policy: impl Into<Policy>) -> Self {
        Self::new(MemoryStore::new(), policy)
    }

    /// [`Limiter::decide`] without a future: the memory store never waits,
    /// and a future's answer is moved through each layer that awaits it
    /// (about 15 ns a check, BENCHMARKS.md).
    ///
    /// # Errors
    ///
    /// An operation the policy's limits do not support.
    pub fn decide_now(&self, subject: &Subject, request: &Request) -> Result<Outcome> {
        match self.overridden(subject) {
            Some(policy) => self.store.decide_now(subject, &policy, request),
            None => self.store.decide_now(subject, &self.policy, request),
        }
    }

    /// [`Limiter::check`] without a future.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Limit, Limiter, Subject};
    ///
    /// let limiter = Limiter::in_memory(Limit::gcra(10, Duration::from_secs(1), 2)?);
    /// let client = Subject::new("203.0.113.7");
    /// assert_eq!(limiter.check_now(&client)?.remaining, 1);
    /// assert_eq!(limiter.check_now(&client)?.remaining, 0);
    /// assert!(!limiter.check_now(&client)?.allowed);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Limiter::decide_now`].
    pub fn check_now(&self, subject: &Subject) -> Result<Decision> {
        match self.overridden(subject) {
            Some(policy) => self.store.check(subject, &policy, 1),
            None => self.store.check(subject, &self.policy, 1),
        }
    }
}

impl<S: Store> Limiter<S> {
    /// `policy` (or a single [`Limit`](crate::Limit)) over `store`.
    pub fn new(store: S, policy: impl Into<Policy>) -> Self {
        Self {
            store,
            policy: Arc::new(policy.into()),
            overrides: None,
            settling: Arc::default(),
        }
    }

    /// Decides a subject that has an override in `overrides` by the
    /// override's policy instead of this limiter's, in the same keys (see
    /// [`PolicyOverrides`]).
    #[must_use]
    pub fn with_overrides(mut self, overrides: Arc<PolicyOverrides>) -> Self {
        self.overrides = Some(overrides);
        self
    }

    /// The override for `subject`, if any.
    #[inline]
    fn overridden(&self, subject: &Subject) -> Option<Arc<Policy>> {
        self.overrides.as_ref().and_then(|overrides| overrides.get(subject))
    }

    /// The policy this limiter applies.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The store this limiter decides in.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Runs any request, with every detail of the outcome.
    ///
    /// # Errors
    ///
    /// An operation the policy's limits do not support, or a store fault.
    pub async fn decide(&self, subject: &Subject, request: &Request) -> Result<Outcome> {
        match self.overridden(subject) {
            Some(policy) => self.store.decide(subject, &policy, request).await,
            None => self.store.decide(subject, &self.policy, request).await,
        }
    }

    async fn decision(&self, subject: &Subject, op: Op, cost: u64) -> Result<Decision> {
        Ok(self.decide(subject, &Request::new(op, cost)).await?.decision)
    }

    /// Settles an estimate of `estimate` units that `subject` took at
    /// `taken_at` (the store's instant, [`Outcome::decided_at`] of its
    /// check) with the `actual` cost, as [`Settlement::settle`] does: for a
    /// caller that keeps the estimate's instant rather than the settlement
    /// (a settlement made by another task, or another request).
    ///
    /// On a shared store, the refunds of one subject that arrive while one
    /// of its refunds is under way wait for it, then go to the store as one
    /// refund of their summed cost (when every limit says such refunds add
    /// up, [`Policy::refund_keys`]): a busy budget costs one store call per
    /// round trip, not one per settlement. Each is answered with the limits
    /// as they stand after the refund it went in.
    ///
    /// # Errors
    ///
    /// A store fault (the estimate then stays taken, or part of it: whether
    /// a refund under way when its connection failed was made is unknown).
    pub async fn settle(&self, subject: &Subject, taken_at: Timestamp, estimate: u64, actual: u64) -> Result<Decision> {
        let settlement = Request::settlement(taken_at, estimate, actual);
        let refund_keys = match self.overridden(subject) {
            Some(policy) => policy.refund_keys(taken_at),
            None => self.policy.refund_keys(taken_at),
        };
        match (refund_keys, &settlement.op) {
            (Some(keys), Op::Refund { .. }) if !self.store.in_process() => {
                let refund =
                    |at, cost| async move { self.decision(subject, Op::Refund { at, lease: None }, cost).await };
                let key = (subject.clone(), keys);
                self.settling.refund(key, taken_at, settlement.units(), refund).await
            }
            _ => {
                let units = settlement.units();
                self.decision(subject, settlement.op, units).await
            }
        }
    }

    /// Checks one unit, consuming it when allowed.
    ///
    /// # Errors
    ///
    /// A store fault, or a policy of concurrency limits (use [`Limiter::acquire`]).
    pub async fn check(&self, subject: &Subject) -> Result<Decision> {
        self.decision(subject, Op::Check, 1).await
    }

    /// Checks `cost` units at once, consuming them all when allowed.
    ///
    /// # Errors
    ///
    /// As [`Limiter::check`].
    pub async fn check_n(&self, subject: &Subject, cost: u64) -> Result<Decision> {
        self.decision(subject, Op::Check, cost).await
    }

    /// Reports the state without consuming anything.
    ///
    /// # Errors
    ///
    /// A store fault.
    pub async fn peek(&self, subject: &Subject) -> Result<Decision> {
        self.decision(subject, Op::Check, 0).await
    }

    /// Counts `cost` units that were already spent (an LLM's tokens, reported
    /// once the response is done), whether or not they fit: windows go above
    /// their limit until the usage leaves them, buckets and GCRA into debt
    /// that the refill pays back, so an overspend delays the next admission
    /// in proportion. The decision is the limit as it stands after them
    /// (`allowed`: they fit). See [`Op::Record`].
    ///
    /// # Errors
    ///
    /// A store fault, or a policy with a concurrency limit (it counts
    /// requests in flight, not usage).
    pub async fn record(&self, subject: &Subject, cost: u64) -> Result<Decision> {
        self.decision(subject, Op::Record, cost).await
    }

    /// Takes `estimate` units for a request whose cost is known only later,
    /// as a check of `estimate` does (so that concurrent requests cannot all
    /// pass while the budget has room for one); settle the admitted
    /// [`Settlement`] with the actual cost once it is known. Overspend is
    /// then at most the excess of the actual costs over their estimates.
    ///
    /// # Errors
    ///
    /// As [`Limiter::check`].
    pub async fn estimate(&self, subject: &Subject, estimate: u64) -> Result<Estimated<S>> {
        let outcome = self.decide(subject, &Request::new(Op::Check, estimate)).await?;
        if !outcome.decision.allowed {
            return Ok(Estimated::Denied(outcome.decision));
        }
        Ok(Estimated::Admitted(Settlement {
            limiter: self.clone(),
            subject: subject.clone(),
            estimate,
            taken_at: outcome.decided_at,
            decision: outcome.decision,
        }))
    }

    /// Admits as many units as are available, up to `cost`
    /// (`Outcome::granted` says how many).
    ///
    /// # Errors
    ///
    /// As [`Limiter::check`].
    pub async fn check_at_most(&self, subject: &Subject, cost: u64) -> Result<Outcome> {
        self.decide(subject, &Request::new(Op::CheckAtMost, cost)).await
    }

    /// Borrowing and shaping limits: books `cost` units at the next free
    /// moment, `Decision::wait` away; denied (nothing booked) when that is
    /// more than `max_wait` (`None`: any wait). Does not wait itself.
    ///
    /// # Errors
    ///
    /// A store fault, or a policy whose limits cannot reserve.
    pub async fn reserve(&self, subject: &Subject, cost: u64, max_wait: Option<Duration>) -> Result<Decision> {
        self.decision(subject, Op::Reserve { max_wait }, cost).await
    }

    /// Waits until `cost` units are admitted, for at most `timeout`.
    ///
    /// On borrowing and shaping limits this books a slot and waits it out; on
    /// concurrency limits it returns a lease that is released when the
    /// [`Permit`] drops; other limits are retried after their `retry_after`
    /// while that stays within the timeout. Waiting uses the store's clock
    /// (a manual clock advances instead of sleeping).
    ///
    /// # Errors
    ///
    /// A store fault.
    pub async fn acquire(&self, subject: &Subject, cost: u64, timeout: Duration) -> Result<Acquired<S>> {
        let lease = format!("{:016x}", fastrand::u64(..));
        let mut left = timeout;
        loop {
            let op = Op::Acquire {
                lease: lease.clone(),
                max_wait: Some(left),
            };
            let outcome = self.decide(subject, &Request::new(op, cost)).await?;
            let decision = outcome.decision;
            if decision.allowed {
                if !decision.wait.is_zero() {
                    self.store.sleep(decision.wait).await;
                }
                let lease = outcome.lease.map(|id| Lease {
                    limiter: self.clone(),
                    subject: subject.clone(),
                    id,
                    released: false,
                });
                return Ok(Acquired::Granted(Permit { decision, lease }));
            }
            match decision.retry_after {
                Some(retry_after) if retry_after <= left => {
                    self.store.sleep(retry_after).await;
                    left -= retry_after;
                }
                _ => return Ok(Acquired::Denied(decision)),
            }
        }
    }

    async fn release(&self, subject: &Subject, lease: &str) -> Result<Decision> {
        let op = Op::Release {
            lease: lease.to_owned(),
        };
        self.decision(subject, op, 0).await
    }

    /// Forgets `subject`'s state: its limits are full again.
    ///
    /// # Errors
    ///
    /// A store fault.
    pub async fn reset(&self, subject: &Subject) -> Result<()> {
        match self.overridden(subject) {
            Some(policy) => self.store.reset(subject, &policy).await,
            None => self.store.reset(subject, &self.policy).await,
        }
    }
}
