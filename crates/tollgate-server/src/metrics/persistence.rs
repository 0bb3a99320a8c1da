//! Whether the store keeps the counts across a restart, and how many rules
//! keep state long enough to care.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PersistsLabel {
    persists: &'static str,
}

/// The store's persistence metrics.
#[derive(Default)]
pub struct PersistenceMetrics {
    persists: Family<PersistsLabel, Gauge>,
    lost_on_restart: Gauge,
}

/// Every label `persists` takes.
const LABELS: [&str; 5] = ["aof", "snapshots", "aof+snapshots", "none", "unknown"];

impl PersistenceMetrics {
    /// Registers the families in `registry` (prefixed `tollgate`).
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "store_persistence",
            "1 for what the Redis store keeps across a restart: aof, snapshots, aof+snapshots, none, unknown (CONFIG refused)",
            self.persists.clone(),
        );
        registry.register(
            "rules_lost_on_restart",
            "Rules keeping state for a day or longer on a Redis that persists nothing",
            self.lost_on_restart.clone(),
        );
    }

    /// The store persists as `label` says; `lost` rules would lose their state on its restart.
    pub fn set(&self, label: &'static str, lost: usize) {
        for persists in LABELS {
            self.persists
                .get_or_create(&PersistsLabel { persists })
                .set(i64::from(persists == label));
        }
        self.lost_on_restart.set(i64::try_from(lost).unwrap_or(i64::MAX));
    }
}
