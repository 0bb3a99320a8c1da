//! The rate limit service: one request of descriptors in, one status per
//! descriptor out, whatever the protocol (gRPC or HTTP).
//!
//! All descriptors of a request are decided together: when any is over its
//! limit, none consumes. (envoyproxy/ratelimit counts every descriptor's hits
//! even when another is over; Tollgate does not, so a request that is refused
//! costs nothing.) Each descriptor is its own subject — the domain and the
//! descriptor's entries — so that one domain's keys spread over a Redis
//! Cluster; a descriptor's limit is named `rule` (or, for a limit Envoy
//! sends, `override.<requests>.<unit>`). The store decides them with
//! [`Store::decide_spread`]: in one call on one Redis server; on a Cluster
//! in one call per hash slot, giving back what the other slots took when one
//! denies.
//!
//! Rules in `shadow_mode` are decided apart, each alone: they count and
//! consume like any limit, but never refuse. A rule in `quota_mode` (or every
//! rule, with the global quota mode) refuses the request only when every
//! quota-mode descriptor of it is over: one that is over is set aside and the
//! others are decided again, so that an admitted request consumes from all
//! the limits that admit it and a refused one from none.
//!
//! On Envoy's protocol the answer follows envoyproxy/ratelimit's conventions:
//! an OVER_LIMIT status reports `limit_remaining` 0; a fixed window's
//! `duration_until_reset` is the time to the window's end, even for a counter
//! nothing touched; the global shadow mode answers an overall OK and keeps
//! each descriptor's code; the response headers are those of the most
//! restrictive descriptor ([`restrictiveness`], the library's rule).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tollgate::wire::{rate_limit_headers as rate_limit_headers_of, HeaderLimit};
use tollgate::{AnyStore, Decision, Limit, Op, Policy, Request, Restrictiveness, Store, Subject};

use crate::config::{Config, Quota, Rule, Unit};
use crate::metrics::Metrics;

/// The name of a configured rule's limit within its descriptor's subject.
const RULE: &str = "rule";

/// The most hits one request or descriptor may add.
pub const MAX_HITS: u64 = u32::MAX as u64;

/// One descriptor of a request: its entries, and optionally its own hits
/// and a limit that overrides the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// `(key, value)` pairs, outermost first.
    pub entries: Vec<(String, String)>,
    /// Hits for this descriptor instead of the request's.
    pub hits_addend: Option<u64>,
    /// A fixed window of `requests_per_unit` per `unit` instead of the configured rule.
    pub limit_override: Option<(u64, Unit)>,
}

/// A request: Envoy's `RateLimitRequest`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckRequest {
    /// The configuration domain.
    pub domain: String,
    /// The descriptors to decide.
    pub descriptors: Vec<Descriptor>,
    /// Hits each descriptor adds (0 counts as 1).
    pub hits_addend: u64,
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

/// The answer to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResponse {
    /// OVER_LIMIT when a descriptor outside shadow and quota mode is over
    /// its limit, or when every quota-mode descriptor is; OK in global
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
}

/// Why a request was not decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceError {
    /// The request is malformed (400 / `INVALID_ARGUMENT`).
    InvalidArgument(String),
    /// The store failed (503 / `UNAVAILABLE`, so Envoy's `failure_mode_deny` decides).
    Unavailable(String),
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::InvalidArgument(message) | Self::Unavailable(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for ServiceError {}

/// Global switches, as envoyproxy/ratelimit's settings.
#[derive(Debug, Clone)]
#[allow(clippy::struct_excessive_bools)] // Each is one setting.
pub struct Options {
    /// Decide and count, but always answer an overall OK (each descriptor
    /// keeps its real code) (`SHADOW_MODE`).
    pub shadow_mode: bool,
    /// Every rule in quota mode (`QUOTA_MODE`).
    pub quota_mode: bool,
    /// Add the limit, remaining and reset headers to every answer
    /// (`LIMIT_RESPONSE_HEADERS_ENABLED`).
    pub response_headers: bool,
    /// Their names.
    pub header_names: HeaderNames,
    /// The share of a limit past which hits count as near the limit
    /// (`NEAR_LIMIT_RATIO`, 0.8).
    pub near_limit_ratio: f32,
    /// Healthy only once a configuration with a domain is loaded
    /// (`HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    pub healthy_with_config_only: bool,
    /// Answer with dynamic metadata: the request, and the `metadata` of the
    /// rules it passed (`RESPONSE_DYNAMIC_METADATA`).
    pub dynamic_metadata: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            shadow_mode: false,
            quota_mode: false,
            response_headers: false,
            header_names: HeaderNames::default(),
            near_limit_ratio: 0.8,
            healthy_with_config_only: false,
            dynamic_metadata: false,
        }
    }
}

/// The names of the response headers (`LIMIT_LIMIT_HEADER`,
/// `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`); by default the IETF
/// draft's, as in envoyproxy/ratelimit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    /// The limit's requests per unit.
    pub limit: String,
    /// Hits left.
    pub remaining: String,
    /// Seconds until the limit resets.
    pub reset: String,
}

impl Default for HeaderNames {
    fn default() -> Self {
        Self {
            limit: "RateLimit-Limit".to_owned(),
            remaining: "RateLimit-Remaining".to_owned(),
            reset: "RateLimit-Reset".to_owned(),
        }
    }
}

/// The service state shared by the gRPC and HTTP front ends.
pub struct Service {
    config: ArcSwap<Config>,
    store: AnyStore,
    metrics: Metrics,
    options: Options,
    healthy: watch::Sender<bool>,
}

/// What the rules say of a request's descriptors.
struct Matched<'a> {
    applied: Vec<Applied<'a>>,
    blocked: Vec<Blocked<'a>>,
    statuses: Vec<DescriptorStatus>,
    /// Each descriptor's rule's metadata (none for unlimited or replaced rules).
    metadata: Vec<Option<&'a serde_json::Value>>,
}

/// A descriptor whose limit applies in this request.
struct Applied<'a> {
    index: usize,
    limit: Limit,
    rule: Option<&'a Rule>,
    hits: u64,
    /// The descriptor: the domain and its entries.
    subject: Subject,
    /// The counter's name within the subject.
    name: String,
    /// envoyproxy/ratelimit's stat key, without the domain.
    stat_key: Cow<'a, str>,
    /// A fixed window's length (its reset is the window's end).
    window: Option<Duration>,
    shadow: bool,
    quota: bool,
}

/// A descriptor whose rule blocks (`requests_per_unit: 0`).
struct Blocked<'a> {
    index: usize,
    rule: &'a Rule,
    hits: u64,
    stat_key: Cow<'a, str>,
    quota: bool,
}

fn invalid(message: impl Into<String>) -> ServiceError {
    ServiceError::InvalidArgument(message.into())
}

impl Service {
    /// A service over `store` with `config` in force.
    pub fn new(config: Config, store: AnyStore, options: Options) -> Self {
        let healthy = !options.healthy_with_config_only || !config.domains.is_empty();
        Self {
            config: ArcSwap::from_pointee(config),
            store,
            metrics: Metrics::with_near_limit_ratio(options.near_limit_ratio),
            options,
            healthy: watch::channel(healthy).0,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Puts a new configuration in force.
    pub fn replace_config(&self, config: Config) {
        if self.options.healthy_with_config_only {
            self.healthy.send_replace(!config.domains.is_empty());
        }
        self.config.store(Arc::new(config));
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The global switches.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The store.
    pub fn store(&self) -> &AnyStore {
        &self.store
    }

    /// Follows whether the service is healthy (gRPC health and `/healthcheck`).
    pub fn health(&self) -> watch::Receiver<bool> {
        self.healthy.subscribe()
    }

    /// Marks the service unhealthy from now on (it is shutting down).
    pub fn stopping(&self) {
        self.healthy.send_replace(false);
    }

    fn validate(request: &CheckRequest) -> Result<(), ServiceError> {
        if request.domain.is_empty() {
            return Err(invalid("domain must not be empty"));
        }
        if request.descriptors.is_empty() {
            return Err(invalid("descriptors must not be empty"));
        }
        if request.hits_addend > MAX_HITS {
            return Err(invalid(format!("hits_addend must be at most {MAX_HITS}")));
        }
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            if descriptor.entries.is_empty() {
                return Err(invalid(format!("descriptors[{index}] has no entries")));
            }
            if descriptor.entries.iter().any(|(key, _)| key.is_empty()) {
                return Err(invalid(format!("descriptors[{index}] has an entry without a key")));
            }
            if descriptor.hits_addend.is_some_and(|hits| hits > MAX_HITS) {
                return Err(invalid(format!(
                    "descriptors[{index}].hits_addend must be at most {MAX_HITS}"
                )));
            }
            if let Some((requests, _)) = descriptor.limit_override {
                if requests == 0 {
                    return Err(invalid(format!(
                        "descriptors[{index}].limit.requests_per_unit must be at least 1"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Finds the limit each descriptor of `request` meets.
    fn match_rules<'a>(
        &self,
        request: &CheckRequest,
        domain: Option<&'a crate::config::Domain>,
        hits: u64,
    ) -> Result<Matched<'a>, ServiceError> {
        let mut applied: Vec<Applied<'a>> = Vec::new();
        let mut blocked: Vec<Blocked<'a>> = Vec::new();
        let mut replacing: Vec<&'a str> = Vec::new();
        let mut metadata: Vec<Option<&'a serde_json::Value>> = vec![None; request.descriptors.len()];
        let mut statuses: Vec<DescriptorStatus> = request
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok,
                current_limit: None,
                limit_remaining: 0,
                duration_until_reset: None,
                decision: None,
                rule: None,
            })
            .collect();
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            let hits = descriptor.hits_addend.unwrap_or(hits);
            if let Some((requests, unit)) = descriptor.limit_override {
                applied.push(self.overridden(&request.domain, index, descriptor, hits, requests, unit)?);
                continue;
            }
            let Some(found) = domain.and_then(|domain| domain.lookup(&descriptor.entries)) else {
                continue;
            };
            let rule = found.rule;
            replacing.extend(rule.replaces.iter().map(String::as_str));
            if !matches!(rule.quota, Quota::Unlimited) {
                metadata[index] = found.metadata;
            }
            let stat_key = match found.stat_key {
                Some(key) => Cow::Owned(key),
                None => Cow::Borrowed(rule.path.as_str()),
            };
            statuses[index].rule = Some(rule.path.clone());
            let quota = rule.quota_mode || self.options.quota_mode;
            match &rule.quota {
                Quota::Limited(limit) => {
                    // Subjects are injective encodings, hashed when long. A
                    // share_threshold wildcard puts its pattern in place of
                    // the value, so its matches share.
                    let entries = descriptor.entries.iter().enumerate().flat_map(|(at, (key, value))| {
                        let value = found
                            .shared
                            .iter()
                            .find(|(shared, _)| *shared == at)
                            .map_or(value.as_str(), |(_, pattern)| *pattern);
                        [key.as_str(), value]
                    });
                    applied.push(Applied {
                        index,
                        limit: limit.clone(),
                        rule: Some(rule),
                        hits,
                        subject: Subject::from_parts(std::iter::once(request.domain.as_str()).chain(entries)),
                        name: RULE.to_owned(),
                        stat_key,
                        window: rule.quota.fixed_window(),
                        shadow: rule.shadow_mode,
                        quota,
                    });
                }
                // Unlimited: always OK, with everything remaining, and no stats.
                Quota::Unlimited => statuses[index].limit_remaining = u64::from(u32::MAX),
                Quota::Blocked => blocked.push(Blocked {
                    index,
                    rule,
                    hits,
                    stat_key,
                    quota,
                }),
            }
        }
        // A rule that `replaces` another drops it when both match.
        let replaced = |rule: Option<&Rule>| {
            rule.and_then(|rule| rule.name.as_deref())
                .is_some_and(|name| replacing.contains(&name))
        };
        for each in applied.iter().filter(|each| replaced(each.rule)) {
            statuses[each.index].rule = None;
            metadata[each.index] = None;
        }
        for each in blocked.iter().filter(|each| replaced(Some(each.rule))) {
            metadata[each.index] = None;
        }
        applied.retain(|each| !replaced(each.rule));
        blocked.retain(|each| !replaced(Some(each.rule)));
        Ok(Matched {
            applied,
            blocked,
            statuses,
            metadata,
        })
    }

    /// A descriptor with a limit sent by Envoy. As envoyproxy/ratelimit: it
    /// is never in shadow mode, but follows the global quota mode.
    fn overridden<'a>(
        &self,
        domain: &str,
        index: usize,
        descriptor: &Descriptor,
        hits: u64,
        requests: u64,
        unit: Unit,
    ) -> Result<Applied<'a>, ServiceError> {
        let limit = Limit::fixed_window(requests, unit.duration()).map_err(|error| invalid(error.to_string()))?;
        let entries = descriptor
            .entries
            .iter()
            .flat_map(|(key, value)| [key.as_str(), value.as_str()]);
        Ok(Applied {
            index,
            limit,
            rule: None,
            hits,
            subject: Subject::from_parts(std::iter::once(domain).chain(entries)),
            name: format!("override.{requests}.{}", unit.name()),
            stat_key: Cow::Owned(override_stat_key(&descriptor.entries)),
            window: Some(unit.duration()),
            shadow: false,
            quota: self.options.quota_mode,
        })
    }

    /// Decides every descriptor of `request` at once.
    ///
    /// Descriptors in shadow mode are decided apart, each alone. The others
    /// are decided together, all-or-nothing; a quota-mode descriptor that is
    /// over its limit is then set aside and the rest decided again, so that
    /// the request consumes from every limit or from none (when it is
    /// refused).
    ///
    /// # Errors
    ///
    /// A malformed request, or a store fault.
    pub async fn should_rate_limit(&self, request: &CheckRequest) -> Result<CheckResponse, ServiceError> {
        if let Err(error) = Self::validate(request) {
            self.metrics.service_error();
            return Err(error);
        }
        let started = Instant::now();
        let config = self.config.load();
        let hits = if request.hits_addend == 0 {
            1
        } else {
            request.hits_addend
        };
        let domain = config.domains.get(&request.domain);

        let Matched {
            applied,
            blocked,
            mut statuses,
            metadata,
        } = self.match_rules(request, domain, hits)?;
        let mut decisions: Vec<Option<Decision>> = vec![None; statuses.len()];
        let decided = self.decide_all(&applied, &blocked, &mut decisions).await;
        if let Err(error) = decided {
            self.metrics.store_error(&request.domain);
            return Err(ServiceError::Unavailable(error));
        }

        let now = unix_now();
        let mut quota_of = vec![false; statuses.len()];
        for each in &blocked {
            quota_of[each.index] = each.quota;
            self.block(&request.domain, each, &mut statuses[each.index], now);
        }
        for each in &applied {
            let Some(decision) = decisions[each.index].take() else {
                continue;
            };
            quota_of[each.index] = each.quota;
            self.metrics.record(
                &request.domain,
                &each.stat_key,
                each.hits,
                Usage::of(&decision, each.hits, each.shadow),
            );
            let over = !decision.allowed;
            let status = &mut statuses[each.index];
            status.code = if over && !each.shadow {
                Code::OverLimit
            } else {
                Code::Ok
            };
            status.current_limit = Some(current_limit(each, &decision));
            status.limit_remaining = if over { 0 } else { decision.remaining };
            status.duration_until_reset = Some(match each.window {
                Some(window) if decision.reset_after.is_zero() => until_window_end(window, now),
                None if over => decision.retry_after.unwrap_or(decision.reset_after),
                _ => decision.reset_after,
            });
            status.decision = Some(decision);
            status.rule = Some(
                each.rule
                    .map_or_else(|| "override".to_owned(), |rule| rule.path.clone()),
            );
        }

        let mut overall = overall_code(&statuses, &quota_of);
        if overall == Code::OverLimit && self.options.shadow_mode {
            overall = Code::Ok;
            self.metrics.global_shadow_mode();
        }
        self.metrics.latency(&request.domain, started.elapsed());
        let headers = if self.options.response_headers {
            envoy_headers(&statuses, &self.options.header_names)
        } else {
            Vec::new()
        };
        let dynamic_metadata = self
            .options
            .dynamic_metadata
            .then(|| dynamic_metadata(request, &statuses, &metadata));
        Ok(CheckResponse {
            overall,
            statuses,
            headers,
            dynamic_metadata,
        })
    }

    /// The status of a descriptor whose rule blocks: over the limit (but for
    /// a peek), always, consuming nothing.
    fn block(&self, domain: &str, each: &Blocked<'_>, status: &mut DescriptorStatus, now: u64) {
        let over = each.hits > 0;
        status.code = if over && !each.rule.shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        };
        status.current_limit = Some(CurrentLimit {
            name: each.rule.name.clone().unwrap_or_default(),
            requests_per_unit: 0,
            unit: each.rule.unit,
        });
        status.duration_until_reset = each.rule.unit.map(|unit| until_window_end(unit.duration(), now));
        let usage = Usage {
            limit: 0,
            before: 0,
            after: each.hits,
            over,
            shadow: each.rule.shadow_mode,
        };
        self.metrics.record(domain, &each.stat_key, each.hits, usage);
    }

    /// Decides the applied limits (see [`Service::should_rate_limit`]),
    /// leaving each descriptor's decision in `decisions`.
    async fn decide_all(
        &self,
        applied: &[Applied<'_>],
        blocked: &[Blocked<'_>],
        decisions: &mut [Option<Decision>],
    ) -> Result<(), String> {
        for shadow in applied.iter().filter(|each| each.shadow) {
            let outcome = self.decide_together(&[shadow]).await?;
            decisions[shadow.index] = outcome.into_iter().next();
        }
        let enforced: Vec<&Applied<'_>> = applied.iter().filter(|each| !each.shadow && !each.quota).collect();
        let mut live: Vec<&Applied<'_>> = applied.iter().filter(|each| !each.shadow && each.quota).collect();
        // Quota-mode descriptors: all of them (shadow ones included), and
        // those that already failed (blocked ones).
        let total_quota =
            applied.iter().filter(|each| each.quota).count() + blocked.iter().filter(|each| each.quota).count();
        let mut failed_quota = blocked
            .iter()
            .filter(|each| each.quota && each.hits > 0 && !each.rule.shadow_mode)
            .count();
        loop {
            let batch: Vec<&Applied<'_>> = enforced.iter().chain(&live).copied().collect();
            if batch.is_empty() {
                return Ok(());
            }
            let outcome = self.decide_together(&batch).await?;
            let mut enforced_denied = false;
            let mut newly_failed = 0;
            for (each, decision) in batch.iter().zip(outcome) {
                if !decision.allowed {
                    if each.quota {
                        newly_failed += 1;
                    } else {
                        enforced_denied = true;
                    }
                }
                decisions[each.index] = Some(decision);
            }
            // Refused (nothing consumed), or admitted (all consumed).
            if enforced_denied || newly_failed == 0 || failed_quota + newly_failed == total_quota {
                return Ok(());
            }
            // Some quota-mode descriptors are over but the request goes on:
            // decide again without them, so that the others consume.
            failed_quota += newly_failed;
            live.retain(|each| decisions[each.index].as_ref().is_some_and(|decision| decision.allowed));
        }
    }

    /// Decides `applied` as one all-or-nothing policy; returns each one's decision.
    async fn decide_together(&self, applied: &[&Applied<'_>]) -> Result<Vec<Decision>, String> {
        if applied.is_empty() {
            return Ok(Vec::new());
        }
        // A descriptor sent twice is one limit, weighing the sum of its hits.
        let mut subjects: Vec<Subject> = Vec::new();
        let mut limits: Vec<(String, Limit)> = Vec::new();
        let mut costs: Vec<u64> = Vec::new();
        let mut slot_of = Vec::with_capacity(applied.len());
        for each in applied {
            let same =
                |(subject, (name, _)): (&Subject, &(String, Limit))| *subject == each.subject && *name == each.name;
            if let Some(slot) = subjects.iter().zip(&limits).position(same) {
                costs[slot] = costs[slot].saturating_add(each.hits);
                slot_of.push(slot);
            } else {
                slot_of.push(limits.len());
                subjects.push(each.subject.clone());
                limits.push((each.name.clone(), each.limit.clone()));
                costs.push(each.hits);
            }
        }
        let policy = Policy::spread(limits).map_err(|error| error.to_string())?;
        let cost = costs.iter().copied().max().unwrap_or(1);
        let request = Request::new(gateway_op(&policy), cost).with_costs(costs);
        let outcome = self
            .store
            .decide_spread(&subjects, &policy, &request)
            .await
            .map_err(|error| {
                if error.is_invalid() {
                    format!("invalid request: {error}")
                } else {
                    error.to_string()
                }
            })?;
        self.metrics.path(outcome.path);
        Ok(slot_of.into_iter().map(|slot| outcome.limits[slot].1.clone()).collect())
    }
}

/// envoyproxy/ratelimit's dynamic metadata (see [`CheckResponse`]).
fn dynamic_metadata(
    request: &CheckRequest,
    statuses: &[DescriptorStatus],
    metadata: &[Option<&serde_json::Value>],
) -> serde_json::Map<String, serde_json::Value> {
    use serde_json::{json, Map, Value};
    let descriptors: Vec<Value> = request
        .descriptors
        .iter()
        .map(|descriptor| {
            let mut fields = Map::new();
            let entries: Vec<Value> = descriptor
                .entries
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
            if let Some(hits) = descriptor.hits_addend {
                fields.insert("hitsAddend".to_owned(), json!(hits));
            }
            Value::Object(fields)
        })
        .collect();
    let mut fields = Map::new();
    fields.insert("domain".to_owned(), Value::String(request.domain.clone()));
    fields.insert("descriptors".to_owned(), Value::Array(descriptors));
    if request.hits_addend != 0 {
        fields.insert("hitsAddend".to_owned(), json!(request.hits_addend));
    }
    let mut passed = Map::new();
    for (status, metadata) in statuses.iter().zip(metadata) {
        if let (Code::Ok, Some(Value::Object(metadata))) = (status.code, metadata) {
            merge(&mut passed, metadata);
        }
    }
    if !passed.is_empty() {
        fields.insert("metadata".to_owned(), Value::Object(passed));
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

/// As envoyproxy/ratelimit: over when a descriptor outside quota mode is,
/// or when every quota-mode descriptor (`quota_of`) is.
fn overall_code(statuses: &[DescriptorStatus], quota_of: &[bool]) -> Code {
    let over = |index: &usize| statuses[*index].code == Code::OverLimit;
    let quota: Vec<usize> = (0..statuses.len()).filter(|index| quota_of[*index]).collect();
    let failed = (0..statuses.len()).any(|index| !quota_of[index] && over(&index));
    if failed || (!quota.is_empty() && quota.iter().all(over)) {
        Code::OverLimit
    } else {
        Code::Ok
    }
}

/// What one descriptor did to its limit, as envoyproxy/ratelimit's stats
/// count it: hits used before and after the request, of `limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// The limit.
    pub limit: u64,
    /// Hits used before this request.
    pub before: u64,
    /// Hits used with this request's (what it would have used, when over).
    pub after: u64,
    /// Over the limit.
    pub over: bool,
    /// The rule is in shadow mode.
    pub shadow: bool,
}

impl Usage {
    /// The usage a library decision reports, for `hits`.
    pub fn of(decision: &Decision, hits: u64, shadow: bool) -> Self {
        let used = decision.limit.saturating_sub(decision.remaining);
        let (before, after) = if decision.allowed {
            (used.saturating_sub(hits), used)
        } else {
            (used, used.saturating_add(hits))
        };
        Self {
            limit: decision.limit,
            before,
            after,
            over: !decision.allowed,
            shadow,
        }
    }
}

/// envoyproxy/ratelimit's stat key of a limit sent by Envoy, without the
/// domain: `key_value.key2_value2` (`key` alone for an empty value).
fn override_stat_key(entries: &[(String, String)]) -> String {
    let mut key = String::new();
    for (name, value) in entries {
        if !key.is_empty() {
            key.push('.');
        }
        key.push_str(name);
        if !value.is_empty() {
            key.push('_');
            key.push_str(value);
        }
    }
    key
}

/// The system time in microseconds since the Unix epoch.
fn unix_now() -> u64 {
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

/// The operation a gateway request runs on `policy`: a check, or, when a
/// rule is a concurrency limit, an acquire whose lease ends with its ttl (a
/// gateway request has no release).
pub(crate) fn gateway_op(policy: &Policy) -> Op {
    if policy.has_concurrency() {
        Op::Acquire {
            lease: format!("{:016x}", fastrand::u64(..)),
            max_wait: Some(Duration::ZERO),
        }
    } else {
        Op::Check
    }
}

fn current_limit(applied: &Applied<'_>, decision: &Decision) -> CurrentLimit {
    match applied.rule {
        Some(rule) => CurrentLimit {
            name: rule.name.clone().unwrap_or_default(),
            requests_per_unit: rule.requests_per_unit.unwrap_or(decision.limit),
            unit: rule.unit,
        },
        None => CurrentLimit {
            name: String::new(),
            requests_per_unit: decision.limit,
            unit: applied.window.and_then(|window| {
                [
                    Unit::Second,
                    Unit::Minute,
                    Unit::Hour,
                    Unit::Day,
                    Unit::Week,
                    Unit::Month,
                    Unit::Year,
                ]
                .into_iter()
                .find(|unit| unit.duration() == window)
            }),
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

/// Whole seconds, rounded up (a client told 0 would retry at once).
fn seconds(duration: Duration) -> u64 {
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
    vec![
        (names.limit.clone(), limit.to_string()),
        (names.remaining.clone(), status.limit_remaining.to_string()),
        (
            names.reset.clone(),
            seconds(status.duration_until_reset.unwrap_or_default()).to_string(),
        ),
    ]
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
