//! What a request is and what it is answered, whatever the front end.

use std::time::Duration;

use tollgate::Decision;

use crate::unit::Unit;

/// What a descriptor names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `(key, value)` pairs, outermost first, matched against the domain's
    /// rules (Envoy's descriptors).
    Entries(Vec<(String, String)>),
    /// The rule of the domain with this `name`, for `subject`
    /// (`/v1/check`'s named form).
    Named {
        /// Whom the limit is kept for.
        subject: String,
        /// The rule's `name`.
        rule: String,
    },
}

impl Default for Target {
    fn default() -> Self {
        Self::Entries(Vec::new())
    }
}

/// One descriptor of a request: what it names, and optionally its own cost
/// and a limit that overrides the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// The entries, or a named rule.
    pub target: Target,
    /// Its cost instead of the request's (Envoy's per-descriptor
    /// `hits_addend`); 0 is a peek.
    pub cost: Option<u64>,
    /// A fixed window of `requests_per_unit` per `unit` instead of the configured rule.
    pub limit_override: Option<(u64, Unit)>,
}

impl Descriptor {
    /// A descriptor of `entries`.
    pub fn entries(entries: Vec<(String, String)>) -> Self {
        Self {
            target: Target::Entries(entries),
            ..Self::default()
        }
    }

    /// Its entries (none for a named rule).
    pub(super) fn entry_list(&self) -> &[(String, String)] {
        match &self.target {
            Target::Entries(entries) => entries,
            Target::Named { .. } => &[],
        }
    }
}

/// A request, whatever the front end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckRequest {
    /// The configuration domain.
    pub domain: String,
    /// The descriptors to decide.
    pub descriptors: Vec<Descriptor>,
    /// The cost each descriptor adds unless it says otherwise (Envoy's
    /// `hits_addend`, 0 there read as not set); not set, 1. 0 is a peek.
    pub cost: Option<u64>,
}

impl CheckRequest {
    /// The cost each descriptor adds unless it says otherwise.
    pub(super) fn default_cost(&self) -> u64 {
        self.cost.unwrap_or(1)
    }
}

/// Envoy's response codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Under the limit.
    Ok,
    /// Over the limit.
    OverLimit,
}

/// The limit reported to Envoy for a descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentLimit {
    /// The rule's `name`, or empty.
    pub name: String,
    /// Requests per unit (the configured figure, else the limit's capacity).
    pub requests_per_unit: u64,
    /// The unit, when the rule has one.
    pub unit: Option<Unit>,
}

/// The answer for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorStatus {
    /// OK or over the limit.
    pub code: Code,
    /// The limit that applied, if any.
    pub current_limit: Option<CurrentLimit>,
    /// Hits left before the limit refuses (0 when over the limit, as
    /// envoyproxy/ratelimit reports).
    pub limit_remaining: u64,
    /// Until the limit resets, when a limit applied: for a fixed window,
    /// the time to the window's end (even when nothing touched it); for
    /// other algorithms, until this request would pass when over, else until
    /// the limit is full again.
    pub duration_until_reset: Option<Duration>,
    /// The library's decision behind it, when a limit applied.
    pub decision: Option<Decision>,
    /// The rule that applied (its path), for headers and metrics.
    pub rule: Option<String>,
}

impl DescriptorStatus {
    /// No limit applies.
    pub(super) fn unmatched() -> Self {
        Self {
            code: Code::Ok,
            current_limit: None,
            limit_remaining: 0,
            duration_until_reset: None,
            decision: None,
            rule: None,
        }
    }
}

/// The answer to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResponse {
    /// OVER_LIMIT when a descriptor outside shadow mode and no alternative
    /// is over its limit, or when every alternative is; OK in global
    /// shadow mode.
    pub overall: Code,
    /// One status per descriptor, in the request's order.
    pub statuses: Vec<DescriptorStatus>,
    /// When response headers are enabled: envoyproxy/ratelimit's limit,
    /// remaining and reset headers, of the most restrictive descriptor, for
    /// `response_headers_to_add`.
    pub headers: Vec<(String, String)>,
    /// With dynamic metadata enabled, envoyproxy/ratelimit's: `domain`,
    /// `descriptors` (their `entries` as `key=value`, `limit`,
    /// `hitsAddend`), the request's `hitsAddend`, and the `metadata` of the
    /// rules of the descriptors that passed, merged (the first wins).
    pub dynamic_metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// The instant the store decided at (µs since the epoch; the latest,
    /// over several calls), when it was asked.
    pub decided_at: Option<u64>,
}
