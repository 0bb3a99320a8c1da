//! Limits from envoyproxy/ratelimit's YAML configuration format, unchanged
//! and complete.
//!
//! ```yaml
//! domain: messaging
//! descriptors:
//!   - key: message_type
//!     value: marketing
//!     descriptors:
//!       - key: to_number
//!         rate_limit:
//!           unit: day
//!           requests_per_unit: 5
//!   - key: to_number
//!     rate_limit:
//!       unit: day
//!       requests_per_unit: 100
//! ```
//!
//! Every field of envoyproxy/ratelimit's current release is read: `domain`,
//! `descriptors` (`key`, `value`, `rate_limit`, `shadow_mode`, `quota_mode`,
//! `detailed_metric`, `value_to_metric`, `share_threshold`, `metadata`) and
//! `rate_limit` (`unit`, `requests_per_unit`, `unlimited`, `name`,
//! `replaces`). As there, a key of that set is accepted anywhere and ignored
//! where it means nothing, any other key is refused, a scalar is read as the
//! text it was written as (`value: 0123` is "0123"), YAML anchors, aliases
//! and merge keys (`<<: *defaults`) apply, and a file is refused for
//! the same faults: an empty domain or key, an unknown unit, a unit on an
//! unlimited rule, an empty or self `replaces`, `share_threshold` without a
//! wildcard, two descriptors of one list with the same `key_value`.
//!
//! A `rate_limit` without an `algorithm` block is a fixed window of one
//! `unit`, counted as envoyproxy/ratelimit counts it: a descriptor that goes
//! over still adds its hits (usage that happened; the limit records its
//! overage). Tollgate's extension is the optional `algorithm` block, any
//! limit of the library (`{algorithm: gcra, rate: 10, period: 1s, burst:
//! 20}`), all-or-nothing unless it says `overage: record`; `unit` and
//! `requests_per_unit` then only describe the limit to Envoy and may be left
//! out.
//!
//! Matching follows envoyproxy/ratelimit: for each entry of a request's
//! descriptor, in order, the node whose `key_value` is the entry's wins, then
//! the first wildcard node (in file order) whose `key_value` pattern matches
//! (`*` anywhere, any run of characters including none), then the node with
//! the key and no value; a limit applies only when the request's descriptor is
//! exactly as deep as the node that holds it.
//!
//! Errors name the file and the line.
//!
//! The same model comes from a control plane too: [`resource`] reads
//! `RateLimitConfig` resources (xDS) through the same reader and checks.
//!
//! The module is split by job: the model here, `yaml` reads a file,
//! `resource` a control plane's resource, `lookup` matches a request's
//! descriptor, `load` reads files and directories into a [`Config`].

mod load;
mod lookup;
pub mod resource;
mod yaml;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use tollgate::{Limit, LimitSpec};

pub use self::load::LoadOptions;
pub use self::lookup::{exact_stat_key, wildcard_match, Below};
pub(crate) use self::yaml::rule_from_json;
pub use self::yaml::{RateLimitError, RuleJsonError};
pub use crate::unit::Unit;

/// A rule: what applies to the descriptors that reach one node.
#[derive(Debug, Clone, Serialize)]
pub struct Rule {
    /// The rule's place in the tree (`message_type_marketing.to_number`):
    /// envoyproxy/ratelimit's stat key without the domain, the label of its
    /// metrics.
    pub path: String,
    /// The `name` given in the file, if any (what `replaces` refers to).
    pub name: Option<String>,
    /// The unit reported to Envoy.
    pub unit: Option<Unit>,
    /// The request count per unit reported to Envoy.
    pub requests_per_unit: Option<u64>,
    /// What applies.
    pub limit: RuleLimit,
    /// Names of rules this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// Decide and count, but never deny.
    pub shadow_mode: bool,
    /// One of the request's alternatives (envoyproxy/ratelimit's
    /// `quota_mode`): over its limit, it refuses the request only when every
    /// alternative descriptor of the request is over (and reports its own
    /// OVER_LIMIT).
    #[serde(rename = "quota_mode")]
    pub alternative: bool,
    /// Label metrics with the request's own descriptor values.
    pub detailed_metric: bool,
    /// What an alert of this rule names of it (made once, on first use).
    #[serde(skip)]
    pub(crate) alert_label: std::sync::OnceLock<Option<std::sync::Arc<str>>>,
}

/// What a rule does to the descriptors it matches.
#[derive(Debug, Clone)]
pub enum RuleLimit {
    /// A limit of the library.
    Limited(Limit),
    /// `unlimited: true`: never limited.
    Unlimited,
    /// `requests_per_unit: 0`: always over the limit (a block list).
    Blocked,
}

impl RuleLimit {
    /// The window of a fixed-window limit aligned on the epoch (what
    /// envoyproxy/ratelimit counts in), whose `duration_until_reset` is the
    /// time to the window's end (a calendar window's is its decision's).
    pub fn fixed_window(&self) -> Option<Duration> {
        match self {
            Self::Limited(limit) => match limit.spec() {
                LimitSpec::FixedWindow(spec) => spec.window,
                _ => None,
            },
            Self::Unlimited | Self::Blocked => None,
        }
    }
}

impl Serialize for RuleLimit {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Limited(limit) => limit.spec().serialize(serializer),
            Self::Unlimited => serializer.serialize_str("unlimited"),
            Self::Blocked => serializer.serialize_str("blocked"),
        }
    }
}

/// One node of a domain's descriptor tree.
#[derive(Debug, Clone, Serialize)]
pub struct Node {
    /// The descriptor entry's key.
    pub key: String,
    /// The value it must have: exact, a pattern with `*` wildcards, or any (`None`).
    pub value: Option<String>,
    /// What applies at this depth, if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<Rule>,
    /// Every value matching this node's wildcard shares one counter.
    #[serde(skip_serializing_if = "is_false")]
    pub share_threshold: bool,
    /// Metrics name the request's value at this depth.
    #[serde(skip_serializing_if = "is_false")]
    pub value_to_metric: bool,
    /// `metadata`, as written (envoyproxy/ratelimit hands it to Envoy in
    /// dynamic metadata).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
    /// Deeper nodes.
    #[serde(skip_serializing_if = "Level::is_empty")]
    pub descriptors: Level,
    /// `key`, or `key_value`: what envoyproxy/ratelimit matches on.
    #[serde(skip)]
    composite: String,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_false(value: &bool) -> bool {
    !*value
}

/// The nodes of one list, indexed as envoyproxy/ratelimit looks them up.
#[derive(Debug, Clone, Default)]
pub struct Level {
    nodes: Vec<Node>,
    /// Node by `key` / `key_value`.
    by_composite: HashMap<String, usize>,
    /// Wildcard nodes in file order: the node and its `key_value` split on `*`.
    wildcards: Vec<(usize, Vec<String>)>,
}

impl Level {
    /// The nodes, in file order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// True when the list holds no node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// How many nodes the list holds.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    fn contains(&self, composite: &str) -> bool {
        self.by_composite.contains_key(composite)
    }

    fn push(&mut self, node: Node) {
        let index = self.nodes.len();
        if node.composite.contains('*') {
            let parts = node.composite.split('*').map(str::to_owned).collect();
            self.wildcards.push((index, parts));
        }
        self.by_composite.insert(node.composite.clone(), index);
        self.nodes.push(node);
    }
}

impl Serialize for Level {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.nodes.serialize(serializer)
    }
}

/// The limits of one domain (from one file, or several merged).
#[derive(Debug, Clone, Serialize)]
pub struct Domain {
    /// The domain's name.
    pub domain: String,
    /// The file it was read from (the first, when merged).
    pub file: PathBuf,
    /// The top level of its tree.
    pub descriptors: Level,
    /// Some node has `value_to_metric` (metrics then look at every level).
    #[serde(skip)]
    value_to_metric: bool,
}

/// The rule a request descriptor meets, and how to name its counter and metrics.
#[derive(Debug, Clone)]
pub struct Found<'a> {
    /// The rule.
    pub rule: &'a Rule,
    /// Entries matched by a `share_threshold` wildcard: their index and the
    /// pattern that stands for their value in the counter's name, so that
    /// every matching value shares one counter.
    pub shared: Vec<(usize, &'a str)>,
    /// envoyproxy/ratelimit's stat key (without the domain) when it is not
    /// the rule's path (`detailed_metric`, `value_to_metric`).
    pub stat_key: Option<String>,
    /// The `metadata` of the node holding the rule.
    pub metadata: Option<&'a serde_json::Value>,
}

impl Found<'_> {
    /// The stat key without the domain: the metrics' label.
    pub fn stat_key(&self) -> &str {
        self.stat_key.as_deref().unwrap_or(&self.rule.path)
    }
}

/// Every domain in force.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Config {
    /// Domains by name.
    pub domains: BTreeMap<String, Domain>,
}

impl Config {
    /// Every rule of every domain, with its domain, in file order.
    pub fn rules(&self) -> Vec<(&str, &Rule)> {
        fn level<'a>(out: &mut Vec<(&'a str, &'a Rule)>, domain: &'a str, nodes: &'a Level) {
            for node in nodes.nodes() {
                if let Some(rule) = &node.rule {
                    out.push((domain, rule));
                }
                level(out, domain, &node.descriptors);
            }
        }
        let mut out = Vec::new();
        for (name, domain) in &self.domains {
            level(&mut out, name, &domain.descriptors);
        }
        out
    }

    /// envoyproxy/ratelimit's debug view (`/rlconfig`): one line per rule,
    /// `<domain>.<path>: unit=<UNIT> requests_per_unit=<n>, shadow_mode: <bool>`.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for (domain, rule) in self.rules() {
            out.push_str(&rule.dump_line(domain));
            out.push('\n');
        }
        out
    }
}

impl Rule {
    /// The rule's line of `/rlconfig`, as envoyproxy/ratelimit writes it:
    /// `<domain>.<path>: unit=<UNIT> requests_per_unit=<n>, shadow_mode: <bool>`.
    pub fn dump_line(&self, domain: &str) -> String {
        let requests = self.requests_per_unit.unwrap_or_else(|| match &self.limit {
            RuleLimit::Limited(limit) => limit.capacity(),
            RuleLimit::Unlimited | RuleLimit::Blocked => 0,
        });
        format!(
            "{domain}.{}: unit={} requests_per_unit={requests}, shadow_mode: {}",
            self.path,
            self.unit.map_or("UNKNOWN", Unit::name),
            self.shadow_mode
        )
    }
}

/// A configuration file that cannot be used: where, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file at fault.
    pub file: PathBuf,
    /// The line at fault, when known.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file.display(), self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

impl std::error::Error for ConfigError {}
