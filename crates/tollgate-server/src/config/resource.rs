//! `ratelimit.config.ratelimit.v3.RateLimitConfig`, the resource a control
//! plane (Envoy Gateway, Envoy AI Gateway, go-control-plane's snapshot cache)
//! serves to rate limit services over ADS. No crate carries it, so its
//! messages are declared here, field for field and tag for tag.

use std::path::PathBuf;

use envoy_types::pb::google::protobuf::Struct;

use super::{Config, ConfigError, Domain, Unit};

/// The type URL of a [`RateLimitConfig`] resource.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// One domain's limits, as a control plane sends them.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitConfig {
    /// The resource's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The domain.
    #[prost(string, tag = "2")]
    pub domain: String,
    /// The top level of the descriptor tree.
    #[prost(message, repeated, tag = "3")]
    pub descriptors: Vec<RateLimitDescriptor>,
}

/// One node of the descriptor tree.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    /// The entry's key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Its value (empty: any).
    #[prost(string, tag = "2")]
    pub value: String,
    /// What applies at this depth.
    #[prost(message, optional, tag = "3")]
    pub rate_limit: Option<RateLimitPolicy>,
    /// Deeper nodes.
    #[prost(message, repeated, tag = "4")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// Decide and count, but never deny.
    #[prost(bool, tag = "5")]
    pub shadow_mode: bool,
    /// Metrics with the request's own values.
    #[prost(bool, tag = "6")]
    pub detailed_metric: bool,
    /// Quota mode.
    #[prost(bool, tag = "7")]
    pub quota_mode: bool,
    /// Handed to Envoy in dynamic metadata.
    #[prost(message, optional, tag = "8")]
    pub metadata: Option<Struct>,
}

/// A limit.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitPolicy {
    /// The unit, as [`crate::unit::Unit::proto`] numbers it (0: none).
    #[prost(int32, tag = "1")]
    pub unit: i32,
    /// Requests per unit.
    #[prost(uint32, tag = "2")]
    pub requests_per_unit: u32,
    /// Never limited.
    #[prost(bool, tag = "3")]
    pub unlimited: bool,
    /// The name other rules' `replaces` refer to.
    #[prost(string, tag = "4")]
    pub name: String,
    /// Rules this one replaces.
    #[prost(message, repeated, tag = "5")]
    pub replaces: Vec<RateLimitReplace>,
}

/// A rule replaced, by name.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitReplace {
    /// The name.
    #[prost(string, tag = "1")]
    pub name: String,
}

// --- Reading a resource. -------------------------------------------------------

/// A resource written as the YAML a file would hold, and the descriptor
/// each line belongs to, so that what the YAML reader refuses is named by
/// resource and descriptor rather than by a line nobody wrote.
struct Written {
    text: String,
    /// The descriptor path (`key_value.key2`) of each line, `""` above them.
    lines: Vec<String>,
}

impl Written {
    fn line(&mut self, depth: usize, path: &str, text: &str) {
        for _ in 0..depth {
            self.text.push_str("  ");
        }
        self.text.push_str(text);
        self.text.push('\n');
        self.lines.push(path.to_owned());
    }

    fn descriptors(&mut self, depth: usize, parent: &str, descriptors: &[RateLimitDescriptor]) {
        for descriptor in descriptors {
            let composite = if descriptor.value.is_empty() {
                descriptor.key.clone()
            } else {
                format!("{}_{}", descriptor.key, descriptor.value)
            };
            let path = if parent.is_empty() {
                composite
            } else {
                format!("{parent}.{composite}")
            };
            self.line(depth, &path, &format!("- key: {}", quoted(&descriptor.key)));
            let depth = depth + 1;
            if !descriptor.value.is_empty() {
                self.line(depth, &path, &format!("value: {}", quoted(&descriptor.value)));
            }
            if let Some(policy) = &descriptor.rate_limit {
                self.line(depth, &path, "rate_limit:");
                self.policy(depth + 1, &path, policy);
            }
            for (name, set) in [
                ("shadow_mode", descriptor.shadow_mode),
                ("detailed_metric", descriptor.detailed_metric),
                ("quota_mode", descriptor.quota_mode),
            ] {
                if set {
                    self.line(depth, &path, &format!("{name}: true"));
                }
            }
            if let Some(metadata) = &descriptor.metadata {
                let json = serde_json::Value::Object(struct_to_json(metadata));
                self.line(depth, &path, &format!("metadata: {json}"));
            }
            if !descriptor.descriptors.is_empty() {
                self.line(depth, &path, "descriptors:");
                self.descriptors(depth, &path, &descriptor.descriptors);
            }
        }
    }

    fn policy(&mut self, depth: usize, path: &str, policy: &RateLimitPolicy) {
        // As envoyproxy/ratelimit reads a resource: the unit by its enum name
        // (`UNKNOWN` for 0, refused unless the rule is unlimited).
        match Unit::from_proto(policy.unit) {
            Some(unit) => self.line(depth, path, &format!("unit: {}", unit.name())),
            None if policy.unit == 0 && policy.unlimited => {}
            None if policy.unit == 0 => self.line(depth, path, "unit: UNKNOWN"),
            None => self.line(depth, path, &format!("unit: \"{}\"", policy.unit)),
        }
        self.line(depth, path, &format!("requests_per_unit: {}", policy.requests_per_unit));
        if policy.unlimited {
            self.line(depth, path, "unlimited: true");
        }
        if !policy.name.is_empty() {
            self.line(depth, path, &format!("name: {}", quoted(&policy.name)));
        }
        if !policy.replaces.is_empty() {
            self.line(depth, path, "replaces:");
            for replace in &policy.replaces {
                self.line(depth, path, &format!("- name: {}", quoted(&replace.name)));
            }
        }
    }
}

/// A YAML double-quoted scalar (JSON's escapes are YAML's).
fn quoted(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

fn struct_to_json(fields: &Struct) -> serde_json::Map<String, serde_json::Value> {
    fields
        .fields
        .iter()
        .map(|(name, value)| (name.clone(), value_to_json(value)))
        .collect()
}

fn value_to_json(value: &envoy_types::pb::google::protobuf::Value) -> serde_json::Value {
    use envoy_types::pb::google::protobuf::value::Kind;
    match &value.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(flag)) => serde_json::Value::Bool(*flag),
        Some(Kind::NumberValue(number)) => {
            serde_json::Number::from_f64(*number).map_or(serde_json::Value::Null, serde_json::Value::Number)
        }
        Some(Kind::StringValue(text)) => serde_json::Value::String(text.clone()),
        Some(Kind::ListValue(list)) => serde_json::Value::Array(list.values.iter().map(value_to_json).collect()),
        Some(Kind::StructValue(fields)) => serde_json::Value::Object(struct_to_json(fields)),
    }
}

impl Domain {
    /// Reads a `RateLimitConfig` resource through the same reader, and the
    /// same checks, as a file: the resource is written as the YAML a file
    /// would hold and read as one.
    ///
    /// # Errors
    ///
    /// What a file would be refused for; the error names the resource (as
    /// its file, `xds:<name>`) and the descriptor at fault.
    pub fn from_resource(resource: &RateLimitConfig) -> Result<Self, ConfigError> {
        let mut written = Written {
            text: String::new(),
            lines: Vec::new(),
        };
        written.line(0, "", &format!("domain: {}", quoted(&resource.domain)));
        if !resource.descriptors.is_empty() {
            written.line(0, "", "descriptors:");
            written.descriptors(0, "", &resource.descriptors);
        }
        let file = PathBuf::from(format!("xds:{}", resource.name));
        Self::parse(&written.text, &file).map_err(|error| {
            let descriptor = error
                .line
                .and_then(|line| written.lines.get(line.wrapping_sub(1)))
                .filter(|path| !path.is_empty());
            ConfigError {
                message: match descriptor {
                    Some(path) => format!("descriptor {path}: {}", error.message),
                    None => error.message,
                },
                line: None,
                file,
            }
        })
    }
}

impl Config {
    /// The configuration a control plane's resources make, one domain each
    /// (or merged, with `merge_domains`), as [`Config::load_with`] makes one
    /// of files.
    ///
    /// # Errors
    ///
    /// The first resource that cannot be used, or a domain twice.
    pub fn from_resources(resources: &[RateLimitConfig], merge_domains: bool) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        for resource in resources {
            config.insert(Domain::from_resource(resource)?, merge_domains)?;
        }
        Ok(config)
    }
}
