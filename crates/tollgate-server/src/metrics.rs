//! Prometheus metrics, per domain and rule, as envoyproxy/ratelimit counts
//! them: total hits, over limit, near limit (80 % used), within limit, shadow
//! mode; plus store errors, decision latency and configuration reloads.

use std::hash::BuildHasher as _;
use std::sync::RwLock;
use std::time::Duration;

use hashbrown::HashTable;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tollgate::Decision;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    domain: String,
    rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DomainLabels {
    domain: String,
}

type HistogramFamily = Family<DomainLabels, Histogram, fn() -> Histogram>;

/// The counters of one rule, looked up once and kept.
#[derive(Clone)]
struct RuleCounters {
    domain: String,
    rule: String,
    hits: Counter,
    over_limit: Counter,
    near_limit: Counter,
    within_limit: Counter,
    shadow_mode: Counter,
}

/// The service's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    hits: Family<RuleLabels, Counter>,
    over_limit: Family<RuleLabels, Counter>,
    near_limit: Family<RuleLabels, Counter>,
    within_limit: Family<RuleLabels, Counter>,
    shadow_mode: Family<RuleLabels, Counter>,
    store_errors: Family<DomainLabels, Counter>,
    latency: HistogramFamily,
    config_reloads: Counter,
    config_errors: Counter,
    /// Handles by `(domain, rule)`, so a request neither allocates labels
    /// nor hashes them with SipHash in every family.
    cache: RwLock<HashTable<RuleCounters>>,
    /// Latency histograms by domain, likewise.
    histograms: RwLock<HashTable<(String, Histogram)>>,
    hasher: foldhash::fast::RandomState,
}

fn latency_histogram() -> Histogram {
    // 10 µs to about 5 s.
    Histogram::new(exponential_buckets(0.000_01, 2.0, 20))
}

impl Metrics {
    /// Empty metrics, registered under `tollgate_`.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tollgate");
        let metrics = Self {
            hits: Family::default(),
            over_limit: Family::default(),
            near_limit: Family::default(),
            within_limit: Family::default(),
            shadow_mode: Family::default(),
            store_errors: Family::default(),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            config_reloads: Counter::default(),
            config_errors: Counter::default(),
            registry: Registry::default(),
            cache: RwLock::new(HashTable::new()),
            histograms: RwLock::new(HashTable::new()),
            hasher: foldhash::fast::RandomState::default(),
        };
        registry.register("hits", "Hits decided, per domain and rule", metrics.hits.clone());
        registry.register(
            "over_limit",
            "Hits refused as over the limit",
            metrics.over_limit.clone(),
        );
        registry.register(
            "near_limit",
            "Hits admitted with 80 % or more of the limit used",
            metrics.near_limit.clone(),
        );
        registry.register("within_limit", "Hits admitted", metrics.within_limit.clone());
        registry.register(
            "shadow_mode",
            "Hits over the limit but admitted by shadow mode",
            metrics.shadow_mode.clone(),
        );
        registry.register(
            "store_errors",
            "Requests that failed because the store failed",
            metrics.store_errors.clone(),
        );
        registry.register(
            "decision_seconds",
            "Time to decide one request",
            metrics.latency.clone(),
        );
        registry.register(
            "config_reloads",
            "Configurations loaded",
            metrics.config_reloads.clone(),
        );
        registry.register("config_errors", "Configurations refused", metrics.config_errors.clone());
        Self { registry, ..metrics }
    }

    /// Runs `update` on the counters of `(domain, rule)`, creating them once.
    fn with_counters(&self, domain: &str, rule: &str, update: impl FnOnce(&RuleCounters)) {
        let hash = self.hasher.hash_one((domain, rule));
        let matches = |counters: &RuleCounters| counters.domain == domain && counters.rule == rule;
        if let Ok(cache) = self.cache.read() {
            if let Some(counters) = cache.find(hash, matches) {
                update(counters);
                return;
            }
        }
        let rule_labels = RuleLabels {
            domain: domain.to_owned(),
            rule: rule.to_owned(),
        };
        let counters = RuleCounters {
            domain: domain.to_owned(),
            rule: rule.to_owned(),
            hits: self.hits.get_or_create(&rule_labels).clone(),
            over_limit: self.over_limit.get_or_create(&rule_labels).clone(),
            near_limit: self.near_limit.get_or_create(&rule_labels).clone(),
            within_limit: self.within_limit.get_or_create(&rule_labels).clone(),
            shadow_mode: self.shadow_mode.get_or_create(&rule_labels).clone(),
        };
        update(&counters);
        if let Ok(mut cache) = self.cache.write() {
            if cache.find(hash, matches).is_none() {
                cache.insert_unique(hash, counters, |counters| {
                    self.hasher.hash_one((counters.domain.as_str(), counters.rule.as_str()))
                });
            }
        }
    }

    /// Counts one descriptor's decision.
    pub fn record(&self, domain: &str, rule: &str, hits: u64, decision: &Decision, shadow: bool) {
        self.with_counters(domain, rule, |counters| {
            counters.hits.inc_by(hits);
            if decision.allowed {
                counters.within_limit.inc_by(hits);
                // As envoyproxy/ratelimit: the hits that went past 80 % of the limit.
                let threshold = decision.limit / 5 * 4 + decision.limit % 5 * 4 / 5;
                let used_after = decision.limit.saturating_sub(decision.remaining);
                let used_before = used_after.saturating_sub(hits);
                if used_after > threshold {
                    counters.near_limit.inc_by(used_after - used_before.max(threshold));
                }
            } else {
                counters.over_limit.inc_by(hits);
                if shadow {
                    counters.shadow_mode.inc_by(hits);
                }
            }
        });
    }

    /// Counts a request the store failed.
    pub fn store_error(&self, domain: &str) {
        self.store_errors
            .get_or_create(&DomainLabels {
                domain: domain.to_owned(),
            })
            .inc();
    }

    /// Records how long a request took to decide.
    pub fn latency(&self, domain: &str, elapsed: Duration) {
        let hash = self.hasher.hash_one(domain);
        if let Ok(histograms) = self.histograms.read() {
            if let Some((_, histogram)) = histograms.find(hash, |(name, _)| name == domain) {
                histogram.observe(elapsed.as_secs_f64());
                return;
            }
        }
        let labels = DomainLabels {
            domain: domain.to_owned(),
        };
        let histogram = self.latency.get_or_create(&labels).clone();
        histogram.observe(elapsed.as_secs_f64());
        if let Ok(mut histograms) = self.histograms.write() {
            if histograms.find(hash, |(name, _)| name == domain).is_none() {
                histograms.insert_unique(hash, (domain.to_owned(), histogram), |(name, _)| {
                    self.hasher.hash_one(name.as_str())
                });
            }
        }
    }

    /// Counts a configuration put in force (`ok`) or refused.
    pub fn config_loaded(&self, ok: bool) {
        if ok {
            self.config_reloads.inc();
        } else {
            self.config_errors.inc();
        }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
