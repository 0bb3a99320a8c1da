//! Decisions over limits kept under several subjects — a gateway's
//! descriptors, each its own subject — all-or-nothing.
//!
//! Limits that one atomic step reaches are decided in it: one subject in the
//! memory store; on Redis every key of one server, or of one Cluster hash
//! slot. Across steps each part consumes and, when any denies (or fails),
//! the parts that consumed give their units back with [`Op::Refund`]. For
//! the time of that second round trip another request can see the units
//! taken and be denied by them; none is ever admitted beyond a limit.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use futures_util::future::join_all;

use super::Store;
use crate::algorithm::Limit;
use crate::clock::Timestamp;
use crate::decision::{Decision, Outcome, Path};
use crate::error::{Error, Result};
use crate::policy::Policy;
use crate::request::{Op, Request};
use crate::subject::Subject;

/// Limits kept under several subjects and decided together, all-or-nothing
/// ([`Store::decide_spread`]): a gateway's descriptors, each its own
/// subject. Built row by row, each row a limit: its subject, its name
/// within the subject, the limit, and the units the request asks of it.
///
/// ```
/// # use std::time::Duration;
/// # use tollgate::{Limit, Spread, Subject};
/// let minute = Duration::from_secs(60);
/// let mut rows = Spread::builder();
/// rows.row(Subject::new("api").and("tenant=acme"), "rule", Limit::fixed_window(100, minute)?, 1);
/// rows.row(Subject::new("api").and("route=/chat"), "rule", Limit::gcra(10, minute, 5)?, 1);
/// let spread = rows.build()?;
/// assert_eq!(spread.len(), 2);
/// # Ok::<(), tollgate::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Spread {
    subjects: Vec<Subject>,
    policy: Policy,
    costs: Vec<u64>,
    /// Row `i`'s alert label ([`Request::labels`]; `None`: none).
    labels: Option<Arc<[Arc<str>]>>,
    /// The instant to decide at (`None`: the store's time).
    now: Option<Timestamp>,
}

/// The rows of a [`Spread`], as they are given.
#[derive(Debug, Default)]
pub struct SpreadBuilder {
    subjects: Vec<Subject>,
    limits: Vec<(String, Limit)>,
    costs: Vec<u64>,
    labels: Vec<Arc<str>>,
}

impl SpreadBuilder {
    /// Adds the limit `name` of `subject`, asked `cost` units; its row.
    /// The same limit of the same subject given again is that row, its
    /// costs summed (one limit weighs the sum of what is asked of it).
    pub fn row(&mut self, subject: Subject, name: &str, limit: Limit, cost: u64) -> usize {
        let given = self
            .subjects
            .iter()
            .zip(&self.limits)
            .position(|(each, (each_name, _))| *each == subject && each_name == name);
        if let Some(row) = given {
            self.costs[row] = self.costs[row].saturating_add(cost);
            return row;
        }
        self.subjects.push(subject);
        self.limits.push((name.to_owned(), limit));
        self.costs.push(cost);
        self.costs.len() - 1
    }

    /// Labels `row`'s alert crossings `label` in a store's outbox
    /// ([`Request::labels`]).
    pub fn label(&mut self, row: usize, label: Arc<str>) {
        // Made only when a row is labelled: most spreads have none.
        if row < self.costs.len() {
            self.labels.resize(self.costs.len(), Arc::from(""));
            self.labels[row] = label;
        }
    }

    /// The spread.
    ///
    /// # Errors
    ///
    /// No row, or limits that cannot be decided together (as
    /// [`Policy::spread`]).
    pub fn build(self) -> Result<Spread> {
        Ok(Spread {
            subjects: self.subjects,
            policy: Policy::spread(self.limits)?,
            costs: self.costs,
            labels: self
                .labels
                .iter()
                .any(|label| !label.is_empty())
                .then(|| Arc::from(self.labels)),
            now: None,
        })
    }
}

impl Spread {
    /// Rows to add, then [`SpreadBuilder::build`].
    pub fn builder() -> SpreadBuilder {
        SpreadBuilder::default()
    }

    /// How many limits (rows) it holds.
    pub fn len(&self) -> usize {
        self.costs.len()
    }

    /// Never true: a spread holds at least one row.
    pub fn is_empty(&self) -> bool {
        self.costs.is_empty()
    }

    /// Row `i`'s subject.
    pub fn subjects(&self) -> &[Subject] {
        &self.subjects
    }

    /// Row `row`'s alert label ([`SpreadBuilder::label`]), if it has one.
    pub fn label(&self, row: usize) -> Option<&str> {
        let label = self.labels.as_ref()?.get(row)?;
        (!label.is_empty()).then_some(&**label)
    }

    /// The limits, row by row, as one policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Decided at `now` rather than the store's time (as [`Request::at`]).
    #[must_use]
    pub fn at(mut self, now: Timestamp) -> Self {
        self.now = Some(now);
        self
    }

    /// The request of `op` over the rows, each asked its cost: one cost
    /// for all when they are equal, else one per row.
    pub fn request(&self, op: Op) -> Request {
        let most = self.costs.iter().copied().max().unwrap_or(0);
        let mut request = Request::new(op, most);
        if self.costs.iter().any(|&cost| cost != most) {
            request = request.with_costs(self.costs.clone());
        }
        request.labels.clone_from(&self.labels);
        match self.now {
            Some(now) => request.at(now),
            None => request,
        }
    }
}

/// The indices `0..len` grouped by `part_of(index)`, in order of first
/// appearance.
pub(crate) fn group<K: Hash + Eq>(len: usize, part_of: impl Fn(usize) -> K) -> Vec<Vec<usize>> {
    let mut part_by_key: HashMap<K, usize> = HashMap::new();
    let mut parts: Vec<Vec<usize>> = Vec::new();
    for index in 0..len {
        let part = *part_by_key.entry(part_of(index)).or_insert_with(|| {
            parts.push(Vec::new());
            parts.len() - 1
        });
        parts[part].push(index);
    }
    parts
}

/// The default [`Store::decide_spread`]: one decision per subject (each
/// validates its part of the request).
pub(crate) async fn by_subject<S: Store>(store: &S, spread: &Spread, op: Op) -> Result<Outcome> {
    let (subjects, policy, request) = (spread.subjects(), spread.policy(), &spread.request(op));
    let parts = group(subjects.len(), |index| &subjects[index]);
    if parts.len() == 1 {
        return store.decide(&subjects[0], policy, request).await;
    }
    decide_parts(policy, request, &parts, |part, policy, request| {
        let subject = &subjects[parts[part][0]];
        async move { store.decide(subject, &policy, &request).await }
    })
    .await
}

/// Decides `policy` in `parts` (indices of its limits), each part with
/// `decide(part, its policy, its request)`, all at once; when any part
/// denies or fails, the parts that consumed are refunded the same way.
///
/// # Errors
///
/// `check_at_most` over several parts (each would grant a different share);
/// a part's fault, once the others are refunded.
pub(crate) async fn decide_parts<F, Fut>(
    policy: &Policy,
    request: &Request,
    parts: &[Vec<usize>],
    decide: F,
) -> Result<Outcome>
where
    F: Fn(usize, Policy, Request) -> Fut,
    Fut: Future<Output = Result<Outcome>>,
{
    if request.op == Op::CheckAtMost {
        return Err(Error::invalid_argument(
            "check_at_most takes limits that one call decides (one subject, or one Redis Cluster slot)",
        ));
    }
    let policies: Vec<Policy> = parts.iter().map(|indices| policy.part(indices)).collect();
    let taken = join_all(
        parts
            .iter()
            .enumerate()
            .map(|(part, indices)| decide(part, policies[part].clone(), request.part(request.op.clone(), indices))),
    )
    .await;
    let allowed = taken
        .iter()
        .all(|outcome| outcome.as_ref().is_ok_and(|outcome| outcome.decision.allowed));
    let mut outcomes = taken;
    // A record counts in every part, whether or not it fits.
    if !allowed && request.op != Op::Record {
        let lease = match &request.op {
            Op::Acquire { lease, .. } => Some(lease.clone()),
            _ => None,
        };
        // Only the parts that consumed give back.
        let refunds = outcomes.iter().enumerate().filter_map(|(part, outcome)| {
            let at = outcome
                .as_ref()
                .ok()
                .filter(|outcome| outcome.decision.allowed)?
                .decided_at;
            let op = Op::Refund {
                at,
                lease: lease.clone(),
            };
            Some((
                part,
                decide(part, policies[part].clone(), request.part(op, &parts[part])),
            ))
        });
        let (refunded, futures): (Vec<usize>, Vec<Fut>) = refunds.unzip();
        for (part, result) in refunded.into_iter().zip(join_all(futures).await) {
            match result {
                // The limits as they stand after the refund.
                Ok(outcome) => outcomes[part] = Ok(outcome),
                Err(fault) => tracing::warn!(
                    error = %fault,
                    "a refund failed: units taken by a refused request stay taken until they lapse"
                ),
            }
        }
    }
    let mut decisions: Vec<Option<Decision>> = vec![None; policy.len()];
    let mut path = Path::Store;
    let mut decided_at = Timestamp::EPOCH;
    for (indices, outcome) in parts.iter().zip(outcomes) {
        let outcome = outcome?;
        if path == Path::Store {
            path = outcome.path;
        }
        decided_at = decided_at.max(outcome.decided_at);
        for (&index, (_, decision)) in indices.iter().zip(outcome.limits) {
            decisions[index] = Some(decision);
        }
    }
    // Every limit is in one part, and each part's outcome lists its limits.
    let decisions: Vec<Decision> = decisions.into_iter().flatten().collect();
    let mut outcome = policy.outcome(
        &request.op,
        allowed,
        request.units(),
        decided_at.as_micros(),
        decisions.into_iter(),
    );
    outcome.path = path;
    Ok(outcome)
}
