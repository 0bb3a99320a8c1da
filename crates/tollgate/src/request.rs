//! A request: what it asks of a policy (an [`Op`]), what it weighs (a
//! [`Cost`], one for all limits or one per limit), and when it is decided.
//!
//! The request is the one value every front end builds and every store
//! reads; the policy validates it against its limits before any store runs.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Timestamp;

/// What a request asks for.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Decide and consume `cost` when allowed (`cost == 0` is a peek).
    Check,
    /// Admit as many units as are available, up to `cost`.
    CheckAtMost,
    /// Borrowing/shaping limits: grant at the next free moment, denied when
    /// that is more than `max_wait` away (`None`: any wait).
    Reserve {
        /// The longest acceptable wait.
        max_wait: Option<Duration>,
    },
    /// Take lease `lease` on the concurrency limits (and reserve or check the
    /// others, accepting a wait of at most `max_wait`).
    Acquire {
        /// The caller's name for the lease.
        lease: String,
        /// The longest acceptable wait on borrowing/shaping limits.
        max_wait: Option<Duration>,
    },
    /// Give lease `lease` back.
    Release {
        /// The lease to end.
        lease: String,
    },
    /// Give back `cost` units an earlier request took at `at` (its
    /// [`Outcome::decided_at`](crate::Outcome::decided_at)): a reservation cancelled, or the part of a
    /// decision that another store denied. Never denied; each limit reports
    /// as a release does (what is left, no wait). Window counts (fixed
    /// window, sliding window, sliding log) give back only while the units
    /// taken at `at` still count; buckets and TATs give back up to full; a
    /// concurrency limit releases `lease` (nothing without one).
    ///
    /// A refund restores exactly the state the limit would hold had the
    /// units never been taken when nothing else consumed on it in between;
    /// otherwise a bucket or TAT may give back units whose effect had
    /// already lapsed, at most the refunded cost.
    Refund {
        /// When the units were taken.
        at: Timestamp,
        /// The lease to end on concurrency limits.
        lease: Option<String>,
    },
    /// Count `cost` units that were already spent (an LLM's tokens, reported
    /// once the response is done), on every limit, whether or not they fit:
    /// windows and logs go above their limit until the usage leaves the
    /// window; token bucket, GCRA, leaky bucket and reservation go into debt
    /// that the refill pays back (capped at 2^52 ticks, so that all
    /// arithmetic stays exact), delaying the next admission by the overspend.
    /// The decision is the policy's as it stands after: allowed when the
    /// units fit in every limit, `granted` the units counted. Concurrency
    /// limits refuse it (an invalid argument).
    Record,
}

/// One decision to make: the operation, its cost, and optionally the instant
/// (`None`: the store's clock, or in Redis the server's time).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// What to do.
    pub op: Op,
    /// Units the request weighs on each limit of the policy.
    pub cost: Cost,
    /// The instant to decide at; `None` asks the store.
    pub now: Option<Timestamp>,
    /// For each limit of the policy, in its order, what a store's alert
    /// outbox writes with a crossing of one of its thresholds (who and what
    /// crossed, as the caller names them; shared, not copied, from call to
    /// call). `None`: nothing.
    pub labels: Option<Arc<[Arc<str>]>>,
}

/// What a request weighs on each limit of its policy: one cost for every
/// limit, or one per limit (a row each). An admitted request grants
/// [`Cost::units`], the most any limit is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cost {
    /// The most any limit is asked.
    units: u64,
    /// One cost per limit, in the policy's order; empty: `units` on every
    /// limit.
    per_limit: Vec<u64>,
}

impl Cost {
    /// The same `units` on every limit.
    #[inline]
    pub fn same(units: u64) -> Self {
        Self {
            units,
            per_limit: Vec::new(),
        }
    }

    /// `costs[i]` units on limit `i`, in the policy's order (a gateway
    /// request weighing differently on each of its descriptors); as many as
    /// the policy has limits.
    pub fn per_limit(costs: Vec<u64>) -> Self {
        Self {
            units: costs.iter().copied().max().unwrap_or(0),
            per_limit: costs,
        }
    }

    /// The units the request weighs: the most any limit is asked.
    #[inline]
    pub fn units(&self) -> u64 {
        self.units
    }

    /// The units limit `index` is asked.
    #[inline]
    pub fn of(&self, index: usize) -> u64 {
        self.per_limit.get(index).copied().unwrap_or(self.units)
    }

    /// Each limit's cost, when they have one each.
    #[inline]
    pub fn each(&self) -> Option<&[u64]> {
        (!self.per_limit.is_empty()).then_some(self.per_limit.as_slice())
    }
}

impl Request {
    /// A request for `op` weighing `cost` on every limit, decided at the
    /// store's time.
    pub fn new(op: Op, cost: u64) -> Self {
        Self {
            op,
            cost: Cost::same(cost),
            now: None,
            labels: None,
        }
    }

    /// Weighs the request `costs[i]` on limit `i` of the policy
    /// ([`Cost::per_limit`]).
    #[must_use]
    pub fn with_costs(mut self, costs: Vec<u64>) -> Self {
        self.cost = Cost::per_limit(costs);
        self
    }

    /// The units the request weighs ([`Cost::units`]).
    #[inline]
    pub fn units(&self) -> u64 {
        self.cost.units()
    }

    /// Labels limit `i`'s alert crossings `labels[i]` in a store's outbox
    /// ([`Request::labels`]).
    #[must_use]
    pub fn with_labels(mut self, labels: impl Into<Arc<[Arc<str>]>>) -> Self {
        self.labels = Some(labels.into());
        self
    }

    /// The label of limit `index`'s alert crossings (none: empty).
    pub(crate) fn label_of(&self, index: usize) -> Option<&Arc<str>> {
        self.labels.as_ref().and_then(|labels| labels.get(index))
    }

    /// The cost limit `index` sees.
    #[inline]
    pub(crate) fn cost_of(&self, index: usize) -> u64 {
        self.cost.of(index)
    }

    /// This request as the limits at `indices` of its policy see it, with
    /// operation `op`.
    pub(crate) fn part(&self, op: Op, indices: &[usize]) -> Self {
        let cost = match self.cost.each() {
            None => self.cost.clone(),
            Some(_) => Cost::per_limit(indices.iter().map(|&index| self.cost_of(index)).collect()),
        };
        let labels = self.labels.as_ref().map(|_| {
            indices
                .iter()
                .map(|&index| self.label_of(index).cloned().unwrap_or_else(|| Arc::from("")))
                .collect::<Arc<[Arc<str>]>>()
        });
        Self {
            op,
            cost,
            now: self.now,
            labels,
        }
    }

    /// The request that settles an estimate of `estimate` units taken at
    /// `taken_at` with the `actual` cost: the excess recorded
    /// ([`Op::Record`]), or the unused part given back ([`Op::Refund`]; at
    /// the estimate exactly, a refund of nothing: a look).
    pub fn settlement(taken_at: Timestamp, estimate: u64, actual: u64) -> Self {
        if actual > estimate {
            Self::new(Op::Record, actual - estimate)
        } else {
            Self::new(
                Op::Refund {
                    at: taken_at,
                    lease: None,
                },
                estimate - actual,
            )
        }
    }

    /// Decides at `now` instead of the store's time (tests, simulations, replays).
    #[must_use]
    pub fn at(mut self, now: Timestamp) -> Self {
        self.now = Some(now);
        self
    }
}
