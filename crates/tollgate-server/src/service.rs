//! The rate limit service: one request of descriptors in, one status per
//! descriptor out, whatever the front end (gRPC, `/json`, `/v1/check`).
//!
//! Every front end parses into one [`CheckRequest`] and calls
//! [`Service::should_rate_limit`]; each descriptor then travels as one value
//! carrying its match, its decision and its status to the answer, and errors
//! keep their kind ([`ServiceError`]) until the front end maps them to a
//! status code.
//!
//! All descriptors of a request are decided together, counted as
//! envoyproxy/ratelimit counts them: a descriptor is over when its count
//! plus its hits exceeds its limit; when none is, all add their hits; when
//! one is, the descriptors that are over still add theirs (usage that
//! happened: a gateway's report of tokens spent looks like a check) and the
//! others add nothing — upstream with `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`
//! set, Tollgate's default ([`Options::stop_increment_when_over`]; unset, every
//! descriptor adds, as upstream's default). A rule with an `algorithm` block
//! counts that way only with `overage: record`; otherwise a refused request
//! costs it nothing. Each descriptor is its own subject — the domain and the
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
//! restrictive descriptor ([`restrictiveness`], the library's rule). Every
//! reset is counted from the instant the store decided at (Redis's clock, on
//! Redis), never the host's.
//!
//! Work is linear in the number of descriptors, which is capped
//! ([`Options::max_descriptors`]), so one request never becomes an unbounded
//! store call.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use futures_util::future::join_all;
use tokio::sync::watch;
use tollgate::wire::{rate_limit_headers as rate_limit_headers_of, HeaderLimit};
use tollgate::{AnyStore, Decision, LeasedStore, Limit, Op, Policy, Request, Restrictiveness, Store, Subject};

use crate::config::{Config, Domain, Quota, Rule};
use crate::metrics::Metrics;
use crate::unit::Unit;

/// The name of a configured rule's limit within its descriptor's subject.
const RULE: &str = "rule";

/// The most hits one request or descriptor may add.
pub const MAX_HITS: u64 = u32::MAX as u64;

/// The most descriptors one request may carry, by default.
pub const DEFAULT_MAX_DESCRIPTORS: usize = 1_000;

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
        limit: String,
    },
}

impl Default for Target {
    fn default() -> Self {
        Self::Entries(Vec::new())
    }
}

/// One descriptor of a request: what it names, and optionally its own hits
/// and a limit that overrides the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// The entries, or a named rule.
    pub target: Target,
    /// Hits for this descriptor instead of the request's.
    pub hits_addend: Option<u64>,
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
    fn entry_list(&self) -> &[(String, String)] {
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
    /// Hits each descriptor adds unless it says otherwise; 0 is a peek (the
    /// gRPC and `/json` front ends read Envoy's `hits_addend` 0 as 1).
    pub hits: u64,
    /// Envoy's `hits_addend` as sent (0: not set), for the dynamic metadata.
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

impl DescriptorStatus {
    /// No limit applies.
    fn unmatched() -> Self {
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
    /// The instant the store decided at (µs since the epoch; the latest,
    /// over several calls), when it was asked.
    pub decided_at: Option<u64>,
}

/// Why a request was not decided; each kind has its status code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceError {
    /// The request is malformed (400 / `INVALID_ARGUMENT`).
    InvalidArgument(String),
    /// The store failed or did not answer in time (503 / `UNAVAILABLE`, so
    /// Envoy's `failure_mode_deny` decides).
    Unavailable(String),
    /// What the request names is not there: an unknown or expired
    /// reservation (404 / `NOT_FOUND`).
    NotFound(String),
    /// The request contradicts what was done: a reservation settled
    /// already with another amount (409 / `FAILED_PRECONDITION`).
    Conflict(String),
}

impl ServiceError {
    /// The service error of a library error: an invalid argument stays one,
    /// anything else is the store's fault.
    pub fn from_store(error: &tollgate::Error) -> Self {
        if error.is_invalid() {
            Self::InvalidArgument(error.to_string())
        } else {
            Self::Unavailable(error.to_string())
        }
    }
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::InvalidArgument(message)
            | Self::Unavailable(message)
            | Self::NotFound(message)
            | Self::Conflict(message) => f.write_str(message),
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
    /// The most descriptors one request may carry (`MAX_DESCRIPTORS`,
    /// [`DEFAULT_MAX_DESCRIPTORS`]); more is an invalid argument.
    pub max_descriptors: usize,
    /// Unhealthy (gRPC health, `/healthcheck`, `/healthz`) while the store
    /// does not answer, checked every second
    /// (`REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`).
    pub health_checks_store: bool,
    /// When a request is refused, only the descriptors that are over add
    /// their hits (true, the default); false: every descriptor whose limit
    /// records its overage adds them (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`,
    /// whose default upstream is false).
    pub stop_increment_when_over: bool,
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
            max_descriptors: DEFAULT_MAX_DESCRIPTORS,
            health_checks_store: false,
            stop_increment_when_over: true,
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
    /// The store, with the blocks of rules whose limit carries a lease
    /// (none on the memory store: it is this process's own).
    store: LeasedStore<AnyStore>,
    metrics: Metrics,
    options: Options,
    healthy: watch::Sender<bool>,
    health: std::sync::Mutex<Health>,
    /// Open reservations (`/v1/reserve`, `/v1/settle`).
    pub(crate) reservations: crate::reservations::Reservations,
}

/// What the service's health depends on; healthy when none holds.
#[derive(Debug, Clone, Copy, Default)]
#[allow(clippy::struct_excessive_bools)] // Each is one cause.
struct Health {
    /// Shutting down.
    stopping: bool,
    /// No domain loaded, with `healthy_with_config_only`.
    no_config: bool,
    /// The store does not answer, with `health_checks_store`.
    store_down: bool,
}

/// One descriptor on its way through the service: what it matched, then
/// its decision and its status.
struct Item<'a> {
    /// Hits it adds (0: a peek).
    hits: u64,
    /// The configured rule that applied, if any (none for Envoy's override).
    rule: Option<&'a Rule>,
    /// What applies to it.
    matched: Matched,
    /// envoyproxy/ratelimit's stat key, without the domain.
    stat_key: Cow<'a, str>,
    /// In quota mode.
    quota: bool,
    /// In shadow mode.
    shadow: bool,
    /// Its rule's metadata, for the dynamic metadata.
    metadata: Option<&'a serde_json::Value>,
    /// The answer, filled in as the request is decided.
    status: DescriptorStatus,
}

/// What applies to a descriptor.
enum Matched {
    /// No rule: OK, with nothing counted.
    Nothing,
    /// An unlimited rule: OK, with everything remaining.
    Unlimited,
    /// A rule of `requests_per_unit: 0`: over (but for a peek), consuming nothing.
    Blocked,
    /// A limit, decided in the store.
    Limited(Box<Limited>),
}

/// A limit that applies in this request.
struct Limited {
    limit: Limit,
    /// The descriptor: the domain and its entries.
    subject: Subject,
    /// The counter's name within the subject.
    name: String,
    /// A fixed window's length (its reset is the window's end).
    window: Option<Duration>,
    /// The store's decision, once made.
    decision: Option<Decision>,
}

impl Item<'_> {
    fn limited(&self) -> Option<&Limited> {
        match &self.matched {
            Matched::Limited(limited) => Some(limited),
            _ => None,
        }
    }

    /// Decided in the store, and enforced (not in shadow mode).
    fn is_enforced(&self) -> bool {
        self.limited().is_some() && !self.shadow
    }

    /// Over its limit, as far as the overall code is concerned.
    fn is_over(&self) -> bool {
        match &self.matched {
            Matched::Blocked => self.hits > 0 && !self.shadow,
            Matched::Limited(limited) => limited.decision.as_ref().is_some_and(|decision| !decision.allowed),
            Matched::Nothing | Matched::Unlimited => false,
        }
    }
}

fn invalid(message: impl Into<String>) -> ServiceError {
    ServiceError::InvalidArgument(message.into())
}

impl Service {
    /// A service over `store` with `config` in force.
    pub fn new(config: Config, store: AnyStore, options: Options) -> Self {
        let health = Health {
            no_config: options.healthy_with_config_only && config.domains.is_empty(),
            ..Health::default()
        };
        Self {
            config: ArcSwap::from_pointee(config),
            store: LeasedStore::new(store),
            metrics: Metrics::with_near_limit_ratio(options.near_limit_ratio),
            options,
            healthy: watch::channel(!health.no_config).0,
            health: std::sync::Mutex::new(health),
            reservations: crate::reservations::Reservations::default(),
        }
    }

    /// Changes a cause of ill health and publishes the result.
    fn update_health(&self, change: impl FnOnce(&mut Health)) {
        let mut health = self.health.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        change(&mut health);
        self.healthy
            .send_replace(!health.stopping && !health.no_config && !health.store_down);
    }

    /// Records whether the store answered its health check (with
    /// [`Options::health_checks_store`]).
    pub fn store_reachable(&self, reachable: bool) {
        self.update_health(|health| health.store_down = !reachable);
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Puts a new configuration in force.
    pub fn replace_config(&self, config: Config) {
        if self.options.healthy_with_config_only {
            let missing = config.domains.is_empty();
            self.update_health(|health| health.no_config = missing);
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
        self.store.inner()
    }

    /// The engine deciding in Redis; `None` on the memory store, or before a
    /// Redis store has connected.
    pub fn engine(&self) -> Option<tollgate::EngineKind> {
        match self.store.inner() {
            AnyStore::Redis(redis) => Some(redis.engine()),
            AnyStore::Resilient(resilient) => resilient.store().map(tollgate::RedisStore::engine),
            _ => None,
        }
    }

    /// Gives back what leased rules hold: before the process stops.
    pub async fn close_leases(&self) {
        // Boxed: the store's futures nest deeply, and the server's own
        // future would otherwise have to lay them out once more.
        let closing: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> =
            Box::pin(self.store.close(None));
        closing.await;
    }

    /// Follows whether the service is healthy (gRPC health and `/healthcheck`).
    pub fn health(&self) -> watch::Receiver<bool> {
        self.healthy.subscribe()
    }

    /// Marks the service unhealthy from now on (it is shutting down).
    pub fn stopping(&self) {
        self.update_health(|health| health.stopping = true);
    }

    fn validate(&self, request: &CheckRequest) -> Result<(), ServiceError> {
        if request.domain.is_empty() {
            return Err(invalid("domain must not be empty"));
        }
        if request.descriptors.is_empty() {
            return Err(invalid("descriptors must not be empty"));
        }
        let most = self.options.max_descriptors;
        if request.descriptors.len() > most {
            return Err(invalid(format!(
                "descriptors: {} given, at most {most} per request (MAX_DESCRIPTORS, --max-descriptors)",
                request.descriptors.len()
            )));
        }
        if request.hits > MAX_HITS {
            return Err(invalid(format!("hits_addend must be at most {MAX_HITS}")));
        }
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            match &descriptor.target {
                Target::Entries(entries) if entries.is_empty() => {
                    return Err(invalid(format!("descriptors[{index}] has no entries")));
                }
                Target::Entries(entries) if entries.iter().any(|(key, _)| key.is_empty()) => {
                    return Err(invalid(format!("descriptors[{index}] has an entry without a key")));
                }
                Target::Named { limit, .. } if limit.is_empty() => {
                    return Err(invalid("limit must not be empty"));
                }
                _ => {}
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

    /// Finds what applies to each descriptor of `request`, and drops the
    /// rules that a matched rule `replaces`.
    fn match_rules<'a>(
        &self,
        request: &'a CheckRequest,
        domain: Option<&'a Domain>,
    ) -> Result<Vec<Item<'a>>, ServiceError> {
        let mut items = Vec::with_capacity(request.descriptors.len());
        let mut replacing: HashSet<&'a str> = HashSet::new();
        for descriptor in &request.descriptors {
            let item = self.match_one(&request.domain, domain, descriptor, request.hits)?;
            if let Some(rule) = item.rule {
                replacing.extend(rule.replaces.iter().map(String::as_str));
            }
            items.push(item);
        }
        if !replacing.is_empty() {
            for item in &mut items {
                let replaced = item
                    .rule
                    .and_then(|rule| rule.name.as_deref())
                    .is_some_and(|name| replacing.contains(name));
                if replaced {
                    item.matched = Matched::Nothing;
                    item.metadata = None;
                    item.status.rule = None;
                }
            }
        }
        Ok(items)
    }

    /// What applies to the descriptor at `index`.
    fn match_one<'a>(
        &self,
        domain_name: &str,
        domain: Option<&'a Domain>,
        descriptor: &'a Descriptor,
        hits: u64,
    ) -> Result<Item<'a>, ServiceError> {
        let hits = descriptor.hits_addend.unwrap_or(hits);
        let mut item = Item {
            hits,
            rule: None,
            matched: Matched::Nothing,
            stat_key: Cow::Borrowed(""),
            quota: false,
            shadow: false,
            metadata: None,
            status: DescriptorStatus::unmatched(),
        };
        if let (Some((requests, unit)), Some(_)) = (descriptor.limit_override, domain) {
            // As envoyproxy/ratelimit: only in a known domain, never in
            // shadow mode, but in the global quota mode.
            let limit = Limit::fixed_window(requests, unit.duration())
                .and_then(Limit::recording_overage)
                .map_err(|error| invalid(error.to_string()))?;
            let entries = descriptor.entry_list();
            let parts = entries.iter().flat_map(|(key, value)| [key.as_str(), value.as_str()]);
            item.matched = Matched::Limited(Box::new(Limited {
                limit,
                subject: Subject::from_parts(std::iter::once(domain_name).chain(parts)),
                name: format!("override.{requests}.{}", unit.name()),
                window: Some(unit.duration()),
                decision: None,
            }));
            item.stat_key = Cow::Owned(override_stat_key(entries));
            item.status.rule = Some("override".to_owned());
            item.quota = self.options.quota_mode;
            return Ok(item);
        }
        let (rule, subject, name, stat_key) = match &descriptor.target {
            Target::Entries(entries) => {
                let Some(found) = domain.and_then(|domain| domain.lookup(entries)) else {
                    return Ok(item);
                };
                let rule = found.rule;
                if !matches!(rule.quota, Quota::Unlimited) {
                    item.metadata = found.metadata;
                }
                // Subjects are injective encodings, hashed when long. A
                // share_threshold wildcard puts its pattern in place of the
                // value, so its matches share.
                let parts = entries.iter().enumerate().flat_map(|(at, (key, value))| {
                    let value = found
                        .shared
                        .iter()
                        .find(|(shared, _)| *shared == at)
                        .map_or(value.as_str(), |(_, pattern)| *pattern);
                    [key.as_str(), value]
                });
                let subject = Subject::from_parts(std::iter::once(domain_name).chain(parts));
                let stat_key = match found.stat_key {
                    Some(key) => Cow::Owned(key),
                    None => Cow::Borrowed(rule.path.as_str()),
                };
                (rule, subject, RULE.to_owned(), stat_key)
            }
            Target::Named { subject, limit } => {
                let rule = domain
                    .and_then(|domain| domain.named_rule(limit))
                    .ok_or_else(|| invalid(format!("domain \"{domain_name}\" has no limit named \"{limit}\"")))?;
                let subject = Subject::new(domain_name).and(subject);
                let name = format!("named:{}", Subject::new(limit).as_key());
                (rule, subject, name, Cow::Borrowed(rule.path.as_str()))
            }
        };
        item.rule = Some(rule);
        item.stat_key = stat_key;
        item.status.rule = Some(rule.path.clone());
        item.quota = rule.quota_mode || self.options.quota_mode;
        item.shadow = rule.shadow_mode;
        item.matched = match &rule.quota {
            Quota::Limited(limit) => Matched::Limited(Box::new(Limited {
                limit: limit.clone(),
                subject,
                name,
                window: rule.quota.fixed_window(),
                decision: None,
            })),
            Quota::Unlimited => Matched::Unlimited,
            Quota::Blocked => Matched::Blocked,
        };
        Ok(item)
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
    /// A malformed request ([`ServiceError::InvalidArgument`]), or a store
    /// fault ([`ServiceError::Unavailable`], counted as one).
    pub async fn should_rate_limit(&self, request: &CheckRequest) -> Result<CheckResponse, ServiceError> {
        self.decide_request(request, Cost::Hits).await
    }

    /// [`Service::should_rate_limit`], each descriptor's hits weighed as
    /// `hits` says: [`Cost::Hits`], or [`Cost::Estimate`] for a reservation
    /// (all-or-nothing, a refused estimate counts nowhere).
    pub(crate) async fn decide_request(
        &self,
        request: &CheckRequest,
        hits: Cost,
    ) -> Result<CheckResponse, ServiceError> {
        if let Err(error) = self.validate(request) {
            self.metrics.service_error();
            return Err(error);
        }
        let started = Instant::now();
        let config = self.config.load();
        let domain = config.domains.get(&request.domain);
        let mut items = match self.match_rules(request, domain) {
            Ok(items) => items,
            Err(error) => {
                self.metrics.service_error();
                return Err(error);
            }
        };
        let decided_at = match self.decide_all(&mut items, hits).await {
            Ok(decided_at) => decided_at,
            Err(error) if error.is_invalid() => {
                self.metrics.service_error();
                return Err(ServiceError::from_store(&error));
            }
            Err(error) => {
                self.metrics.store_error(&request.domain);
                return Err(ServiceError::from_store(&error));
            }
        };
        // Resets count from the store's instant; with nothing decided in
        // the store (only blocked or unlimited rules), from the host's.
        let now = decided_at.unwrap_or_else(unix_now);
        for item in &mut items {
            self.answer(&request.domain, item, now, true);
        }
        let mut overall = overall_code(&items);
        if overall == Code::OverLimit && self.options.shadow_mode {
            overall = Code::Ok;
            self.metrics.global_shadow_mode();
        }
        self.metrics.latency(&request.domain, started.elapsed());
        let dynamic_metadata = self.options.dynamic_metadata.then(|| dynamic_metadata(request, &items));
        let statuses: Vec<DescriptorStatus> = items.into_iter().map(|item| item.status).collect();
        let headers = if self.options.response_headers {
            envoy_headers(&statuses, &self.options.header_names)
        } else {
            Vec::new()
        };
        Ok(CheckResponse {
            overall,
            statuses,
            headers,
            dynamic_metadata,
            decided_at,
        })
    }

    /// Runs `adjustment` for each descriptor's hits on every limit that
    /// applies to `request` (shadow rules too): what settles a reservation.
    /// Answers each limit as it stands after; a refund is not counted as
    /// hits in the metrics, a record is.
    ///
    /// # Errors
    ///
    /// As [`Service::should_rate_limit`].
    pub(crate) async fn adjust(
        &self,
        request: &CheckRequest,
        adjustment: Adjustment,
    ) -> Result<CheckResponse, ServiceError> {
        self.validate(request)?;
        let config = self.config.load();
        let domain = config.domains.get(&request.domain);
        let mut items = self.match_rules(request, domain)?;
        let limited: Vec<usize> = (0..items.len())
            .filter(|&index| items[index].limited().is_some())
            .collect();
        let mut decided_at = None;
        if !limited.is_empty() {
            let cost = match adjustment {
                Adjustment::Refund { at } => Cost::Refund { at },
                Adjustment::Record => Cost::Record,
            };
            let (decisions, at) = self.decide_together(&items, &limited, cost).await.map_err(|error| {
                if !error.is_invalid() {
                    self.metrics.store_error(&request.domain);
                }
                ServiceError::from_store(&error)
            })?;
            set_decisions(&mut items, decisions);
            decided_at = Some(at);
        }
        let now = decided_at.unwrap_or_else(unix_now);
        let count = adjustment == Adjustment::Record;
        for item in &mut items {
            self.answer(&request.domain, item, now, count);
        }
        let overall = overall_code(&items);
        let statuses: Vec<DescriptorStatus> = items.into_iter().map(|item| item.status).collect();
        Ok(CheckResponse {
            overall,
            headers: Vec::new(),
            statuses,
            dynamic_metadata: None,
            decided_at,
        })
    }

    /// Fills in `item`'s status from what was decided, `now` being the
    /// decision's instant, and counts its hits in the metrics when `count`.
    fn answer(&self, domain: &str, item: &mut Item<'_>, now: u64, count: bool) {
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
                    after: item.hits,
                    over: item.hits > 0,
                    shadow: item.shadow,
                };
                if count {
                    self.metrics.record(domain, &item.stat_key, item.hits, usage);
                }
            }
            Matched::Limited(limited) => {
                let Some(decision) = limited.decision.clone() else {
                    return;
                };
                if count {
                    self.metrics.record(
                        domain,
                        &item.stat_key,
                        item.hits,
                        Usage::of(&decision, item.hits, item.shadow),
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

    /// Decides the limits of `items` (see [`Service::should_rate_limit`]),
    /// leaving each one's decision in it; the instant the store decided at
    /// (the latest, over several calls), if it was asked.
    async fn decide_all(&self, items: &mut [Item<'_>], hits: Cost) -> Result<Option<u64>, tollgate::Error> {
        let mut decided_at: Option<u64> = None;
        let note = |seen: Option<u64>, at: u64| Some(seen.map_or(at, |seen| seen.max(at)));
        // Shadow descriptors: each alone (they never refuse the others).
        let shadows: Vec<usize> = (0..items.len())
            .filter(|&index| items[index].limited().is_some() && items[index].shadow)
            .collect();
        let outcomes = join_all(shadows.chunks(1).map(|one| self.decide_together(&*items, one, hits))).await;
        for outcome in outcomes {
            let (decisions, at) = outcome?;
            decided_at = note(decided_at, at);
            set_decisions(items, decisions);
        }
        // Quota-mode descriptors: all of them (shadow ones included), and
        // those that already failed (blocked ones).
        let total_quota = items
            .iter()
            .filter(|item| item.quota && (item.limited().is_some() || matches!(item.matched, Matched::Blocked)))
            .count();
        let mut failed_quota = items
            .iter()
            .filter(|item| item.quota && matches!(item.matched, Matched::Blocked) && item.is_over())
            .count();
        let mut batch: Vec<usize> = (0..items.len()).filter(|&index| items[index].is_enforced()).collect();
        if !self.options.stop_increment_when_over && hits == Cost::Hits {
            // Upstream's default: every descriptor counted as upstream counts
            // adds its hits, over or not, whatever the others say.
            let recording: Vec<usize> = batch
                .iter()
                .copied()
                .filter(|&index| {
                    items[index]
                        .limited()
                        .is_some_and(|limited| limited.limit.records_overage())
                })
                .collect();
            if !recording.is_empty() {
                let (decisions, at) = self.decide_together(&*items, &recording, Cost::Record).await?;
                decided_at = note(decided_at, at);
                set_decisions(items, decisions);
                batch.retain(|index| !recording.contains(index));
            }
        }
        // A blocking rule already refuses the request (one outside quota
        // mode, or every quota-mode descriptor): the others are only looked
        // at, so that a refused request consumes nothing.
        let blocked = items
            .iter()
            .any(|item| !item.quota && matches!(item.matched, Matched::Blocked) && item.is_over());
        if blocked || (total_quota > 0 && failed_quota == total_quota) {
            if !batch.is_empty() {
                let (decisions, at) = self.decide_together(&*items, &batch, Cost::Peek).await?;
                decided_at = note(decided_at, at);
                set_decisions(items, decisions);
            }
            return Ok(decided_at);
        }
        loop {
            if batch.is_empty() {
                return Ok(decided_at);
            }
            let (decisions, at) = self.decide_together(&*items, &batch, hits).await?;
            decided_at = note(decided_at, at);
            set_decisions(items, decisions);
            let mut enforced_denied = false;
            let mut newly_failed = 0;
            for &index in &batch {
                if items[index].is_over() {
                    if items[index].quota {
                        newly_failed += 1;
                    } else {
                        enforced_denied = true;
                    }
                }
            }
            // Refused (nothing consumed), or admitted (all consumed).
            if enforced_denied || newly_failed == 0 || failed_quota + newly_failed == total_quota {
                return Ok(decided_at);
            }
            // Some quota-mode descriptors are over but the request goes on:
            // decide again without them, so that the others consume.
            failed_quota += newly_failed;
            batch.retain(|&index| !items[index].is_over());
        }
    }

    /// Decides the limits of `items` at `indices` as one all-or-nothing
    /// policy; each one's decision (by its index), and the store's instant.
    async fn decide_together(
        &self,
        items: &[Item<'_>],
        indices: &[usize],
        cost: Cost,
    ) -> Result<(Vec<(usize, Decision)>, u64), tollgate::Error> {
        // A descriptor sent twice is one limit, weighing the sum of its hits.
        let mut slot_by_key: HashMap<(&Subject, &str), usize> = HashMap::with_capacity(indices.len());
        let mut subjects: Vec<Subject> = Vec::with_capacity(indices.len());
        let mut limits: Vec<(String, Limit)> = Vec::with_capacity(indices.len());
        let mut costs: Vec<u64> = Vec::with_capacity(indices.len());
        let mut slot_of = Vec::with_capacity(indices.len());
        for &index in indices {
            let item = &items[index];
            let Some(limited) = item.limited() else { continue };
            let next = limits.len();
            let slot = *slot_by_key
                .entry((&limited.subject, limited.name.as_str()))
                .or_insert(next);
            let hits = match cost {
                Cost::Hits | Cost::Estimate | Cost::Record | Cost::Refund { .. } => item.hits,
                Cost::Peek => 0,
            };
            if slot == next {
                subjects.push(limited.subject.clone());
                let limit = if cost == Cost::Estimate {
                    limited.limit.clone().refusing_overage()
                } else {
                    limited.limit.clone()
                };
                limits.push((limited.name.clone(), limit));
                costs.push(hits);
            } else {
                costs[slot] = costs[slot].saturating_add(hits);
            }
            slot_of.push((index, slot));
        }
        let policy = Policy::spread(limits)?;
        let op = match cost {
            Cost::Hits | Cost::Estimate => gateway_op(&policy),
            Cost::Record => Op::Record,
            Cost::Refund { at } => Op::Refund {
                at: tollgate::Timestamp::from_micros(at),
                lease: None,
            },
            Cost::Peek => Op::Check,
        };
        let request = Request::new(op, costs.iter().copied().max().unwrap_or(0)).with_costs(costs);
        let outcome = self.store.decide_spread(&subjects, &policy, &request).await?;
        self.metrics.path(outcome.path);
        let decisions = slot_of
            .into_iter()
            .map(|(index, slot)| (index, outcome.limits[slot].1.clone()))
            .collect();
        Ok((decisions, outcome.decided_at.as_micros()))
    }
}

/// How [`Service::adjust`] changes a request's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Adjustment {
    /// Give back the hits taken at `at` (µs since the epoch).
    Refund { at: u64 },
    /// Count the hits, whether or not they fit.
    Record,
}

/// What the limits of a request are decided for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cost {
    /// Each descriptor's hits.
    Hits,
    /// Each descriptor's hits, an estimate: all-or-nothing, a limit that
    /// records its overage counts nothing when refused.
    Estimate,
    /// Each descriptor's hits, counted whether or not they fit.
    Record,
    /// Each descriptor's hits given back, taken at `at` (µs).
    Refund { at: u64 },
    /// Nothing: a look at each limit (the request is refused already).
    Peek,
}

/// Puts each decision into the item at its index.
fn set_decisions(items: &mut [Item<'_>], decisions: Vec<(usize, Decision)>) {
    for (index, decision) in decisions {
        if let Matched::Limited(limited) = &mut items[index].matched {
            limited.decision = Some(decision);
        }
    }
}

/// envoyproxy/ratelimit's dynamic metadata (see [`CheckResponse`]).
fn dynamic_metadata(request: &CheckRequest, items: &[Item<'_>]) -> serde_json::Map<String, serde_json::Value> {
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
    for item in items {
        if let (Code::Ok, Some(Value::Object(metadata))) = (item.status.code, item.metadata) {
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
/// or when every quota-mode descriptor is.
fn overall_code(items: &[Item<'_>]) -> Code {
    let over = |item: &&Item<'_>| item.status.code == Code::OverLimit;
    // A descriptor counts in quota mode when a rule (or an override) applied to it.
    let quota: Vec<&Item<'_>> = items
        .iter()
        .filter(|item| item.quota && item.status.current_limit.is_some())
        .collect();
    let failed = items.iter().filter(|item| !item.quota).any(|item| over(&item));
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
