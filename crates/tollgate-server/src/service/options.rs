//! The service's global switches, as envoyproxy/ratelimit's settings.

use super::DEFAULT_MAX_DESCRIPTORS;

/// Global switches, as envoyproxy/ratelimit's settings.
#[derive(Debug, Clone)]
#[allow(clippy::struct_excessive_bools)] // Each is one setting.
pub struct Options {
    /// Decide and count, but always answer an overall OK (each descriptor
    /// keeps its real code) (`SHADOW_MODE`).
    pub shadow_mode: bool,
    /// Every rule an alternative (`QUOTA_MODE`): see
    /// [`Rule::alternative`](crate::config::Rule::alternative).
    pub all_alternatives: bool,
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
    /// their cost (true, the default); false: every descriptor whose limit
    /// records its overage adds them (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`,
    /// whose default upstream is false).
    pub stop_increment_when_over: bool,
    /// Log a line for this share of the refused descriptors (domain,
    /// descriptor, rule, limit, retry), out of [`REFUSALS_SAMPLED_OF`];
    /// none by default (`--log-refusals`).
    pub log_refusals: u32,
    /// Keep each rule's heaviest descriptors (`/v1/top`): on when a token
    /// opens the API that reads them.
    pub track_top: bool,
    /// Where alerts are delivered: a URL each is POSTed to as JSON
    /// (`--alert-webhook`); none: alerts are counted and shown, not sent.
    pub alert_webhook: Option<String>,
    /// Certificates an `https://` webhook's may chain to, beside the
    /// public roots (webpki-roots): a private CA's (`--alert-webhook-ca`).
    pub alert_webhook_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
    /// How long an alert a replica was given may wait undelivered before
    /// another replica takes it over (`--alert-take-over`; 30 s).
    pub alert_take_over: std::time::Duration,
}

/// What [`Options::log_refusals`] counts in: every refusal is logged at
/// this figure.
pub const REFUSALS_SAMPLED_OF: u32 = 1_000_000;

impl Default for Options {
    fn default() -> Self {
        Self {
            shadow_mode: false,
            all_alternatives: false,
            response_headers: false,
            header_names: HeaderNames::default(),
            near_limit_ratio: 0.8,
            healthy_with_config_only: false,
            dynamic_metadata: false,
            max_descriptors: DEFAULT_MAX_DESCRIPTORS,
            health_checks_store: false,
            stop_increment_when_over: true,
            log_refusals: 0,
            track_top: false,
            alert_webhook: None,
            alert_webhook_roots: Vec::new(),
            alert_take_over: std::time::Duration::from_secs(30),
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
    /// The name of the rule that refused, on a refused request's answer
    /// (Tollgate's, off unless named: `LIMIT_POLICY_HEADER`,
    /// `--policy-header`, say `x-ratelimit-policy`).
    pub policy: Option<String>,
}

impl Default for HeaderNames {
    fn default() -> Self {
        Self {
            limit: "RateLimit-Limit".to_owned(),
            remaining: "RateLimit-Remaining".to_owned(),
            reset: "RateLimit-Reset".to_owned(),
            policy: None,
        }
    }
}
