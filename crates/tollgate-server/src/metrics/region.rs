//! A region's view of its global limits (`--global-redis`): whether home
//! answers, the round trip to it, the outbox of reports not yet counted
//! there, and per global rule its fills and what its share holds.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use tollgate::{RegionStats, RuleStats};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegionLabel {
    region: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabel {
    region: String,
    rule: String,
}

type Seconds = Gauge<f64, AtomicU64>;

/// The region's metrics; nothing is written without `--global-redis`.
#[derive(Default)]
pub struct RegionMetrics {
    home_reachable: Family<RegionLabel, Gauge>,
    round_trip: Family<RegionLabel, Seconds>,
    outbox: Family<RegionLabel, Gauge>,
    forwarded: Family<RegionLabel, Gauge>,
    fill_failures: Family<RegionLabel, Gauge>,
    share: Family<RuleLabel, Gauge>,
    fills: Family<RuleLabel, Gauge>,
    taken: Family<RuleLabel, Gauge>,
    fill_seconds: Family<RuleLabel, Seconds>,
}

fn count(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl RegionMetrics {
    /// Registers the families in `registry` (prefixed `tollgate`).
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "region_home_reachable",
            "1 while the home Redis of global limits answers this region",
            self.home_reachable.clone(),
        );
        registry.register(
            "region_home_round_trip_seconds",
            "The round trip of a fill from the home Redis, smoothed",
            self.round_trip.clone(),
        );
        registry.register(
            "region_outbox_reports",
            "Usage reports recorded in this region and not yet counted at home",
            self.outbox.clone(),
        );
        registry.register(
            "region_reports_forwarded",
            "Usage reports this process counted at home (each once)",
            self.forwarded.clone(),
        );
        registry.register(
            "region_fill_failures",
            "Fills of a share that found home unreachable",
            self.fill_failures.clone(),
        );
        registry.register(
            "region_share_units",
            "What the region's share of a global rule held after the last decision on it",
            self.share.clone(),
        );
        registry.register(
            "region_fills",
            "Blocks of a global rule this process took from home into the region's shares",
            self.fills.clone(),
        );
        registry.register(
            "region_units_taken",
            "Units of a global rule home granted into the region's shares through this process",
            self.taken.clone(),
        );
        registry.register(
            "region_fill_seconds",
            "The last fill's latency, per global rule",
            self.fill_seconds.clone(),
        );
    }

    /// Sets every family from the region's `stats` and `rules`.
    pub fn set(&self, stats: &RegionStats, rules: &[RuleStats]) {
        let region = RegionLabel {
            region: stats.region.clone(),
        };
        self.home_reachable
            .get_or_create(&region)
            .set(i64::from(stats.home_reachable));
        self.round_trip
            .get_or_create(&region)
            .set(stats.round_trip.as_secs_f64());
        self.outbox.get_or_create(&region).set(count(stats.outbox));
        self.forwarded.get_or_create(&region).set(count(stats.forwarded));
        self.fill_failures
            .get_or_create(&region)
            .set(count(stats.fill_failures));
        for rule in rules {
            let label = RuleLabel {
                region: stats.region.clone(),
                rule: rule.rule.clone(),
            };
            self.share.get_or_create(&label).set(count(rule.share_left));
            self.fills.get_or_create(&label).set(count(rule.fills));
            self.taken.get_or_create(&label).set(count(rule.units_taken));
            self.fill_seconds
                .get_or_create(&label)
                .set(rule.last_fill.as_secs_f64());
        }
    }
}
