//! Global limits across regions ([`RegionalStore`]): every decision in the
//! region, the regions together never over the limit.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{store_error, RedisStore};
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::decision::{Decision, Outcome, Path};
use crate::error::{Error, ErrorKind, Result};
use crate::policy::Policy;
use crate::request::{Op, Request};
use crate::store::{MemoryStore, OnStoreError, Spread, Store};
use crate::subject::Subject;
use crate::Limit;

mod fill;
mod reports;
mod share;

/// A block is at most this fraction (1 / `REGION_SHARE`) of the limit's
/// capacity: a region far from home fills its share one block a round
/// trip, so at 80 ms and 200 a second it needs a block of 16.
const REGION_SHARE: u64 = 2;

/// A [`Store`] for a service that runs in several regions and wants some
/// limits to hold across all of them ([`Limit::with_scope`]), while every
/// decision stays in its region.
///
/// Each region runs its own Redis (`regional`); one Redis is home to the
/// global limits (`home`). For a global limit:
///
/// - **Units are created only at home**, by its atomic call: a region takes
///   a block of them ([`Op::CheckAtMost`] at home, as a lease does) into
///   its **share**, a hash in the regional Redis. Every replica of the
///   region decides against that share, in one call to the regional Redis:
///   the replicas of a region share one share, and a decision costs a
///   regional round trip, never one to home. The regions together never
///   admit more than home grants, and home never grants more than the
///   limit: **never over the limit**, for every algorithm that leases.
/// - **Refilled ahead of need.** A decision that leaves the share under its
///   low-water mark (the region's recent rate over twice the round trip to
///   home, and a margin) asks for a fill; one replica at a time fills it (a
///   fenced lock in the share: a replica whose lock lapsed adds nothing,
///   and gives its block back home). A block is the region's recent rate
///   over `block` (at most half the limit): capacity follows demand.
/// - **The time shift.** A block lapses `block` after home counted it
///   (within a window's end, for a window): what it holds then is not
///   admitted; what a region holds when a newer block replaces it goes back
///   home ([`Op::Refund`]). So the algorithm's bound holds over any interval
///   stretched by `block`, and exactly per window for a fixed window.
/// - **Usage after the fact** ([`Op::Record`]: tokens counted once a
///   response is done) is never refused: it goes at once into the region's
///   outbox (a Redis stream in the regional Redis) and from there to home,
///   at least once, each entry counted once (a marker at home, in the same
///   transaction as the record), so the home counter converges to the exact
///   total. While home cannot be reached a region overspends at most what
///   it records meanwhile.
/// - **Regional Redis unreachable.** A global decision follows the same
///   failure policy as the region's own limits: `error`, `open`,
///   `closed`, or `local` (this process's memory store, the whole limit per
///   process); a report goes to home directly.
/// - **Home unreachable.** The region spends its share until it is gone or
///   lapses, then follows [`RegionalStoreBuilder::on_home_error`]:
///   `error`, `open`, `closed`, or `local`, which fills the share without
///   home with `fraction` of the limit once per window (or block): at most
///   `regions × fraction × limit` over the limit per window while cut off.
///
/// A policy without a global limit goes to `local` (the region's store) as
/// it is. A global limit is decided alone (one limit in its policy) and
/// takes check, check-at-most, record and refund.
pub struct RegionalStore<S: Store = RedisStore> {
    inner: Arc<Region<S>>,
}

impl<S: Store> std::fmt::Debug for RegionalStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionalStore")
            .field("region", &self.inner.name)
            .field("replica", &self.inner.replica)
            .finish_non_exhaustive()
    }
}

impl<S: Store> Clone for RegionalStore<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Region<S> {
    local: S,
    regional: RedisStore,
    home: RedisStore,
    name: String,
    /// This replica, as the shares' locks and the outbox's group know it.
    replica: String,
    block: Duration,
    on_home_error: OnStoreError,
    fraction: f64,
    stats: Stats,
    /// Decides while the regional Redis fails, with `local`.
    memory: MemoryStore,
    /// Per global limit (by name): its fills and what its shares hold.
    rules: parking_lot::Mutex<HashMap<String, RuleStats>>,
    /// The outbox's forwarder runs.
    forwarding: AtomicBool,
}

#[derive(Default)]
struct Stats {
    fills: AtomicU64,
    fill_failures: AtomicU64,
    /// The last fill's latency (µs).
    last_fill: AtomicU64,
    /// The round trip to home (µs, smoothed).
    round_trip: AtomicU64,
    home_unreachable: AtomicBool,
    /// A probe of home is under way.
    probing: AtomicBool,
    forwarded: AtomicU64,
    given_back: AtomicU64,
}

/// What a region does and sees ([`RegionalStore::stats`]).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionStats {
    /// The region's name.
    pub region: String,
    /// False once a call to home failed, until one succeeds.
    pub home_reachable: bool,
    /// Fills of a share from home (blocks taken), and those that failed.
    pub fills: u64,
    /// Fills that failed (home unreachable).
    pub fill_failures: u64,
    /// The last fill's latency.
    pub last_fill: Duration,
    /// The round trip to home, smoothed.
    pub round_trip: Duration,
    /// Reports forwarded home (each counted once).
    pub forwarded: u64,
    /// Units given back home.
    pub given_back: u64,
    /// Reports in the outbox, not yet counted at home.
    pub outbox: u64,
}

/// What a region did for one global limit, over all its subjects
/// ([`RegionalStore::rule_stats`]).
#[non_exhaustive]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleStats {
    /// The limit's name.
    pub rule: String,
    /// Blocks taken from home into its shares.
    pub fills: u64,
    /// Units home granted into them.
    pub units_taken: u64,
    /// What the share held after the last decision on it.
    pub share_left: u64,
    /// The last fill's latency.
    pub last_fill: Duration,
}

/// What a share holds ([`RegionalStore::share`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// Units the region may still admit.
    pub units: u64,
    /// Until they lapse.
    pub lapses_in: Duration,
}

/// Options for a [`RegionalStore`].
pub struct RegionalStoreBuilder<S: Store> {
    local: S,
    regional: RedisStore,
    home: RedisStore,
    name: String,
    block: Duration,
    on_home_error: OnStoreError,
    fraction: f64,
}

impl<S: Store> RegionalStoreBuilder<S> {
    /// How long a block lives, and the horizon a block is sized over (the
    /// region's recent rate times this): 1 s unless set.
    #[must_use]
    pub fn block(mut self, block: Duration) -> Self {
        self.block = block.max(Duration::from_millis(1));
        self
    }

    /// What a global decision is when the share is spent and home cannot
    /// be reached: `error` (the default), `open`, `closed`, or `local`
    /// with `fraction` (0 to 1) of the limit per window taken without home.
    #[must_use]
    pub fn on_home_error(mut self, policy: OnStoreError, fraction: f64) -> Self {
        self.on_home_error = policy;
        self.fraction = fraction.clamp(0.0, 1.0);
        self
    }

    /// The store.
    pub fn build(self) -> RegionalStore<S> {
        let replica = format!("{}:{:016x}", self.name, fastrand::u64(..));
        RegionalStore {
            inner: Arc::new(Region {
                local: self.local,
                regional: self.regional,
                home: self.home,
                name: self.name,
                replica,
                block: self.block,
                on_home_error: self.on_home_error,
                fraction: self.fraction,
                stats: Stats::default(),
                memory: MemoryStore::new(),
                rules: parking_lot::Mutex::new(HashMap::new()),
                forwarding: AtomicBool::new(false),
            }),
        }
    }
}

impl RegionalStore<RedisStore> {
    /// A region `name` deciding on `regional` (its Redis, which also decides
    /// its regional limits), whose global limits are created at `home`.
    pub fn builder(
        regional: RedisStore,
        home: RedisStore,
        name: impl Into<String>,
    ) -> RegionalStoreBuilder<RedisStore> {
        RegionalStore::with_local(regional.clone(), regional, home, name)
    }
}

impl<S: Store> RegionalStore<S> {
    /// As [`RegionalStore::builder`], with the region's own limits decided
    /// on `local` (say a [`ResilientStore`](crate::ResilientStore) over the
    /// regional Redis), the shares and outbox kept in `regional`.
    pub fn with_local(
        local: S,
        regional: RedisStore,
        home: RedisStore,
        name: impl Into<String>,
    ) -> RegionalStoreBuilder<S> {
        RegionalStoreBuilder {
            local,
            regional,
            home,
            name: name.into(),
            block: Duration::from_secs(1),
            on_home_error: OnStoreError::Error,
            fraction: 0.0,
        }
    }

    /// The region's name.
    pub fn region(&self) -> &str {
        &self.inner.name
    }

    /// The home store.
    pub fn home(&self) -> &RedisStore {
        &self.inner.home
    }

    /// The regional Redis (shares and outbox).
    pub fn regional(&self) -> &RedisStore {
        &self.inner.regional
    }

    /// The store of the region's own limits.
    pub fn local(&self) -> &S {
        &self.inner.local
    }

    /// What the region does and sees, with its outbox's length.
    ///
    /// # Errors
    ///
    /// The regional Redis does not answer (for the outbox's length).
    pub async fn stats(&self) -> Result<RegionStats> {
        let stats = &self.inner.stats;
        Ok(RegionStats {
            region: self.inner.name.clone(),
            home_reachable: !stats.home_unreachable.load(Ordering::Relaxed),
            fills: stats.fills.load(Ordering::Relaxed),
            fill_failures: stats.fill_failures.load(Ordering::Relaxed),
            last_fill: Duration::from_micros(stats.last_fill.load(Ordering::Relaxed)),
            round_trip: Duration::from_micros(stats.round_trip.load(Ordering::Relaxed)),
            forwarded: stats.forwarded.load(Ordering::Relaxed),
            given_back: stats.given_back.load(Ordering::Relaxed),
            outbox: self.inner.outbox_len().await?,
        })
    }

    /// What the region did per global limit, by name.
    pub fn rule_stats(&self) -> Vec<RuleStats> {
        let mut rules: Vec<RuleStats> = self.inner.rules.lock().values().cloned().collect();
        rules.sort_by(|a, b| a.rule.cmp(&b.rule));
        rules
    }

    /// What the region's share of `policy`'s global limit holds for
    /// `subject` now.
    ///
    /// # Errors
    ///
    /// A policy without a global limit, or the regional Redis does not answer.
    pub async fn share(&self, subject: &Subject, policy: &Policy) -> Result<Share> {
        let (name, _) = global_limit(policy)?;
        let key = self.inner.share_key(subject, name);
        let mut invocation = share::peek().key(&key);
        invocation.arg("");
        let (units, lapses_in): (u64, u64) = self
            .inner
            .regional
            .bounded(self.inner.regional.inner.client.connection.invoke(&invocation))
            .await?;
        Ok(Share {
            units,
            lapses_in: Duration::from_micros(lapses_in),
        })
    }

    /// Forwards what the outbox holds to home now, as the forwarder does
    /// in the background: how many reports were counted.
    ///
    /// # Errors
    ///
    /// Either Redis fails; what is left stays for the next round.
    pub async fn forward(&self) -> Result<usize> {
        reports::forward_once(&self.inner).await
    }
}

/// The one global limit of `policy`, with its name.
fn global_limit(policy: &Policy) -> Result<(&str, &Limit)> {
    let mut limits = policy.limits();
    match (limits.next(), limits.next()) {
        (Some((name, limit)), None) if limit.is_global() => Ok((name, limit)),
        _ => Err(Error::invalid_argument(
            "scope: a global limit is decided alone, as the only limit of its policy",
        )),
    }
}

impl<S: Store> Store for RegionalStore<S> {
    async fn decide(&self, subject: &Subject, policy: &Policy, request: &Request) -> Result<Outcome> {
        if !policy.limits().any(|(_, limit)| limit.is_global()) {
            return self.inner.local.decide(subject, policy, request).await;
        }
        let (name, limit) = global_limit(policy)?;
        policy.validate(request)?;
        match &request.op {
            Op::Check | Op::CheckAtMost => Region::take(&self.inner, subject, policy, name, limit, request).await,
            Op::Record => self.inner.report(subject, name, limit, request).await,
            Op::Refund { .. } => self.inner.give(subject, policy, name, request).await,
            _ => Err(Error::invalid_argument(
                "scope: a global limit takes check, check_at_most, record and refund",
            )),
        }
    }

    async fn decide_spread(&self, spread: &Spread, op: Op) -> Result<Outcome> {
        // Regional rows alone go to the region's store as one spread (one
        // call where it can); a global row is decided on its share.
        if spread.policy().limits().any(|(_, limit)| limit.is_global()) {
            crate::store::spread::by_subject(self, spread, op).await
        } else {
            self.inner.local.decide_spread(spread, op).await
        }
    }

    async fn reset(&self, subject: &Subject, policy: &Policy) -> Result<()> {
        if !policy.limits().any(|(_, limit)| limit.is_global()) {
            return self.inner.local.reset(subject, policy).await;
        }
        let (name, _) = global_limit(policy)?;
        self.inner.home.reset(subject, policy).await?;
        let key = self.inner.share_key(subject, name);
        self.inner
            .regional
            .bounded(
                self.inner
                    .regional
                    .inner
                    .client
                    .connection
                    .query::<()>(redis::cmd("DEL").arg(&key)),
            )
            .await
    }

    async fn ping(&self) -> Result<()> {
        self.inner.local.ping().await
    }
}

impl RedisStore {
    /// `call`, bounded by the store's timeout.
    async fn bounded<T>(&self, call: impl std::future::Future<Output = redis::RedisResult<T>>) -> Result<T> {
        let timeout = self.inner.timeout;
        tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| Error::new(ErrorKind::Timeout, format!("redis: no answer within {timeout:?}")))?
            .map_err(store_error)
    }
}

/// A `TAKE`'s reply.
struct Taken {
    granted: u64,
    left: u64,
    until: u64,
    retry: u64,
    fill: u64,
    /// The instant it was decided at (µs).
    now: u64,
}

impl<S: Store> Region<S> {
    /// The key of `subject`'s share of the global limit `name`.
    fn share_key(&self, subject: &Subject, name: &str) -> String {
        self.regional.key(subject, &format!("{name}:share"))
    }

    fn now_arg(request: &Request) -> String {
        request.now.map(|now| now.as_micros().to_string()).unwrap_or_default()
    }

    /// Updates what is known of the global limit `name`.
    fn note(&self, name: &str, change: impl FnOnce(&mut RuleStats)) {
        let mut rules = self.rules.lock();
        if let Some(rule) = rules.get_mut(name) {
            change(rule);
            return;
        }
        let mut rule = RuleStats {
            rule: name.to_owned(),
            ..RuleStats::default()
        };
        change(&mut rule);
        rules.insert(name.to_owned(), rule);
    }

    /// The lock a fill holds at most: the home store's timeout, twice.
    fn lock_micros(&self) -> u64 {
        micros(self.home.inner.timeout * 2)
    }

    async fn run_take(&self, key: &str, request: &Request, limit: &Limit) -> Result<Taken> {
        let round_trip = self.stats.round_trip.load(Ordering::Relaxed).max(1_000);
        let low = 2 * round_trip + micros(self.block) / 10;
        let most = (limit.capacity() / REGION_SHARE).max(1);
        let mut invocation = share::take().key(key);
        invocation
            .arg(request.units())
            .arg(u8::from(matches!(request.op, Op::CheckAtMost)))
            .arg(Self::now_arg(request))
            .arg(&self.replica)
            .arg(self.lock_micros())
            .arg(low)
            .arg(micros(self.block))
            .arg(most);
        let (granted, left, until, retry, fill, _holder, now): (u64, u64, u64, u64, u64, u8, u64) = self
            .regional
            .bounded(self.regional.inner.client.connection.invoke(&invocation))
            .await?;
        Ok(Taken {
            granted,
            left,
            until,
            retry,
            fill,
            now,
        })
    }

    async fn take(
        this: &Arc<Self>,
        subject: &Subject,
        policy: &Policy,
        name: &str,
        limit: &Limit,
        request: &Request,
    ) -> Result<Outcome> {
        let cost = request.units();
        let at_most = matches!(request.op, Op::CheckAtMost);
        let key = this.share_key(subject, name);
        let mut taken = match this.run_take(&key, request, limit).await {
            Ok(taken) => taken,
            Err(error) => return this.fallback(subject, policy, request, error),
        };
        this.note(name, |rule| rule.share_left = taken.left);
        let served = |taken: &Taken| {
            if at_most {
                taken.granted > 0 || cost == 0
            } else {
                taken.granted >= cost
            }
        };
        let fill = |block| {
            Self::fill(
                Arc::clone(this),
                subject.clone(),
                policy.clone(),
                key.clone(),
                block,
                request.now,
            )
        };
        if taken.fill > 0 {
            if served(&taken) {
                tokio::spawn(fill(taken.fill));
            } else {
                // The share could not serve this request: it waits for the
                // fill it asked for (a cold share, or one spent early).
                Box::pin(fill(taken.fill)).await;
                let mut again = request.clone();
                if at_most {
                    again.cost = crate::request::Cost::same(cost);
                }
                taken = match this.run_take(&key, &again, limit).await {
                    Ok(taken) => taken,
                    Err(error) => return this.fallback(subject, policy, request, error),
                };
                if taken.fill > 0 {
                    tokio::spawn(fill(taken.fill));
                }
            }
        }
        let allowed = served(&taken);
        if !allowed && this.stats.home_unreachable.load(Ordering::Relaxed) {
            match this.on_home_error {
                OnStoreError::Error => {
                    return Err(Error::new(
                        ErrorKind::Store,
                        format!(
                            "region {}: the share of global limit {name} is spent and home cannot be reached",
                            this.name
                        ),
                    ))
                }
                OnStoreError::Open => {
                    let decision = Decision::allow(limit.capacity(), 0, taken.until, 0);
                    return Ok(Self::outcome(policy, request, true, cost, decision, Path::Policy));
                }
                OnStoreError::Closed | OnStoreError::Local => {}
            }
        }
        let granted = if at_most { taken.granted } else { cost };
        let decision = if allowed {
            Decision::allow(limit.capacity(), taken.left, taken.until, 0)
        } else {
            let round_trip = this.stats.round_trip.load(Ordering::Relaxed).max(1_000);
            let retry = match taken.retry {
                0 => round_trip,
                retry => retry,
            };
            Decision::deny(limit.capacity(), taken.left, Some(retry), taken.until.max(retry))
        };
        let mut outcome = Self::outcome(policy, request, allowed, granted, decision, Path::Leased);
        outcome.decided_at = Timestamp::from_micros(taken.now);
        Ok(outcome)
    }

    /// The regional Redis failed `request`: the region's failure policy
    /// answers, as for its own limits (`local`: this process's memory
    /// store, the whole limit per process while the regional Redis is down).
    fn fallback(&self, subject: &Subject, policy: &Policy, request: &Request, error: Error) -> Result<Outcome> {
        let (allowed, path) = match self.on_home_error {
            OnStoreError::Error => return Err(error),
            OnStoreError::Open => (true, Path::Policy),
            OnStoreError::Closed => (false, Path::Policy),
            OnStoreError::Local => {
                let mut outcome = self.memory.decide_now(subject, policy, request)?;
                outcome.path = Path::Local;
                return Ok(outcome);
            }
        };
        let capacity = policy.limits().next().map_or(0, |(_, limit)| limit.capacity());
        let decision = if allowed {
            Decision::allow(capacity, 0, 0, 0)
        } else {
            Decision::deny(capacity, 0, Some(1_000_000), 1_000_000)
        };
        Ok(Self::outcome(
            policy,
            request,
            allowed,
            if allowed { request.units() } else { 0 },
            decision,
            path,
        ))
    }

    fn outcome(
        policy: &Policy,
        request: &Request,
        allowed: bool,
        granted: u64,
        decision: Decision,
        path: Path,
    ) -> Outcome {
        let now = request.now.unwrap_or_else(|| SystemClock.now()).as_micros();
        let mut outcome = policy.outcome(&request.op, allowed, granted, now, std::iter::once(decision));
        outcome.path = path;
        outcome
    }

    /// Gives a refund back to the region's share.
    async fn give(&self, subject: &Subject, policy: &Policy, name: &str, request: &Request) -> Result<Outcome> {
        let key = self.share_key(subject, name);
        let mut invocation = share::give().key(&key);
        invocation.arg(Self::now_arg(request)).arg(request.units());
        let left: u64 = self
            .regional
            .bounded(self.regional.inner.client.connection.invoke(&invocation))
            .await?;
        let (_, limit) = global_limit(policy)?;
        let decision = Decision::allow(limit.capacity(), left, 0, 0);
        Ok(Self::outcome(
            policy,
            request,
            true,
            request.units(),
            decision,
            Path::Leased,
        ))
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}
