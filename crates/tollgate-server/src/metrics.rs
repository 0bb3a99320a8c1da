//! Prometheus metrics, per domain and rule, as envoyproxy/ratelimit counts
//! them: total hits, over limit, near limit (past `NEAR_LIMIT_RATIO`, 80 %,
//! of the limit), within limit, shadow mode; plus store errors, decision
//! latency and configuration reloads; and decisions by the path that made
//! them (the store, or its fallbacks when it fails).
//!
//! Each is exported twice: as `tollgate_*{domain, rule}` counters, and under
//! the names envoyproxy/ratelimit's stats take in Prometheus through its
//! statsd exporter mapping (`ratelimit_service_rate_limit_total_hits{domain,
//! key1, key2}`, `ratelimit_service_config_load_success`, …), so its
//! dashboards and alerts keep working. `rule` and `key1.key2…` are its stat
//! key: the descriptor path of the rule (`key_value.subkey`), or with
//! `detailed_metric` / `value_to_metric` the request's own values.

use std::hash::BuildHasher as _;

use std::sync::RwLock;

use std::time::Duration;

use hashbrown::HashTable;

use prometheus_client::metrics::counter::Counter;

use prometheus_client::metrics::family::Family;

use prometheus_client::metrics::gauge::Gauge;

use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

use prometheus_client::registry::Registry;

use tollgate::{Decision, EngineKind, Path};

mod alerts;
mod labels;
mod overrides;
mod persistence;
mod quota;
mod recent;
mod region;
mod tls;

pub use alerts::AlertMetrics;
pub use overrides::OverrideMetrics;
pub use persistence::PersistenceMetrics;
pub(crate) use quota::bucket_name;
pub use quota::QuotaMetrics;
pub use region::RegionMetrics;
pub use tls::TlsMetrics;

use labels::{
    register_paths, upstream_labels, ConfigLabels, DomainLabels, EngineLabels, ErrorLabels, KeyLabels, RuleLabels,
    Untyped,
};

type HistogramFamily = Family<DomainLabels, Histogram, fn() -> Histogram>;

fn register_source(registry: &mut Registry, info: &Family<ConfigLabels, Gauge>, connected: &Gauge) {
    registry.register(
        "config_info",
        "The configuration in force: its source (file, xds) and version (an xDS version)",
        info.clone(),
    );
    registry.register(
        "xds_connected",
        "1 while the stream to the xDS control plane is open",
        connected.clone(),
    );
}

/// Metric handles kept by `(domain, rule)`, so a request neither allocates
/// labels nor hashes them with SipHash in every family.
struct Cached<T> {
    domain: String,
    rule: String,
    handles: T,
}

type Cache<T> = RwLock<HashTable<Cached<T>>>;

/// The counters of one rule, in both namings.
struct RuleCounters {
    hits: Counter,
    over_limit: Counter,
    near_limit: Counter,
    within_limit: Counter,
    shadow_mode: Counter,
    upstream: [Untyped; 5],
}

/// The families of envoyproxy/ratelimit's names.
struct Upstream {
    /// total_hits, over_limit, near_limit, within_limit, shadow_mode.
    rule: [Family<KeyLabels, Untyped>; 5],
    config_load_success: Untyped,
    config_load_error: Untyped,
    global_shadow_mode: Untyped,
    should_rate_limit_error: Family<ErrorLabels, Untyped>,
}

const UPSTREAM_STATS: [&str; 5] = ["total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"];

/// The service's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    hits: Family<RuleLabels, Counter>,
    over_limit: Family<RuleLabels, Counter>,
    near_limit: Family<RuleLabels, Counter>,
    within_limit: Family<RuleLabels, Counter>,
    shadow_mode: Family<RuleLabels, Counter>,
    store_errors: Family<DomainLabels, Counter>,
    /// Decisions by path, in the order of [`Path::ALL`].
    paths: [Counter; Path::ALL.len()],
    /// 1 for the engine deciding in Redis, 0 for the other (none on memory).
    engine: Family<EngineLabels, Gauge>,
    latency: HistogramFamily,
    config_reloads: Counter,
    config_errors: Counter,
    /// 1 for the configuration in force, by source and version.
    config_info: Family<ConfigLabels, Gauge>,
    /// 1 while the xDS stream is open.
    xds_connected: Gauge,
    upstream: Upstream,
    near_limit_ratio: f32,
    counters: Cache<RuleCounters>,
    /// Latency histograms by domain (the rule left empty).
    histograms: Cache<Histogram>,
    hasher: foldhash::fast::RandomState,
    quota: QuotaMetrics,
    overrides: OverrideMetrics,
    persistence: PersistenceMetrics,
    region: RegionMetrics,
    tls: TlsMetrics,
    alerts: AlertMetrics,
    /// The last minute's latencies, for the console.
    recent: recent::RecentLatency,
}

fn latency_histogram() -> Histogram {
    // 10 µs to about 5 s.
    Histogram::new(exponential_buckets(0.000_01, 2.0, 20))
}

impl Metrics {
    /// Empty metrics, near the limit past 80 % of it.
    pub fn new() -> Self {
        Self::with_near_limit_ratio(0.8)
    }

    /// Empty metrics, near the limit past `ratio` of it (`NEAR_LIMIT_RATIO`).
    #[allow(clippy::too_many_lines)] // one registration per family
    pub fn with_near_limit_ratio(ratio: f32) -> Self {
        let mut metrics = Self {
            hits: Family::default(),
            over_limit: Family::default(),
            near_limit: Family::default(),
            within_limit: Family::default(),
            shadow_mode: Family::default(),
            store_errors: Family::default(),
            paths: Default::default(),
            engine: Family::default(),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            config_reloads: Counter::default(),
            config_errors: Counter::default(),
            config_info: Family::default(),
            xds_connected: Gauge::default(),
            upstream: Upstream {
                rule: Default::default(),
                config_load_success: Untyped::default(),
                config_load_error: Untyped::default(),
                global_shadow_mode: Untyped::default(),
                should_rate_limit_error: Family::default(),
            },
            near_limit_ratio: ratio,
            registry: Registry::default(),
            counters: RwLock::new(HashTable::new()),
            histograms: RwLock::new(HashTable::new()),
            hasher: foldhash::fast::RandomState::default(),
            quota: QuotaMetrics::default(),
            overrides: OverrideMetrics::default(),
            persistence: PersistenceMetrics::default(),
            region: RegionMetrics::default(),
            tls: TlsMetrics::default(),
            alerts: AlertMetrics::default(),
            recent: recent::RecentLatency::default(),
        };
        let tollgate = metrics.registry.sub_registry_with_prefix("tollgate");
        tollgate.register("hits", "Hits decided, per domain and rule", metrics.hits.clone());
        tollgate.register(
            "over_limit",
            "Hits refused as over the limit",
            metrics.over_limit.clone(),
        );
        tollgate.register(
            "near_limit",
            "Hits past the near-limit ratio of the limit",
            metrics.near_limit.clone(),
        );
        tollgate.register("within_limit", "Hits admitted", metrics.within_limit.clone());
        tollgate.register(
            "shadow_mode",
            "Hits over the limit but admitted by a rule in shadow mode",
            metrics.shadow_mode.clone(),
        );
        tollgate.register(
            "store_errors",
            "Requests that failed because the store failed",
            metrics.store_errors.clone(),
        );
        metrics.paths = register_paths(tollgate);
        tollgate.register(
            "store_engine",
            "1 for the engine deciding in Redis: module (Tollgate's Redis module) or lua \
             (the functions library); absent on the memory store",
            metrics.engine.clone(),
        );
        tollgate.register(
            "decision_seconds",
            "Time to decide one request",
            metrics.latency.clone(),
        );
        tollgate.register(
            "config_reloads",
            "Configurations loaded",
            metrics.config_reloads.clone(),
        );
        tollgate.register("config_errors", "Configurations refused", metrics.config_errors.clone());
        register_source(tollgate, &metrics.config_info, &metrics.xds_connected);
        metrics.quota.register(tollgate);
        metrics.overrides.register(tollgate);
        metrics.persistence.register(tollgate);
        metrics.region.register(tollgate);
        metrics.tls.register(tollgate);
        metrics.alerts.register(tollgate);
        let upstream = metrics.registry.sub_registry_with_prefix("ratelimit_service");
        for (stat, family) in UPSTREAM_STATS.iter().zip(&metrics.upstream.rule) {
            upstream.register(
                format!("rate_limit_{stat}"),
                format!("envoyproxy/ratelimit's {stat} stat, per domain and descriptor key"),
                family.clone(),
            );
        }
        upstream.register(
            "config_load_success",
            "Configurations loaded (envoyproxy/ratelimit's name)",
            metrics.upstream.config_load_success.clone(),
        );
        upstream.register(
            "config_load_error",
            "Configurations refused (envoyproxy/ratelimit's name)",
            metrics.upstream.config_load_error.clone(),
        );
        upstream.register(
            "global_shadow_mode",
            "Requests over the limit answered OK by the global shadow mode",
            metrics.upstream.global_shadow_mode.clone(),
        );
        upstream.register(
            "should_rate_limit_error",
            "Requests that failed: invalid (service_error) or store faults (redis_error)",
            metrics.upstream.should_rate_limit_error.clone(),
        );
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

    /// Counts one descriptor's `hits` on the rule whose stat key (without
    /// the domain) is `key`, as envoyproxy/ratelimit counts them: within,
    /// near (the hits past the near-limit ratio) and over the limit (the hits
    /// past the limit), and in shadow mode those a shadow rule let through.
    pub fn record(&self, domain: &str, key: &str, hits: u64, usage: Usage) {
        let make = || {
            let labels = RuleLabels {
                domain: domain.to_owned(),
                rule: key.to_owned(),
            };
            let upstream = upstream_labels(domain, key);
            RuleCounters {
                hits: self.hits.get_or_create(&labels).clone(),
                over_limit: self.over_limit.get_or_create(&labels).clone(),
                near_limit: self.near_limit.get_or_create(&labels).clone(),
                within_limit: self.within_limit.get_or_create(&labels).clone(),
                shadow_mode: self.shadow_mode.get_or_create(&labels).clone(),
                upstream: std::array::from_fn(|stat| self.upstream.rule[stat].get_or_create(&upstream).clone()),
            }
        };
        let Split {
            over,
            near: near_hits,
            within,
            shadow,
        } = usage.split(hits, self.near_limit_ratio);
        self.with_cached(&self.counters, (domain, key), make, |counters| {
            let [up_hits, up_over, up_near, up_within, up_shadow] = &counters.upstream;
            for (counter, upstream, by) in [
                (&counters.hits, up_hits, hits),
                (&counters.over_limit, up_over, over),
                (&counters.near_limit, up_near, near_hits),
                (&counters.within_limit, up_within, within),
                (&counters.shadow_mode, up_shadow, shadow),
            ] {
                counter.inc_by(by);
                upstream.inc_by(by);
            }
        });
    }

    /// The RLQS metrics.
    pub fn quota(&self) -> &QuotaMetrics {
        &self.quota
    }

    /// One override change (`set`, `delete`, `expire`) in `domain`.
    pub fn override_change(&self, domain: &str, change: &'static str) {
        self.overrides.change(domain, change);
    }

    /// The gRPC listener's TLS handshakes.
    pub fn tls(&self) -> &TlsMetrics {
        &self.tls
    }

    /// The alerts' metrics.
    pub fn alerts(&self) -> &AlertMetrics {
        &self.alerts
    }

    /// `domain` has `count` overrides in force.
    pub fn overrides_in_force(&self, domain: &str, count: usize) {
        self.overrides.in_force(domain, count);
    }

    /// The store persists as `label` says (`Persistence::label`); `lost`
    /// rules would lose their state on its restart.
    pub fn store_persistence(&self, label: &'static str, lost: usize) {
        self.persistence.set(label, lost);
    }

    /// The region's metrics (with `--global-redis`).
    pub fn region(&self) -> &RegionMetrics {
        &self.region
    }

    /// Counts a request whose overall OVER_LIMIT the global shadow mode
    /// turned into OK.
    pub fn global_shadow_mode(&self) {
        self.upstream.global_shadow_mode.inc_by(1);
    }

    /// Counts an invalid request.
    pub fn service_error(&self) {
        self.upstream
            .should_rate_limit_error
            .get_or_create(&ErrorLabels {
                err_type: "service_error",
            })
            .inc_by(1);
    }

    /// Counts a request the store failed.
    pub fn store_error(&self, domain: &str) {
        self.upstream
            .should_rate_limit_error
            .get_or_create(&ErrorLabels {
                err_type: "redis_error",
            })
            .inc_by(1);
        self.store_errors
            .get_or_create(&DomainLabels {
                domain: domain.to_owned(),
            })
            .inc();
    }

    /// Counts a decision of the store by the path that made it.
    pub fn path(&self, path: Path) {
        self.paths[path.index()].inc();
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
        self.recent.record(elapsed, unix_secs());
    }

    /// The 99th percentile of the last minute's decision latencies (the
    /// upper bound of its bucket), and how many requests; `None`: none.
    pub fn recent_p99(&self) -> Option<(Duration, u64)> {
        self.recent.p99(unix_secs())
    }

    /// Counts a configuration put in force (`ok`) or refused.
    pub fn config_loaded(&self, ok: bool) {
        if ok {
            self.config_reloads.inc();
            self.upstream.config_load_success.inc_by(1);
        } else {
            self.config_errors.inc();
            self.upstream.config_load_error.inc_by(1);
        }
    }

    /// Says where the configuration in force comes from: `source` (`file`,
    /// `xds`), its `version` (empty for files), and whether the source is
    /// connected (the xDS stream is open).
    pub fn config_source(&self, source: &str, version: &str, connected: bool) {
        self.config_info.clear();
        self.config_info
            .get_or_create(&ConfigLabels {
                source: source.to_owned(),
                version: version.to_owned(),
            })
            .set(1);
        if source == "xds" {
            self.xds_connected.set(i64::from(connected));
        }
    }

    /// Counts the configuration read at start in envoyproxy/ratelimit's
    /// `config_load_success` / `config_load_error` (as it counts its first
    /// load), not in Tollgate's reload counters.
    pub fn initial_config(&self, ok: bool) {
        if ok {
            self.upstream.config_load_success.inc_by(1);
        } else {
            self.upstream.config_load_error.inc_by(1);
        }
    }

    /// Marks `engine` as the one deciding in Redis.
    pub fn engine(&self, engine: EngineKind) {
        for kind in EngineKind::ALL {
            self.engine
                .get_or_create(&EngineLabels { engine: kind.name() })
                .set(i64::from(kind == engine));
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

/// What one descriptor did to its limit, as envoyproxy/ratelimit's stats
/// count it: hits used before and after the request, of `limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// The limit.
    pub limit: u64,
    /// Hits used before this request.
    pub before: u64,
    /// Hits used with this request's (what it would have used, when over).
    pub after: u64,
    /// Over the limit.
    pub over: bool,
    /// The rule is in shadow mode.
    pub shadow: bool,
}

impl Usage {
    /// The usage a library decision reports, for `hits`.
    pub fn of(decision: &Decision, hits: u64, shadow: bool) -> Self {
        let used = decision.limit.saturating_sub(decision.remaining);
        let (before, after) = if decision.allowed {
            (used.saturating_sub(hits), used)
        } else {
            (used, used.saturating_add(hits))
        };
        Self {
            limit: decision.limit,
            before,
            after,
            over: !decision.allowed,
            shadow,
        }
    }

    /// How `hits` count, as envoyproxy/ratelimit counts them: over the
    /// limit (the hits past it), near it (those past `near_ratio` of it, and
    /// not over), within it, and in shadow mode (over, but let through).
    pub fn split(&self, hits: u64, near_ratio: f32) -> Split {
        // envoyproxy/ratelimit computes the threshold in 32-bit floats.
        let near = (self.limit as f32 * near_ratio).floor() as u64;
        let Self {
            limit, before, after, ..
        } = *self;
        let mut split = Split::default();
        if self.over {
            split.over = if before >= limit || after <= limit {
                hits
            } else {
                // Only the hits past the limit are over; those before it near.
                split.near = limit - near.max(before);
                after - limit
            };
            if self.shadow {
                split.shadow = split.over;
            }
        } else {
            split.within = hits;
            if after > near {
                split.near = if before >= near { hits } else { after - near };
            }
        }
        split
    }
}

/// How one descriptor's hits count ([`Usage::split`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Split {
    /// Past the limit.
    pub over: u64,
    /// Past the near-limit ratio, not over.
    pub near: u64,
    /// Within the limit.
    pub within: u64,
    /// Over, let through by a shadow rule.
    pub shadow: u64,
}

/// Seconds since the Unix epoch.
fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

#[cfg(test)]
mod tests;
