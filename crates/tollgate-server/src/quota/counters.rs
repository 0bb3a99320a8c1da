//! The counters of a bucket's demand, kept in the store beside its limit as
//! fixed windows of one interval: every replica adds its Envoys' demands,
//! then reads everyone's sums (and the limit's remaining units) back.

use std::collections::HashMap;

use tollgate::{Limit, Op, Path, Spread, Store as _, Subject};

use super::split::{Totals, RUNGS};
use super::Quotas;
use crate::service::Limited;

impl Quotas {
    /// Adds `totals`, this replica's demands on a bucket, to its counters
    /// under `subject`.
    pub(super) async fn add_totals(&self, subject: &Subject, totals: &Totals) {
        let result = match self.demand_rows(subject, None, totals) {
            Ok(spread) => self.service.store().decide_spread(&spread, Op::Record).await.map(drop),
            Err(error) => Err(error),
        };
        if let Err(error) = result {
            self.service.metrics().quota().store_error();
            tracing::debug!(%error, "rlqs: demands could not be added");
        }
    }

    /// Every replica's demands on the block's bucket, and what its limit
    /// has left now.
    pub(super) async fn read_totals(&self, block: &Limited) -> Option<(Totals, f64)> {
        let empty = Totals {
            rungs: vec![0; RUNGS],
            ..Totals::default()
        };
        let spread = self.demand_rows(&block.subject, Some(block), &empty).ok()?;
        let outcome = match self.service.store().decide_spread(&spread, Op::Check).await {
            Ok(outcome) if outcome.path == Path::Store || outcome.path == Path::Local => outcome,
            Ok(_) => return None,
            Err(error) => {
                self.service.metrics().quota().store_error();
                tracing::debug!(%error, "rlqs: demands could not be read");
                return None;
            }
        };
        // Each limit's decision by its name (a policy keeps its own order).
        let decided: HashMap<&str, u64> = outcome
            .limits
            .iter()
            .map(|(name, decision)| (name.as_str(), decision.remaining))
            .collect();
        let count = |name: &str| {
            decided
                .get(name)
                .map_or(0, |remaining| DEMAND_LIMIT - remaining.min(&DEMAND_LIMIT))
        };
        let totals = Totals {
            demand: count(DEMAND),
            envoys: count(ENVOYS),
            rungs: (0..RUNGS).map(|rung| count(&rung_name(rung))).collect(),
        };
        let budget = decided.get(block.name.as_str()).copied().unwrap_or(0);
        Some((totals, budget as f64))
    }

    /// The demand counters of a bucket (and, to read it with them, its
    /// limit), each weighing what `totals` says.
    fn demand_rows(&self, subject: &Subject, limit: Option<&Limited>, totals: &Totals) -> tollgate::Result<Spread> {
        let counter = Limit::fixed_window(DEMAND_LIMIT, self.settings.interval)?;
        let mut rows = Spread::builder();
        rows.row(subject.clone(), DEMAND, counter.clone(), totals.demand);
        rows.row(subject.clone(), ENVOYS, counter.clone(), totals.envoys);
        for (rung, capped) in totals.rungs.iter().enumerate() {
            rows.row(subject.clone(), &rung_name(rung), counter.clone(), *capped);
        }
        if let Some(block) = limit {
            rows.row(block.subject.clone(), &block.name, block.limit.clone(), 0);
        }
        rows.build()
    }
}

/// The counters of a bucket's demand, beside its limit: every Envoy's, in
/// thousandths, and the Envoys.
const DEMAND: &str = "rlqs.demand";
const ENVOYS: &str = "rlqs.envoys";

/// The counter of the demand capped at `rung`, in thousandths.
fn rung_name(rung: usize) -> String {
    format!("rlqs.rung.{rung}")
}

/// The limit of the demand counters: they only count.
const DEMAND_LIMIT: u64 = 1 << 52;
