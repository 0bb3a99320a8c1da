//! Limits from envoyproxy/ratelimit's YAML configuration format, unchanged.
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
//! A `rate_limit` without an `algorithm` block is a fixed window of one
//! `unit`, as in envoyproxy/ratelimit. Tollgate's extension is the optional
//! `algorithm` block, any limit of the library (`{algorithm: gcra, rate: 10,
//! period: 1s, burst: 20}`); `unit` and `requests_per_unit` then only
//! describe the limit to Envoy and may be left out.
//!
//! Matching follows envoyproxy/ratelimit: for each entry of a request's
//! descriptor, in order, the node with the same key and value wins, then the
//! first wildcard (`value: "foo*"`) whose prefix matches, then the node with
//! the key and no value; a limit applies only when the request's descriptor is
//! exactly as deep as the node that holds it.
//!
//! Errors name the file and the line.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};
use tollgate::{Limit, LimitSpec};

/// The units of envoyproxy/ratelimit, with their lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Unit {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day.
    Day,
    /// Seven days.
    Week,
    /// Thirty days, as envoyproxy/ratelimit counts a month.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// The length of one unit.
    pub fn duration(self) -> Duration {
        let seconds = match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3_600,
            Self::Day => 86_400,
            Self::Week => 7 * 86_400,
            Self::Month => 30 * 86_400,
            Self::Year => 365 * 86_400,
        };
        Duration::from_secs(seconds)
    }

    /// The protobuf enum value of `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit`.
    pub fn proto(self) -> i32 {
        match self {
            Self::Second => 1,
            Self::Minute => 2,
            Self::Hour => 3,
            Self::Day => 4,
            Self::Month => 5,
            Self::Year => 6,
            Self::Week => 7,
        }
    }

    /// The name in protobuf's JSON mapping (`"SECOND"`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Second => "SECOND",
            Self::Minute => "MINUTE",
            Self::Hour => "HOUR",
            Self::Day => "DAY",
            Self::Week => "WEEK",
            Self::Month => "MONTH",
            Self::Year => "YEAR",
        }
    }

    /// Reads a unit name in any case (`second`, `SECOND`).
    pub fn parse(name: &str) -> Option<Self> {
        let unit = match name.to_ascii_lowercase().as_str() {
            "second" => Self::Second,
            "minute" => Self::Minute,
            "hour" => Self::Hour,
            "day" => Self::Day,
            "week" => Self::Week,
            "month" => Self::Month,
            "year" => Self::Year,
            _ => return None,
        };
        Some(unit)
    }
}

impl<'de> Deserialize<'de> for Unit {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Self::parse(&name).ok_or_else(|| {
            de::Error::custom(format!(
                "unknown unit \"{name}\" (expected second, minute, hour, day, week, month or year)"
            ))
        })
    }
}

/// A rule: what applies to the descriptors that reach one node.
#[derive(Debug, Clone, Serialize)]
pub struct Rule {
    /// The rule's place in the tree (`message_type_marketing.to_number`),
    /// the label of its metrics.
    pub path: String,
    /// The `name` given in the file, if any (what `replaces` refers to).
    pub name: Option<String>,
    /// The unit reported to Envoy.
    pub unit: Option<Unit>,
    /// The request count per unit reported to Envoy.
    pub requests_per_unit: Option<u64>,
    /// What applies.
    pub quota: Quota,
    /// Names of rules this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// Decide and count, but never deny.
    pub shadow_mode: bool,
    /// Label metrics with the request's own descriptor values.
    pub detailed_metric: bool,
    /// A wildcard rule whose matches all share one counter (`share_threshold`).
    pub shared: bool,
}

/// What a rule does to the descriptors it matches.
#[derive(Debug, Clone)]
pub enum Quota {
    /// A limit of the library.
    Limited(Limit),
    /// `unlimited: true`: never limited.
    Unlimited,
    /// `requests_per_unit: 0`: always over the limit (a block list).
    Blocked,
}

impl Serialize for Quota {
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
    /// The value it must have: exact, a `prefix*` wildcard, or any (`None`).
    pub value: Option<String>,
    /// What applies at this depth, if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<Rule>,
    /// Deeper nodes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub descriptors: Vec<Node>,
}

/// The limits of one domain, from one file.
#[derive(Debug, Clone, Serialize)]
pub struct Domain {
    /// The domain's name.
    pub domain: String,
    /// The file it was read from.
    pub file: PathBuf,
    /// The top level of its tree.
    pub descriptors: Vec<Node>,
}

/// Every domain in force.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Config {
    /// Domains by name.
    pub domains: BTreeMap<String, Domain>,
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

// --- The file format, as read. -------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    domain: String,
    #[serde(default, deserialize_with = "descriptors")]
    descriptors: Vec<RawNode>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    key: String,
    #[serde(default, deserialize_with = "scalar")]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<RawRateLimit>,
    #[serde(default, deserialize_with = "descriptors")]
    descriptors: Vec<RawNode>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    share_threshold: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplaces {
    name: String,
}

/// A `rate_limit` block, validated as it is read so errors carry its line.
struct RawRateLimit {
    unit: Option<Unit>,
    requests_per_unit: Option<u64>,
    name: Option<String>,
    replaces: Vec<String>,
    quota: Quota,
}

impl<'de> Deserialize<'de> for RawRateLimit {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Fields {
            unit: Option<Unit>,
            requests_per_unit: Option<u64>,
            #[serde(default)]
            unlimited: bool,
            name: Option<String>,
            #[serde(default)]
            replaces: Vec<RawReplaces>,
            #[serde(default, deserialize_with = "algorithm")]
            algorithm: Option<Limit>,
        }
        let fields = Fields::deserialize(deserializer)?;
        let replaces = fields.replaces.into_iter().map(|replaces| replaces.name).collect();
        if fields.unlimited {
            if fields.algorithm.is_some() {
                return Err(de::Error::custom("rate_limit: unlimited cannot have an algorithm"));
            }
            return Ok(Self {
                unit: fields.unit,
                requests_per_unit: fields.requests_per_unit,
                name: fields.name,
                replaces,
                quota: Quota::Unlimited,
            });
        }
        let quota = match (fields.algorithm, fields.unit, fields.requests_per_unit) {
            (Some(limit), _, _) => Quota::Limited(limit),
            (None, Some(_), Some(0)) => Quota::Blocked,
            (None, Some(unit), Some(requests)) => Limit::fixed_window(requests, unit.duration())
                .map(Quota::Limited)
                .map_err(|error| de::Error::custom(format!("rate_limit: requests_per_unit: {error}")))?,
            (None, None, _) => return Err(de::Error::custom("rate_limit: missing field \"unit\"")),
            (None, Some(_), None) => return Err(de::Error::custom("rate_limit: missing field \"requests_per_unit\"")),
        };
        Ok(Self {
            unit: fields.unit,
            requests_per_unit: fields.requests_per_unit,
            name: fields.name,
            replaces,
            quota,
        })
    }
}

/// An `algorithm` block, validated where it stands (so errors carry its line).
fn algorithm<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Limit>, D::Error> {
    let value = serde_json::Value::deserialize(deserializer)?;
    LimitSpec::from_value(value)
        .and_then(LimitSpec::build)
        .map(Some)
        .map_err(|error| de::Error::custom(format!("algorithm: {error}")))
}

/// A YAML scalar read as text (`value: 123` is the string "123").
fn scalar<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    let value = Option::<serde_yaml_ng::Value>::deserialize(deserializer)?;
    match value {
        None | Some(serde_yaml_ng::Value::Null) => Ok(None),
        Some(serde_yaml_ng::Value::String(text)) => Ok(Some(text)),
        Some(serde_yaml_ng::Value::Number(number)) => Ok(Some(number.to_string())),
        Some(serde_yaml_ng::Value::Bool(flag)) => Ok(Some(flag.to_string())),
        Some(_) => Err(de::Error::custom("value must be a string")),
    }
}

/// A list of descriptors, refusing two nodes with the same key and value.
///
/// Each node is checked against those before it as it is read, so the error
/// carries the line of the duplicate.
fn descriptors<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<RawNode>, D::Error> {
    struct Nodes;

    struct Unique<'a>(&'a [RawNode]);

    impl<'de> de::DeserializeSeed<'de> for Unique<'_> {
        type Value = RawNode;

        fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<RawNode, D::Error> {
            let node = RawNode::deserialize(deserializer)?;
            let first = self
                .0
                .iter()
                .position(|other| other.key == node.key && other.value == node.value);
            if let Some(first) = first {
                let value = node
                    .value
                    .as_deref()
                    .map(|value| format!(" value \"{value}\""))
                    .unwrap_or_default();
                return Err(de::Error::custom(format!(
                    "entry {} (key \"{}\"{value}) duplicates entry {first}",
                    self.0.len(),
                    node.key
                )));
            }
            Ok(node)
        }
    }

    impl<'de> de::Visitor<'de> for Nodes {
        type Value = Vec<RawNode>;

        fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
            formatter.write_str("a list of descriptors")
        }

        fn visit_unit<E: de::Error>(self) -> Result<Vec<RawNode>, E> {
            Ok(Vec::new())
        }

        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<RawNode>, A::Error> {
            let mut nodes = Vec::new();
            while let Some(node) = seq.next_element_seed(Unique(&nodes))? {
                nodes.push(node);
            }
            Ok(nodes)
        }
    }

    deserializer.deserialize_any(Nodes)
}

fn build(nodes: Vec<RawNode>, parent: &str) -> Vec<Node> {
    nodes
        .into_iter()
        .map(|raw| {
            let step = match &raw.value {
                Some(value) => format!("{}_{value}", raw.key),
                None => raw.key.clone(),
            };
            let path = if parent.is_empty() {
                step
            } else {
                format!("{parent}.{step}")
            };
            let rule = raw.rate_limit.map(|rate_limit| Rule {
                path: path.clone(),
                name: rate_limit.name,
                unit: rate_limit.unit,
                requests_per_unit: rate_limit.requests_per_unit,
                quota: rate_limit.quota,
                replaces: rate_limit.replaces,
                shadow_mode: raw.shadow_mode,
                detailed_metric: raw.detailed_metric,
                shared: raw.share_threshold,
            });
            Node {
                key: raw.key,
                value: raw.value,
                rule,
                descriptors: build(raw.descriptors, &path),
            }
        })
        .collect()
}

impl Domain {
    /// Reads one domain from YAML `text`; `file` names it in errors.
    ///
    /// # Errors
    ///
    /// Malformed YAML, unknown fields, units or algorithm fields, negative
    /// numbers, duplicate descriptors: with the line.
    pub fn parse(text: &str, file: &Path) -> Result<Self, ConfigError> {
        let raw: RawFile = serde_yaml_ng::from_str(text).map_err(|error| ConfigError {
            file: file.to_owned(),
            line: error.location().map(|location| location.line()),
            message: strip_location(&error.to_string()).replace('`', "\""),
        })?;
        if raw.domain.is_empty() {
            return Err(ConfigError {
                file: file.to_owned(),
                line: Some(1),
                message: "domain must not be empty".to_owned(),
            });
        }
        Ok(Self {
            domain: raw.domain,
            file: file.to_owned(),
            descriptors: build(raw.descriptors, ""),
        })
    }

    /// The rule for a request descriptor's entries, matched as
    /// envoyproxy/ratelimit does (see the module docs).
    pub fn lookup<'a>(&'a self, entries: &[(String, String)]) -> Option<&'a Rule> {
        let mut level = &self.descriptors;
        let mut found = None;
        for (depth, (key, value)) in entries.iter().enumerate() {
            let keyed = || level.iter().filter(move |node| node.key == *key);
            let node = keyed()
                .find(|node| node.value.as_deref() == Some(value.as_str()))
                .or_else(|| {
                    keyed().find(|node| {
                        node.value
                            .as_deref()
                            .and_then(|pattern| pattern.strip_suffix('*'))
                            .is_some_and(|prefix| value.starts_with(prefix))
                    })
                })
                .or_else(|| keyed().find(|node| node.value.is_none()))?;
            if depth == entries.len() - 1 {
                found = node.rule.as_ref();
            }
            level = &node.descriptors;
        }
        found
    }
}

/// serde_yaml_ng puts "at line L column C" in its message; the location is
/// reported separately, so drop it.
fn strip_location(message: &str) -> String {
    match message.find(" at line ") {
        Some(at) => message[..at].to_owned(),
        None => message.to_owned(),
    }
}

impl Config {
    /// Loads a file, or every `*.yaml` / `*.yml` file of a directory (one
    /// domain per file).
    ///
    /// # Errors
    ///
    /// The first file that cannot be read or used, or a domain defined twice
    /// (naming both files).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let unreadable = |file: &Path, error: std::io::Error| ConfigError {
            file: file.to_owned(),
            line: None,
            message: format!("cannot read: {error}"),
        };
        let files = if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|error| unreadable(path, error))?
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .filter(|file| {
                    file.is_file()
                        && file
                            .extension()
                            .is_some_and(|extension| extension == "yaml" || extension == "yml")
                })
                .collect();
            files.sort();
            files
        } else {
            vec![path.to_owned()]
        };
        let mut config = Self::default();
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|error| unreadable(&file, error))?;
            config.add(Domain::parse(&text, &file)?)?;
        }
        Ok(config)
    }

    /// Adds a domain.
    ///
    /// # Errors
    ///
    /// When the domain is already defined.
    pub fn add(&mut self, domain: Domain) -> Result<(), ConfigError> {
        if let Some(existing) = self.domains.get(&domain.domain) {
            return Err(ConfigError {
                file: domain.file.clone(),
                line: Some(1),
                message: format!(
                    "duplicate domain \"{}\" (already in {})",
                    domain.domain,
                    existing.file.display()
                ),
            });
        }
        self.domains.insert(domain.domain.clone(), domain);
        Ok(())
    }

    /// Every rule of every domain with a name, by domain and name.
    pub fn named_rule(&self, domain: &str, name: &str) -> Option<&Rule> {
        fn search<'a>(nodes: &'a [Node], name: &str) -> Option<&'a Rule> {
            nodes.iter().find_map(|node| {
                node.rule
                    .as_ref()
                    .filter(|rule| rule.name.as_deref() == Some(name))
                    .or_else(|| search(&node.descriptors, name))
            })
        }
        search(&self.domains.get(domain)?.descriptors, name)
    }
}
