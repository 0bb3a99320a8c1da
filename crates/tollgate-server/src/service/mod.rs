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
//! plus its cost exceeds its limit; when none is, all add their cost; when
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
//! [`Store::decide_spread`](tollgate::Store::decide_spread): in one call on one Redis server; on a Cluster
//! in one call per hash slot, giving back what the other slots took when one
//! denies.
//!
//! Rules in `shadow_mode` are decided apart, each alone: they count and
//! consume like any limit, but never refuse. A rule in `quota_mode` (an
//! alternative; every rule, with `QUOTA_MODE`) refuses the request only when
//! every alternative descriptor of it is over: one that is over is set aside and the
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

mod alerts;
mod answer;
mod deciding;
mod error;
pub mod estimates;
mod events;
mod lasting;
mod matching;
mod options;
mod overriding;
mod overview;
mod request;
mod top;
mod usage;

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tollgate::{AnyStore, LeasedStore, Op};

pub use self::alerts::{
    Alert, AlertEntry, DeliveryError, WebhookClient, WebhookError, GROUP as ALERT_GROUP, OUTBOX_KEPT,
};
use self::answer::{dynamic_metadata, overall_code, unix_now};
pub use self::answer::{envoy_headers, rate_limit_headers, restrictiveness, seconds};
use self::deciding::set_decisions;
pub(crate) use self::deciding::Charge;
pub use self::error::{Failure, ServiceError};
pub use self::events::Event;
pub use self::lasting::{Lasting, PERSISTENCE_CHECK};
pub(crate) use self::matching::{BucketMatch, Limited, Matched};
pub use self::options::{HeaderNames, Options, REFUSALS_SAMPLED_OF};
pub use self::overview::Overview;
pub use self::request::{CheckRequest, CheckResponse, Code, CurrentLimit, Descriptor, DescriptorStatus, Target};
pub use self::usage::{Usage, UsageEntry, UsagePage, Varying, VaryingEntry, MAX_PAGE};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::overrides::Overrides;

/// The target of the span each decision opens (`should_rate_limit`, with
/// its domain, descriptors, hits and code): what a tracing exporter
/// subscribes to, and other subscribers leave out.
pub const DECISION_SPANS: &str = "tollgate::decision";

/// The name of a configured rule's limit within its descriptor's subject.
const RULE: &str = "rule";

/// The most one request or descriptor may cost.
pub const MAX_COST: u64 = u32::MAX as u64;

/// The most descriptors one request may carry, by default.
pub const DEFAULT_MAX_DESCRIPTORS: usize = 1_000;

/// The service state shared by the gRPC and HTTP front ends.
pub struct Service {
    config: ArcSwap<Config>,
    /// Where the configuration in force came from, as `/rlconfig` says it.
    config_source: ArcSwap<String>,
    /// How many times the configuration was replaced.
    config_changes: watch::Sender<u64>,
    /// The store, with the blocks of rules whose limit carries a lease
    /// (none on the memory store: it is this process's own).
    store: LeasedStore<AnyStore>,
    metrics: Metrics,
    options: Options,
    healthy: watch::Sender<bool>,
    health: std::sync::Mutex<Health>,
    /// Open estimates (`/v1/estimate`, `/v1/settle`).
    pub(crate) estimates: estimates::Estimates,
    /// Limits set per descriptor while running (`/v1/overrides`).
    overrides: Overrides,
    /// What the store was last found to keep across a restart.
    lasting: std::sync::Mutex<Option<Lasting>>,
    /// Each rule's heaviest descriptors (with [`Options::track_top`]).
    top: crate::top::Top,
    /// The last events (configurations, overrides, alerts).
    events: events::Events,
    /// Alerts this process holds to deliver.
    alerts: alerts::Alerts,
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

impl Service {
    /// A service over `store` with `config` in force.
    pub fn new(config: Config, store: AnyStore, options: Options) -> Self {
        let health = Health {
            no_config: options.healthy_with_config_only && config.domains.is_empty(),
            ..Health::default()
        };
        Self {
            config: ArcSwap::from_pointee(config),
            config_source: ArcSwap::from_pointee(String::new()),
            config_changes: watch::channel(0).0,
            overrides: Overrides::new(&store),
            lasting: std::sync::Mutex::new(None),
            store: LeasedStore::new(store),
            metrics: Metrics::with_near_limit_ratio(options.near_limit_ratio),
            options,
            healthy: watch::channel(!health.no_config).0,
            health: std::sync::Mutex::new(health),
            estimates: estimates::Estimates::default(),
            top: crate::top::Top::default(),
            events: events::Events::default(),
            alerts: alerts::Alerts::default(),
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

    /// Puts a new configuration in force; the one it replaces (to drop
    /// where a large one's freeing delays nothing).
    pub fn replace_config(&self, config: Config) -> Arc<Config> {
        if self.options.healthy_with_config_only {
            let missing = config.domains.is_empty();
            self.update_health(|health| health.no_config = missing);
        }
        let previous = self.config.swap(Arc::new(config));
        self.config_changes.send_modify(|changes| *changes += 1);
        previous
    }

    /// Follows configuration changes: the count of replacements so far.
    pub fn config_changes(&self) -> watch::Receiver<u64> {
        self.config_changes.subscribe()
    }

    /// Says where the configuration in force comes from (`file <path>`,
    /// `xds (server …, version …)`): the first line of `/rlconfig`.
    pub fn set_config_source(&self, source: String) {
        self.config_source.store(Arc::new(source));
    }

    /// Where the configuration in force comes from.
    pub fn config_source(&self) -> Arc<String> {
        self.config_source.load_full()
    }

    /// The overrides in force, and where they are kept.
    pub fn overrides(&self) -> &Overrides {
        &self.overrides
    }

    /// Decides overrides' expiry by `clock` rather than the system's (tests).
    #[must_use]
    pub fn with_overrides_clock(mut self, clock: std::sync::Arc<dyn tollgate::Clock>) -> Self {
        self.overrides = self.overrides.with_clock(clock);
        self
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
        self.store.inner().redis().map(tollgate::RedisStore::engine)
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

    /// Decides every descriptor of `request` at once.
    ///
    /// Descriptors in shadow mode are decided apart, each alone. The others
    /// are decided together, all-or-nothing; an alternative descriptor that is
    /// over its limit is then set aside and the rest decided again, so that
    /// the request consumes from every limit or from none (when it is
    /// refused).
    ///
    /// # Errors
    ///
    /// A malformed request ([`Failure::InvalidArgument`]), or a store fault
    /// ([`Failure::Unavailable`], counted as one).
    pub async fn should_rate_limit(&self, request: &CheckRequest) -> Result<CheckResponse, ServiceError> {
        use tracing::Instrument as _;
        let span = tracing::info_span!(
            target: DECISION_SPANS,
            "should_rate_limit",
            domain = %request.domain,
            descriptors = request.descriptors.len(),
            hits = request.default_cost(),
            code = tracing::field::Empty,
            error = tracing::field::Empty,
        );
        // No subscriber wants decision spans (no tracing exporter): nothing to pay.
        if span.is_disabled() {
            return self.decide_request(request, Charge::Check).await;
        }
        let answer = self
            .decide_request(request, Charge::Check)
            .instrument(span.clone())
            .await;
        match &answer {
            Ok(response) => span.record("code", tracing::field::debug(response.overall)),
            Err(error) => span.record("error", tracing::field::display(error)),
        };
        answer
    }

    /// [`Service::should_rate_limit`], each descriptor's cost charged as
    /// `charge` says: [`Charge::Check`], or [`Charge::Estimate`] for an estimate
    /// (all-or-nothing, a refused estimate counts nowhere).
    pub(crate) async fn decide_request(
        &self,
        request: &CheckRequest,
        charge: Charge,
    ) -> Result<CheckResponse, ServiceError> {
        if let Err(error) = self.validate(request) {
            self.metrics.service_error();
            return Err(error);
        }
        let started = Instant::now();
        let config = self.config.load();
        let domain = config.domains.get(&request.domain);
        let overrides = self.overrides.domain(&request.domain);
        let mut items = match self.match_rules(request, domain, overrides.as_deref()) {
            Ok(items) => items,
            Err(error) => {
                self.metrics.service_error();
                return Err(error);
            }
        };
        let decided_at = match self.decide_all(&mut items, charge).await {
            Ok(decided_at) => decided_at,
            Err(error) if error.is_invalid() => {
                self.metrics.service_error();
                return Err(ServiceError::from(error));
            }
            Err(error) => {
                self.metrics.store_error(&request.domain);
                return Err(ServiceError::from(error));
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
        let dynamic_metadata = self
            .options
            .dynamic_metadata
            .then(|| dynamic_metadata(request, &items, overall));
        if self.options.log_refusals > 0 {
            self.log_refusals(request, &items);
        }
        if self.options.track_top {
            self.track_top(&request.domain, &items, now);
        }
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

    /// Runs `settlement` ([`tollgate::Request::settlement`]'s record or
    /// refund) for each descriptor's cost on every limit that applies to
    /// `request` (shadow rules too): what settles an estimate. Answers
    /// each limit as it stands after; a refund is not counted as hits in
    /// the metrics, a record is.
    ///
    /// # Errors
    ///
    /// As [`Service::should_rate_limit`].
    pub(crate) async fn adjust(&self, request: &CheckRequest, settlement: &Op) -> Result<CheckResponse, ServiceError> {
        let charge = match settlement {
            Op::Refund { at, .. } => Charge::Refund { at: at.as_micros() },
            Op::Record => Charge::Record,
            _ => return Err(ServiceError::invalid("a settlement records or refunds")),
        };
        self.validate(request)?;
        let config = self.config.load();
        let domain = config.domains.get(&request.domain);
        let overrides = self.overrides.domain(&request.domain);
        let mut items = self.match_rules(request, domain, overrides.as_deref())?;
        let limited: Vec<usize> = (0..items.len())
            .filter(|&index| items[index].limited().is_some())
            .collect();
        let mut decided_at = None;
        if !limited.is_empty() {
            let (decisions, at) = self.decide_together(&items, &limited, charge).await.map_err(|error| {
                if !error.is_invalid() {
                    self.metrics.store_error(&request.domain);
                }
                ServiceError::from(error)
            })?;
            set_decisions(&mut items, decisions);
            decided_at = Some(at);
        }
        let now = decided_at.unwrap_or_else(unix_now);
        let count = charge == Charge::Record;
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
}
