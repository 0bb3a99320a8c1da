//! A resource read as the YAML document a file would hold, without writing
//! it out: a serde `Deserializer` over the message itself, so that the YAML
//! reader's own visitors (and their checks) read it field by field, as
//! they read a file, borrowing its strings.

use std::borrow::Cow;

use serde::de::value::Error;
use serde::de::{self, DeserializeSeed, IntoDeserializer as _, MapAccess, SeqAccess, Visitor};
use serde::forward_to_deserialize_any;

use super::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace};
use crate::unit::Unit;

/// A part of the document.
pub(super) enum Document<'a> {
    Root(&'a RateLimitConfig),
    Descriptors(&'a [RateLimitDescriptor]),
    Descriptor(&'a RateLimitDescriptor),
    Policy(&'a RateLimitPolicy),
    Replaces(&'a [RateLimitReplace]),
    Replace(&'a RateLimitReplace),
    Text(Cow<'a, str>),
    Flag(bool),
    Count(u64),
    Json(serde_json::Value),
}

/// A mapping's entries, in the order a file would write them.
struct Entries<'a> {
    entries: std::vec::IntoIter<(&'static str, Document<'a>)>,
    value: Option<Document<'a>>,
}

impl<'a> Document<'a> {
    fn entries(&self) -> Option<Vec<(&'static str, Document<'a>)>> {
        Some(match *self {
            Self::Root(resource) => vec![
                ("domain", Self::Text(Cow::Borrowed(&resource.domain))),
                ("descriptors", Self::Descriptors(&resource.descriptors)),
            ],
            Self::Descriptor(descriptor) => {
                let mut entries = Vec::with_capacity(8);
                entries.push(("key", Self::Text(Cow::Borrowed(&descriptor.key))));
                if !descriptor.value.is_empty() {
                    entries.push(("value", Self::Text(Cow::Borrowed(&descriptor.value))));
                }
                if let Some(policy) = &descriptor.rate_limit {
                    entries.push(("rate_limit", Self::Policy(policy)));
                }
                entries.push(("shadow_mode", Self::Flag(descriptor.shadow_mode)));
                entries.push(("detailed_metric", Self::Flag(descriptor.detailed_metric)));
                entries.push(("quota_mode", Self::Flag(descriptor.quota_mode)));
                if let Some(metadata) = &descriptor.metadata {
                    let json = serde_json::Value::Object(crate::protobuf_json::from_struct(metadata));
                    entries.push(("metadata", Self::Json(json)));
                }
                if !descriptor.descriptors.is_empty() {
                    entries.push(("descriptors", Self::Descriptors(&descriptor.descriptors)));
                }
                entries
            }
            Self::Policy(policy) => {
                let mut entries = Vec::with_capacity(5);
                // As envoyproxy/ratelimit reads a resource: the unit by its
                // enum name (`UNKNOWN` for 0, refused unless unlimited).
                let unit = match Unit::from_proto(policy.unit) {
                    Some(unit) => Some(Cow::Borrowed(unit.name())),
                    None if policy.unit == 0 && policy.unlimited => None,
                    None if policy.unit == 0 => Some(Cow::Borrowed("UNKNOWN")),
                    None => Some(Cow::Owned(policy.unit.to_string())),
                };
                if let Some(unit) = unit {
                    entries.push(("unit", Self::Text(unit)));
                }
                entries.push(("requests_per_unit", Self::Count(u64::from(policy.requests_per_unit))));
                entries.push(("unlimited", Self::Flag(policy.unlimited)));
                if !policy.name.is_empty() {
                    entries.push(("name", Self::Text(Cow::Borrowed(&policy.name))));
                }
                entries.push(("replaces", Self::Replaces(&policy.replaces)));
                entries
            }
            Self::Replace(replace) => vec![("name", Self::Text(Cow::Borrowed(&replace.name)))],
            _ => return None,
        })
    }
}

impl<'de> de::Deserializer<'de> for Document<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if let Some(entries) = self.entries() {
            return visitor.visit_map(Entries {
                entries: entries.into_iter(),
                value: None,
            });
        }
        match self {
            Self::Descriptors(descriptors) => visitor.visit_seq(Items(
                descriptors
                    .iter()
                    .map(Document::Descriptor)
                    .collect::<Vec<_>>()
                    .into_iter(),
            )),
            Self::Replaces(replaces) => visitor.visit_seq(Items(
                replaces.iter().map(Document::Replace).collect::<Vec<_>>().into_iter(),
            )),
            Self::Text(Cow::Borrowed(text)) => visitor.visit_borrowed_str(text),
            Self::Text(Cow::Owned(text)) => visitor.visit_string(text),
            Self::Flag(flag) => visitor.visit_bool(flag),
            Self::Count(count) => visitor.visit_u64(count),
            Self::Json(json) => json
                .into_deserializer()
                .deserialize_any(visitor)
                .map_err(de::Error::custom),
            Self::Root(_) | Self::Descriptor(_) | Self::Policy(_) | Self::Replace(_) => {
                unreachable!("mappings are read above")
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

struct Items<'a>(std::vec::IntoIter<Document<'a>>);

impl<'de> SeqAccess<'de> for Items<'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Error> {
        self.0.next().map(|item| seed.deserialize(item)).transpose()
    }
}

impl<'de> MapAccess<'de> for Entries<'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Error> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some(value);
        seed.deserialize(Document::Text(Cow::Borrowed(key))).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let value = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a value without its key"))?;
        seed.deserialize(value)
    }
}
