//! The deny cache: a denial with a finite `retry_after`, answered again
//! without calling the store until then.

use std::collections::HashMap;
use std::hash::{BuildHasher as _, Hash as _, Hasher as _};
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use crate::decision::{Decision, Outcome, Path};
use crate::policy::Policy;
use crate::request::{Cost, Op, Request};
use crate::subject::Subject;

/// Denials by subject and policy, answered again until their `retry_after`.
/// Looked up under a read lock and by a hash of the subject and the limit
/// names, so that a decision that finds nothing allocates nothing.
pub(super) struct DenyCache {
    capacity: usize,
    hasher: foldhash::fast::RandomState,
    entries: RwLock<HashMap<u64, Denial>>,
}

struct Denial {
    /// The subject's key, to tell apart subjects whose hashes meet.
    subject: String,
    policy: Policy,
    op: Op,
    cost: Cost,
    outcome: Outcome,
    at: Instant,
    until: Instant,
}

impl DenyCache {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            hasher: foldhash::fast::RandomState::default(),
            entries: RwLock::new(HashMap::new()),
        }
    }

    pub(super) fn cacheable(policy: &Policy, request: &Request) -> bool {
        request.now.is_none()
            && !policy.has_concurrency()
            // A refused check of such a limit still counts, in the store.
            && !policy.records_overage()
            && matches!(request.op, Op::Check | Op::CheckAtMost | Op::Reserve { .. })
    }

    /// Where the denials of `policy` for `subject` are kept: a hash of the
    /// subject and the names of the policy's limits (a server decides many
    /// policies for one subject).
    pub(super) fn key(&self, subject: &Subject, policy: &Policy) -> u64 {
        let mut hasher = self.hasher.build_hasher();
        subject.as_key().hash(&mut hasher);
        for (name, _) in policy.limits() {
            name.hash(&mut hasher);
        }
        hasher.finish()
    }

    /// The remembered denial of this very request, its times brought to now.
    pub(super) fn answer(&self, subject: &Subject, policy: &Policy, request: &Request) -> Option<Outcome> {
        if !Self::cacheable(policy, request) {
            return None;
        }
        let entries = self.entries.read();
        let denial = entries.get(&self.key(subject, policy))?;
        let now = Instant::now();
        // An expired denial is replaced by the next one, or swept when full.
        if now >= denial.until {
            return None;
        }
        let same = denial.subject == subject.as_key()
            && denial.op == request.op
            && denial.cost == request.cost
            && denial.policy == *policy;
        if !same {
            return None;
        }
        let elapsed = now.duration_since(denial.at);
        let mut outcome = denial.outcome.clone();
        drop(entries);
        age(&mut outcome.decision, elapsed);
        for (_, decision) in &mut outcome.limits {
            age(decision, elapsed);
        }
        outcome.path = Path::DenyCache;
        Some(outcome)
    }

    pub(super) fn remember(&self, subject: &Subject, policy: &Policy, request: &Request, outcome: &Outcome) {
        let retry_after = match outcome.decision.retry_after {
            Some(retry_after) if !outcome.decision.allowed && !retry_after.is_zero() => retry_after,
            _ => return,
        };
        if !Self::cacheable(policy, request) {
            return;
        }
        let at = Instant::now();
        let Some(until) = at.checked_add(retry_after) else {
            return;
        };
        let key = self.key(subject, policy);
        let mut entries = self.entries.write();
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.retain(|_, denial| denial.until > at);
            if entries.len() >= self.capacity {
                // Still full of live denials: start again rather than grow.
                entries.clear();
            }
        }
        entries.insert(
            key,
            Denial {
                subject: subject.as_key().to_owned(),
                policy: policy.clone(),
                op: request.op.clone(),
                cost: request.cost.clone(),
                outcome: outcome.clone(),
                at,
                until,
            },
        );
    }

    pub(super) fn forget(&self, subject: &Subject, policy: &Policy) {
        let key = self.key(subject, policy);
        self.entries.write().remove(&key);
    }
}

/// A decision as it reads `elapsed` later: its waits that much shorter.
fn age(decision: &mut Decision, elapsed: Duration) {
    if let Some(retry_after) = &mut decision.retry_after {
        if !decision.allowed {
            *retry_after = retry_after.saturating_sub(elapsed);
        }
    }
    decision.reset_after = decision.reset_after.saturating_sub(elapsed);
}
