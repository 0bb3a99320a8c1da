//! The labels of the Prometheus families, and envoyproxy/ratelimit's stat
//! names.

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use tollgate::Path;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RuleLabels {
    pub(super) domain: String,
    pub(super) rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PathLabels {
    pub(super) path: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct EngineLabels {
    pub(super) engine: &'static str,
}

/// Registers `decisions_by_path` and returns its counters, in the order of [`Path::ALL`].
pub(super) fn register_paths(registry: &mut Registry) -> [Counter; Path::ALL.len()] {
    let paths = Family::<PathLabels, Counter>::default();
    let counters = Path::ALL.map(|path| {
        paths
            .get_or_create(&PathLabels {
                path: path.as_str().to_owned(),
            })
            .clone()
    });
    registry.register(
        "decisions_by_path",
        "Store calls by what decided them: store (Redis or memory), local (the \
         in-process fallback while Redis fails), policy (--on-store-error open or \
         closed), deny_cache (a denial answered again until its retry_after), \
         leased (a block of units this process took earlier, or a denial it remembers)",
        paths,
    );
    counters
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ConfigLabels {
    pub(super) source: String,
    pub(super) version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DomainLabels {
    pub(super) domain: String,
}

/// The labels envoyproxy/ratelimit's statsd exporter mapping gives its stats:
/// the domain and the first two parts of the descriptor path (`key2` empty,
/// so absent, for a path of one part).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KeyLabels {
    pub(super) domain: String,
    pub(super) key1: String,
    pub(super) key2: Option<String>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ErrorLabels {
    pub(super) err_type: &'static str,
}

/// A counter exported under its bare name, as envoyproxy/ratelimit's are
/// (OpenMetrics would add `_total` to a counter's): an untyped sample.
#[derive(Clone, Debug, Default)]
pub(super) struct Untyped(pub(super) Counter);

impl Untyped {
    pub(super) fn inc_by(&self, by: u64) {
        self.0.inc_by(by);
    }
}

impl TypedMetric for Untyped {
    const TYPE: MetricType = MetricType::Unknown;
}

impl EncodeMetric for Untyped {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.0.get())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Unknown
    }
}

/// The labels of a stat key as envoyproxy/ratelimit's statsd exporter
/// mapping makes them, after its stat name sanitizing (`:` and `|` become
/// `_`, so do the dots of an IPv4 address).
pub(super) fn upstream_labels(domain: &str, key: &str) -> KeyLabels {
    let full = sanitize(&format!("{domain}.{key}"));
    let mut parts = full.split('.');
    KeyLabels {
        domain: parts.next().unwrap_or_default().to_owned(),
        key1: parts.next().unwrap_or_default().to_owned(),
        key2: parts.next().map(str::to_owned),
    }
}

/// envoyproxy/ratelimit's `SanitizeStatName`.
pub(super) fn sanitize(name: &str) -> String {
    let name = name.replace([':', '|'], "_");
    let bytes = name.as_bytes();
    let mut out = String::with_capacity(name.len());
    let mut at = 0;
    while at < bytes.len() {
        if let Some(len) = ipv4_at(&bytes[at..]) {
            out.push_str(&name[at..at + len].replace('.', "_"));
            at += len;
        } else {
            let next = name[at..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&name[at..at + next]);
            at += next;
        }
    }
    out
}

/// The length of `\d{1,3}(\.\d{1,3}){3}` at the start of `bytes`, if any
/// (the longest match, as Go's leftmost-first regexp finds it).
pub(super) fn ipv4_at(bytes: &[u8]) -> Option<usize> {
    let mut at = 0;
    for group in 0..4 {
        if group > 0 {
            if bytes.get(at) != Some(&b'.') {
                return None;
            }
            at += 1;
        }
        let digits = bytes[at..]
            .iter()
            .take(3)
            .take_while(|byte| byte.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        at += digits;
    }
    Some(at)
}
