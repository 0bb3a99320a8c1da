//! What the console's overview shows: where the configuration comes from,
//! the store and its health, the overrides in force, the replicas seen.

use serde::Serialize;
use tollgate::AnyStore;

use super::events::Event;
use super::Service;

/// The service at a glance (`GET /v1/overview`).
#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    /// Where the configuration comes from (`file …`, `xds …`).
    pub config_source: String,
    /// How many times the configuration was replaced since start.
    pub config_changes: u64,
    /// The last configuration refused since start (an xDS NACK, a file
    /// that failed to load): when, and why.
    pub last_refused_config: Option<Event>,
    /// Every domain, with its rules' count.
    pub domains: Vec<(String, usize)>,
    /// `memory`, `redis`, or `redis (with a failure policy)`.
    pub store: &'static str,
    /// The engine deciding in Redis (`module`, `lua`).
    pub engine: Option<String>,
    /// Healthy, as `/healthz` says.
    pub healthy: bool,
    /// The circuit breaker in front of Redis is open (Redis is skipped).
    pub breaker_open: Option<bool>,
    /// What the store keeps across a restart, and the rules that would
    /// lose their state (`/rlconfig`'s `# store:` line).
    pub persistence: Option<String>,
    /// Overrides in force.
    pub overrides: usize,
    /// Where alerts are delivered (`--alert-webhook`; none: not sent).
    pub alert_webhook: Option<String>,
    /// Alerts waiting to be delivered, as last seen (the outbox on Redis,
    /// this replica's queue on memory).
    pub alerts_waiting: u64,
    /// The 99th percentile of this replica's decision latency over the
    /// last minute (ms, a bucket's upper bound; none without requests).
    pub p99_ms: Option<f64>,
    /// Requests decided over the last minute.
    pub requests_last_minute: u64,
    /// RLQS streams open to this replica (Envoys with a quota filter).
    pub rlqs_streams: i64,
}

impl Service {
    /// The service at a glance.
    pub fn overview(&self) -> Overview {
        let config = self.config();
        let (store, breaker_open) = match self.store() {
            AnyStore::Redis(_) => ("redis", None),
            AnyStore::Resilient(resilient) => ("redis (with a failure policy)", Some(resilient.stats().breaker_open)),
            AnyStore::Regional(regional) => (
                "redis (a region's, with global limits at home)",
                Some(regional.local().stats().breaker_open),
            ),
            _ => ("memory", None),
        };
        let recent = self.metrics.recent_p99();
        Overview {
            config_source: self.config_source().to_string(),
            config_changes: *self.config_changes.borrow(),
            last_refused_config: self.last_refused_config(),
            domains: config
                .domains
                .keys()
                .map(|name| {
                    let rules = config.rules().iter().filter(|(domain, _)| domain == name).count();
                    (name.clone(), rules)
                })
                .collect(),
            store,
            engine: self.engine().map(|engine| engine.name().to_owned()),
            healthy: *self.health().borrow(),
            breaker_open,
            persistence: self
                .lasting()
                .map(|lasting| lasting.describe().trim_start_matches("# store: ").trim().to_owned()),
            overrides: self.overrides().all().iter().map(|(_, domain)| domain.len()).sum(),
            alert_webhook: self.options.alert_webhook.clone(),
            alerts_waiting: self.alerts_waiting(),
            p99_ms: recent.map(|(p99, _)| p99.as_secs_f64() * 1_000.0),
            requests_last_minute: recent.map_or(0, |(_, requests)| requests),
            rlqs_streams: self.metrics.quota().streams_open(),
        }
    }
}
