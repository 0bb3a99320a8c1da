//! Envoy's rate limit quota service (RLQS): global limits with no call on
//! the request path.
//!
//! Each Envoy holds one stream, sorts its requests into buckets, decides
//! them itself from the assignment this server last sent for the bucket,
//! and reports what it allowed and denied (about every 5 s). A bucket's id
//! is matched as an RLS request of one descriptor with the id's entries (in
//! key order) would be, so one configuration governs both protocols.
//!
//! Every `interval` (1 s), aligned to the clock, the server splits each
//! limited bucket's budget among the Envoys that ask for it (max-min fair,
//! see the `split` module) and takes each Envoy's share from the limit in
//! the store as a block ([`Op::CheckAtMost`]): several replicas on one Redis split one
//! limit, and no assignment is ever made of units the store did not grant.
//! An Envoy's assignment is a token bucket that cannot admit more than its
//! blocks: a new bucket may start full with `max_tokens` (beyond the
//! capacity of the one it replaces, whose fill ratio Envoy carries over) and
//! refills at the block's rate, so its first block pays for both, and while
//! the assignment is unchanged each interval's block pays for that
//! interval's refill. Assignments live `ttl` (3 intervals): an Envoy whose server
//! stopped answering keeps its last rate that long, then falls back to its
//! own `expired_assignment_behavior`.
//!
//! The steps of an interval, for every replica at the same instants:
//! at 1/10 of it each replica adds its Envoys' demands to counters in the
//! store (one call per bucket), at 1/4 it reads every replica's sums and
//! the limit's remaining units back (one call), and at 2/5, once every
//! replica has read, it takes the blocks of its Envoys under the level (one
//! call each), and at 1/2 those of its Envoys at the level.
//! Replicas' clocks must agree within a tenth of the interval (NTP does);
//! one that reads late finds less left and under-assigns, never over.

pub(crate) mod split;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use tokio::sync::{mpsc, watch};
use tollgate::{Limit, Op, Path, Policy, Request, Spread, Store as _, Subject};

use self::split::{Ladder, Split, Totals, RUNGS};
use crate::service::{BucketMatch, Failure, Limited, Matched, Service, ServiceError};

/// What `serve` does for RLQS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaSettings {
    /// How often shares are split and assignments sent (1 s).
    pub interval: Duration,
    /// How long an assignment lives (3 intervals): how long an Envoy keeps
    /// its last rate once this server stops answering.
    pub ttl: Duration,
    /// A bucket an Envoy has neither reported nor sent requests into for
    /// this long is abandoned (60 s).
    pub abandon_after: Duration,
    /// What a bucket that matches no rule is assigned (allow all).
    pub unmatched: Blanket,
}

impl QuotaSettings {
    /// Settings of these values.
    ///
    /// # Errors
    ///
    /// Naming the setting: an interval or ttl not in whole seconds (Envoy
    /// reads only those), an interval under one second, a ttl shorter than
    /// the interval, an abandon time shorter than Envoy's 5 s reports.
    pub fn new(interval: Duration, ttl: Duration, abandon_after: Duration, unmatched: Blanket) -> Result<Self, String> {
        if interval < Duration::from_secs(1) || interval.subsec_nanos() != 0 {
            return Err("rlqs interval must be a whole number of seconds, at least 1s".to_owned());
        }
        if ttl < interval || ttl.subsec_nanos() != 0 {
            return Err("rlqs ttl must be a whole number of seconds, at least the interval".to_owned());
        }
        if abandon_after < Duration::from_secs(10) {
            return Err("rlqs abandon-after must be at least 10s (Envoy reports every 5 s)".to_owned());
        }
        Ok(Self {
            interval,
            ttl,
            abandon_after,
            unmatched,
        })
    }
}

impl Default for QuotaSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            ttl: Duration::from_secs(3),
            abandon_after: Duration::from_secs(60),
            unmatched: Blanket::AllowAll,
        }
    }
}

/// A blanket rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blanket {
    /// Every request passes.
    AllowAll,
    /// Every request is denied.
    DenyAll,
}

/// How an Envoy decides a bucket's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// All or nothing.
    Blanket(Blanket),
    /// A token bucket: at most `max_tokens`, gaining `tokens_per_fill`
    /// every `fill_interval` (whole seconds: Envoy reads only those).
    TokenBucket {
        /// Its capacity.
        max_tokens: u32,
        /// Tokens gained per `fill_interval`.
        tokens_per_fill: u32,
        /// The refill period, in whole seconds.
        fill_interval: Duration,
    },
}

/// What the server tells an Envoy about one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Decide with `strategy` for `ttl`.
    Assign {
        /// How to decide.
        strategy: Strategy,
        /// How long; zero expires the assignment at once.
        ttl: Duration,
    },
    /// Forget the bucket (and stop reporting it).
    Abandon,
}

impl Action {
    /// How the metrics name it: `token_bucket`, `allow_all`, `deny_all`,
    /// `expire` (an assignment of no time) or `abandon`.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::Abandon => "abandon",
            Self::Assign { ttl, .. } if ttl.is_zero() => "expire",
            Self::Assign {
                strategy: Strategy::TokenBucket { .. },
                ..
            } => "token_bucket",
            Self::Assign {
                strategy: Strategy::Blanket(Blanket::AllowAll),
                ..
            } => "allow_all",
            Self::Assign {
                strategy: Strategy::Blanket(Blanket::DenyAll),
                ..
            } => "deny_all",
        }
    }
}

/// A bucket's id: its entries in key order.
pub type BucketId = Vec<(String, String)>;

/// One action for one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketAction {
    /// The bucket.
    pub bucket: BucketId,
    /// What to do.
    pub action: Action,
}

/// One bucket's usage in a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// The bucket's id, as sent.
    pub bucket: BucketId,
    /// The time since the previous report, if sent.
    pub elapsed: Option<Duration>,
    /// Requests the Envoy let through.
    pub allowed: u64,
    /// Requests it denied.
    pub denied: u64,
}

/// The most requests one report may say a bucket had: more is refused.
pub const MAX_REPORTED: u64 = 1 << 40;

/// The most buckets one stream may report on (and one report may carry):
/// the buckets past it are refused, so one Envoy cannot grow the server's
/// state without bound.
pub const MAX_BUCKETS_PER_STREAM: usize = 10_000;

/// An Envoy's stream, as the server knows it.
pub type StreamId = u64;

/// The RLQS service state: streams, buckets and the Envoys' shares.
pub struct Quotas {
    service: Arc<Service>,
    settings: QuotaSettings,
    state: Mutex<State>,
    next_stream: AtomicU64,
}

#[derive(Default)]
struct State {
    streams: HashMap<StreamId, Stream>,
    buckets: HashMap<BucketKey, Bucket>,
    /// Set once the server stops: no stream is opened after.
    stopped: bool,
}

/// A bucket of a domain.
type BucketKey = (String, BucketId);

struct Stream {
    domain: Option<String>,
    /// The buckets it reports on.
    held: usize,
    /// How metrics name this Envoy.
    peer: String,
    sender: mpsc::UnboundedSender<Vec<BucketAction>>,
}

#[derive(Default)]
struct Bucket {
    envoys: HashMap<StreamId, Share>,
}

/// One Envoy's part of a bucket.
struct Share {
    /// Requests per second it asked for over its last report; `None`
    /// until a report covers some time (Envoy's first report of a bucket
    /// counts one request over no time).
    demand: Option<f64>,
    /// Its last report on the bucket.
    reported: Instant,
    /// The last report that had requests in it.
    busy: Instant,
    /// Its token bucket, while it has one.
    current: Option<Current>,
}

/// An assigned token bucket and what the store granted for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Current {
    /// Units it gains per interval: the block each interval takes.
    per_interval: u64,
    /// Its capacity.
    burst: u64,
}

/// What one interval decided for one local Envoy of a bucket.
struct Decided {
    stream: StreamId,
    action: Action,
    current: Option<Current>,
    /// Units per second assigned (for the metrics).
    rate: f64,
}

impl Decided {
    /// Envoy `stream` assigned `blanket` for `ttl`.
    fn blanket(stream: StreamId, blanket: Blanket, ttl: Duration) -> Self {
        Self {
            stream,
            action: Action::Assign {
                strategy: Strategy::Blanket(blanket),
                ttl,
            },
            current: None,
            rate: if blanket == Blanket::AllowAll {
                f64::INFINITY
            } else {
                0.0
            },
        }
    }
}

impl Quotas {
    /// The RLQS service over `service`'s configuration and store.
    pub fn new(service: Arc<Service>, settings: QuotaSettings) -> Self {
        Self {
            service,
            settings,
            state: Mutex::new(State::default()),
            next_stream: AtomicU64::new(1),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a stream for the Envoy at `peer`: its id, and where its
    /// actions arrive.
    ///
    /// # Errors
    ///
    /// Unavailable once the server is stopping.
    pub fn open(&self, peer: String) -> Result<(StreamId, mpsc::UnboundedReceiver<Vec<BucketAction>>), ServiceError> {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = mpsc::unbounded_channel();
        let mut state = self.state();
        if state.stopped {
            return Err(ServiceError::Refused(
                Failure::Unavailable,
                "the server is stopping".to_owned(),
            ));
        }
        state.streams.insert(
            id,
            Stream {
                domain: None,
                held: 0,
                peer,
                sender,
            },
        );
        self.service.metrics().quota().streams(state.streams.len());
        Ok((id, receiver))
    }

    /// Forgets stream `id`: its shares go back to the others at the next
    /// interval.
    pub fn close(&self, id: StreamId) {
        let mut state = self.state();
        let Some(stream) = state.streams.remove(&id) else {
            return;
        };
        for ((domain, bucket), entry) in &mut state.buckets {
            if entry.envoys.remove(&id).is_some() {
                self.service
                    .metrics()
                    .quota()
                    .forget_share(domain, bucket, &stream.peer);
            }
        }
        state.buckets.retain(|_, bucket| !bucket.envoys.is_empty());
        self.service.metrics().quota().streams(state.streams.len());
        self.service.metrics().quota().buckets(state.buckets.len());
    }

    /// Takes one report of stream `id`: the domain (on its first report),
    /// and each bucket's usage. A bucket reported for the first time is
    /// assigned at once. A usage that cannot be read (no entries, an entry
    /// without a key, implausible counts) is counted and skipped; the
    /// stream's other buckets go on.
    ///
    /// # Errors
    ///
    /// An unknown domain, none on the first report, or another than the
    /// stream's: the stream ends.
    pub async fn report(&self, id: StreamId, domain: &str, usages: Vec<Usage>) -> Result<(), ServiceError> {
        let domain = self.stream_domain(id, domain)?;
        let metrics = self.service.metrics().quota();
        let now = Instant::now();
        let mut subscribed = Vec::new();
        {
            let mut state = self.state();
            let state = &mut *state;
            for (index, usage) in usages.into_iter().enumerate() {
                metrics.report(&domain);
                let readable = if index < MAX_BUCKETS_PER_STREAM {
                    readable(&usage)
                } else {
                    Err("too_many_buckets")
                };
                if let Err(reason) = readable {
                    metrics.rejected(reason);
                    tracing::warn!(domain, reason, "rlqs: a bucket's usage is skipped");
                    continue;
                }
                let mut bucket = usage.bucket;
                bucket.sort();
                let requests = usage.allowed + usage.denied;
                let demand = usage
                    .elapsed
                    .filter(|elapsed| !elapsed.is_zero())
                    .map(|elapsed| requests as f64 / elapsed.as_secs_f64());
                let key = (domain.clone(), bucket);
                if let Some(share) = state.buckets.get_mut(&key).and_then(|entry| entry.envoys.get_mut(&id)) {
                    share.demand = demand.or(share.demand);
                    share.reported = now;
                    if requests > 0 {
                        share.busy = now;
                    }
                    continue;
                }
                let Some(stream) = state
                    .streams
                    .get_mut(&id)
                    .filter(|stream| stream.held < MAX_BUCKETS_PER_STREAM)
                else {
                    metrics.rejected("too_many_buckets");
                    continue;
                };
                stream.held += 1;
                let share = Share {
                    demand,
                    reported: now,
                    busy: now,
                    current: None,
                };
                subscribed.push((key.1.clone(), demand));
                state.buckets.entry(key).or_default().envoys.insert(id, share);
            }
            metrics.buckets(state.buckets.len());
        }
        // The new buckets' first assignments, in one answer.
        let mut first = Vec::with_capacity(subscribed.len());
        for (bucket, demand) in subscribed {
            if let Some(decided) = self.assign_first(id, &domain, &bucket, demand).await {
                first.push((bucket, vec![decided]));
            }
        }
        if !first.is_empty() {
            self.finish(&domain, first);
        }
        Ok(())
    }

    /// The domain of stream `id`, set by its first report.
    fn stream_domain(&self, id: StreamId, sent: &str) -> Result<String, ServiceError> {
        let mut state = self.state();
        let stream = state
            .streams
            .get_mut(&id)
            .ok_or_else(|| ServiceError::Refused(Failure::Unavailable, "the stream is closed".to_owned()))?;
        match &stream.domain {
            Some(domain) if sent.is_empty() || sent == domain => Ok(domain.clone()),
            Some(domain) => Err(ServiceError::invalid(format!(
                "domain \"{sent}\" differs from the stream's \"{domain}\": open another stream"
            ))),
            None if sent.is_empty() => Err(ServiceError::invalid("domain must be set on the stream's first report")),
            None => {
                if !self.service.config().domains.contains_key(sent) {
                    return Err(ServiceError::invalid(format!("domain \"{sent}\" is not configured")));
                }
                stream.domain = Some(sent.to_owned());
                Ok(sent.to_owned())
            }
        }
    }

    /// Assigns a bucket an Envoy reports for the first time: its demand
    /// (or, not known yet, a quarter of the limit) until the next blocks
    /// are taken.
    async fn assign_first(
        &self,
        id: StreamId,
        domain: &str,
        bucket: &BucketId,
        demand: Option<f64>,
    ) -> Option<Decided> {
        let interval = self.settings.interval.as_secs_f64();
        // Until the next interval's blocks are taken: the interval's own
        // split, if still to come, counts this block as spent.
        let left = (TAKE_AT - phase(SystemTime::now(), self.settings.interval)).rem_euclid(1.0);
        let rule = self.service.match_bucket(domain, bucket.clone());
        let Some(block) = splittable(rule.as_ref()) else {
            return Some(self.blanket(id, rule.as_ref()));
        };
        let demand = demand.map_or_else(|| unknown_demand(&block.limit), |demand| demand * interval * HEADROOM);
        let want = demand.min(block.limit.capacity() as f64);
        self.take(block, id, want, left, None).await
    }

    /// The assignment of a bucket whose rule is not a limit taken in
    /// blocks.
    fn blanket(&self, id: StreamId, rule: Option<&BucketMatch>) -> Decided {
        let blanket = match rule {
            Some(BucketMatch {
                matched: Matched::Unlimited,
                ..
            }) => Blanket::AllowAll,
            Some(BucketMatch {
                matched: Matched::Blocked,
                ..
            }) => Blanket::DenyAll,
            Some(BucketMatch {
                matched: Matched::Nothing,
                ..
            })
            | None => self.settings.unmatched,
            Some(BucketMatch {
                matched: Matched::Limited(block),
                stat_key,
            }) => {
                tracing::warn!(
                    rule = stat_key,
                    algorithm = block.limit.algorithm(),
                    "rlqs: this algorithm is not taken in blocks; the bucket gets the unmatched default"
                );
                self.settings.unmatched
            }
        };
        Decided::blanket(id, blanket, self.settings.ttl)
    }

    /// Takes a block for Envoy `id` to admit about `want` units per
    /// interval over `part` of an interval (`current`: its token bucket,
    /// kept when the block it needs is granted again); its assignment.
    /// `None` when the store failed with no failure policy to answer: the
    /// Envoy keeps its assignment until it lapses.
    async fn take(
        &self,
        block: &Limited,
        id: StreamId,
        want: f64,
        part: f64,
        current: Option<Current>,
    ) -> Option<Decided> {
        let want = round_randomly(want.max(0.0));
        // Kept while the share moves less than a tenth: a new assignment
        // costs its capacity again.
        let keep = current.filter(|current| {
            current.per_interval > 0 && want.abs_diff(current.per_interval) <= (current.per_interval / 10).max(1)
        });
        // Envoy starts a token bucket that replaces another at the old one's
        // fill ratio: of the new capacity, only what exceeds the old one's
        // (paid for already) may be unpaid tokens.
        let held = current.map_or(0, |current| current.burst);
        let over_part = |units: u64| (units as f64 * part).ceil() as u64;
        let asked = match keep {
            Some(current) => over_part(current.per_interval),
            None => over_part(want) + burst_of(want).saturating_sub(held),
        };
        let interval = self.settings.interval;
        let outcome = match Policy::new([(block.name.as_str(), block.limit.clone())]) {
            Ok(policy) => {
                let request = Request::new(Op::CheckAtMost, asked);
                self.service.store().decide(&block.subject, &policy, &request).await
            }
            Err(error) => Err(error),
        };
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(error) => {
                self.service.metrics().quota().store_error();
                tracing::warn!(%error, "rlqs: a block could not be taken; assignments run until they lapse");
                return None;
            }
        };
        let (granted, path_allows) = match outcome.path {
            Path::Policy => (0, Some(outcome.decision.allowed)),
            _ => (outcome.granted, None),
        };
        let ttl = self.settings.ttl;
        // The failure policy answered: open allows all, closed denies all,
        // for one interval at a time.
        if let Some(allows) = path_allows {
            let blanket = if allows { Blanket::AllowAll } else { Blanket::DenyAll };
            return Some(Decided::blanket(id, blanket, interval * 2));
        }
        let current = match keep {
            Some(current) if granted == asked => current,
            _ if granted == 0 => return Some(Decided::blanket(id, Blanket::DenyAll, ttl)),
            // A new bucket: it may start full, so this block pays for its
            // capacity (beyond the old one's) and for its refill over the
            // part of the interval.
            _ if keep.is_none() && granted == asked => Current {
                per_interval: want,
                burst: burst_of(want),
            },
            _ => {
                let burst = granted.div_ceil(11).clamp(1, granted);
                let unpaid = burst.saturating_sub(held);
                Current {
                    per_interval: ((granted - unpaid) as f64 / part) as u64,
                    burst,
                }
            }
        };
        // No refill before the next interval takes a block: one token an
        // hour (Envoy compares only the sub-second part of the interval, so
        // this never carries the slow rate into a later assignment of the
        // same capacity: that one would only refill slower than granted).
        let (tokens_per_fill, fill_interval) = match u32::try_from(current.per_interval) {
            Ok(0) => (1, Duration::from_secs(3600)),
            Ok(tokens) => (tokens, interval),
            Err(_) => (u32::MAX, interval),
        };
        Some(Decided {
            stream: id,
            action: Action::Assign {
                strategy: Strategy::TokenBucket {
                    max_tokens: u32::try_from(current.burst).unwrap_or(u32::MAX),
                    tokens_per_fill,
                    fill_interval,
                },
                ttl,
            },
            current: Some(current),
            rate: current.per_interval as f64 / interval.as_secs_f64(),
        })
    }

    /// Records what was decided for a domain's buckets and sends each
    /// stream its actions.
    fn finish(&self, domain: &str, decided: Vec<(BucketId, Vec<Decided>)>) {
        let metrics = self.service.metrics().quota();
        let mut outgoing: HashMap<StreamId, Vec<BucketAction>> = HashMap::new();
        let mut state = self.state();
        let state = &mut *state;
        for (bucket, envoys) in decided {
            let key = (domain.to_owned(), bucket);
            for decided in envoys {
                let Some(share) = state
                    .buckets
                    .get_mut(&key)
                    .and_then(|entry| entry.envoys.get_mut(&decided.stream))
                else {
                    continue;
                };
                share.current = decided.current;
                tracing::debug!(domain, bucket = ?key.1, stream = decided.stream, action = ?decided.action, "rlqs: assigned");
                let Some(stream) = state.streams.get(&decided.stream) else {
                    continue;
                };
                metrics.assigned(decided.action.label());
                metrics.share(domain, &key.1, &stream.peer, decided.rate);
                outgoing.entry(decided.stream).or_default().push(BucketAction {
                    bucket: key.1.clone(),
                    action: decided.action,
                });
            }
        }
        for (id, actions) in outgoing {
            if let Some(stream) = state.streams.get(&id) {
                let _ = stream.sender.send(actions);
            }
        }
    }

    /// Splits and assigns every interval until `stopped`, then expires
    /// every assignment (Envoys fall back to their
    /// `expired_assignment_behavior` rather than keep a rate no one
    /// renews) and ends the streams.
    pub async fn run(self: Arc<Self>, mut stopped: watch::Receiver<bool>) {
        let interval = self.settings.interval;
        loop {
            let start = next_start(SystemTime::now(), interval);
            tokio::select! {
                () = sleep_until(start + interval.mul_f64(ADD_AT)) => {}
                _ = stopped.wait_for(|stop| *stop) => break,
            }
            self.interval(start).await;
        }
        self.expire_all();
    }

    /// One interval, begun at `start`.
    async fn interval(&self, start: SystemTime) {
        let now = Instant::now();
        let plans = self.plan(now);
        tracing::debug!(buckets = plans.len(), "rlqs: interval");
        // Each replica adds its demands...
        join_all(plans.iter().map(|plan| self.add_demands(plan))).await;
        // ...then, once all have, reads everyone's and the budget...
        sleep_until(start + self.settings.interval.mul_f64(READ_AT)).await;
        let splits = join_all(plans.iter().map(|plan| self.split(plan))).await;
        // ...and once all have read, takes its blocks.
        sleep_until(start + self.settings.interval.mul_f64(TAKE_AT)).await;
        let decided = join_all(
            plans
                .iter()
                .zip(splits)
                .map(|(plan, split)| self.take_shares(plan, split, start)),
        )
        .await;
        let mut by_domain: HashMap<&str, Vec<(BucketId, Vec<Decided>)>> = HashMap::new();
        for (plan, decided) in plans.iter().zip(decided) {
            by_domain
                .entry(plan.domain.as_str())
                .or_default()
                .push((plan.bucket.clone(), decided));
        }
        for (domain, decided) in by_domain {
            self.finish(domain, decided);
        }
    }

    /// Abandons the buckets gone quiet, and lists the others' Envoys.
    fn plan(&self, now: Instant) -> Vec<Plan> {
        let interval = self.settings.interval.as_secs_f64();
        let quiet = self.settings.abandon_after;
        let metrics = self.service.metrics().quota();
        let mut abandoned: HashMap<StreamId, Vec<BucketAction>> = HashMap::new();
        let mut plans = Vec::new();
        let mut state = self.state();
        let state = &mut *state;
        for ((domain, bucket), entry) in &mut state.buckets {
            entry.envoys.retain(|&id, share| {
                let gone = now.duration_since(share.reported) > quiet || now.duration_since(share.busy) > quiet;
                if gone {
                    abandoned.entry(id).or_default().push(BucketAction {
                        bucket: bucket.clone(),
                        action: Action::Abandon,
                    });
                    if let Some(stream) = state.streams.get_mut(&id) {
                        stream.held = stream.held.saturating_sub(1);
                        metrics.forget_share(domain, bucket, &stream.peer);
                    }
                }
                !gone
            });
            if entry.envoys.is_empty() {
                continue;
            }
            let mut envoys: Vec<(StreamId, Option<f64>, Option<Current>)> = entry
                .envoys
                .iter()
                .map(|(&id, share)| (id, share.demand.map(|demand| demand * interval), share.current))
                .collect();
            // No Envoy is always first to take.
            fastrand::shuffle(&mut envoys);
            plans.push(Plan {
                domain: domain.clone(),
                bucket: bucket.clone(),
                rule: self.service.match_bucket(domain, bucket.clone()),
                envoys,
            });
        }
        state.buckets.retain(|_, entry| !entry.envoys.is_empty());
        metrics.buckets(state.buckets.len());
        for (id, actions) in abandoned {
            for _ in &actions {
                metrics.assigned(Action::Abandon.label());
            }
            if let Some(stream) = state.streams.get(&id) {
                let _ = stream.sender.send(actions);
            }
        }
        plans
    }

    /// Adds this replica's demands on `plan`'s bucket to the store.
    async fn add_demands(&self, plan: &Plan) {
        let Some(block) = splittable(plan.rule.as_ref()) else {
            return;
        };
        let totals = Ladder::new(block.limit.capacity()).capped(&plan.demands(&block.limit));
        let result = match self.demand_rows(&block.subject, None, &totals) {
            Ok(spread) => self.service.store().decide_spread(&spread, Op::Record).await.map(drop),
            Err(error) => Err(error),
        };
        if let Err(error) = result {
            self.service.metrics().quota().store_error();
            tracing::debug!(%error, "rlqs: demands could not be added");
        }
    }

    /// Reads every replica's demands on `plan`'s bucket and what its limit
    /// has left, and splits it; `None` when its rule is not a limit taken in
    /// blocks.
    async fn split(&self, plan: &Plan) -> Option<Split> {
        let block = splittable(plan.rule.as_ref())?;
        let ladder = Ladder::new(block.limit.capacity());
        // The split as every replica sees it; this replica's alone if the
        // store cannot tell.
        Some(match self.read_totals(block).await {
            Some((totals, budget)) => ladder.split(budget, &totals),
            None => ladder.split(
                block.limit.capacity() as f64,
                &ladder.capped(&plan.demands(&block.limit)),
            ),
        })
    }

    /// Takes each local Envoy's block of `plan`'s bucket, as `split` says.
    async fn take_shares(&self, plan: &Plan, split: Option<Split>, start: SystemTime) -> Vec<Decided> {
        let (Some(split), Some(block)) = (split, splittable(plan.rule.as_ref())) else {
            return plan
                .envoys
                .iter()
                .map(|&(id, ..)| self.blanket(id, plan.rule.as_ref()))
                .collect();
        };
        let local = plan.demands(&block.limit);
        // The smallest shares are taken first, and those capped at the
        // level only once every replica has taken the others: when the
        // limit runs short (a new token bucket's capacity, rounding), an
        // Envoy at the level gets less rather than one under it.
        let mut shares: Vec<(StreamId, f64, bool, Option<Current>)> = plan
            .envoys
            .iter()
            .zip(&local)
            .map(|(&(id, _, current), &demand)| (id, split.share(demand), split.caps(demand), current))
            .collect();
        shares.sort_by(|a, b| a.1.total_cmp(&b.1));
        let mut decided = Vec::with_capacity(shares.len());
        let mut waited = false;
        for (id, share, capped, current) in shares {
            if capped && !waited {
                sleep_until(start + self.settings.interval.mul_f64(TAKE_CAPPED_AT)).await;
                waited = true;
            }
            if let Some(one) = self.take(block, id, share, 1.0, current).await {
                decided.push(one);
            }
        }
        decided
    }

    /// Every replica's demands on the block's bucket, and what its limit
    /// has left now.
    async fn read_totals(&self, block: &Limited) -> Option<(Totals, f64)> {
        let empty = Totals {
            rungs: vec![0; RUNGS],
            ..Totals::default()
        };
        let spread = self.demand_rows(&block.subject, Some(block), &empty).ok()?;
        let outcome = match self.service.store().decide_spread(&spread, Op::Check).await {
            Ok(outcome) if outcome.path == Path::Store || outcome.path == Path::Local => outcome,
            Ok(_) => return None,
            Err(error) => {
                self.service.metrics().quota().store_error();
                tracing::debug!(%error, "rlqs: demands could not be read");
                return None;
            }
        };
        // Each limit's decision by its name (a policy keeps its own order).
        let decided: HashMap<&str, u64> = outcome
            .limits
            .iter()
            .map(|(name, decision)| (name.as_str(), decision.remaining))
            .collect();
        let count = |name: &str| {
            decided
                .get(name)
                .map_or(0, |remaining| DEMAND_LIMIT - remaining.min(&DEMAND_LIMIT))
        };
        let totals = Totals {
            demand: count(DEMAND),
            envoys: count(ENVOYS),
            rungs: (0..RUNGS).map(|rung| count(&rung_name(rung))).collect(),
        };
        let budget = decided.get(block.name.as_str()).copied().unwrap_or(0);
        Some((totals, budget as f64))
    }

    /// The demand counters of a bucket (and, to read it with them, its
    /// limit), each weighing what `totals` says.
    fn demand_rows(&self, subject: &Subject, limit: Option<&Limited>, totals: &Totals) -> tollgate::Result<Spread> {
        let counter = Limit::fixed_window(DEMAND_LIMIT, self.settings.interval)?;
        let mut rows = Spread::builder();
        rows.row(subject.clone(), DEMAND, counter.clone(), totals.demand);
        rows.row(subject.clone(), ENVOYS, counter.clone(), totals.envoys);
        for (rung, capped) in totals.rungs.iter().enumerate() {
            rows.row(subject.clone(), &rung_name(rung), counter.clone(), *capped);
        }
        if let Some(block) = limit {
            rows.row(block.subject.clone(), &block.name, block.limit.clone(), 0);
        }
        rows.build()
    }

    /// The buckets Envoys report on, one line each (for `/rlconfig`): the
    /// domain and the bucket, what it matched, and each Envoy's assigned
    /// rate; nothing when no Envoy reports.
    pub fn describe(&self) -> String {
        let interval = self.settings.interval.as_secs_f64();
        let state = self.state();
        let mut lines: Vec<String> = state
            .buckets
            .iter()
            .map(|((domain, bucket), entry)| {
                let matched = match self.service.match_bucket(domain, bucket.clone()) {
                    Some(BucketMatch {
                        matched: Matched::Limited(_),
                        stat_key,
                    }) => format!("{domain}.{stat_key}"),
                    Some(BucketMatch {
                        matched: Matched::Unlimited,
                        ..
                    }) => "unlimited: allow all".to_owned(),
                    Some(BucketMatch {
                        matched: Matched::Blocked,
                        ..
                    }) => "blocked: deny all".to_owned(),
                    Some(BucketMatch {
                        matched: Matched::Nothing,
                        ..
                    })
                    | None => format!("no rule: {:?}", self.settings.unmatched),
                };
                let mut envoys: Vec<String> = entry
                    .envoys
                    .iter()
                    .map(|(id, share)| {
                        let peer = state.streams.get(id).map_or("?", |stream| stream.peer.as_str());
                        match share.current {
                            Some(current) => format!("{peer} {:.1}/s", current.per_interval as f64 / interval),
                            None => format!("{peer} -"),
                        }
                    })
                    .collect();
                envoys.sort();
                format!(
                    "rlqs {domain} {{{}}} -> {matched}: {}\n",
                    crate::metrics::bucket_name(bucket),
                    envoys.join(", ")
                )
            })
            .collect();
        lines.sort();
        lines.concat()
    }

    /// Expires every assignment of every stream, and ends the streams.
    fn expire_all(&self) {
        let mut state = self.state();
        state.stopped = true;
        let mut outgoing: HashMap<StreamId, Vec<BucketAction>> = HashMap::new();
        for ((_, bucket), entry) in &state.buckets {
            for &id in entry.envoys.keys() {
                outgoing.entry(id).or_default().push(BucketAction {
                    bucket: bucket.clone(),
                    action: Action::Assign {
                        strategy: Strategy::Blanket(Blanket::AllowAll),
                        ttl: Duration::ZERO,
                    },
                });
            }
        }
        for (id, actions) in outgoing {
            if let Some(stream) = state.streams.get(&id) {
                let _ = stream.sender.send(actions);
            }
        }
        // Dropping the senders ends the streams.
        state.streams.clear();
        state.buckets.clear();
    }
}

/// One bucket to split in an interval.
struct Plan {
    domain: String,
    bucket: BucketId,
    rule: Option<BucketMatch>,
    /// Each local Envoy, its demand per interval (if known yet) and its
    /// token bucket.
    envoys: Vec<(StreamId, Option<f64>, Option<Current>)>,
}

impl Plan {
    /// Each local Envoy's demand per interval, one not known yet counted
    /// as [`unknown_demand`].
    fn demands(&self, limit: &Limit) -> Vec<f64> {
        self.envoys
            .iter()
            .map(|(_, demand, _)| demand.map_or_else(|| unknown_demand(limit), |demand| demand * HEADROOM))
            .collect()
    }
}

/// A reported demand counts this much more: a rate measured over Envoy's
/// 5 s reports varies from one to the next, and an Envoy under its fair
/// share must not be denied for it.
const HEADROOM: f64 = 1.1;

/// The demand assumed of an Envoy until its reports cover some time: a
/// quarter of the limit's capacity, so that Envoys starting together share
/// it evenly and one under its fair share is not denied meanwhile.
fn unknown_demand(limit: &Limit) -> f64 {
    limit.capacity() as f64 / 4.0
}

/// When, into its interval, a replica adds its demands; reads everyone's and
/// the budget; takes the blocks of its Envoys under the level; and those of
/// its Envoys at the level (see the module's steps).
const ADD_AT: f64 = 0.1;
const READ_AT: f64 = 0.25;
const TAKE_AT: f64 = 0.4;
const TAKE_CAPPED_AT: f64 = 0.5;

/// The limit of `rule` when it is split among Envoys: a limit taken in
/// blocks (the leasable algorithms); the others get blanket rules.
fn splittable(rule: Option<&BucketMatch>) -> Option<&Limited> {
    match rule.map(|rule| &rule.matched) {
        Some(Matched::Limited(block)) if block.limit.is_leasable() => Some(block),
        _ => None,
    }
}

/// The counters of a bucket's demand, beside its limit: every Envoy's, in
/// thousandths, and the Envoys.
const DEMAND: &str = "rlqs.demand";
const ENVOYS: &str = "rlqs.envoys";

/// The counter of the demand capped at `rung`, in thousandths.
fn rung_name(rung: usize) -> String {
    format!("rlqs.rung.{rung}")
}

/// The limit of the demand counters: they only count.
const DEMAND_LIMIT: u64 = 1 << 52;

/// Why a usage cannot be read, if it cannot.
fn readable(usage: &Usage) -> Result<(), &'static str> {
    if usage.bucket.is_empty() {
        return Err("empty_bucket_id");
    }
    if usage.bucket.iter().any(|(key, _)| key.is_empty()) {
        return Err("empty_key");
    }
    if usage.allowed > MAX_REPORTED || usage.denied > MAX_REPORTED {
        return Err("implausible_counts");
    }
    Ok(())
}

/// The capacity of a token bucket refilling `per_interval`: a tenth of it,
/// at least one.
fn burst_of(per_interval: u64) -> u64 {
    per_interval.div_ceil(10).max(1)
}

/// `value` rounded down or up, up with the probability of its fraction:
/// shares of a unit add up over intervals.
fn round_randomly(value: f64) -> u64 {
    let whole = value.floor();
    let up = fastrand::f64() < value - whole;
    whole as u64 + u64::from(up)
}

/// How far `now` is into its interval, from 0 to 1.
fn phase(now: SystemTime, interval: Duration) -> f64 {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    let length = interval.as_nanos().max(1);
    (since % length) as f64 / length as f64
}

/// The start of the next interval after `now`, interval boundaries being
/// multiples of `interval` since the epoch (so that replicas agree).
fn next_start(now: SystemTime, interval: Duration) -> SystemTime {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    let length = interval.as_nanos().max(1);
    let next = (since / length + 1) * length;
    UNIX_EPOCH + Duration::from_nanos(u64::try_from(next).unwrap_or(u64::MAX))
}

async fn sleep_until(at: SystemTime) {
    if let Ok(wait) = at.duration_since(SystemTime::now()) {
        tokio::time::sleep(wait).await;
    }
}
