//! Decisions over limits kept under several subjects — a gateway's
//! descriptors, each its own subject — all-or-nothing.
//!
//! Limits that one atomic step reaches are decided in it: one subject in the
//! memory store; on Redis every key of one server, or of one Cluster hash
//! slot. Across steps each part consumes and, when any denies (or fails),
//! the parts that consumed give their units back with [`Op::Refund`]. For
//! the time of that second round trip another request can see the units
//! taken and be denied by them; none is ever admitted beyond a limit.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::hash::Hash;

use futures_util::future::join_all;

use super::Store;
use crate::clock::Timestamp;
use crate::decision::{Decision, Outcome, Path};
use crate::error::{Error, Result};
use crate::policy::{Op, Policy, Request};
use crate::subject::Subject;

/// Refuses a spread decision whose subjects do not match its policy, or
/// that names one limit of one subject twice. (The request is validated
/// where it is decided.)
pub(crate) fn check(subjects: &[Subject], policy: &Policy) -> Result<()> {
    if subjects.len() != policy.len() {
        return Err(Error::invalid_argument(format!(
            "{} subjects for a policy of {} limits",
            subjects.len(),
            policy.len()
        )));
    }
    if subjects.len() > 1 {
        let mut seen = HashSet::with_capacity(subjects.len());
        for (subject, (name, _)) in subjects.iter().zip(policy.limits()) {
            if !seen.insert((subject, name)) {
                return Err(Error::invalid_argument(format!(
                    "limit \"{name}\" of subject \"{subject}\" is given twice"
                )));
            }
        }
    }
    Ok(())
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
pub(crate) async fn by_subject<S: Store>(
    store: &S,
    subjects: &[Subject],
    policy: &Policy,
    request: &Request,
) -> Result<Outcome> {
    check(subjects, policy)?;
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
        request.cost,
        decided_at.as_micros(),
        decisions.into_iter(),
    );
    outcome.path = path;
    Ok(outcome)
}
