//! The overrides' metrics: how many each domain has in force, and the
//! changes made through this replica (and the expiries it removed).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DomainLabel {
    domain: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChangeLabels {
    domain: String,
    change: &'static str,
}

/// The overrides' metrics.
#[derive(Default)]
pub struct OverrideMetrics {
    in_force: Family<DomainLabel, Gauge>,
    changes: Family<ChangeLabels, Counter>,
}

impl OverrideMetrics {
    /// Registers the families in `registry` (prefixed `tollgate`).
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register("overrides", "Overrides in force, per domain", self.in_force.clone());
        registry.register(
            "override_changes",
            "Overrides set, deleted or expired through this replica, per domain",
            self.changes.clone(),
        );
    }

    /// `domain` has `count` overrides in force.
    pub fn in_force(&self, domain: &str, count: usize) {
        self.in_force
            .get_or_create(&DomainLabel {
                domain: domain.to_owned(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// One change (`set`, `delete`, `expire`) in `domain`.
    pub fn change(&self, domain: &str, change: &'static str) {
        self.changes
            .get_or_create(&ChangeLabels {
                domain: domain.to_owned(),
                change,
            })
            .inc();
    }
}
