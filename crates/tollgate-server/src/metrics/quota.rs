//! The RLQS metrics: streams, buckets, reports, assignments by strategy,
//! and each Envoy's share of each bucket.

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
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StrategyLabel {
    strategy: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShareLabels {
    domain: String,
    bucket: String,
    envoy: String,
}

/// The RLQS metrics.
#[derive(Default)]
pub struct QuotaMetrics {
    streams: Gauge,
    buckets: Gauge,
    reports: Family<DomainLabel, Counter>,
    rejected: Family<ReasonLabel, Counter>,
    assignments: Family<StrategyLabel, Counter>,
    shares: Family<ShareLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    store_errors: Counter,
}

impl QuotaMetrics {
    /// Registers the families in `registry` (prefixed `tollgate_rlqs`).
    pub(super) fn register(&self, registry: &mut Registry) {
        let rlqs = registry.sub_registry_with_prefix("rlqs");
        rlqs.register("streams", "Envoy streams open", self.streams.clone());
        rlqs.register("buckets", "Buckets some Envoy reports on", self.buckets.clone());
        rlqs.register("reports", "Bucket usages reported, per domain", self.reports.clone());
        rlqs.register(
            "reports_rejected",
            "Bucket usages skipped: empty_bucket_id, empty_key, implausible_counts, too_many_buckets",
            self.rejected.clone(),
        );
        rlqs.register(
            "assignments",
            "Actions sent, by strategy: token_bucket, allow_all, deny_all, expire, abandon",
            self.assignments.clone(),
        );
        rlqs.register(
            "share",
            "Requests per second assigned to each Envoy (stream) of each bucket; +Inf when allowed all",
            self.shares.clone(),
        );
        rlqs.register(
            "store_errors",
            "Store calls of the RLQS split that failed",
            self.store_errors.clone(),
        );
    }

    /// The streams open now.
    pub fn streams_open(&self) -> i64 {
        self.streams.get()
    }

    /// `open` streams.
    pub(crate) fn streams(&self, open: usize) {
        self.streams.set(i64::try_from(open).unwrap_or(i64::MAX));
    }

    /// `known` buckets.
    pub(crate) fn buckets(&self, known: usize) {
        self.buckets.set(i64::try_from(known).unwrap_or(i64::MAX));
    }

    /// One usage reported in `domain`.
    pub(crate) fn report(&self, domain: &str) {
        self.reports
            .get_or_create(&DomainLabel {
                domain: domain.to_owned(),
            })
            .inc();
    }

    /// One usage skipped, for `reason`.
    pub(crate) fn rejected(&self, reason: &'static str) {
        self.rejected.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// One action sent, of `strategy` (its label: `token_bucket`,
    /// `allow_all`, `deny_all`, `expire` or `abandon`).
    pub(crate) fn assigned(&self, strategy: &'static str) {
        self.assignments.get_or_create(&StrategyLabel { strategy }).inc();
    }

    /// Envoy `envoy`'s share of `bucket` in `domain`: `rate` per second.
    pub(crate) fn share(&self, domain: &str, bucket: &[(String, String)], envoy: &str, rate: f64) {
        self.shares
            .get_or_create(&share_labels(domain, bucket, envoy))
            .set(rate);
    }

    /// Envoy `envoy` no longer has a share of `bucket`.
    pub(crate) fn forget_share(&self, domain: &str, bucket: &[(String, String)], envoy: &str) {
        self.shares.remove(&share_labels(domain, bucket, envoy));
    }

    /// A store call failed.
    pub(crate) fn store_error(&self) {
        self.store_errors.inc();
    }
}

fn share_labels(domain: &str, bucket: &[(String, String)], envoy: &str) -> ShareLabels {
    ShareLabels {
        domain: domain.to_owned(),
        bucket: bucket_name(bucket),
        envoy: envoy.to_owned(),
    }
}

/// A bucket id as one label: `key=value,key=value`, in key order.
pub(crate) fn bucket_name(bucket: &[(String, String)]) -> String {
    bucket
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",")
}
