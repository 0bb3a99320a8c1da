//! One interval's steps, for every bucket some Envoy reports on: quiet
//! buckets abandoned, this replica's demands added, everyone's read and
//! split, and each local Envoy's block taken.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use futures_util::future::join_all;
use tokio::sync::watch;
use tollgate::Limit;

use super::blocks::{splittable, unknown_demand, Decided, HEADROOM};
use super::schedule::{next_start, sleep_until, ADD_AT, READ_AT, TAKE_AT, TAKE_CAPPED_AT};
use super::settings::{Action, BucketAction, BucketId, StreamId};
use super::split::{Ladder, Split};
use super::{Current, Quotas};
use crate::service::BucketMatch;

impl Quotas {
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
        self.add_totals(&block.subject, &totals).await;
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
