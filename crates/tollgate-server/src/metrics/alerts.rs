//! The alerts' metrics: crossings seen by this replica (each crossing is
//! seen by one replica), deliveries by result, and the outbox's length.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AlertLabels {
    domain: String,
    rule: String,
    threshold: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// The alerts' metrics.
#[derive(Default)]
pub struct AlertMetrics {
    crossed: Family<AlertLabels, Counter>,
    deliveries: Family<ResultLabel, Counter>,
    outbox: Gauge,
    dropped: Counter,
}

impl AlertMetrics {
    /// Registers the families in `registry` (prefixed `tollgate`).
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "alerts",
            "Alert thresholds crossed, seen by this replica (each crossing by one), per domain, rule and threshold",
            self.crossed.clone(),
        );
        registry.register(
            "alert_deliveries",
            "Alert deliveries to the webhook by this replica, by result (delivered, failed)",
            self.deliveries.clone(),
        );
        registry.register(
            "alert_outbox_length",
            "Alerts waiting in the outbox (the Redis stream, or this replica's queue)",
            self.outbox.clone(),
        );
        registry.register(
            "alerts_dropped",
            "Alerts dropped because the outbox was full (its oldest first)",
            self.dropped.clone(),
        );
    }

    /// One threshold crossed.
    pub fn crossed(&self, domain: &str, rule: &str, threshold: u8) {
        self.crossed
            .get_or_create(&AlertLabels {
                domain: domain.to_owned(),
                rule: rule.to_owned(),
                threshold: threshold.to_string(),
            })
            .inc();
    }

    /// One delivery attempt's result.
    pub fn delivery(&self, result: &'static str) {
        self.deliveries.get_or_create(&ResultLabel { result }).inc();
    }

    /// The outbox holds `length` alerts.
    pub fn outbox_length(&self, length: u64) {
        self.outbox.set(i64::try_from(length).unwrap_or(i64::MAX));
    }

    /// `count` alerts dropped from a full outbox.
    pub fn dropped(&self, count: u64) {
        self.dropped.inc_by(count);
    }
}
