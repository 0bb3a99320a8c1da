//! Policies: several named limits on one subject, decided all-or-nothing.
//!
//! "10 per second *and* 1000 per hour" is a policy of two limits. A request is
//! admitted only when every limit admits it; when any denies, none consumes.

mod decide;

use std::time::Duration;

pub(crate) use self::decide::{Ask, CheckOf, Slots};
use crate::algorithm::{Action, Limit};
use crate::clock::{micros, Timestamp};
use crate::error::{Error, Result};

/// The longest limit name.
pub const MAX_NAME_LEN: usize = 200;

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
    /// [`Outcome::decided_at`]): a reservation cancelled, or the part of a
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
    /// Units the request weighs.
    pub cost: u64,
    /// The instant to decide at; `None` asks the store.
    pub now: Option<Timestamp>,
    /// A cost for each limit of the policy, in its order, instead of `cost`
    /// for all (a gateway request weighing differently on each of its
    /// descriptors). Empty: `cost` for every limit.
    pub costs: Vec<u64>,
}

impl Request {
    /// A request for `op` weighing `cost`, decided at the store's time.
    pub fn new(op: Op, cost: u64) -> Self {
        Self {
            op,
            cost,
            now: None,
            costs: Vec::new(),
        }
    }

    /// Weighs the request `costs[i]` on limit `i` of the policy.
    #[must_use]
    pub fn with_costs(mut self, costs: Vec<u64>) -> Self {
        self.costs = costs;
        self
    }

    /// The cost limit `index` sees.
    pub(crate) fn cost_of(&self, index: usize) -> u64 {
        self.cost_of_resolved(index, self.cost)
    }

    /// The cost limit `index` sees once the request's own is resolved to
    /// `cost` (`check_at_most` takes what is available).
    #[inline]
    pub(crate) fn cost_of_resolved(&self, index: usize, cost: u64) -> u64 {
        self.costs.get(index).copied().unwrap_or(cost)
    }

    /// This request as the limits at `indices` of its policy see it, with
    /// operation `op`.
    pub(crate) fn part(&self, op: Op, indices: &[usize]) -> Self {
        let costs = if self.costs.is_empty() {
            Vec::new()
        } else {
            indices.iter().map(|&index| self.cost_of(index)).collect()
        };
        Self {
            op,
            cost: self.cost,
            now: self.now,
            costs,
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

/// Named limits checked together; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    limits: Vec<(String, Limit)>,
    /// Each limit's [`name_hash`], in order: computed once, for the memory
    /// store's lookups.
    name_hashes: Vec<u64>,
    /// Built from named limits: outcomes list each limit's decision.
    named: bool,
}

/// The hash of a limit's name, the same in every run: names come from the
/// operator, not from requests, so a fixed seed gives nothing away.
pub(crate) fn name_hash(name: &[u8]) -> u64 {
    use std::hash::BuildHasher as _;
    foldhash::fast::FixedState::with_seed(0x746f_6c6c_6761_7465).hash_one(name)
}

fn check_name(name: &str) -> Result<()> {
    // Letters, digits and the bytes a subject encoding uses (so a name may be
    // an encoded descriptor, hashed with '#' when long): never '{', '}',
    // spaces or quotes.
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.~/@=+!,;%:#".contains(&b));
    if valid {
        Ok(())
    } else {
        Err(Error::invalid_limit(format!(
            "limit name \"{name}\" must be 1 to {MAX_NAME_LEN} letters, digits or any of _-.~/@=+!,;%:#"
        )))
    }
}

impl Policy {
    /// A policy of one limit, named after its algorithm; its outcomes carry
    /// no per-limit list.
    pub fn single(limit: Limit) -> Self {
        Self::of(vec![(limit.algorithm().to_owned(), limit)], false)
    }

    /// The policy of `limits`, checked; `named`: its outcomes list each
    /// limit's decision.
    fn of(limits: Vec<(String, Limit)>, named: bool) -> Self {
        let name_hashes = limits.iter().map(|(name, _)| name_hash(name.as_bytes())).collect();
        Self {
            limits,
            name_hashes,
            named,
        }
    }

    /// Builds a policy from `(name, limit)` pairs.
    ///
    /// # Errors
    ///
    /// When there is no limit, a name is not 1 to 200 letters,
    /// digits or any of `_-.~/@=+!,;%:#`, or a name repeats.
    pub fn new<N: Into<String>>(limits: impl IntoIterator<Item = (N, Limit)>) -> Result<Self> {
        Self::named(limits, false)
    }

    /// Builds a policy whose limits live under several subjects, as a
    /// [`Spread`](crate::Spread) holds them: as [`Policy::new`], except
    /// that a name may repeat (a limit is told apart by its subject too).
    ///
    /// # Errors
    ///
    /// When there is no limit, or a name is not 1 to 200 letters, digits or
    /// any of `_-.~/@=+!,;%:#`.
    pub fn spread<N: Into<String>>(limits: impl IntoIterator<Item = (N, Limit)>) -> Result<Self> {
        Self::named(limits, true)
    }

    /// [`Policy::new`], or with `repeats` [`Policy::spread`].
    fn named<N: Into<String>>(limits: impl IntoIterator<Item = (N, Limit)>, repeats: bool) -> Result<Self> {
        let limits: Vec<(String, Limit)> = limits.into_iter().map(|(name, limit)| (name.into(), limit)).collect();
        if limits.is_empty() {
            return Err(Error::invalid_limit("a policy needs at least one limit"));
        }
        for (at, (name, _)) in limits.iter().enumerate() {
            check_name(name)?;
            if !repeats && limits[..at].iter().any(|(other, _)| other == name) {
                return Err(Error::invalid_limit(format!("limit name \"{name}\" is used twice")));
            }
        }
        // Leased together or not at all: a block is taken from every limit.
        let leased: Vec<&str> = limits
            .iter()
            .filter(|(_, limit)| limit.lease().is_some())
            .map(|(name, _)| name.as_str())
            .collect();
        if !leased.is_empty() && leased.len() < limits.len() {
            let bare = limits
                .iter()
                .find(|(_, limit)| limit.lease().is_none())
                .map_or("", |(name, _)| name.as_str());
            return Err(Error::invalid_limit(format!(
                "{bare}.lease: every limit of a policy needs a lease when one has it ({} has one)",
                leased[0]
            )));
        }
        Ok(Self::of(limits, true))
    }

    /// The policy of the limits at `indices`, in that order (names kept).
    pub(crate) fn part(&self, indices: &[usize]) -> Self {
        Self::of(indices.iter().map(|&index| self.limits[index].clone()).collect(), true)
    }

    /// Reads a limit (`{"algorithm": …}`) or a policy of named limits
    /// (`{"per_second": {…}, "per_hour": {…}}`) from JSON.
    ///
    /// # Errors
    ///
    /// When the text is not a JSON object or any limit is invalid; the message
    /// names the limit and the field (`per_hour.window: …`).
    pub fn from_json(text: &str) -> Result<Self> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|error| Error::invalid_limit(format!("invalid JSON: {error}")))?;
        Self::from_value(value)
    }

    /// Like [`Policy::from_json`], from a parsed value.
    ///
    /// # Errors
    ///
    /// As [`Policy::from_json`].
    pub fn from_value(value: serde_json::Value) -> Result<Self> {
        let serde_json::Value::Object(fields) = value else {
            return Err(Error::invalid_limit("a limit or policy must be a JSON object"));
        };
        if fields.contains_key("algorithm") {
            let limit = Limit::from_value(serde_json::Value::Object(fields))?;
            return Ok(Self::single(limit));
        }
        let mut limits = Vec::with_capacity(fields.len());
        for (name, value) in fields {
            let limit = Limit::from_value(value).map_err(|error| error.context(&name))?;
            limits.push((name, limit));
        }
        Self::new(limits)
    }

    /// The lease its limits are taken in ([`Limit::with_lease`]): the
    /// shortest of theirs; `None` when they carry none.
    pub fn lease(&self) -> Option<Duration> {
        self.limits.iter().map(|(_, limit)| limit.lease()).min().flatten()
    }

    /// The limits, in order.
    pub fn limits(&self) -> impl ExactSizeIterator<Item = (&str, &Limit)> {
        self.limits.iter().map(|(name, limit)| (name.as_str(), limit))
    }

    /// Each limit with its name and the name's [`name_hash`], in order.
    #[inline]
    pub(crate) fn hashed_limits(&self) -> impl ExactSizeIterator<Item = (&str, u64, &Limit)> {
        self.limits
            .iter()
            .zip(&self.name_hashes)
            .map(|((name, limit), &hash)| (name.as_str(), hash, limit))
    }

    /// Limit `index` with its name and the name's [`name_hash`].
    #[inline]
    pub(crate) fn hashed_limit(&self, index: usize) -> (&str, u64, &Limit) {
        let (name, limit) = &self.limits[index];
        (name.as_str(), self.name_hashes[index], limit)
    }

    /// What a refund of units taken at `at` depends on besides its cost,
    /// one key per limit, when every limit's refunds add up: two refunds
    /// with the same keys, applied at one moment, do what one refund of
    /// their summed cost does. `None` when a limit's do not (a sliding log
    /// takes back entries of its own).
    pub fn refund_keys(&self, at: Timestamp) -> Option<Vec<u64>> {
        self.limits.iter().map(|(_, limit)| limit.refund_key(at)).collect()
    }

    /// How many limits the policy holds.
    pub fn len(&self) -> usize {
        self.limits.len()
    }

    /// Never true: a policy holds at least one limit.
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }

    /// True when a limit is a concurrency limiter (taken with leases).
    #[inline]
    pub fn has_concurrency(&self) -> bool {
        self.limits.iter().any(|(_, limit)| limit.is_concurrency())
    }

    /// The action every limit sees for `op`; `check_at_most` is resolved to a
    /// `check` of what is available by the caller.
    pub(crate) fn action(op: &Op) -> Action<'_> {
        match op {
            Op::Check | Op::CheckAtMost => Action::Check,
            Op::Reserve { max_wait } => Action::Reserve(max_wait.map(micros)),
            Op::Acquire { lease, max_wait } => Action::Acquire {
                lease: Some(lease),
                max_wait: max_wait.map(micros),
            },
            Op::Release { lease } => Action::Release(lease),
            Op::Refund { at, lease } => Action::Refund {
                at: at.as_micros(),
                lease: lease.as_deref(),
            },
            Op::Record => Action::Record,
        }
    }

    /// True when a limit counts the cost of a check it refuses
    /// ([`Limit::recording_overage`]).
    pub fn records_overage(&self) -> bool {
        self.limits.iter().any(|(_, limit)| limit.records_overage())
    }

    /// Refuses a request some limit cannot run, before any store is asked.
    ///
    /// # Errors
    ///
    /// As [`Limit::supports`], prefixed with the limit's name in a named
    /// policy; per-limit costs that do not match the policy.
    #[inline]
    pub(crate) fn validate(&self, request: &Request) -> Result<()> {
        // The common case: every limit but a concurrency one takes a check.
        if matches!(request.op, Op::Check) && request.costs.is_empty() && !self.has_concurrency() {
            return Ok(());
        }
        self.validate_each(request)
    }

    /// [`Policy::validate`] for a check of `cost` units, without a request
    /// to build.
    ///
    /// # Errors
    ///
    /// As [`Policy::validate`].
    #[inline]
    pub(crate) fn validate_check(&self, cost: u64) -> Result<()> {
        if self.has_concurrency() {
            return self.validate_each(&Request::new(Op::Check, cost));
        }
        Ok(())
    }

    /// [`Policy::validate`] asking each limit.
    #[inline(never)]
    fn validate_each(&self, request: &Request) -> Result<()> {
        if !request.costs.is_empty() {
            if request.costs.len() != self.limits.len() {
                return Err(Error::invalid_argument(format!(
                    "costs has {} entries for a policy of {} limits",
                    request.costs.len(),
                    self.limits.len()
                )));
            }
            if request.op == Op::CheckAtMost {
                return Err(Error::invalid_argument(
                    "check_at_most takes one cost, not one per limit",
                ));
            }
        }
        let action = Self::action(&request.op);
        for (index, (name, limit)) in self.limits.iter().enumerate() {
            limit.supports(action, request.cost_of(index)).map_err(|error| {
                if self.named {
                    error.context(name)
                } else {
                    error
                }
            })?;
        }
        Ok(())
    }
}

impl From<Limit> for Policy {
    fn from(limit: Limit) -> Self {
        Self::single(limit)
    }
}
