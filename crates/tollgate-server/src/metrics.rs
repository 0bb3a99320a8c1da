//! Prometheus metrics, per domain and rule, as envoyproxy/ratelimit counts
//! them: total hits, over limit, near limit (80 % used), within limit, shadow
//! mode; plus store errors, decisions by the path that made them (the
//! store, or its fallbacks when it fails), decision latency and
//! configuration reloads.

use std::hash::BuildHasher as _;
use std::sync::RwLock;
use std::time::Duration;

use hashbrown::HashTable;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tollgate::{Decision, Path};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    domain: String,
    rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    path: String,
}

/// The paths a decision can take, with a counter each.
const PATHS: [Path; 4] = [Path::Store, Path::Local, Path::Policy, Path::DenyCache];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DomainLabels {
    domain: String,
}

type HistogramFamily = Family<DomainLabels, Histogram, fn() -> Histogram>;

/// Metric handles kept by `(domain, rule)`, so a request neither allocates
/// labels nor hashes them with SipHash in every family.
struct Cached<T> {
    domain: String,
    rule: String,
    handles: T,
}

type Cache<T> = RwLock<HashTable<Cached<T>>>;

/// The counters of one rule.
struct RuleCounters {
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
    /// Decisions by path, in the order of [`PATHS`].
    paths: [Counter; 4],
    latency: HistogramFamily,
    config_reloads: Counter,
    config_errors: Counter,
    counters: Cache<RuleCounters>,
    /// Latency histograms by domain (the rule left empty).
    histograms: Cache<Histogram>,
    hasher: foldhash::fast::RandomState,
}

fn latency_histogram() -> Histogram {
    // 10 µs to about 5 s.
    Histogram::new(exponential_buckets(0.000_01, 2.0, 20))
}

impl Metrics {
    /// Empty metrics, registered under `tollgate_`.
    pub fn new() -> Self {
        let mut metrics = Self {
            hits: Family::default(),
            over_limit: Family::default(),
            near_limit: Family::default(),
            within_limit: Family::default(),
            shadow_mode: Family::default(),
            store_errors: Family::default(),
            paths: Default::default(),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            config_reloads: Counter::default(),
            config_errors: Counter::default(),
            registry: Registry::with_prefix("tollgate"),
            counters: RwLock::new(HashTable::new()),
            histograms: RwLock::new(HashTable::new()),
            hasher: foldhash::fast::RandomState::default(),
        };
        metrics
            .registry
            .register("hits", "Hits decided, per domain and rule", metrics.hits.clone());
        metrics.registry.register(
            "over_limit",
            "Hits refused as over the limit",
            metrics.over_limit.clone(),
        );
        metrics.registry.register(
            "near_limit",
            "Hits admitted with 80 % or more of the limit used",
            metrics.near_limit.clone(),
        );
        metrics
            .registry
            .register("within_limit", "Hits admitted", metrics.within_limit.clone());
        metrics.registry.register(
            "shadow_mode",
            "Hits over the limit but admitted by shadow mode",
            metrics.shadow_mode.clone(),
        );
        metrics.registry.register(
            "store_errors",
            "Requests that failed because the store failed",
            metrics.store_errors.clone(),
        );
        let paths = Family::<PathLabels, Counter>::default();
        for (path, counter) in PATHS.iter().zip(&mut metrics.paths) {
            *counter = paths
                .get_or_create(&PathLabels {
                    path: path.as_str().to_owned(),
                })
                .clone();
        }
        metrics.registry.register(
            "decisions_by_path",
            "Store calls by what decided them: store (Redis or memory), local (the \
             in-process fallback while Redis fails), policy (--on-store-error open or \
             closed), deny_cache (a denial answered again until its retry_after)",
            paths,
        );
        metrics.registry.register(
            "decision_seconds",
            "Time to decide one request",
            metrics.latency.clone(),
        );
        metrics.registry.register(
            "config_reloads",
            "Configurations loaded",
            metrics.config_reloads.clone(),
        );
        metrics
            .registry
            .register("config_errors", "Configurations refused", metrics.config_errors.clone());
        metrics
    }

    /// Runs `use_handles` on the handles cached for `(domain, rule)`, making
    /// them with `make` the first time.
    fn with_cached<T>(
        &self,
        cache: &Cache<T>,
        (domain, rule): (&str, &str),
        make: impl FnOnce() -> T,
        use_handles: impl FnOnce(&T),
    ) {
        let hash = self.hasher.hash_one((domain, rule));
        let matches = |cached: &Cached<T>| cached.domain == domain && cached.rule == rule;
        if let Ok(table) = cache.read() {
            if let Some(cached) = table.find(hash, matches) {
                use_handles(&cached.handles);
                return;
            }
        }
        let handles = make();
        use_handles(&handles);
        if let Ok(mut table) = cache.write() {
            if table.find(hash, matches).is_none() {
                let cached = Cached {
                    domain: domain.to_owned(),
                    rule: rule.to_owned(),
                    handles,
                };
                table.insert_unique(hash, cached, |cached| {
                    self.hasher.hash_one((cached.domain.as_str(), cached.rule.as_str()))
                });
            }
        }
    }

    /// Counts one descriptor's decision.
    pub fn record(&self, domain: &str, rule: &str, hits: u64, decision: &Decision, shadow: bool) {
        let make = || {
            let labels = RuleLabels {
                domain: domain.to_owned(),
                rule: rule.to_owned(),
            };
            RuleCounters {
                hits: self.hits.get_or_create(&labels).clone(),
                over_limit: self.over_limit.get_or_create(&labels).clone(),
                near_limit: self.near_limit.get_or_create(&labels).clone(),
                within_limit: self.within_limit.get_or_create(&labels).clone(),
                shadow_mode: self.shadow_mode.get_or_create(&labels).clone(),
            }
        };
        self.with_cached(&self.counters, (domain, rule), make, |counters| {
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

    /// Counts a decision of the store by the path that made it.
    pub fn path(&self, path: Path) {
        if let Some(index) = PATHS.iter().position(|each| *each == path) {
            self.paths[index].inc();
        }
    }

    /// Records how long a request took to decide.
    pub fn latency(&self, domain: &str, elapsed: Duration) {
        let make = || {
            let labels = DomainLabels {
                domain: domain.to_owned(),
            };
            self.latency.get_or_create(&labels).clone()
        };
        self.with_cached(&self.histograms, (domain, ""), make, |histogram| {
            histogram.observe(elapsed.as_secs_f64());
        });
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
