//! The answer to every check.

use std::time::Duration;

use crate::clock::Timestamp;

/// The outcome of one check against a limit or a policy.
///
/// A denial is a `Decision` with `allowed == false`, never an error. When a
/// request can never be admitted (its cost is above `limit`), `retry_after` is
/// `None` rather than a wait that would never end.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The request may proceed now (after `wait`, for shaping and borrowing).
    pub allowed: bool,
    /// The most unit-cost requests the limit admits at once.
    pub limit: u64,
    /// Unit-cost requests that would still be admitted right now, after this decision.
    pub remaining: u64,
    /// When denied: the time until this same request would be admitted; zero
    /// when allowed; `None` when it can never be admitted.
    pub retry_after: Option<Duration>,
    /// The time until the limit is back to its full, untouched state.
    pub reset_after: Duration,
    /// For shaping and borrowing: how long the caller must wait before
    /// proceeding; zero otherwise.
    pub wait: Duration,
}

impl Decision {
    /// An admitted request, with integer microseconds.
    #[inline]
    pub(crate) fn allow(limit: u64, remaining: u64, reset_after: u64, wait: u64) -> Self {
        Self {
            allowed: true,
            limit,
            remaining,
            retry_after: Some(Duration::ZERO),
            reset_after: Duration::from_micros(reset_after),
            wait: Duration::from_micros(wait),
        }
    }

    /// A denied request, with integer microseconds (`retry_after` `None`: never).
    #[inline]
    pub(crate) fn deny(limit: u64, remaining: u64, retry_after: Option<u64>, reset_after: u64) -> Self {
        Self {
            allowed: false,
            limit,
            remaining,
            retry_after: retry_after.map(Duration::from_micros),
            reset_after: Duration::from_micros(reset_after),
            wait: Duration::ZERO,
        }
    }

    /// The decision where no limit applies: allowed, with everything remaining.
    pub fn unlimited() -> Self {
        Self::allow(u64::MAX, u64::MAX, 0, 0)
    }

    /// True when the request was denied and can never be admitted.
    pub fn is_never(&self) -> bool {
        !self.allowed && self.retry_after.is_none()
    }

    /// How restrictive this decision is, to pick the one that speaks for
    /// several (see [`Restrictiveness`]).
    pub fn restrictiveness(&self) -> Restrictiveness {
        Restrictiveness::new(!self.allowed, self.retry_after, self.remaining)
    }

    /// The position of the most restrictive of `decisions` (the first of
    /// equals), `None` when there are none: the one rule by which a policy,
    /// `tollgate serve` and its headers pick the decision that speaks for
    /// several.
    pub fn most_restrictive<'a>(decisions: impl IntoIterator<Item = &'a Decision>) -> Option<usize> {
        Restrictiveness::most(decisions.into_iter().map(Decision::restrictiveness))
    }
}

/// How restrictive a decision is, ordered so that the most restrictive is
/// the greatest: a denial before any admission; among denials, the longest
/// `retry_after` (never admissible is longest), then the fewest `remaining`;
/// among admissions, the fewest `remaining`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Restrictiveness {
    denied: bool,
    retry_after: Duration,
    scarcity: u64,
}

impl Restrictiveness {
    /// The restrictiveness of a decision given by its parts: `denied`, its
    /// `retry_after` (`None`: never admissible) and its `remaining`.
    pub fn new(denied: bool, retry_after: Option<Duration>, remaining: u64) -> Self {
        Self {
            denied,
            retry_after: if denied {
                retry_after.unwrap_or(Duration::MAX)
            } else {
                Duration::ZERO
            },
            scarcity: u64::MAX - remaining,
        }
    }

    /// The position of the greatest (the first of equals), `None` when empty.
    pub fn most(all: impl IntoIterator<Item = Self>) -> Option<usize> {
        let mut best: Option<(usize, Self)> = None;
        for (index, each) in all.into_iter().enumerate() {
            if best.is_none_or(|(_, chosen)| each > chosen) {
                best = Some((index, each));
            }
        }
        best.map(|(index, _)| index)
    }
}

/// A [`Decision`] with what only some operations produce.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The decision of the policy: that of its most restrictive limit (the
    /// denying one with the longest `retry_after`, else the one with the least
    /// `remaining`), with `wait` the longest of its limits'.
    pub decision: Decision,
    /// Units consumed: the cost when allowed, zero when denied; for
    /// `check_at_most`, the part of the cost that was granted.
    pub granted: u64,
    /// The lease taken by an `acquire` on a concurrency limit.
    pub lease: Option<String>,
    /// Each limit's own decision, in the policy's order.
    pub limits: Vec<(String, Decision)>,
    /// What decided: the store, or, behind a
    /// [`ResilientStore`](crate::ResilientStore), its fallbacks.
    pub path: Path,
    /// The instant the decision was made at: the request's `now`, else the
    /// store's clock (in Redis, the server's `TIME`). What an
    /// [`Op::Refund`](crate::Op::Refund) of this decision's units names.
    pub decided_at: Timestamp,
    /// The alert thresholds this decision crossed
    /// ([`Limit::alerting`](crate::Limit::alerting)), found in the same
    /// atomic step as the decision: each crossing is reported to one caller
    /// only, whatever the number of processes sharing the store.
    pub crossed: Vec<Crossing>,
}

/// A limit's alert threshold that a decision crossed: the limit's use went
/// from below `threshold` percent of it to at or above.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crossing {
    /// The limit's place in its policy (its decision in
    /// [`Outcome::limits`] when the policy names its limits).
    pub index: usize,
    /// The threshold, a percent of the limit.
    pub threshold: u8,
    /// Units used after the decision (the limit less what remains: at most
    /// the limit).
    pub used: u64,
    /// The limit.
    pub limit: u64,
    /// Until the limit's use resets (a window's end; a bucket, refilled).
    pub reset_after: Duration,
}

impl Crossing {
    /// The thresholds of `alerts` (rising) crossed by a decision that took
    /// the available units of a limit of `limit` from `before` to the
    /// decision's `remaining`: each with the decision's figures.
    pub(crate) fn found(index: usize, alerts: &[u8], before: u64, decision: &Decision, crossed: &mut Vec<Self>) {
        let limit = decision.limit;
        let used = |available: u64| limit - available.min(limit);
        let (before, after) = (u128::from(used(before)), u128::from(used(decision.remaining)));
        for &threshold in alerts {
            let at = u128::from(threshold) * u128::from(limit);
            if before * 100 < at && after * 100 >= at {
                crossed.push(Self {
                    index,
                    threshold,
                    used: used(decision.remaining),
                    limit,
                    reset_after: decision.reset_after,
                });
            }
        }
    }

    /// Bit `i` set for each threshold `alerts[i]` among `crossed` of the
    /// limit at `index` (a reply's figure).
    #[cfg(feature = "engine")]
    pub(crate) fn mask(crossed: &[Self], index: usize, alerts: &[u8]) -> i64 {
        crossed
            .iter()
            .filter(|crossing| crossing.index == index)
            .filter_map(|crossing| alerts.iter().position(|&threshold| threshold == crossing.threshold))
            .fold(0, |mask, bit| mask | 1 << bit)
    }

    /// The crossings a reply's `mask` names for the limit at `index`, with
    /// its decision's figures.
    #[cfg(feature = "redis")]
    pub(crate) fn of_mask(index: usize, alerts: &[u8], mask: i64, decision: &Decision, crossed: &mut Vec<Self>) {
        let limit = decision.limit;
        for (bit, &threshold) in alerts.iter().enumerate() {
            if mask & (1 << bit) != 0 {
                crossed.push(Self {
                    index,
                    threshold,
                    used: limit - decision.remaining.min(limit),
                    limit,
                    reset_after: decision.reset_after,
                });
            }
        }
    }
}

/// What decided an [`Outcome`].
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Path {
    /// The store (Redis, or the memory store).
    #[default]
    Store,
    /// The in-process memory store that takes over while the store fails
    /// (failure policy `local`).
    Local,
    /// The failure policy itself, while the store fails: `open` admits,
    /// `closed` denies.
    Policy,
    /// A denial remembered from the store and answered again until its
    /// `retry_after` has passed.
    DenyCache,
    /// A [`LeasedStore`](crate::LeasedStore)'s block: units this process
    /// took from the store earlier, or a denial it remembers.
    Leased,
}

impl Path {
    /// Every path, in the order of [`Path::index`]: for counting by path.
    pub const ALL: [Self; 5] = [Self::Store, Self::Local, Self::Policy, Self::DenyCache, Self::Leased];

    /// The position of this path in [`Path::ALL`].
    pub fn index(self) -> usize {
        match self {
            Self::Store => 0,
            Self::Local => 1,
            Self::Policy => 2,
            Self::DenyCache => 3,
            Self::Leased => 4,
        }
    }

    /// The name used in metrics and JSON: `store`, `local`, `policy`,
    /// `deny_cache`, `leased`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Store => "store",
            Self::Local => "local",
            Self::Policy => "policy",
            Self::DenyCache => "deny_cache",
            Self::Leased => "leased",
        }
    }
}
