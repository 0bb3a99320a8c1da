//! The values the file format is made of, each read by a serde visitor of
//! its own that checks it where it stands: refused values, key names,
//! generic YAML, lists of maps, text, flags and counts.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::{KEYS, MERGE_KEY};

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
pub(super) struct Keys(Vec<String>);

impl Keys {
    /// The next key of the mapping, refused when it was given before.
    pub(super) fn next<'de, A: MapAccess<'de>>(&mut self, map: &mut A) -> Result<Option<String>, A::Error> {
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
pub(super) fn other_key<'de, A: MapAccess<'de>>(map: &mut A, key: &str) -> Result<(), A::Error> {
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
pub(super) struct ListOfMaps<V>(pub(super) V);

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
pub(super) struct Text;

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
pub(super) struct Flag;

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
pub(super) struct Count;

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

/// `key`, or `key_value`: how envoyproxy/ratelimit names a node.
pub(super) fn composite(key: &str, value: &str) -> String {
    if value.is_empty() {
        key.to_owned()
    } else {
        format!("{key}_{value}")
    }
}

/// The stat key without the domain (`domain.a_b.c` is `a_b.c`).
pub(super) fn path_of(full_key: &str) -> String {
    full_key.split_once('.').map_or(full_key, |(_, path)| path).to_owned()
}

/// Why YAML does not make JSON.
#[derive(Debug, thiserror::Error)]
pub enum YamlJsonError {
    /// A number JSON cannot hold.
    #[error("{0}")]
    Number(serde_json::Error),
    /// A mapping key that is not a scalar.
    #[error("a metadata key must be a scalar")]
    Key,
}

/// metadata as JSON (envoyproxy/ratelimit's `google.protobuf.Struct`).
pub(super) fn yaml_to_json(value: &serde_yaml_ng::Value) -> Result<serde_json::Value, YamlJsonError> {
    use serde_yaml_ng::Value as Yaml;
    Ok(match value {
        Yaml::Null => serde_json::Value::Null,
        Yaml::Bool(flag) => serde_json::Value::Bool(*flag),
        Yaml::Number(number) => serde_json::to_value(number).map_err(YamlJsonError::Number)?,
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
                    _ => return Err(YamlJsonError::Key),
                };
                object.insert(key, yaml_to_json(value)?);
            }
            serde_json::Value::Object(object)
        }
        Yaml::Tagged(tagged) => yaml_to_json(&tagged.value)?,
    })
}

/// serde_yaml_ng puts "at line L column C" in its message; the location is
/// reported separately, so drop it.
pub(super) fn strip_location(message: &str) -> String {
    match message.find(" at line ") {
        Some(at) => message[..at].to_owned(),
        None => message.to_owned(),
    }
}
