//! From decisions to the answer: each descriptor's status, the overall
//! code, headers and dynamic metadata.

use std::time::Duration;

use tollgate::wire::{rate_limit_headers as rate_limit_headers_of, HeaderLimit};
use tollgate::{Decision, Restrictiveness};

use super::matching::{Item, Matched};
use super::{CheckRequest, CheckResponse, Code, CurrentLimit, DescriptorStatus, HeaderNames, Service};
use crate::config::Rule;
use crate::metrics::Usage;
use crate::unit::Unit;

impl Service {
    /// Fills in `item`'s status from what was decided, `now` being the
    /// decision's instant, and counts its hits in the metrics when `count`.
    pub(super) fn answer(&self, domain: &str, item: &mut Item<'_>, now: u64, count: bool) {
        let over = item.is_over();
        match &item.matched {
            Matched::Nothing => {}
            // Unlimited: always OK, with everything remaining, and no stats.
            Matched::Unlimited => item.status.limit_remaining = u64::from(u32::MAX),
            Matched::Blocked => {
                let Some(rule) = item.rule else { return };
                item.status.code = if over { Code::OverLimit } else { Code::Ok };
                item.status.current_limit = Some(CurrentLimit {
                    name: rule.name.clone().unwrap_or_default(),
                    requests_per_unit: 0,
                    unit: rule.unit,
                });
                item.status.duration_until_reset = rule.unit.map(|unit| until_window_end(unit.duration(), now));
                let usage = Usage {
                    limit: 0,
                    before: 0,
                    after: item.cost,
                    over: item.cost > 0,
                    shadow: item.shadow,
                };
                if count {
                    self.metrics.record(domain, &item.stat_key, item.cost, usage);
                }
            }
            Matched::Limited(limited) => {
                let Some(decision) = item.decision.clone() else {
                    return;
                };
                if count {
                    self.metrics.record(
                        domain,
                        &item.stat_key,
                        item.cost,
                        Usage::of(&decision, item.cost, item.shadow),
                    );
                }
                let status = &mut item.status;
                status.code = if over && !item.shadow {
                    Code::OverLimit
                } else {
                    Code::Ok
                };
                status.current_limit = Some(current_limit(item.rule, limited.window, &decision));
                status.limit_remaining = if over { 0 } else { decision.remaining };
                status.duration_until_reset = Some(match limited.window {
                    Some(window) if decision.reset_after.is_zero() => until_window_end(window, now),
                    None if over => decision.retry_after.unwrap_or(decision.reset_after),
                    _ => decision.reset_after,
                });
                status.decision = Some(decision);
            }
        }
    }
}

impl CheckResponse {
    /// The request's decision, as one limit answers it: the most
    /// restrictive descriptor's ([`restrictiveness`]), `allowed` as the
    /// overall code says. Refused by a blocking rule (or admitted past a
    /// limit that does not refuse, in shadow mode or an alternative): that rule's
    /// answer, never admissible (or `retry_after` zero). No limit applied:
    /// [`Decision::unlimited`].
    pub fn decision(&self) -> Decision {
        let over = self.overall == Code::OverLimit;
        let chosen = most_restrictive(&self.statuses, |status| status.decision.is_some());
        let mut decision = match chosen.and_then(|status| status.decision.clone()) {
            Some(decision) if !over || chosen.is_some_and(|status| status.code == Code::OverLimit) => decision,
            _ if over => blocked(),
            _ => Decision::unlimited(),
        };
        decision.allowed = !over;
        if decision.allowed {
            decision.retry_after = Some(Duration::ZERO);
        }
        decision
    }
}

/// The decision of a request a blocking rule refuses: never admissible.
fn blocked() -> Decision {
    let mut decision = Decision::unlimited();
    decision.allowed = false;
    decision.limit = 0;
    decision.remaining = 0;
    decision.retry_after = None;
    decision
}

/// envoyproxy/ratelimit's dynamic metadata (see [`CheckResponse`]).
pub(super) fn dynamic_metadata(
    request: &CheckRequest,
    items: &[Item<'_>],
    overall: Code,
) -> serde_json::Map<String, serde_json::Value> {
    use serde_json::{json, Map, Value};
    let descriptors: Vec<Value> = request
        .descriptors
        .iter()
        .map(|descriptor| {
            let mut fields = Map::new();
            let entries: Vec<Value> = descriptor
                .entry_list()
                .iter()
                .map(|(key, value)| Value::String(format!("{key}={value}")))
                .collect();
            fields.insert("entries".to_owned(), Value::Array(entries));
            if let Some((requests, unit)) = descriptor.limit_override {
                fields.insert(
                    "limit".to_owned(),
                    Value::String(format!("requests_per_unit:{requests} unit:{}", unit.name())),
                );
            }
            if let Some(cost) = descriptor.cost {
                fields.insert("hitsAddend".to_owned(), json!(cost));
            }
            Value::Object(fields)
        })
        .collect();
    let mut fields = Map::new();
    fields.insert("domain".to_owned(), Value::String(request.domain.clone()));
    fields.insert("descriptors".to_owned(), Value::Array(descriptors));
    if let Some(cost) = request.cost {
        fields.insert("hitsAddend".to_owned(), json!(cost));
    }
    let mut passed = Map::new();
    for item in items {
        if let (Code::Ok, Some(Value::Object(metadata))) = (item.status.code, item.metadata) {
            merge(&mut passed, metadata);
        }
    }
    if !passed.is_empty() {
        fields.insert("metadata".to_owned(), Value::Object(passed));
    }
    // Tollgate's: the rule that refused (the most restrictive of those over).
    let statuses: Vec<&DescriptorStatus> = items.iter().map(|item| &item.status).collect();
    let refusing = Restrictiveness::most(statuses.iter().map(|status| restrictiveness(status)))
        .and_then(|index| refused_by(statuses[index]))
        .filter(|_| overall == Code::OverLimit);
    if let Some(rule) = refusing {
        fields.insert("refusedBy".to_owned(), Value::String(rule.to_owned()));
    }
    fields
}

/// Adds `from`'s fields missing in `into`, merging maps in both.
fn merge(into: &mut serde_json::Map<String, serde_json::Value>, from: &serde_json::Map<String, serde_json::Value>) {
    for (key, value) in from {
        match (into.get_mut(key), value) {
            (Some(serde_json::Value::Object(existing)), serde_json::Value::Object(more)) => merge(existing, more),
            (Some(_), _) => {}
            (None, _) => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

/// As envoyproxy/ratelimit: over when a descriptor that is no alternative
/// is, or when every alternative is.
pub(super) fn overall_code(items: &[Item<'_>]) -> Code {
    let over = |item: &&Item<'_>| item.status.code == Code::OverLimit;
    // A descriptor counts as an alternative when a rule (or an override) applied to it.
    let alternatives: Vec<&Item<'_>> = items
        .iter()
        .filter(|item| item.alternative && item.status.current_limit.is_some())
        .collect();
    let failed = items.iter().filter(|item| !item.alternative).any(|item| over(&item));
    if failed || (!alternatives.is_empty() && alternatives.iter().all(over)) {
        Code::OverLimit
    } else {
        Code::Ok
    }
}

/// The system time in microseconds since the Unix epoch.
pub(super) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_micros()).unwrap_or(u64::MAX))
}

/// The time to the end of the current window of `window` (windows aligned
/// on the Unix epoch, as fixed windows are).
fn until_window_end(window: Duration, now: u64) -> Duration {
    let window = u64::try_from(window.as_micros()).unwrap_or(u64::MAX).max(1);
    Duration::from_micros(window - now % window)
}

fn current_limit(rule: Option<&Rule>, window: Option<Duration>, decision: &Decision) -> CurrentLimit {
    match rule {
        Some(rule) => CurrentLimit {
            name: rule.name.clone().unwrap_or_default(),
            requests_per_unit: rule.requests_per_unit.unwrap_or(decision.limit),
            unit: rule.unit,
        },
        None => CurrentLimit {
            name: String::new(),
            requests_per_unit: decision.limit,
            unit: window.and_then(Unit::of_duration),
        },
    }
}

/// How restrictive a descriptor's answer is: the one rule (longest
/// `retry_after`, see [`Restrictiveness`]) by which the status, the headers
/// and `/v1/check`'s decision speak for several descriptors.
pub fn restrictiveness(status: &DescriptorStatus) -> Restrictiveness {
    Restrictiveness::new(
        status.code == Code::OverLimit,
        status.decision.as_ref().and_then(|decision| decision.retry_after),
        status.limit_remaining,
    )
}

/// The most restrictive of the statuses `candidate` keeps, if any.
fn most_restrictive(
    statuses: &[DescriptorStatus],
    candidate: impl Fn(&DescriptorStatus) -> bool,
) -> Option<&DescriptorStatus> {
    let candidates: Vec<&DescriptorStatus> = statuses.iter().filter(|status| candidate(status)).collect();
    Restrictiveness::most(candidates.iter().map(|status| restrictiveness(status))).map(|index| candidates[index])
}

/// Whole seconds, rounded up (a client told 0 would retry at once): how
/// Envoy's protocol carries a reset, as envoyproxy/ratelimit reports it and
/// as Envoy reads it (its `x-ratelimit-reset` takes the seconds alone, so a
/// reset 0.4 s away sent as such would read 0).
pub fn seconds(duration: Duration) -> u64 {
    duration.as_micros().div_ceil(1_000_000) as u64
}

/// envoyproxy/ratelimit's response headers: the most restrictive limit's
/// requests per unit, hits remaining and seconds to its reset, under
/// `names`.
pub fn envoy_headers(statuses: &[DescriptorStatus], names: &HeaderNames) -> Vec<(String, String)> {
    let Some(status) = most_restrictive(statuses, |status| status.current_limit.is_some()) else {
        return Vec::new();
    };
    let limit = status.current_limit.as_ref().map_or(0, |limit| limit.requests_per_unit);
    let mut headers = vec![
        (names.limit.clone(), limit.to_string()),
        (names.remaining.clone(), status.limit_remaining.to_string()),
        (
            names.reset.clone(),
            seconds(status.duration_until_reset.unwrap_or_default()).to_string(),
        ),
    ];
    if let (Some(policy), Some(rule)) = (&names.policy, refused_by(status)) {
        headers.push((policy.clone(), rule.to_owned()));
    }
    headers
}

/// The rule a refused descriptor's `status` names: its `name`, else its
/// path in the configuration; none when it was not refused.
pub(super) fn refused_by(status: &DescriptorStatus) -> Option<&str> {
    if status.code != Code::OverLimit {
        return None;
    }
    status
        .current_limit
        .as_ref()
        .map(|limit| limit.name.as_str())
        .filter(|name| !name.is_empty())
        .or(status.rule.as_deref())
}

/// The IETF draft's `RateLimit-Policy` (every limit that applied) and
/// `RateLimit` (the most restrictive), plus `Retry-After` when over; written
/// by the library, as its tower layer writes them.
pub fn rate_limit_headers(statuses: &[DescriptorStatus], overall: Code) -> Vec<(&'static str, String)> {
    let limits: Vec<HeaderLimit<'_>> = statuses
        .iter()
        .filter(|status| status.decision.is_some())
        .map(|status| {
            let limit = status.current_limit.as_ref();
            HeaderLimit::from_parts(
                status.rule.as_deref().unwrap_or("limit"),
                limit.map_or(0, |limit| limit.requests_per_unit),
                limit.and_then(|limit| limit.unit).map(Unit::duration),
                status.limit_remaining,
                status.duration_until_reset.unwrap_or_default(),
                status.code == Code::OverLimit,
            )
        })
        .collect();
    rate_limit_headers_of(&limits, overall == Code::OverLimit)
}

impl Service {
    /// Logs a line for a sample ([`Options::log_refusals`](super::Options::log_refusals))
    /// of the refused descriptors of `request`: which rule refused whom.
    pub(super) fn log_refusals(&self, request: &CheckRequest, items: &[Item<'_>]) {
        for (descriptor, item) in request.descriptors.iter().zip(items) {
            let Some(rule) = refused_by(&item.status) else {
                continue;
            };
            if fastrand::u32(..super::options::REFUSALS_SAMPLED_OF) >= self.options.log_refusals {
                continue;
            }
            let entries: Vec<String> = descriptor
                .entry_list()
                .iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect();
            let decision = item.status.decision.as_ref();
            tracing::info!(
                domain = %request.domain,
                descriptor = %entries.join(","),
                rule,
                limit = decision.map_or(0, |decision| decision.limit),
                hits = item.cost,
                retry_after_ms = decision
                    .and_then(|decision| decision.retry_after)
                    .map_or(-1, |retry| i64::try_from(retry.as_millis()).unwrap_or(i64::MAX)),
                "refused"
            );
        }
    }
}
