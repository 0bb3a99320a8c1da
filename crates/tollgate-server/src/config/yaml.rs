//! The file format, as envoyproxy/ratelimit reads it: hand-written serde
//! visitors, so that every error carries its line and every key is checked
//! where it stands.

use std::fmt;
use std::path::Path;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use tollgate::Limit;

use super::{ConfigError, Domain, Level, Node, Quota, Rule, Unit};

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

/// The keys of one mapping so far: a key given twice is refused, as
/// envoyproxy/ratelimit's YAML reader refuses it (rather than the last one
/// silently winning).
#[derive(Default)]
struct Keys(Vec<String>);

impl Keys {
    /// The next key of the mapping, refused when it was given before.
    fn next<'de, A: MapAccess<'de>>(&mut self, map: &mut A) -> Result<Option<String>, A::Error> {
        let Some(KeyName(key)) = map.next_key()? else {
            return Ok(None);
        };
        if self.0.contains(&key) {
            // Refused where its value starts, so that the error has its line.
            let message = format!("mapping key \"{key}\" already defined");
            map.next_value_seed(Refuse(message.clone()))?;
            return Err(de::Error::custom(message));
        }
        self.0.push(key.clone());
        Ok(Some(key))
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
        let mut keys = Keys::default();
        while let Some(key) = keys.next(&mut map)? {
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
        let mut keys = Keys::default();
        while let Some(key) = keys.next(&mut map)? {
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
                    // envoyproxy/ratelimit's counting: a descriptor that goes
                    // over still adds its hits (usage that happened).
                    requests => Quota::Limited(
                        Limit::fixed_window(requests, unit.duration())
                            .and_then(Limit::recording_overage)
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
