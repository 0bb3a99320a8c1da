//! `ratelimit.config.ratelimit.v3.RateLimitConfig`, the resource a control
//! plane (Envoy Gateway, Envoy AI Gateway, go-control-plane's snapshot cache)
//! serves to rate limit services over ADS. No crate carries it, so its
//! messages are declared here, field for field and tag for tag.

use std::path::PathBuf;

use envoy_types::pb::google::protobuf::Struct;

use tollgate::Limit;

use self::document::Document;

use super::{Config, ConfigError, Domain, RuleLimit, Unit};

mod document;

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
                let json = serde_json::Value::Object(crate::protobuf_json::from_struct(metadata));
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
        let file = PathBuf::from(format!("xds:{}", resource.name));
        // The document built as a value is read without scanning text; only
        // a refused one is written out as text and read again, for its
        // lines to name the descriptor at fault.
        let refused = match Self::from_document(Document::Root(resource), &file) {
            Ok(domain) => return Ok(domain),
            Err(refused) => refused,
        };
        match Self::from_text(resource, file) {
            Err(named) => Err(named),
            Ok(_) => Err(refused),
        }
    }

    /// [`Domain::from_resource`] through YAML text, its errors naming the
    /// descriptor at fault.
    fn from_text(resource: &RateLimitConfig, file: PathBuf) -> Result<Self, ConfigError> {
        let mut written = Written {
            text: String::new(),
            lines: Vec::new(),
        };
        written.line(0, "", &format!("domain: {}", quoted(&resource.domain)));
        if !resource.descriptors.is_empty() {
            written.line(0, "", "descriptors:");
            written.descriptors(0, "", &resource.descriptors);
        }
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

// --- Writing a resource. -------------------------------------------------------

impl Domain {
    /// This domain as the resource a control plane sends: what
    /// [`Domain::from_resource`] reads back as the same rules. The resource
    /// cannot say all a file can: a rule's `algorithm` block (it is sent as
    /// its `unit` and `requests_per_unit`), `share_threshold` and
    /// `value_to_metric`; each loss is named in the returned notes.
    pub fn to_resource(&self) -> (RateLimitConfig, Vec<String>) {
        let mut notes = Vec::new();
        let descriptors = nodes_to_resource(&self.domain, self.descriptors.nodes(), &mut notes);
        let resource = RateLimitConfig {
            name: self.domain.clone(),
            domain: self.domain.clone(),
            descriptors,
        };
        (resource, notes)
    }
}

fn nodes_to_resource(parent: &str, nodes: &[super::Node], notes: &mut Vec<String>) -> Vec<RateLimitDescriptor> {
    nodes
        .iter()
        .map(|node| {
            let path = format!("{parent}.{}", node.composite);
            if node.share_threshold || node.value_to_metric {
                notes.push(format!(
                    "{path}: share_threshold and value_to_metric are not in RateLimitConfig"
                ));
            }
            let rate_limit = node.rule.as_ref().map(|rule| {
                if let RuleLimit::Limited(limit) = &rule.limit {
                    let plain = rule
                        .unit
                        .zip(rule.requests_per_unit)
                        .and_then(|(unit, requests)| Limit::fixed_window(requests, unit.duration()).ok())
                        .and_then(|window| window.recording_overage().ok());
                    if plain.as_ref() != Some(limit) {
                        notes.push(format!(
                            "{path}: its algorithm block is sent as its unit and requests_per_unit"
                        ));
                    }
                }
                RateLimitPolicy {
                    unit: rule.unit.map_or(0, Unit::proto),
                    requests_per_unit: rule
                        .requests_per_unit
                        .map_or(0, |requests| u32::try_from(requests).unwrap_or(u32::MAX)),
                    unlimited: matches!(rule.limit, RuleLimit::Unlimited),
                    name: rule.name.clone().unwrap_or_default(),
                    replaces: rule
                        .replaces
                        .iter()
                        .map(|name| RateLimitReplace { name: name.clone() })
                        .collect(),
                }
            });
            let rule = node.rule.as_ref();
            RateLimitDescriptor {
                key: node.key.clone(),
                value: node.value.clone().unwrap_or_default(),
                rate_limit,
                descriptors: nodes_to_resource(&path, node.descriptors.nodes(), notes),
                shadow_mode: rule.is_some_and(|rule| rule.shadow_mode),
                detailed_metric: rule.is_some_and(|rule| rule.detailed_metric),
                quota_mode: rule.is_some_and(|rule| rule.alternative),
                metadata: match &node.metadata {
                    Some(serde_json::Value::Object(fields)) => Some(crate::protobuf_json::to_struct(fields.clone())),
                    _ => None,
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    const FILE: &str = r"
domain: every-field
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: minute, requests_per_unit: 10, name: acme}
    shadow_mode: true
    detailed_metric: true
    metadata: {plan: gold, seats: 12, tags: [a, b]}
    descriptors:
      - key: path
        rate_limit: {unit: week, requests_per_unit: 7}
  - key: tenant
    rate_limit:
      unit: second
      requests_per_unit: 3
      replaces: [{name: acme}]
    quota_mode: true
  - key: internal
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: hour, requests_per_unit: 0}
";

    /// A file written as a resource (what `--publish-xds` sends) reads back
    /// as the same rules and metadata.
    #[test]
    fn every_field_goes_through_a_resource_and_back() {
        let domain = Domain::parse(FILE, Path::new("every-field.yaml")).unwrap();
        let (resource, notes) = domain.to_resource();
        assert!(notes.is_empty(), "{notes:?}");
        let back = Domain::from_resource(&resource).unwrap();
        let dump = |domain: &Domain| {
            let mut config = Config::default();
            config.add(domain.clone()).unwrap();
            config.dump()
        };
        assert_eq!(dump(&back), dump(&domain));
        let (acme, tenant) = (&back.descriptors.nodes()[0], &back.descriptors.nodes()[1]);
        let rule = acme.rule.as_ref().unwrap();
        assert_eq!((rule.name.as_deref(), rule.detailed_metric), (Some("acme"), true));
        let tenant_rule = tenant.rule.as_ref().unwrap();
        assert_eq!(
            (tenant_rule.replaces.as_slice(), tenant_rule.alternative),
            (["acme".to_owned()].as_slice(), true)
        );
        // A protobuf Struct's numbers are doubles, as upstream reads them.
        let metadata = acme.metadata.as_ref().unwrap();
        assert_eq!(
            (metadata["plan"].as_str(), metadata["seats"].as_f64()),
            (Some("gold"), Some(12.0))
        );
        assert_eq!(metadata["tags"], serde_json::json!(["a", "b"]));
    }

    /// What a resource cannot say is named, and a refused resource names
    /// its descriptor.
    #[test]
    fn losses_and_faults_are_named() {
        let file = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: {algorithm: gcra, rate: 1, period: 1s, burst: 1}}\n";
        let (_, notes) = Domain::parse(file, Path::new("d.yaml")).unwrap().to_resource();
        assert_eq!(
            notes,
            ["d.k: its algorithm block is sent as its unit and requests_per_unit"]
        );
        let mut resource = Domain::parse(FILE, Path::new("f.yaml")).unwrap().to_resource().0;
        resource.descriptors[0].descriptors[0].rate_limit.as_mut().unwrap().unit = 99;
        let error = Domain::from_resource(&resource).unwrap_err().to_string();
        assert!(
            error.starts_with("xds:every-field: descriptor tenant_acme.path: "),
            "{error}"
        );
        assert!(error.contains("invalid rate limit unit \"99\""), "{error}");
    }
}
