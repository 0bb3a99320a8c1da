//! An Envoy's block: the units taken from the limit in the store for one
//! interval, and the token bucket they pay for (or a blanket rule, when
//! the rule is no limit taken in blocks or the store's failure policy
//! answered).

use std::time::{Duration, SystemTime};

use tollgate::{Limit, Op, Path, Policy, Request, Store as _};

use super::schedule::{phase, TAKE_AT};
use super::settings::{Action, Blanket, BucketId, Strategy, StreamId};
use super::{Current, Quotas};
use crate::service::{BucketMatch, Limited, Matched};

/// What one interval decided for one local Envoy of a bucket.
pub(super) struct Decided {
    pub(super) stream: StreamId,
    pub(super) action: Action,
    pub(super) current: Option<Current>,
    /// Units per second assigned (for the metrics).
    pub(super) rate: f64,
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
    /// Assigns a bucket an Envoy reports for the first time: its demand
    /// (or, not known yet, a quarter of the limit) until the next blocks
    /// are taken.
    pub(super) async fn assign_first(
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
    pub(super) fn blanket(&self, id: StreamId, rule: Option<&BucketMatch>) -> Decided {
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
    pub(super) async fn take(
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
}

/// A reported demand counts this much more: a rate measured over Envoy's
/// 5 s reports varies from one to the next, and an Envoy under its fair
/// share must not be denied for it.
pub(super) const HEADROOM: f64 = 1.1;

/// The demand assumed of an Envoy until its reports cover some time: a
/// quarter of the limit's capacity, so that Envoys starting together share
/// it evenly and one under its fair share is not denied meanwhile.
pub(super) fn unknown_demand(limit: &Limit) -> f64 {
    limit.capacity() as f64 / 4.0
}

/// The limit of `rule` when it is split among Envoys: a limit taken in
/// blocks (the leasable algorithms); the others get blanket rules.
pub(super) fn splittable(rule: Option<&BucketMatch>) -> Option<&Limited> {
    match rule.map(|rule| &rule.matched) {
        Some(Matched::Limited(block)) if block.limit.is_leasable() => Some(block),
        _ => None,
    }
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
