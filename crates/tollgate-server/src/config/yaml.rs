//! The file format, as envoyproxy/ratelimit reads it: hand-written serde
//! visitors, so that every error carries its line and every key is checked
//! where it stands.

use std::fmt;

use std::path::Path;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use serde::Deserialize;

use tollgate::Limit;

mod values;

use super::{ConfigError, Domain, Level, Node, Rule, RuleLimit, Unit};
use values::{composite, other_key, path_of, strip_location, yaml_to_json, Count, Flag, Keys, ListOfMaps, Text};

/// The keys envoyproxy/ratelimit accepts, anywhere in a file.
const KEYS: [&str; 16] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// The error that sends a file with YAML merge keys (`<<: *defaults`) to be
/// read again with its merges applied.
const MERGE_KEY: &str = "a YAML merge key (<<)";

/// A domain's file, as read.
struct RawFile {
    domain: String,
    descriptors: Level,
}

impl<'de> Deserialize<'de> for RawFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct File;
        impl<'de> Visitor<'de> for File {
            type Value = RawFile;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a map with domain and descriptors")
            }
            fn visit_unit<E: de::Error>(self) -> Result<RawFile, E> {
                Err(E::custom("config file cannot have empty domain"))
            }
            fn visit_none<E: de::Error>(self) -> Result<RawFile, E> {
                self.visit_unit()
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawFile, A::Error> {
                let mut domain = String::new();
                let mut descriptors = None;
                let mut keys = Keys::default();
                while let Some(key) = keys.next(&mut map)? {
                    match key.as_str() {
                        "domain" => domain = map.next_value_seed(Text)?,
                        // The domain may come after its descriptors: paths
                        // in messages then start at the descriptors.
                        "descriptors" => {
                            descriptors = Some(map.next_value_seed(Descriptors {
                                parent: format!("{domain}."),
                            })?);
                        }
                        _ => other_key(&mut map, &key)?,
                    }
                }
                if domain.is_empty() {
                    return Err(de::Error::custom("config file cannot have empty domain"));
                }
                Ok(RawFile {
                    domain,
                    descriptors: descriptors.unwrap_or_default(),
                })
            }
        }
        deserializer.deserialize_any(File)
    }
}

/// A list of descriptors under `parent` (the stat key so far, `domain.` at
/// the top, ending with a dot).
struct Descriptors {
    parent: String,
}

impl<'de> DeserializeSeed<'de> for Descriptors {
    type Value = Level;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Level, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Descriptors {
    type Value = Level;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a list of descriptors")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Level, E> {
        Ok(Level::default())
    }

    fn visit_none<E: de::Error>(self) -> Result<Level, E> {
        Ok(Level::default())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Level, A::Error> {
        let mut level = Level::default();
        loop {
            let seed = NodeSeed {
                parent: &self.parent,
                siblings: &level,
            };
            match seq.next_element_seed(seed)? {
                Some(node) => level.push(node),
                None => return Ok(level),
            }
        }
    }
}

/// One descriptor node, checked against its siblings as it is read (so an
/// error carries the node's line).
struct NodeSeed<'a> {
    parent: &'a str,
    siblings: &'a Level,
}

impl<'de> DeserializeSeed<'de> for NodeSeed<'_> {
    type Value = Node;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(ListOfMaps(self))
    }
}

/// A `rate_limit` block, as read.
#[derive(Default)]
struct RawRateLimit {
    unit: Option<String>,
    requests_per_unit: Option<u64>,
    unlimited: bool,
    name: String,
    replaces: Vec<String>,
    algorithm: Option<Limit>,
    /// Tollgate's extension: thresholds, percent of the limit, whose
    /// crossing is an alert.
    alerts: Option<Vec<u64>>,
    /// Tollgate's extension: `global`, one limit across regions.
    scope: Option<String>,
}

/// A `rate_limit` block, checked.
struct RateLimit {
    unit: Option<Unit>,
    requests_per_unit: Option<u64>,
    name: String,
    replaces: Vec<String>,
    limit: RuleLimit,
}

impl<'de> Visitor<'de> for NodeSeed<'_> {
    type Value = Node;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a descriptor")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut key = String::new();
        let mut value = String::new();
        let mut rate_limit: Option<RateLimit> = None;
        let mut children: Option<(String, Level)> = None;
        let (mut shadow_mode, mut alternative, mut detailed_metric) = (false, false, false);
        let (mut value_to_metric, mut share_threshold) = (false, false);
        let mut metadata = None;
        let mut keys = Keys::default();
        while let Some(name) = keys.next(&mut map)? {
            match name.as_str() {
                "key" => key = map.next_value_seed(Text)?,
                "value" => value = map.next_value_seed(Text)?,
                "rate_limit" => rate_limit = map.next_value_seed(RateLimitSeed)?,
                "descriptors" => {
                    // The path is known once key and value are: they usually
                    // come first; if not, messages name what was read so far.
                    let path = format!("{}{}.", self.parent, composite(&key, &value));
                    let level = map.next_value_seed(Descriptors { parent: path.clone() })?;
                    children = Some((path, level));
                }
                "shadow_mode" => shadow_mode = map.next_value_seed(Flag)?,
                "quota_mode" => alternative = map.next_value_seed(Flag)?,
                "detailed_metric" => detailed_metric = map.next_value_seed(Flag)?,
                "value_to_metric" => value_to_metric = map.next_value_seed(Flag)?,
                "share_threshold" => share_threshold = map.next_value_seed(Flag)?,
                "metadata" => metadata = map.next_value::<Option<serde_yaml_ng::Value>>()?,
                _ => other_key(&mut map, &name)?,
            }
        }
        if key.is_empty() {
            return Err(de::Error::custom("descriptor has empty key"));
        }
        let composite = composite(&key, &value);
        let full_key = format!("{}{composite}", self.parent);
        if self.siblings.contains(&composite) {
            return Err(de::Error::custom(format!(
                "duplicate descriptor composite key \"{full_key}\""
            )));
        }
        let rule = rate_limit.map(|rate_limit| Rule {
            path: path_of(&full_key),
            name: (!rate_limit.name.is_empty()).then_some(rate_limit.name),
            unit: rate_limit.unit,
            requests_per_unit: rate_limit.requests_per_unit,
            limit: rate_limit.limit,
            replaces: rate_limit.replaces,
            shadow_mode,
            alternative,
            detailed_metric,
            alert_label: std::sync::OnceLock::new(),
        });
        if share_threshold && !composite.contains('*') {
            return Err(de::Error::custom(format!(
                "share_threshold can only be used with wildcard values (containing '*'), but found key \"{composite}\""
            )));
        }
        let metadata = metadata
            .filter(|metadata| !metadata.is_null())
            .map(|metadata| yaml_to_json(&metadata))
            .transpose()
            .map_err(|error| de::Error::custom(format!("error parsing metadata: {error}")))?;
        Ok(Node {
            key,
            value: (!value.is_empty()).then_some(value),
            rule,
            share_threshold,
            value_to_metric,
            metadata,
            descriptors: children.map(|(_, level)| level).unwrap_or_default(),
            composite,
        })
    }
}

/// A `rate_limit` block (nothing is no block, as in Go).
struct RateLimitSeed;

impl<'de> DeserializeSeed<'de> for RateLimitSeed {
    type Value = Option<RateLimit>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for RateLimitSeed {
    type Value = Option<RateLimit>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a rate_limit block")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut raw = RawRateLimit::default();
        let mut keys = Keys::default();
        while let Some(key) = keys.next(&mut map)? {
            match key.as_str() {
                "unit" => raw.unit = Some(map.next_value_seed(Text)?),
                "requests_per_unit" => raw.requests_per_unit = Some(map.next_value_seed(Count)?),
                "unlimited" => raw.unlimited = map.next_value_seed(Flag)?,
                "name" => raw.name = map.next_value_seed(Text)?,
                "replaces" => raw.replaces = map.next_value_seed(ReplacesSeed)?,
                "algorithm" => raw.algorithm = Some(map.next_value_seed(AlgorithmSeed)?),
                "alerts" => raw.alerts = Some(map.next_value()?),
                "scope" => raw.scope = Some(map.next_value_seed(Text)?),
                _ => other_key(&mut map, &key)?,
            }
        }
        raw.check().map(Some).map_err(de::Error::custom)
    }
}

/// `replaces`: a list of `{name: …}`.
struct ReplacesSeed;

impl<'de> DeserializeSeed<'de> for ReplacesSeed {
    type Value = Vec<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Vec<String>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ReplacesSeed {
    type Value = Vec<String>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a list of {name: ...}")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Vec<String>, E> {
        Ok(Vec::new())
    }

    fn visit_none<E: de::Error>(self) -> Result<Vec<String>, E> {
        Ok(Vec::new())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
        struct Replace;
        impl<'de> DeserializeSeed<'de> for Replace {
            type Value = String;
            fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
                deserializer.deserialize_any(ListOfMaps(self))
            }
        }
        impl<'de> Visitor<'de> for Replace {
            type Value = String;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("{name: ...}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
                let mut name = String::new();
                let mut keys = Keys::default();
                while let Some(key) = keys.next(&mut map)? {
                    if key == "name" {
                        name = map.next_value_seed(Text)?;
                    } else {
                        other_key(&mut map, &key)?;
                    }
                }
                Ok(name)
            }
        }
        let mut names = Vec::new();
        while let Some(name) = seq.next_element_seed(Replace)? {
            names.push(name);
        }
        Ok(names)
    }
}

/// Tollgate's `algorithm` block, validated where it stands (so errors carry its line).
struct AlgorithmSeed;

impl<'de> DeserializeSeed<'de> for AlgorithmSeed {
    type Value = Limit;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Limit, D::Error> {
        // Read as YAML first: its mappings refuse a key given twice.
        let value = serde_yaml_ng::Value::deserialize(deserializer)?;
        let value = yaml_to_json(&value).map_err(|error| de::Error::custom(format!("algorithm: {error}")))?;
        Limit::from_value(value).map_err(|error| de::Error::custom(format!("algorithm: {error}")))
    }
}

/// Why a `rate_limit` block given as JSON (an override's) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleJsonError {
    /// The block does not read (the reader's message, naming the field).
    #[error("{0}")]
    Read(String),
    /// No block.
    #[error("a rate_limit block is required")]
    Missing,
    /// `name` or `replaces`, which only a file's rules have.
    #[error("name and replaces belong in a configuration file, not an override")]
    NameInOverride,
}

/// Why a `rate_limit` block is refused (envoyproxy/ratelimit's checks, in
/// its words where it has them).
#[derive(Debug, thiserror::Error)]
pub enum RateLimitError {
    /// A unit beside `unlimited: true`.
    #[error("should not specify rate limit unit when unlimited")]
    UnitWhenUnlimited,
    /// An algorithm beside `unlimited: true`.
    #[error("rate_limit: unlimited cannot have an algorithm")]
    AlgorithmWhenUnlimited,
    /// A unit that is not one.
    #[error("invalid rate limit unit \"{0}\" (expected second, minute, hour, day, week, month or year)")]
    Unit(String),
    /// A count the limit refuses.
    #[error("rate_limit: requests_per_unit: {0}")]
    RequestsPerUnit(tollgate::Error),
    /// Alert thresholds the limit refuses.
    #[error("rate_limit: {0}")]
    Alerts(tollgate::Error),
    /// A scope that is not one, or a limit that cannot be global.
    #[error("rate_limit: {0}")]
    Scope(tollgate::Error),
    /// A scope that is not one.
    #[error("rate_limit: scope: expected \"global\" (one limit across regions) or \"regional\", not \"{0}\"")]
    UnknownScope(String),
    /// A scope without a limit.
    #[error("rate_limit: scope needs a limit (not unlimited, nor 0 requests)")]
    ScopeWithoutLimit,
    /// Alerts without a limit to cross.
    #[error("rate_limit: alerts need a limit (not unlimited, nor 0 requests)")]
    AlertsWithoutLimit,
    /// An empty `replaces` entry.
    #[error("should not have an empty replaces entry")]
    EmptyReplaces,
    /// A rule replacing itself.
    #[error("replaces should not contain name of same descriptor")]
    ReplacesItself,
}

impl RawRateLimit {
    /// The block, with envoyproxy/ratelimit's checks.
    fn check(self) -> Result<RateLimit, RateLimitError> {
        let unit_text = self.unit.unwrap_or_default();
        let unit = Unit::parse(&unit_text);
        let limit = if self.unlimited {
            if unit.is_some() {
                return Err(RateLimitError::UnitWhenUnlimited);
            }
            if self.algorithm.is_some() {
                return Err(RateLimitError::AlgorithmWhenUnlimited);
            }
            RuleLimit::Unlimited
        } else {
            if unit.is_none() && (self.algorithm.is_none() || !unit_text.is_empty()) {
                return Err(RateLimitError::Unit(unit_text));
            }
            match (self.algorithm, unit) {
                (Some(limit), _) => RuleLimit::Limited(limit),
                (None, Some(unit)) => match self.requests_per_unit.unwrap_or(0) {
                    0 => RuleLimit::Blocked,
                    // envoyproxy/ratelimit's counting: a descriptor that goes
                    // over still adds its hits (usage that happened).
                    requests => RuleLimit::Limited(
                        Limit::fixed_window(requests, unit.duration())
                            .and_then(Limit::recording_overage)
                            .map_err(RateLimitError::RequestsPerUnit)?,
                    ),
                },
                (None, None) => unreachable!("refused above"),
            }
        };
        let limit = match (self.alerts, limit) {
            (None, limit) => limit,
            (Some(alerts), RuleLimit::Limited(limit)) => {
                let alerts = alerts
                    .into_iter()
                    .map(|threshold| u8::try_from(threshold).unwrap_or(u8::MAX))
                    .collect::<Vec<u8>>();
                RuleLimit::Limited(limit.alerting(alerts).map_err(RateLimitError::Alerts)?)
            }
            (Some(_), _) => return Err(RateLimitError::AlertsWithoutLimit),
        };
        let limit = match (self.scope.as_deref(), limit) {
            (None | Some("regional"), limit) => limit,
            // A global limit's region refuses what its share cannot grant:
            // a refused check counts nothing there.
            (Some("global"), RuleLimit::Limited(limit)) => RuleLimit::Limited(
                limit
                    .refusing_overage()
                    .with_scope(tollgate::Scope::Global)
                    .map_err(RateLimitError::Scope)?,
            ),
            (Some("global"), _) => return Err(RateLimitError::ScopeWithoutLimit),
            (Some(other), _) => return Err(RateLimitError::UnknownScope(other.to_owned())),
        };
        for replaces in &self.replaces {
            if replaces.is_empty() {
                return Err(RateLimitError::EmptyReplaces);
            }
            if *replaces == self.name {
                return Err(RateLimitError::ReplacesItself);
            }
        }
        Ok(RateLimit {
            unit,
            requests_per_unit: self.requests_per_unit,
            name: self.name,
            replaces: self.replaces,
            limit,
        })
    }
}

impl Domain {
    /// Reads one domain from YAML `text`; `file` names it in errors.
    ///
    /// # Errors
    ///
    /// What envoyproxy/ratelimit refuses (see the module docs), malformed
    /// YAML, and invalid `algorithm` blocks: with the line.
    pub fn parse(text: &str, file: &Path) -> Result<Self, ConfigError> {
        let error_of = |error: serde_yaml_ng::Error| ConfigError {
            file: file.to_owned(),
            line: error.location().map(|location| location.line()),
            message: strip_location(&error.to_string()).replace('`', "\""),
        };
        let raw: RawFile = match serde_yaml_ng::from_str(text) {
            Ok(raw) => raw,
            Err(error) if error.to_string().contains(MERGE_KEY) => {
                // As envoyproxy/ratelimit's parser, apply YAML merge keys; the
                // expanded text has other lines, so errors name none.
                let expanded = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text)
                    .and_then(|mut value| value.apply_merge().map(|()| value))
                    .and_then(|value| serde_yaml_ng::to_string(&value))
                    .map_err(error_of)?;
                serde_yaml_ng::from_str(&expanded).map_err(|error| ConfigError {
                    file: file.to_owned(),
                    line: None,
                    message: format!("{} (with its merge keys applied)", error_of(error).message),
                })?
            }
            Err(error) => return Err(error_of(error)),
        };
        Ok(Self::from_raw(raw, file))
    }

    /// Reads one domain from a document that is not text (a control plane's
    /// resource, `resource::Document`): the same reader and checks as
    /// [`Domain::parse`], without text to scan; `file` names it in errors,
    /// which carry no line.
    ///
    /// # Errors
    ///
    /// As [`Domain::parse`].
    pub(super) fn from_document<'de>(document: impl Deserializer<'de>, file: &Path) -> Result<Self, ConfigError> {
        let raw = RawFile::deserialize(document).map_err(|error| ConfigError {
            file: file.to_owned(),
            line: None,
            message: strip_location(&error.to_string()).replace('`', "\""),
        })?;
        Ok(Self::from_raw(raw, file))
    }

    fn from_raw(raw: RawFile, file: &Path) -> Self {
        let value_to_metric = any_node(&raw.descriptors, &|node| node.value_to_metric);
        Self {
            domain: raw.domain,
            file: file.to_owned(),
            descriptors: raw.descriptors,
            value_to_metric,
        }
    }
}

fn any_node(level: &Level, test: &dyn Fn(&Node) -> bool) -> bool {
    level
        .nodes
        .iter()
        .any(|node| test(node) || any_node(&node.descriptors, test))
}

/// A `rate_limit` block given as JSON (an override, `/v1/overrides`), read
/// by the file's own reader with its checks, as the rule at `path`: its
/// unit, requests per unit and limit, with every flag off. `name` and
/// `replaces` mean nothing outside a file and are refused.
///
/// # Errors
///
/// What a file's `rate_limit` block is refused for, as text.
pub(crate) fn rule_from_json(value: &serde_json::Value, path: String) -> Result<Rule, RuleJsonError> {
    let read = RateLimitSeed
        .deserialize(value)
        .map_err(|error| RuleJsonError::Read(strip_location(&error.to_string()).replace('`', "\"")))?
        .ok_or(RuleJsonError::Missing)?;
    if !read.name.is_empty() || !read.replaces.is_empty() {
        return Err(RuleJsonError::NameInOverride);
    }
    Ok(Rule {
        path,
        name: None,
        unit: read.unit,
        requests_per_unit: read.requests_per_unit,
        limit: read.limit,
        replaces: Vec::new(),
        shadow_mode: false,
        alternative: false,
        detailed_metric: false,
        alert_label: std::sync::OnceLock::new(),
    })
}
