//! Policies: several named limits on one subject, decided all-or-nothing.
//!
//! "10 per second *and* 1000 per hour" is a policy of two limits. A request is
//! admitted only when every limit admits it; when any denies, none consumes.

use std::time::Duration;

use crate::algorithm::{Action, Change, Limit, State, Step, WordKernel};
use crate::clock::{micros, Timestamp};
use crate::decision::{Crossing, Decision, Outcome, Path};
use crate::error::{Error, Result};
use crate::request::{Op, Request};

/// The longest limit name.
pub const MAX_NAME_LEN: usize = 200;

/// Named limits checked together; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    limits: Vec<(String, Limit)>,
    /// Each limit's [`name_hash`], in order: computed once, for the memory
    /// store's lookups.
    name_hashes: Vec<u64>,
    /// Built from named limits: outcomes list each limit's decision.
    named: bool,
    /// The one-word kernel of a policy of one limit whose algorithm offers
    /// one, found once here ([`Policy::kernel`]).
    kernel: Option<WordKernel>,
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
        let kernel = match limits.as_slice() {
            [(_, limit)] => limit.word_kernel(),
            _ => None,
        };
        Self {
            limits,
            name_hashes,
            named,
            kernel,
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

    /// The strongest durability its limits ask for ([`Limit::durable`]).
    pub fn durability(&self) -> Option<crate::Durability> {
        self.limits.iter().filter_map(|(_, limit)| limit.durability()).max()
    }

    /// The policy as JSON that [`Policy::from_value`] reads back as it: a
    /// limit alone (`{"algorithm": …}`) for a one-limit policy of
    /// [`Policy::single`], else its limits by name.
    pub fn to_value(&self) -> serde_json::Value {
        let spec = Limit::to_value;
        match self.limits.as_slice() {
            [(_, limit)] if !self.named => spec(limit),
            limits => limits.iter().map(|(name, limit)| (name.clone(), spec(limit))).collect(),
        }
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
        if matches!(request.op, Op::Check) && request.cost.each().is_none() && !self.has_concurrency() {
            return Ok(());
        }
        self.validate_each(request)
    }

    /// [`Policy::validate`] asking each limit.
    #[inline(never)]
    fn validate_each(&self, request: &Request) -> Result<()> {
        if let Some(costs) = request.cost.each() {
            if costs.len() != self.limits.len() {
                return Err(Error::invalid_argument(format!(
                    "costs has {} entries for a policy of {} limits",
                    costs.len(),
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

    /// Decides `request`, already validated ([`Policy::validate`]), over
    /// every limit, all-or-nothing: the one decision of every store.
    ///
    /// `states[i]` is the stored state of limit `i`; `write(i, change, ttl)`
    /// is called for each state that changed, with the change to commit to
    /// `states[i]` (`ttl`: µs until it carries no information; zero to drop
    /// it). Nothing is committed here: the states are only read. The Lua
    /// function `decide` in the Redis store's script mirrors this one. A
    /// store holding the state of a policy with a [`Policy::kernel`] as one
    /// word decides it with [`Policy::decide_word`] instead, to the same
    /// outcome.
    #[inline]
    pub(crate) fn decide_validated<'r>(
        &self,
        states: &[Option<&State>],
        now: u64,
        request: &'r Request,
        mut write: impl FnMut(usize, Change<'r>, u64),
    ) -> Outcome {
        debug_assert_eq!(states.len(), self.limits.len());
        if let ([(_, limit)], [state]) = (self.limits.as_slice(), states) {
            if !limit.alerts().is_empty() {
                return self.decide_alerting(limit, *state, now, request, write);
            }
            return self.decide_single(
                request,
                now,
                || limit.available(*state, now),
                |action, cost| limit.decide(*state, now, action, cost),
                |change, ttl| write(0, change, ttl),
            );
        }
        // What each limit that alerts had available before.
        let before: Vec<Option<u64>> = if self.limits.iter().any(|(_, limit)| !limit.alerts().is_empty()) {
            self.limits
                .iter()
                .zip(states)
                .map(|((_, limit), state)| (!limit.alerts().is_empty()).then(|| limit.available(*state, now)))
                .collect()
        } else {
            Vec::new()
        };
        let op = &request.op;
        let action = Self::action(op);
        let cost = resolved_cost(request, || {
            self.limits
                .iter()
                .zip(states)
                .map(|((_, limit), state)| limit.available(*state, now))
                .min()
                .unwrap_or(0)
        });
        let cost_of = |index: usize| {
            request
                .cost
                .each()
                .and_then(|costs| costs.get(index).copied())
                .unwrap_or(cost)
        };
        let mut steps = Vec::with_capacity(self.limits.len());
        for (index, ((_, limit), state)) in self.limits.iter().zip(states).enumerate() {
            steps.push(limit.decide(*state, now, action, cost_of(index)));
        }
        let allowed = steps.iter().all(|step| step.decision.allowed);
        if !allowed && !matches!(op, Op::Record | Op::Refund { .. }) {
            // Nothing is consumed: limits that would have admitted report as
            // a peek; a refusing one that records its overage counts it.
            for (index, ((_, limit), (state, step))) in
                self.limits.iter().zip(states.iter().zip(&mut steps)).enumerate()
            {
                if step.decision.allowed {
                    *step = limit.decide(*state, now, action, 0);
                } else if limit.records_overage() && action == Action::Check {
                    *step = limit.decide(*state, now, Action::Record, cost_of(index));
                }
            }
        }
        // What changed: everything when allowed; when denied, only levels
        // stored on first touch (they consume nothing). A limit that alerts
        // and changed reports the thresholds its use rose through.
        let mut crossed = Vec::new();
        for (index, step) in steps.iter_mut().enumerate() {
            if let Some(change) = step.change.take() {
                write(index, change, micros(step.decision.reset_after));
                if let (Some(Some(before)), (_, limit)) = (before.get(index), &self.limits[index]) {
                    Crossing::found(index, limit.alerts(), *before, &step.decision, &mut crossed);
                }
            }
        }
        let mut outcome = self.outcome(op, allowed, cost, now, steps.into_iter().map(|step| step.decision));
        outcome.crossed = crossed;
        outcome
    }

    /// [`Policy::decide_validated`] for one limit that alerts: the
    /// thresholds its use rose through, when the decision changed its state.
    #[inline(never)]
    fn decide_alerting<'r>(
        &self,
        limit: &Limit,
        state: Option<&State>,
        now: u64,
        request: &'r Request,
        mut write: impl FnMut(usize, Change<'r>, u64),
    ) -> Outcome {
        let before = limit.available(state, now);
        let mut changed = false;
        let mut outcome = self.decide_single(
            request,
            now,
            || before,
            |action, cost| limit.decide(state, now, action, cost),
            |change, ttl| {
                changed = true;
                write(0, change, ttl);
            },
        );
        if changed {
            let decision = outcome
                .limits
                .first()
                .map_or(&outcome.decision, |(_, decision)| decision)
                .clone();
            Crossing::found(0, limit.alerts(), before, &decision, &mut outcome.crossed);
        }
        outcome
    }

    /// The first limit's name and its [`name_hash`] (a policy has one at
    /// least): a one-limit policy's.
    #[inline]
    pub(crate) fn first_name(&self) -> (&str, u64) {
        (&self.limits[0].0, self.name_hashes[0])
    }

    /// The one-word kernel of this policy's one limit, when its algorithm
    /// offers one ([`WordKernel`]): a store may then hold the limit's state
    /// as one word and decide it with [`Policy::decide_word`].
    #[inline]
    pub(crate) fn kernel(&self) -> Option<&WordKernel> {
        self.kernel.as_ref()
    }

    /// This policy with no kernel: decided by the general step alone, for
    /// the tests that hold the two equal.
    #[cfg(test)]
    pub(crate) fn without_kernel(mut self) -> Self {
        self.kernel = None;
        self
    }

    /// The kernel by which a check alone may be decided on the word
    /// ([`WordKernel::check`]) with the outcome left unbuilt: none when the
    /// limit counts a refused check's cost.
    #[inline]
    pub(crate) fn check_kernel(&self) -> Option<&WordKernel> {
        self.kernel.as_ref().filter(|_| !self.limits[0].1.records_overage())
    }

    /// The single-limit inline path: `request` (validated) decided by
    /// `kernel`, this policy's [`Policy::kernel`], on the state held as
    /// `word`, to the outcome [`Policy::decide_validated`] gives;
    /// `commit(word)` is called with the new word when it changed, before
    /// the outcome is built (a store that commits by compare-and-swap and
    /// lost the race drops that outcome and decides again).
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    pub(crate) fn decide_word(
        &self,
        kernel: &WordKernel,
        word: u64,
        now: u64,
        request: &Request,
        commit: impl FnOnce(u64),
    ) -> Outcome {
        self.decide_single(
            request,
            now,
            || kernel.available(word, now),
            #[inline(always)]
            |action, cost| kernel.step(word, now, action, cost),
            |word, _| commit(word),
        )
    }

    /// A policy of one limit, whose decision is the policy's: `available()`
    /// and `decide(action, cost)` run that limit on its state, and
    /// `write(change, ttl)` commits the change to its state (`ttl`: µs until
    /// it carries no information) when it changed. The request is already
    /// validated.
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    fn decide_single<'r, C>(
        &self,
        request: &'r Request,
        now: u64,
        available: impl FnOnce() -> u64,
        decide: impl Fn(Action<'r>, u64) -> Step<C>,
        write: impl FnOnce(C, u64),
    ) -> Outcome {
        let single = self.single_step(request, available, decide);
        if let Some(change) = single.step.change {
            write(change, micros(single.step.decision.reset_after));
        }
        self.outcome(
            &request.op,
            single.allowed,
            single.cost,
            now,
            std::iter::once(single.step.decision),
        )
    }

    /// [`Policy::decide_single`] up to its change, not yet committed.
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    fn single_step<'r, C>(
        &self,
        request: &'r Request,
        available: impl FnOnce() -> u64,
        decide: impl Fn(Action<'r>, u64) -> Step<C>,
    ) -> SingleStep<C> {
        let cost = resolved_cost(request, available);
        let action = Self::action(&request.op);
        let cost_seen = request
            .cost
            .each()
            .and_then(|costs| costs.first().copied())
            .unwrap_or(cost);
        // A check, the common case, is decided with its action known here,
        // so that the step inlined for it carries no match on the action.
        let mut step = if action == Action::Check {
            decide(Action::Check, cost_seen)
        } else {
            decide(action, cost_seen)
        };
        let allowed = step.decision.allowed;
        if !allowed && action == Action::Check && self.limits[0].1.records_overage() {
            step = decide(Action::Record, cost_seen);
        }
        SingleStep { step, allowed, cost }
    }

    /// Assembles the outcome from each limit's decision (in the policy's
    /// order), made at `now` (µs since the epoch).
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    pub(crate) fn outcome(
        &self,
        op: &Op,
        allowed: bool,
        cost: u64,
        now: u64,
        decisions: impl ExactSizeIterator<Item = Decision>,
    ) -> Outcome {
        let lease = match op {
            Op::Acquire { lease, .. } if allowed && self.has_concurrency() => Some(lease.clone()),
            _ => None,
        };
        // A record counts, and a refund gives back, whatever the limits say after.
        let granted = if allowed || matches!(op, Op::Record | Op::Refund { .. }) {
            cost
        } else {
            0
        };
        let mut decisions = decisions;
        if !self.named && decisions.len() == 1 {
            if let Some(decision) = decisions.next() {
                return Outcome {
                    decision,
                    granted,
                    lease,
                    limits: Vec::new(),
                    path: Path::Store,
                    decided_at: Timestamp::from_micros(now),
                    crossed: Vec::new(),
                };
            }
        }
        self.outcome_of_each(granted, lease, now, decisions)
    }

    /// [`Policy::outcome`] listing each limit's decision; out of line, so
    /// that the single limit's outcome above is built in place.
    #[inline(never)]
    fn outcome_of_each(
        &self,
        granted: u64,
        lease: Option<String>,
        now: u64,
        decisions: impl Iterator<Item = Decision>,
    ) -> Outcome {
        let limits: Vec<(String, Decision)> = self
            .limits
            .iter()
            .map(|(name, _)| name.clone())
            .zip(decisions)
            .collect();
        Outcome {
            decision: most_restrictive(&limits),
            granted,
            lease,
            limits: if self.named { limits } else { Vec::new() },
            path: Path::Store,
            decided_at: Timestamp::from_micros(now),
            crossed: Vec::new(),
        }
    }
}

/// A policy of one limit decided, its change not yet committed.
struct SingleStep<C> {
    /// The limit's decision and change.
    pub step: Step<C>,
    /// Whether the request was admitted (before a refused check's overage
    /// was recorded).
    pub allowed: bool,
    /// The cost decided on (`check_at_most` resolved).
    pub cost: u64,
}

/// The cost of `request`, with `check_at_most` resolved against
/// `available()`, the least any limit has: as much of the cost as is
/// available, or one unit when nothing is, so that the denial says when one
/// will be.
#[inline]
fn resolved_cost(request: &Request, available: impl FnOnce() -> u64) -> u64 {
    if !matches!(request.op, Op::CheckAtMost) {
        return request.units();
    }
    let available = available();
    let cost = request.units();
    if available == 0 && cost > 0 {
        1
    } else {
        available.min(cost)
    }
}

/// The most restrictive decision ([`Decision::most_restrictive`]), with
/// `wait` the longest of all when it admits.
fn most_restrictive(decisions: &[(String, Decision)]) -> Decision {
    let index = Decision::most_restrictive(decisions.iter().map(|(_, decision)| decision)).unwrap_or(0);
    let mut chosen = decisions[index].1.clone();
    if chosen.allowed {
        chosen.wait = decisions
            .iter()
            .map(|(_, decision)| decision.wait)
            .max()
            .unwrap_or_default();
    }
    chosen
}

impl From<Limit> for Policy {
    fn from(limit: Limit) -> Self {
        Self::single(limit)
    }
}

#[cfg(test)]
mod tests;
