//! The rate limit service: one request of descriptors in, one status per
//! descriptor out, whatever the protocol (gRPC or HTTP).
//!
//! All descriptors of a request are decided together, in one store call:
//! when any is over its limit, none consumes. (envoyproxy/ratelimit counts
//! every descriptor's hits even when another is over; Tollgate does not, so a
//! request that is refused costs nothing.) For that, every limit of a domain
//! lives under one subject — the domain — and each descriptor is a limit of
//! it, named by its entries; in Redis Cluster a domain's keys share one slot.
//!
//! Rules in `shadow_mode` are decided apart, after the others: they count and
//! consume like any limit, but never refuse.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tollgate::wire::{rate_limit_headers as rate_limit_headers_of, HeaderLimit};
use tollgate::{AnyStore, Decision, Limit, Op, Policy, Request, Store, Subject};

use crate::config::{Config, Quota, Rule, Unit};
use crate::metrics::Metrics;

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
    /// Hits left before the limit refuses.
    pub limit_remaining: u64,
    /// Until the limit resets (when over: until this request would pass).
    pub duration_until_reset: Duration,
    /// The library's decision behind it, when a limit applied.
    pub decision: Option<Decision>,
    /// The rule that applied (its path), for headers and metrics.
    pub rule: Option<String>,
}

/// The answer to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResponse {
    /// OVER_LIMIT when any descriptor is over its limit.
    pub overall: Code,
    /// One status per descriptor, in the request's order.
    pub statuses: Vec<DescriptorStatus>,
    /// `RateLimit-Policy`, `RateLimit` and `Retry-After` headers.
    pub headers: Vec<(&'static str, String)>,
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
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Decide and count, but always answer OK.
    pub shadow_mode: bool,
    /// Add RateLimit headers to every answer.
    pub response_headers: bool,
}

/// The service state shared by the gRPC and HTTP front ends.
pub struct Service {
    config: ArcSwap<Config>,
    store: AnyStore,
    metrics: Metrics,
    options: Options,
}

/// What the rules say of a request's descriptors.
struct Matched<'a> {
    applied: Vec<Applied<'a>>,
    blocked: Vec<(usize, &'a Rule)>,
    statuses: Vec<DescriptorStatus>,
}

/// A descriptor whose limit applies in this request.
struct Applied<'a> {
    index: usize,
    limit: Limit,
    rule: Option<&'a Rule>,
    hits: u64,
    name: String,
}

fn invalid(message: impl Into<String>) -> ServiceError {
    ServiceError::InvalidArgument(message.into())
}

impl Service {
    /// A service over `store` with `config` in force.
    pub fn new(config: Config, store: AnyStore, options: Options) -> Self {
        Self {
            config: ArcSwap::from_pointee(config),
            store,
            metrics: Metrics::new(),
            options,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Puts a new configuration in force.
    pub fn replace_config(&self, config: Config) {
        self.config.store(Arc::new(config));
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The global switches.
    pub fn options(&self) -> Options {
        self.options
    }

    /// The store.
    pub fn store(&self) -> &AnyStore {
        &self.store
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
        request: &CheckRequest,
        domain: Option<&'a crate::config::Domain>,
        hits: u64,
    ) -> Result<Matched<'a>, ServiceError> {
        // Which limit applies to each descriptor.
        let mut applied: Vec<Applied<'a>> = Vec::new();
        let mut blocked: Vec<(usize, &'a Rule)> = Vec::new();
        let mut statuses: Vec<DescriptorStatus> = request
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok,
                current_limit: None,
                limit_remaining: 0,
                duration_until_reset: Duration::ZERO,
                decision: None,
                rule: None,
            })
            .collect();
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            let hits = descriptor.hits_addend.unwrap_or(hits);
            // Limit names are subject encodings: injective, and hashed when long.
            let entries = || {
                descriptor
                    .entries
                    .iter()
                    .flat_map(|(key, value)| [key.as_str(), value.as_str()])
            };
            let name = Subject::from_parts(entries()).as_key().to_owned();
            if let Some((requests, unit)) = descriptor.limit_override {
                let limit =
                    Limit::fixed_window(requests, unit.duration()).map_err(|error| invalid(error.to_string()))?;
                applied.push(Applied {
                    index,
                    limit,
                    rule: None,
                    hits,
                    name: Subject::from_parts(
                        ["override", &requests.to_string(), unit.name()]
                            .into_iter()
                            .chain(entries()),
                    )
                    .as_key()
                    .to_owned(),
                });
                continue;
            }
            let Some(rule) = domain.and_then(|domain| domain.lookup(&descriptor.entries)) else {
                continue;
            };
            // A shared wildcard counts every match together, under the rule's path.
            let name = if rule.shared {
                Subject::from_parts(["rule", rule.path.as_str()]).as_key().to_owned()
            } else {
                name
            };
            statuses[index].rule = Some(rule.path.clone());
            match &rule.quota {
                Quota::Limited(limit) => applied.push(Applied {
                    index,
                    limit: limit.clone(),
                    rule: Some(rule),
                    hits,
                    name,
                }),
                // Unlimited: always OK, with everything remaining.
                Quota::Unlimited => statuses[index].limit_remaining = u64::from(u32::MAX),
                Quota::Blocked => blocked.push((index, rule)),
            }
        }
        // A rule that `replaces` another drops it when both match.
        let replaced: Vec<&str> = applied
            .iter()
            .filter_map(|applied| applied.rule)
            .flat_map(|rule| rule.replaces.iter().map(String::as_str))
            .collect();
        applied.retain(|applied| {
            !applied
                .rule
                .and_then(|rule| rule.name.as_deref())
                .is_some_and(|name| replaced.contains(&name))
        });

        Ok(Matched {
            applied,
            blocked,
            statuses,
        })
    }

    /// Decides every descriptor of `request` at once.
    ///
    /// # Errors
    ///
    /// A malformed request, or a store fault.
    pub async fn should_rate_limit(&self, request: &CheckRequest) -> Result<CheckResponse, ServiceError> {
        Self::validate(request)?;
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
        } = Self::match_rules(request, domain, hits)?;
        let (shadowed, enforced): (Vec<Applied<'_>>, Vec<Applied<'_>>) = applied
            .into_iter()
            .partition(|applied| applied.rule.is_some_and(|rule| rule.shadow_mode));
        let subject = Subject::new(&request.domain);
        let mut decisions: Vec<(&Applied<'_>, Decision)> = Vec::new();
        let enforced_outcome = self.decide_together(&subject, &enforced).await;
        let mut store_failure = enforced_outcome.as_ref().err().cloned();
        if let Ok(outcome) = &enforced_outcome {
            decisions.extend(enforced.iter().zip(outcome.iter().cloned()));
        }
        for shadow in &shadowed {
            match self.decide_together(&subject, std::slice::from_ref(shadow)).await {
                Ok(outcome) => decisions.extend(outcome.into_iter().map(|decision| (shadow, decision))),
                Err(error) => store_failure = Some(error),
            }
        }
        if let Some(error) = store_failure {
            self.metrics.store_error(&request.domain);
            return Err(ServiceError::Unavailable(error));
        }

        let mut overall = Code::Ok;
        for (index, rule) in blocked {
            // requests_per_unit 0: over the limit, always, consuming nothing.
            let shadow = rule.shadow_mode || self.options.shadow_mode;
            if !shadow {
                overall = Code::OverLimit;
            }
            let status = &mut statuses[index];
            status.code = if shadow { Code::Ok } else { Code::OverLimit };
            status.current_limit = Some(CurrentLimit {
                name: rule.name.clone().unwrap_or_default(),
                requests_per_unit: 0,
                unit: rule.unit,
            });
        }
        for (applied, decision) in &decisions {
            let shadow = applied.rule.is_some_and(|rule| rule.shadow_mode) || self.options.shadow_mode;
            let over = !decision.allowed;
            if over && !shadow {
                overall = Code::OverLimit;
            }
            let rule_label = match applied.rule {
                Some(rule) if rule.detailed_metric => detailed_label(&request.descriptors[applied.index].entries),
                Some(rule) => rule.path.clone(),
                None => "override".to_owned(),
            };
            self.metrics
                .record(&request.domain, &rule_label, applied.hits, decision, shadow);
            let status = &mut statuses[applied.index];
            status.code = if over && !shadow { Code::OverLimit } else { Code::Ok };
            status.current_limit = Some(current_limit(applied, decision));
            status.limit_remaining = decision.remaining;
            status.duration_until_reset = if over {
                decision.retry_after.unwrap_or(decision.reset_after)
            } else {
                decision.reset_after
            };
            status.decision = Some(decision.clone());
            status.rule = applied
                .rule
                .map(|rule| rule.path.clone())
                .or_else(|| Some("override".to_owned()));
        }
        if self.options.shadow_mode {
            overall = Code::Ok;
        }
        self.metrics.latency(&request.domain, started.elapsed());
        let headers = if self.options.response_headers {
            rate_limit_headers(&statuses, overall)
        } else {
            Vec::new()
        };
        Ok(CheckResponse {
            overall,
            statuses,
            headers,
        })
    }

    /// Decides `applied` as one all-or-nothing policy; returns each one's decision.
    async fn decide_together(&self, subject: &Subject, applied: &[Applied<'_>]) -> Result<Vec<Decision>, String> {
        if applied.is_empty() {
            return Ok(Vec::new());
        }
        // A descriptor sent twice is one limit, weighing the sum of its hits.
        let mut limits: Vec<(String, Limit)> = Vec::new();
        let mut costs: Vec<u64> = Vec::new();
        let mut slot_of = Vec::with_capacity(applied.len());
        for each in applied {
            if let Some(slot) = limits.iter().position(|(name, _)| *name == each.name) {
                costs[slot] = costs[slot].saturating_add(each.hits);
                slot_of.push(slot);
            } else {
                slot_of.push(limits.len());
                limits.push((each.name.clone(), each.limit.clone()));
                costs.push(each.hits);
            }
        }
        let policy = Policy::new(limits).map_err(|error| error.to_string())?;
        let cost = costs.iter().copied().max().unwrap_or(1);
        let request = Request::new(gateway_op(&policy), cost).with_costs(costs);
        let outcome = self.store.decide(subject, &policy, &request).await.map_err(|error| {
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
            unit: None,
        },
    }
}

fn detailed_label(entries: &[(String, String)]) -> String {
    entries
        .iter()
        .map(|(key, value)| format!("{key}_{value}"))
        .collect::<Vec<_>>()
        .join(".")
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
                status.duration_until_reset,
                status.code == Code::OverLimit,
            )
        })
        .collect();
    rate_limit_headers_of(&limits, overall == Code::OverLimit)
}
