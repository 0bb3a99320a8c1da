//! Deciding the limits of a request's items in the store, counted as
//! envoyproxy/ratelimit counts them (see the module above).

use std::time::Duration;

use futures_util::future::join_all;
use tollgate::{Decision, Op, Policy, Spread, Store};

use super::matching::{Item, Matched};
use super::Service;

impl Service {
    /// Decides the limits of `items` (see [`Service::should_rate_limit`]),
    /// leaving each one's decision in it; the instant the store decided at
    /// (the latest, over several calls), if it was asked.
    pub(super) async fn decide_all(
        &self,
        items: &mut [Item<'_>],
        charge: Charge,
    ) -> Result<Option<u64>, tollgate::Error> {
        let mut decided_at: Option<u64> = None;
        let note = |seen: Option<u64>, at: u64| Some(seen.map_or(at, |seen| seen.max(at)));
        // Shadow descriptors: each alone (they never refuse the others).
        let shadows: Vec<usize> = (0..items.len())
            .filter(|&index| items[index].limited().is_some() && items[index].shadow)
            .collect();
        let outcomes = join_all(shadows.chunks(1).map(|one| self.decide_together(&*items, one, charge))).await;
        for outcome in outcomes {
            let (decisions, at) = outcome?;
            decided_at = note(decided_at, at);
            set_decisions(items, decisions);
        }
        // Alternative descriptors: all of them (shadow ones included), and
        // those that already failed (blocked ones).
        let alternatives = items
            .iter()
            .filter(|item| item.alternative && (item.limited().is_some() || matches!(item.matched, Matched::Blocked)))
            .count();
        let mut failed_alternatives = items
            .iter()
            .filter(|item| item.alternative && matches!(item.matched, Matched::Blocked) && item.is_over())
            .count();
        let mut batch: Vec<usize> = (0..items.len()).filter(|&index| items[index].is_enforced()).collect();
        if !self.options.stop_increment_when_over && charge == Charge::Check {
            // Upstream's default: every descriptor counted as upstream counts
            // adds its cost, over or not, whatever the others say.
            let recording: Vec<usize> = batch
                .iter()
                .copied()
                .filter(|&index| {
                    items[index]
                        .limited()
                        .is_some_and(|limited| limited.limit.records_overage())
                })
                .collect();
            if !recording.is_empty() {
                let (decisions, at) = self.decide_together(&*items, &recording, Charge::Record).await?;
                decided_at = note(decided_at, at);
                set_decisions(items, decisions);
                batch.retain(|index| !recording.contains(index));
            }
        }
        // A blocking rule already refuses the request (one not an
        // alternative, or every alternative): the others are only looked
        // at, so that a refused request consumes nothing.
        let blocked = items
            .iter()
            .any(|item| !item.alternative && matches!(item.matched, Matched::Blocked) && item.is_over());
        if blocked || (alternatives > 0 && failed_alternatives == alternatives) {
            if !batch.is_empty() {
                let (decisions, at) = self.decide_together(&*items, &batch, Charge::Peek).await?;
                decided_at = note(decided_at, at);
                set_decisions(items, decisions);
            }
            return Ok(decided_at);
        }
        loop {
            if batch.is_empty() {
                return Ok(decided_at);
            }
            let (decisions, at) = self.decide_together(&*items, &batch, charge).await?;
            decided_at = note(decided_at, at);
            set_decisions(items, decisions);
            let mut enforced_denied = false;
            let mut newly_failed = 0;
            for &index in &batch {
                if items[index].is_over() {
                    if items[index].alternative {
                        newly_failed += 1;
                    } else {
                        enforced_denied = true;
                    }
                }
            }
            // Refused (nothing consumed), or admitted (all consumed).
            if enforced_denied || newly_failed == 0 || failed_alternatives + newly_failed == alternatives {
                return Ok(decided_at);
            }
            // Some alternatives are over but the request goes on:
            // decide again without them, so that the others consume.
            failed_alternatives += newly_failed;
            batch.retain(|&index| !items[index].is_over());
        }
    }

    /// Decides the limits of `items` at `indices` as one all-or-nothing
    /// policy; each one's decision (by its index), and the store's instant.
    pub(super) async fn decide_together(
        &self,
        items: &[Item<'_>],
        indices: &[usize],
        charge: Charge,
    ) -> Result<(Vec<(usize, Decision)>, u64), tollgate::Error> {
        // A descriptor sent twice is one limit (one row), weighing the sum of its costs.
        let mut rows = Spread::builder();
        let mut row_of = Vec::with_capacity(indices.len());
        for &index in indices {
            let item = &items[index];
            let Some(limited) = item.limited() else { continue };
            let cost = match charge {
                Charge::Check | Charge::Estimate | Charge::Record | Charge::Refund { .. } => item.cost,
                Charge::Peek => 0,
            };
            let limit = if charge == Charge::Estimate {
                limited.limit.clone().refusing_overage()
            } else {
                limited.limit.clone()
            };
            let row = rows.row(limited.subject.clone(), &limited.name, limit, cost);
            if let Some(label) = &limited.alert {
                rows.label(row, std::sync::Arc::clone(label));
            }
            row_of.push((index, row));
        }
        let spread = rows.build()?;
        let op = match charge {
            Charge::Check | Charge::Estimate => gateway_op(spread.policy()),
            Charge::Record => Op::Record,
            Charge::Refund { at } => Op::Refund {
                at: tollgate::Timestamp::from_micros(at),
                lease: None,
            },
            Charge::Peek => Op::Check,
        };
        let outcome = self.store.decide_spread(&spread, op).await?;
        self.metrics.path(outcome.path);
        if !outcome.crossed.is_empty() {
            let keys = |row: usize| {
                let subject = spread.subjects().get(row).map_or("", |subject| subject.as_key());
                let name = spread.policy().limits().nth(row).map_or("", |(name, _)| name);
                format!("{subject}\u{1f}{name}")
            };
            let labels = |row: usize| spread.label(row);
            self.note_crossings(&outcome, &labels, &keys);
        }
        let decisions = row_of
            .into_iter()
            .map(|(index, row)| (index, outcome.limits[row].1.clone()))
            .collect();
        Ok((decisions, outcome.decided_at.as_micros()))
    }
}

/// How each descriptor's cost is charged to its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Charge {
    /// Checked, as a gateway request.
    Check,
    /// Checked as an estimate: all-or-nothing, a limit that records its
    /// overage counts nothing when refused.
    Estimate,
    /// Counted whether or not it fits.
    Record,
    /// Given back, taken at `at` (µs).
    Refund { at: u64 },
    /// Not at all: a look at each limit (the request is refused already).
    Peek,
}

/// Puts each decision into the item at its index.
pub(super) fn set_decisions(items: &mut [Item<'_>], decisions: Vec<(usize, Decision)>) {
    for (index, decision) in decisions {
        items[index].decision = Some(decision);
    }
}

/// The operation a gateway request runs on `policy`: a check, or, when a
/// rule is a concurrency limit, an acquire whose lease ends with its ttl (a
/// gateway request has no release).
fn gateway_op(policy: &Policy) -> Op {
    if policy.has_concurrency() {
        Op::Acquire {
            lease: format!("{:016x}", fastrand::u64(..)),
            max_wait: Some(Duration::ZERO),
        }
    } else {
        Op::Check
    }
}
