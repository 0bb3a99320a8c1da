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
//! `unit`, as in envoyproxy/ratelimit. Tollgate's extension is the optional
//! `algorithm` block, any limit of the library (`{algorithm: gcra, rate: 10,
//! period: 1s, burst: 20}`); `unit` and `requests_per_unit` then only
//! describe the limit to Envoy and may be left out.
//!
//! Matching follows envoyproxy/ratelimit: for each entry of a request's
//! descriptor, in order, the node whose `key_value` is the entry's wins, then
//! the first wildcard node (in file order) whose `key_value` pattern matches
//! (`*` anywhere, any run of characters including none), then the node with
//! the key and no value; a limit applies only when the request's descriptor is
//! exactly as deep as the node that holds it.
//!
//! Errors name the file and the line.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
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
        Self::parse(&name).ok_or_else(|| de::Error::custom(unknown_unit(&name)))
    }
}

fn unknown_unit(name: &str) -> String {
    format!("unknown unit \"{name}\" (expected second, minute, hour, day, week, month or year)")
}

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
    pub quota: Quota,
    /// Names of rules this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// Decide and count, but never deny.
    pub shadow_mode: bool,
    /// Over the limit denies the request only when every quota-mode
    /// descriptor of the request is over (and reports its own OVER_LIMIT).
    pub quota_mode: bool,
    /// Label metrics with the request's own descriptor values.
    pub detailed_metric: bool,
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

impl Quota {
    /// The window of a fixed-window limit (what envoyproxy/ratelimit counts
    /// in), whose `duration_until_reset` is the time to the window's end.
    pub fn fixed_window(&self) -> Option<Duration> {
        match self {
            Self::Limited(limit) => match limit.spec() {
                LimitSpec::FixedWindow(spec) => Some(spec.window),
                _ => None,
            },
            Self::Unlimited | Self::Blocked => None,
        }
    }
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

    /// The node for an entry whose `key_value` is `composite`, as
    /// envoyproxy/ratelimit finds it: exact, then the first matching
    /// wildcard, then the key alone. Also says whether a wildcard matched.
    fn find(&self, composite: &str, key: &str) -> Option<(&Node, bool)> {
        if let Some(&index) = self.by_composite.get(composite) {
            return Some((&self.nodes[index], false));
        }
        for (index, parts) in &self.wildcards {
            if wildcard_match(parts, composite) {
                return Some((&self.nodes[*index], true));
            }
        }
        self.by_composite.get(key).map(|&index| (&self.nodes[index], false))
    }
}

impl Serialize for Level {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.nodes.serialize(serializer)
    }
}

/// Whether `text` matches a pattern split on its `*`s: each `*` stands for
/// any run of characters, including none.
pub fn wildcard_match(parts: &[String], text: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|only| only == text);
    };
    if text.len() < parts.iter().map(String::len).sum::<usize>() {
        return false;
    }
    let Some(rest) = text.strip_prefix(first.as_str()) else {
        return false;
    };
    let Some(mut rest) = rest.strip_suffix(last.as_str()) else {
        return false;
    };
    for part in middle {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
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

// --- The file format, as envoyproxy/ratelimit reads it. -------------------

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

/// Refuses a value with `message`, reported where the value starts.
struct Refuse(String);

impl<'de> DeserializeSeed<'de> for Refuse {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

macro_rules! refuse_all {
    ($($method:ident($($arg:ty),*)),* $(,)?) => {
        $(fn $method<E: de::Error>(self, $(_: $arg),*) -> Result<(), E> {
            Err(E::custom(self.0))
        })*
    };
}

impl<'de> Visitor<'de> for Refuse {
    type Value = ();

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.0)
    }

    refuse_all!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_f64(f64),
        visit_str(&str),
        visit_unit(),
        visit_none(),
    );

    fn visit_some<D: Deserializer<'de>>(self, _: D) -> Result<(), D::Error> {
        Err(de::Error::custom(self.0))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(self.0))
    }

    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(self.0))
    }
}

/// A mapping key: text (envoyproxy/ratelimit refuses any other key).
struct KeyName(String);

impl<'de> Deserialize<'de> for KeyName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Name;
        impl Visitor<'_> for Name {
            type Value = String;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a key that is a string")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<String, E> {
                Ok(text.to_owned())
            }
            fn visit_bool<E: de::Error>(self, value: bool) -> Result<String, E> {
                Err(not_text(value))
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<String, E> {
                Err(not_text(value))
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<String, E> {
                Err(not_text(value))
            }
            fn visit_f64<E: de::Error>(self, value: f64) -> Result<String, E> {
                Err(not_text(value))
            }
            fn visit_unit<E: de::Error>(self) -> Result<String, E> {
                Err(not_text("null"))
            }
        }
        fn not_text<E: de::Error>(key: impl fmt::Display) -> E {
            E::custom(format!("key is not of type string: {key}"))
        }
        deserializer.deserialize_any(Name).map(KeyName)
    }
}

/// What to do with a key no typed field takes: ignore a key of
/// envoyproxy/ratelimit's set (checking its value as it does), refuse others.
fn other_key<'de, A: MapAccess<'de>>(map: &mut A, key: &str) -> Result<(), A::Error> {
    if key == "<<" {
        // A YAML merge key: the file is read again with merges applied.
        map.next_value::<de::IgnoredAny>()?;
        return Err(de::Error::custom(MERGE_KEY));
    }
    if KEYS.contains(&key) {
        map.next_value_seed(Generic)
    } else if key == "algorithm" {
        map.next_value_seed(Refuse(
            "unknown key \"algorithm\" (Tollgate's algorithm block belongs in a rate_limit)".to_owned(),
        ))
    } else {
        map.next_value_seed(Refuse(format!("unknown key \"{key}\"")))
    }
}

/// A value under a key that means nothing where it stands, checked as
/// envoyproxy/ratelimit checks every value: maps with known keys, lists of
/// maps, and text, integers, booleans or nothing.
struct Generic;

impl<'de> DeserializeSeed<'de> for Generic {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Generic {
    type Value = ();

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("text, an integer, a boolean, a map or a list of maps")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<(), E> {
        if i64::try_from(value).is_ok() {
            Ok(())
        } else {
            Err(E::custom(format!("error checking config: {value} is too large")))
        }
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<(), E> {
        Err(E::custom(format!(
            "error checking config: {value} is not text, an integer or a boolean"
        )))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(GenericMap)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(KeyName(key)) = map.next_key()? {
            if key == "metadata" {
                map.next_value::<de::IgnoredAny>()?;
            } else {
                other_key(&mut map, &key)?;
            }
        }
        Ok(())
    }
}

/// An element of a list: a map, checked as [`Generic`].
struct GenericMap;

impl<'de> DeserializeSeed<'de> for GenericMap {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(ListOfMaps(Generic))
    }
}

/// Refuses list elements other than maps, as envoyproxy/ratelimit does.
struct ListOfMaps<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for ListOfMaps<V> {
    type Value = V::Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.0.visit_map(map)
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<V::Value, E> {
        Err(not_a_map(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<V::Value, E> {
        Err(not_a_map(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<V::Value, E> {
        Err(not_a_map(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<V::Value, E> {
        Err(not_a_map(value))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<V::Value, E> {
        Err(not_a_map(value))
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        Err(not_a_map("null"))
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        Err(not_a_map("null"))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<V::Value, A::Error> {
        Err(not_a_map("a list"))
    }
}

fn not_a_map<E: de::Error>(element: impl fmt::Display) -> E {
    E::custom(format!("a list holds something other than a map: {element}"))
}

/// A scalar read as the text it was written as (`0123` is "0123"); nothing
/// (`~`, `null`, empty) is the empty text, as in Go.
struct Text;

impl<'de> DeserializeSeed<'de> for Text {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        struct Scalar;
        impl Visitor<'_> for Scalar {
            type Value = String;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("text")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<String, E> {
                Ok(match text {
                    "~" | "null" | "Null" | "NULL" => String::new(),
                    text => text.to_owned(),
                })
            }
        }
        deserializer.deserialize_str(Scalar)
    }
}

/// A boolean as YAML 1.1 (envoyproxy/ratelimit's parser) writes them
/// (`true`, `yes`, `on`, …); nothing is false.
struct Flag;

impl<'de> DeserializeSeed<'de> for Flag {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        struct Boolean;
        impl Visitor<'_> for Boolean {
            type Value = bool;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a boolean (true or false)")
            }
            fn visit_bool<E: de::Error>(self, value: bool) -> Result<bool, E> {
                Ok(value)
            }
            fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
                Ok(false)
            }
            fn visit_none<E: de::Error>(self) -> Result<bool, E> {
                Ok(false)
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<bool, E> {
                match text {
                    "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True" | "TRUE" => Ok(true),
                    "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False" | "FALSE" => Ok(false),
                    _ => Err(E::custom(format!("\"{text}\" is not a boolean (true or false)"))),
                }
            }
        }
        deserializer.deserialize_any(Boolean)
    }
}

/// `requests_per_unit`: a 32-bit unsigned integer, as in envoyproxy/ratelimit;
/// nothing is 0.
struct Count;

impl<'de> DeserializeSeed<'de> for Count {
    type Value = u64;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<u64, D::Error> {
        struct Number;
        impl Visitor<'_> for Number {
            type Value = u64;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("an integer from 0 to 4294967295")
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<u64, E> {
                if value > u64::from(u32::MAX) {
                    return Err(E::custom(format!(
                        "requests_per_unit {value} is too large (at most 4294967295)"
                    )));
                }
                Ok(value)
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<u64, E> {
                u64::try_from(value)
                    .map_err(|_| E::custom(format!("requests_per_unit {value} must not be negative")))
                    .and_then(|value| self.visit_u64(value))
            }
            fn visit_unit<E: de::Error>(self) -> Result<u64, E> {
                Ok(0)
            }
            fn visit_none<E: de::Error>(self) -> Result<u64, E> {
                Ok(0)
            }
            /// YAML 1.1 integers with `_` separators (`1_000`), which YAML
            /// 1.2 reads as text.
            fn visit_str<E: de::Error>(self, text: &str) -> Result<u64, E> {
                let digits: String = text.chars().filter(|c| *c != '_').collect();
                match digits.parse::<u64>() {
                    Ok(value) if !digits.is_empty() => self.visit_u64(value),
                    _ => Err(E::custom(format!(
                        "requests_per_unit \"{text}\" is not an integer from 0 to 4294967295"
                    ))),
                }
            }
        }
        deserializer.deserialize_any(Number)
    }
}

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
                while let Some(KeyName(key)) = map.next_key()? {
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
}

/// A `rate_limit` block, checked.
struct RateLimit {
    unit: Option<Unit>,
    requests_per_unit: Option<u64>,
    name: String,
    replaces: Vec<String>,
    quota: Quota,
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
        let (mut shadow_mode, mut quota_mode, mut detailed_metric) = (false, false, false);
        let (mut value_to_metric, mut share_threshold) = (false, false);
        let mut metadata = None;
        while let Some(KeyName(name)) = map.next_key()? {
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
                "quota_mode" => quota_mode = map.next_value_seed(Flag)?,
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
            quota: rate_limit.quota,
            replaces: rate_limit.replaces,
            shadow_mode,
            quota_mode,
            detailed_metric,
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

/// `key`, or `key_value`: how envoyproxy/ratelimit names a node.
fn composite(key: &str, value: &str) -> String {
    if value.is_empty() {
        key.to_owned()
    } else {
        format!("{key}_{value}")
    }
}

/// The stat key without the domain (`domain.a_b.c` is `a_b.c`).
fn path_of(full_key: &str) -> String {
    full_key.split_once('.').map_or(full_key, |(_, path)| path).to_owned()
}

/// metadata as JSON (envoyproxy/ratelimit's `google.protobuf.Struct`).
fn yaml_to_json(value: &serde_yaml_ng::Value) -> Result<serde_json::Value, String> {
    use serde_yaml_ng::Value as Yaml;
    Ok(match value {
        Yaml::Null => serde_json::Value::Null,
        Yaml::Bool(flag) => serde_json::Value::Bool(*flag),
        Yaml::Number(number) => serde_json::to_value(number).map_err(|error| error.to_string())?,
        Yaml::String(text) => serde_json::Value::String(text.clone()),
        Yaml::Sequence(items) => serde_json::Value::Array(items.iter().map(yaml_to_json).collect::<Result<_, _>>()?),
        Yaml::Mapping(map) => {
            let mut object = serde_json::Map::new();
            for (key, value) in map {
                let key = match key {
                    Yaml::String(text) => text.clone(),
                    Yaml::Number(number) => number.to_string(),
                    Yaml::Bool(flag) => flag.to_string(),
                    Yaml::Null => "null".to_owned(),
                    _ => return Err("a metadata key must be a scalar".to_owned()),
                };
                object.insert(key, yaml_to_json(value)?);
            }
            serde_json::Value::Object(object)
        }
        Yaml::Tagged(tagged) => yaml_to_json(&tagged.value)?,
    })
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
        while let Some(KeyName(key)) = map.next_key()? {
            match key.as_str() {
                "unit" => raw.unit = Some(map.next_value_seed(Text)?),
                "requests_per_unit" => raw.requests_per_unit = Some(map.next_value_seed(Count)?),
                "unlimited" => raw.unlimited = map.next_value_seed(Flag)?,
                "name" => raw.name = map.next_value_seed(Text)?,
                "replaces" => raw.replaces = map.next_value_seed(ReplacesSeed)?,
                "algorithm" => raw.algorithm = Some(map.next_value_seed(AlgorithmSeed)?),
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
                while let Some(KeyName(key)) = map.next_key()? {
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
        let value = serde_json::Value::deserialize(deserializer)?;
        LimitSpec::from_value(value)
            .and_then(LimitSpec::build)
            .map_err(|error| de::Error::custom(format!("algorithm: {error}")))
    }
}

impl RawRateLimit {
    /// The block, with envoyproxy/ratelimit's checks.
    fn check(self) -> Result<RateLimit, String> {
        let unit_text = self.unit.unwrap_or_default();
        let unit = Unit::parse(&unit_text);
        let quota = if self.unlimited {
            if unit.is_some() {
                return Err("should not specify rate limit unit when unlimited".to_owned());
            }
            if self.algorithm.is_some() {
                return Err("rate_limit: unlimited cannot have an algorithm".to_owned());
            }
            Quota::Unlimited
        } else {
            if unit.is_none() && (self.algorithm.is_none() || !unit_text.is_empty()) {
                return Err(format!(
                    "invalid rate limit unit \"{unit_text}\" (expected second, minute, hour, day, week, month or year)"
                ));
            }
            match (self.algorithm, unit) {
                (Some(limit), _) => Quota::Limited(limit),
                (None, Some(unit)) => match self.requests_per_unit.unwrap_or(0) {
                    0 => Quota::Blocked,
                    requests => Quota::Limited(
                        Limit::fixed_window(requests, unit.duration())
                            .map_err(|error| format!("rate_limit: requests_per_unit: {error}"))?,
                    ),
                },
                (None, None) => unreachable!("refused above"),
            }
        };
        for replaces in &self.replaces {
            if replaces.is_empty() {
                return Err("should not have an empty replaces entry".to_owned());
            }
            if *replaces == self.name {
                return Err("replaces should not contain name of same descriptor".to_owned());
            }
        }
        Ok(RateLimit {
            unit,
            requests_per_unit: self.requests_per_unit,
            name: self.name,
            replaces: self.replaces,
            quota,
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
        let value_to_metric = any_node(&raw.descriptors, &|node| node.value_to_metric);
        Ok(Self {
            domain: raw.domain,
            file: file.to_owned(),
            descriptors: raw.descriptors,
            value_to_metric,
        })
    }

    /// Adds `other`'s top-level descriptors to this domain's
    /// (`MERGE_DOMAIN_CONFIG`).
    ///
    /// # Errors
    ///
    /// When both hold a descriptor with the same `key_value`.
    pub fn merge(&mut self, other: Domain) -> Result<(), ConfigError> {
        for node in other.descriptors.nodes {
            if self.descriptors.contains(&node.composite) {
                return Err(ConfigError {
                    file: other.file.clone(),
                    line: None,
                    message: format!(
                        "duplicate descriptor composite key \"{}.{}\"",
                        self.domain, node.composite
                    ),
                });
            }
            self.descriptors.push(node);
        }
        self.value_to_metric |= other.value_to_metric;
        Ok(())
    }

    /// The rule for a request descriptor's entries, matched as
    /// envoyproxy/ratelimit does (see the module docs).
    pub fn lookup<'a>(&'a self, entries: &[(String, String)]) -> Option<Found<'a>> {
        let mut level = &self.descriptors;
        let mut found = None;
        let mut shared = Vec::new();
        let mut composite = String::new();
        // envoyproxy/ratelimit's value_to_metric stat key, built on the way.
        let mut valued = self.value_to_metric.then(String::new);
        for (depth, (key, value)) in entries.iter().enumerate() {
            composite.clear();
            composite.push_str(key);
            composite.push('_');
            composite.push_str(value);
            let Some((node, wildcard)) = level.find(&composite, key) else {
                break;
            };
            let pattern = |node: &'a Node| {
                let prefix_len = key.len() + 1;
                if node.composite.starts_with(key.as_str()) && node.composite.as_bytes().get(key.len()) == Some(&b'_') {
                    &node.composite[prefix_len..]
                } else {
                    node.composite.as_str()
                }
            };
            if wildcard && node.share_threshold {
                shared.push((depth, pattern(node)));
            }
            if let Some(valued) = valued.as_mut() {
                let shown = if wildcard {
                    if node.share_threshold {
                        pattern(node)
                    } else if node.value_to_metric {
                        value.as_str()
                    } else {
                        pattern(node)
                    }
                } else if node.value.is_some() || node.value_to_metric {
                    value.as_str()
                } else {
                    ""
                };
                if depth > 0 {
                    valued.push('.');
                }
                valued.push_str(key);
                if !shown.is_empty() {
                    valued.push('_');
                    valued.push_str(shown);
                }
            }
            if depth == entries.len() - 1 {
                found = node.rule.as_ref().map(|rule| (rule, node.metadata.as_ref()));
            }
            if node.descriptors.is_empty() {
                break;
            }
            level = &node.descriptors;
        }
        let (rule, metadata) = found?;
        let stat_key = if rule.detailed_metric {
            let mut detailed = String::new();
            for (depth, (key, value)) in entries.iter().enumerate() {
                if depth > 0 {
                    detailed.push('.');
                }
                detailed.push_str(key);
                match shared.iter().find(|(at, _)| *at == depth) {
                    Some((_, pattern)) => {
                        detailed.push('_');
                        detailed.push_str(pattern);
                    }
                    // Without share_threshold, envoyproxy/ratelimit writes
                    // `key_` for an empty value; with it, `key`.
                    None if !value.is_empty() || shared.is_empty() => {
                        detailed.push('_');
                        detailed.push_str(value);
                    }
                    None => {}
                }
            }
            Some(detailed)
        } else {
            valued.filter(|valued| *valued != rule.path)
        };
        Some(Found {
            rule,
            shared,
            stat_key,
            metadata,
        })
    }
}

fn any_node(level: &Level, test: &dyn Fn(&Node) -> bool) -> bool {
    level
        .nodes
        .iter()
        .any(|node| test(node) || any_node(&node.descriptors, test))
}

/// serde_yaml_ng puts "at line L column C" in its message; the location is
/// reported separately, so drop it.
fn strip_location(message: &str) -> String {
    match message.find(" at line ") {
        Some(at) => message[..at].to_owned(),
        None => message.to_owned(),
    }
}

/// How a configuration directory is laid out and read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// envoyproxy/ratelimit's runtime layout: every file under the directory,
    /// at any depth and of any name, is a configuration file. Otherwise only
    /// the directory's own `*.yaml` / `*.yml` files are.
    pub runtime_layout: bool,
    /// With `runtime_layout`, skip files and directories whose name starts
    /// with a dot (`RUNTIME_IGNOREDOTFILES`).
    pub ignore_dot_files: bool,
    /// Files of one domain are merged instead of refused (`MERGE_DOMAIN_CONFIG`).
    pub merge_domains: bool,
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
        Self::load_with(path, LoadOptions::default())
    }

    /// Loads a file or a directory laid out as `options` say.
    ///
    /// # Errors
    ///
    /// As [`Config::load`].
    pub fn load_with(path: &Path, options: LoadOptions) -> Result<Self, ConfigError> {
        let unreadable = |file: &Path, error: std::io::Error| ConfigError {
            file: file.to_owned(),
            line: None,
            message: format!("cannot read: {error}"),
        };
        let mut files = Vec::new();
        if path.is_dir() {
            collect_files(path, options, &mut files).map_err(|error| unreadable(path, error))?;
            files.sort();
        } else {
            files.push(path.to_owned());
        }
        let mut config = Self::default();
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|error| unreadable(&file, error))?;
            let domain = Domain::parse(&text, &file)?;
            match config.domains.get_mut(&domain.domain) {
                Some(existing) if options.merge_domains => existing.merge(domain)?,
                _ => config.add(domain)?,
            }
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
                    "duplicate domain \"{}\" in config file (already in {})",
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
        fn search<'a>(level: &'a Level, name: &str) -> Option<&'a Rule> {
            level.nodes.iter().find_map(|node| {
                node.rule
                    .as_ref()
                    .filter(|rule| rule.name.as_deref() == Some(name))
                    .or_else(|| search(&node.descriptors, name))
            })
        }
        search(&self.domains.get(domain)?.descriptors, name)
    }
}

/// The configuration files under `directory`.
fn collect_files(directory: &Path, options: LoadOptions, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(directory)? {
        let path = entry?.path();
        let dotted = path
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with('.'));
        if options.runtime_layout {
            if dotted && options.ignore_dot_files {
                continue;
            }
            if path.is_dir() {
                collect_files(&path, options, files)?;
            } else if path.is_file() {
                files.push(path);
            }
        } else if path.is_file()
            && path
                .extension()
                .is_some_and(|extension| extension == "yaml" || extension == "yml")
        {
            files.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(pattern: &str) -> Vec<String> {
        pattern.split('*').map(str::to_owned).collect()
    }

    #[test]
    fn wildcards_match_any_run_anywhere() {
        for (pattern, text, expected) in [
            ("ab*", "ab", true),
            ("ab*", "abc", true),
            ("ab*", "a", false),
            ("ab*yz", "abyz", true),
            ("ab*yz", "ab-yz", true),
            ("ab*yz", "abyyz", true),
            ("ab*yz", "abyzz", false),
            ("ab*yz", "aby", false),
            ("ab*yz", "abz", false),
            ("*", "", true),
            ("a*b*c", "abc", true),
            ("a*b*c", "a-b-c", true),
            ("a*b*c", "acb", false),
            ("a*b*c", "ac", false),
            ("*b", "b", true),
            ("a**b", "ab", true),
            ("aa*aa", "aaa", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ] {
            assert_eq!(wildcard_match(&parts(pattern), text), expected, "{pattern} ~ {text}");
        }
    }
}
