//! One override: what `PUT /v1/overrides` takes, what the store keeps, and
//! the rule it puts in force.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate::duration::parse_duration;

use crate::config::{exact_stat_key, rule_from_json, Config, Rule, RuleLimit};

/// One entry of a descriptor: a key and its exact value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// The entry's key.
    pub key: String,
    /// Its value, exactly as a request carries it.
    pub value: String,
}

/// The body of `PUT /v1/overrides`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideRequest {
    /// The domain of the rules it overrides.
    pub domain: String,
    /// The exact descriptor, outermost entry first.
    pub descriptor: Vec<Entry>,
    /// The limit, as a file's `rate_limit` block (`unit`,
    /// `requests_per_unit`, `unlimited`, or an `algorithm` block).
    #[serde(default)]
    pub rate_limit: Option<serde_json::Value>,
    /// The limit as Tollgate's `algorithm` block alone.
    #[serde(default)]
    pub algorithm: Option<serde_json::Value>,
    /// When it ends (RFC 3339).
    #[serde(default)]
    pub expires_at: Option<String>,
    /// How long it lasts (`90s`, `2h`): a temporary raise.
    #[serde(default)]
    pub ttl: Option<String>,
    /// Why: logged with the change, and listed.
    #[serde(default)]
    pub reason: Option<String>,
}

/// An override as the store keeps it and `GET /v1/overrides` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stored {
    /// The domain.
    pub domain: String,
    /// The exact descriptor.
    pub descriptor: Vec<Entry>,
    /// The limit, as a `rate_limit` block.
    pub rate_limit: serde_json::Value,
    /// When it ends, if it does (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// Why it was set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When it was set (RFC 3339).
    pub set_at: String,
}

/// An override in force: what it was set as, and the rule it puts in the
/// place of the one its descriptor matches.
#[derive(Debug, Clone)]
pub struct Override {
    /// As stored.
    pub stored: Stored,
    /// The rule, its path the descriptor's (`tenant_acme`).
    pub rule: Rule,
    /// When it ends, µs since the Unix epoch.
    pub expires_at: Option<u64>,
}

/// The longest `reason` kept.
pub const MAX_REASON: usize = 1_000;

impl Override {
    /// The store's field for a descriptor: its entries as compact JSON
    /// (injective, and readable with `redis-cli`).
    pub fn field(descriptor: &[Entry]) -> String {
        // Built as a JSON value (its text cannot fail to write).
        let pairs = descriptor
            .iter()
            .map(|entry| {
                serde_json::Value::Array(vec![
                    serde_json::Value::String(entry.key.clone()),
                    serde_json::Value::String(entry.value.clone()),
                ])
            })
            .collect();
        serde_json::Value::Array(pairs).to_string()
    }

    /// The descriptor's entries as requests carry them.
    pub fn entries(&self) -> Vec<(String, String)> {
        self.stored
            .descriptor
            .iter()
            .map(|entry| (entry.key.clone(), entry.value.clone()))
            .collect()
    }

    /// The override `request` asks for, set at `now` (µs since the Unix
    /// epoch), checked against the domains of `config`.
    ///
    /// # Errors
    ///
    /// The field at fault, and why: an unknown domain, an empty or too deep
    /// descriptor, a limit a file would refuse or of 0 without `unlimited`,
    /// an expiry in the past or given twice.
    pub fn from_request(request: OverrideRequest, config: &Config, now: u64) -> Result<Self, InvalidOverride> {
        let domain = config.domains.get(&request.domain).ok_or_else(|| {
            if request.domain.is_empty() {
                InvalidOverride::NoDomain
            } else {
                InvalidOverride::UnknownDomain(request.domain.clone())
            }
        })?;
        check_descriptor(&request.descriptor)?;
        let deepest = domain.deepest_rule();
        if request.descriptor.len() > deepest {
            return Err(InvalidOverride::TooDeep {
                entries: request.descriptor.len(),
                domain: request.domain,
                deepest,
            });
        }
        let rate_limit = match (request.rate_limit, request.algorithm) {
            (Some(_), Some(_)) => {
                return Err(InvalidOverride::LimitTwice);
            }
            (Some(rate_limit), None) => rate_limit,
            (None, Some(algorithm)) => serde_json::json!({ "algorithm": algorithm }),
            (None, None) => return Err(InvalidOverride::NoLimit),
        };
        let expires_at = match (request.expires_at, request.ttl) {
            (Some(_), Some(_)) => return Err(InvalidOverride::ExpiryTwice),
            (Some(text), None) => {
                let at = parse_instant(&text).map_err(InvalidOverride::ExpiresAt)?;
                if at <= now {
                    return Err(InvalidOverride::Passed(text));
                }
                Some(at)
            }
            (None, Some(text)) => {
                let ttl = parse_duration(&text).map_err(InvalidOverride::Ttl)?;
                if ttl.is_zero() {
                    return Err(InvalidOverride::ZeroTtl);
                }
                Some(now.saturating_add(micros(ttl)))
            }
            (None, None) => None,
        };
        if request.reason.as_ref().is_some_and(|reason| reason.len() > MAX_REASON) {
            return Err(InvalidOverride::LongReason);
        }
        let stored = Stored {
            domain: request.domain,
            descriptor: request.descriptor,
            rate_limit,
            expires_at: expires_at.map(format_instant),
            reason: request.reason,
            set_at: format_instant(now),
        };
        let read = Self::from_stored(stored)?;
        if matches!(read.rule.limit, RuleLimit::Blocked) {
            return Err(InvalidOverride::Blocks);
        }
        Ok(read)
    }

    /// An override read back from the store.
    ///
    /// # Errors
    ///
    /// A limit or an instant that does not read (a value written by hand).
    pub fn from_stored(stored: Stored) -> Result<Self, InvalidOverride> {
        check_descriptor(&stored.descriptor)?;
        let path = stat_key(&stored.descriptor);
        let rule = rule_from_json(&stored.rate_limit, path).map_err(InvalidOverride::Limit)?;
        let expires_at = stored
            .expires_at
            .as_deref()
            .map(parse_instant)
            .transpose()
            .map_err(InvalidOverride::ExpiresAt)?;
        Ok(Self {
            stored,
            rule,
            expires_at,
        })
    }

    /// In force at `now` (µs since the Unix epoch).
    pub fn in_force(&self, now: u64) -> bool {
        self.expires_at.is_none_or(|end| now < end)
    }

    /// The limit, as logs say it.
    pub fn describe(&self) -> String {
        describe_rule(&self.rule)
    }
}

/// A rule's limit in one line, as the logs of a change say it.
pub fn describe_rule(rule: &Rule) -> String {
    match &rule.limit {
        RuleLimit::Unlimited => "unlimited".to_owned(),
        RuleLimit::Blocked => "0 (blocked)".to_owned(),
        RuleLimit::Limited(limit) => {
            serde_json::to_string(&limit.spec()).unwrap_or_else(|_| format!("{:?}", limit.spec()))
        }
    }
}

fn check_descriptor(descriptor: &[Entry]) -> Result<(), InvalidOverride> {
    if descriptor.is_empty() {
        return Err(InvalidOverride::EmptyDescriptor);
    }
    if let Some(at) = descriptor.iter().position(|entry| entry.key.is_empty()) {
        return Err(InvalidOverride::EmptyKey(at));
    }
    Ok(())
}

/// Why an override is refused; each names the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidOverride {
    /// No domain given.
    #[error("domain: must not be empty")]
    NoDomain,
    /// A domain the configuration does not have.
    #[error("domain: no domain \"{0}\" is configured")]
    UnknownDomain(String),
    /// A descriptor without entries.
    #[error("descriptor: must have at least one entry")]
    EmptyDescriptor,
    /// An entry without a key.
    #[error("descriptor[{0}].key: must not be empty")]
    EmptyKey(usize),
    /// A descriptor deeper than any rule of its domain.
    #[error("descriptor: {entries} entries, and no rule of domain \"{domain}\" is deeper than {deepest}")]
    TooDeep {
        /// The descriptor's entries.
        entries: usize,
        /// The domain.
        domain: String,
        /// Its deepest rule's.
        deepest: usize,
    },
    /// Both `rate_limit` and `algorithm`.
    #[error("algorithm: give the limit once, as rate_limit or as algorithm")]
    LimitTwice,
    /// Neither.
    #[error("rate_limit: required (or algorithm)")]
    NoLimit,
    /// A limit a configuration file would refuse.
    #[error("rate_limit: {0}")]
    Limit(crate::config::RuleJsonError),
    /// A limit of 0 that is not `unlimited`.
    #[error("rate_limit.requests_per_unit: must be at least 1 (or unlimited: true)")]
    Blocks,
    /// Both `expires_at` and `ttl`.
    #[error("ttl: give expires_at or ttl, not both")]
    ExpiryTwice,
    /// An `expires_at` that does not read.
    #[error("expires_at: {0}")]
    ExpiresAt(InstantError),
    /// An `expires_at` that has passed.
    #[error("expires_at: {0} has passed")]
    Passed(String),
    /// A `ttl` that does not read.
    #[error("ttl: {0}")]
    Ttl(tollgate::duration::DurationError),
    /// A `ttl` of 0.
    #[error("ttl: must be more than 0")]
    ZeroTtl,
    /// A reason too long.
    #[error("reason: at most {MAX_REASON} bytes")]
    LongReason,
}

/// Why an instant does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstantError {
    /// Not RFC 3339.
    #[error("\"{0}\" is not an RFC 3339 instant (2026-01-31T12:00:00Z)")]
    NotRfc3339(String),
    /// Before the Unix epoch.
    #[error("\"{0}\" is before 1970")]
    Before1970(String),
}

/// envoyproxy/ratelimit's stat key of a rule at exactly this descriptor
/// (`tenant_acme`): an override's path.
pub fn stat_key(descriptor: &[Entry]) -> String {
    exact_stat_key(
        descriptor
            .iter()
            .map(|entry| (entry.key.as_str(), entry.value.as_str())),
    )
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// An RFC 3339 instant, µs since the Unix epoch.
fn parse_instant(text: &str) -> Result<u64, InstantError> {
    let at: jiff::Timestamp = text.parse().map_err(|_| InstantError::NotRfc3339(text.to_owned()))?;
    u64::try_from(at.as_microsecond()).map_err(|_| InstantError::Before1970(text.to_owned()))
}

/// µs since the Unix epoch, as RFC 3339.
pub fn format_instant(micros: u64) -> String {
    i64::try_from(micros)
        .ok()
        .and_then(|micros| jiff::Timestamp::from_microsecond(micros).ok())
        .map_or_else(String::new, |at| at.to_string())
}
