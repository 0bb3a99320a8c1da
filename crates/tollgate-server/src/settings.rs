//! envoyproxy/ratelimit's environment settings, read where they mean
//! something here, so that its container can be swapped for `tollgate serve`
//! with the same environment and configuration directory.
//!
//! | envoyproxy/ratelimit | here |
//! | --- | --- |
//! | `RUNTIME_ROOT` (`/srv/runtime_data/current`), `RUNTIME_SUBDIRECTORY`, `RUNTIME_APPDIRECTORY` (`config`) | the configuration directory, `ROOT/SUBDIRECTORY/APPDIRECTORY`, when `--config` is not given: every file under it, at any depth |
//! | `RUNTIME_IGNOREDOTFILES` | skip files and directories whose name starts with a dot |
//! | `RUNTIME_WATCH_ROOT` (true) | also reload when the `RUNTIME_ROOT` link is swapped |
//! | `MERGE_DOMAIN_CONFIG` | files of one domain are merged instead of refused |
//! | `CONFIG_TYPE` | `FILE`, or `GRPC_XDS_SOTW`: `RateLimitConfig` resources from a control plane over ADS ([`crate::xds`]) |
//! | `CONFIG_GRPC_XDS_SERVER_URL` (`localhost:18000`), `CONFIG_GRPC_XDS_NODE_ID` (`default`), `CONFIG_GRPC_XDS_NODE_METADATA` (`k=v,…`), `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS` (`k:v,…`) | the control plane, the node it knows this service by, and the stream's headers |
//! | `CONFIG_GRPC_XDS_SERVER_USE_TLS`, `CONFIG_GRPC_XDS_CLIENT_TLS_CERT`, `CONFIG_GRPC_XDS_CLIENT_TLS_KEY`, `CONFIG_GRPC_XDS_SERVER_TLS_CACERT`, `CONFIG_GRPC_XDS_SERVER_TLS_SAN` | TLS (mutual, with a client certificate) towards it, files read again at each connection |
//! | `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL` (3s), `XDS_CLIENT_BACKOFF_INITIAL_INTERVAL` (10s), `XDS_CLIENT_BACKOFF_MAX_INTERVAL` (60s), `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES` | reconnecting, and the largest response |
//! | `FORCE_START_WITHOUT_INITIAL_CONFIG` | start with no limits when the configuration cannot be loaded |
//! | `HOST`, `PORT` (8080) | the HTTP listener (`/json`, `/healthcheck`, …); the host defaults to 127.0.0.1 here, 0.0.0.0 there |
//! | `GRPC_HOST`, `GRPC_PORT` (8081) | the gRPC listener; likewise |
//! | `USE_PROMETHEUS`, `PROMETHEUS_ADDR` (`:9090`), `PROMETHEUS_PATH` (`/metrics`) | the metrics also on their own listener (always at `/metrics` of the HTTP one) |
//! | `SHADOW_MODE` | `--shadow-mode` |
//! | `QUOTA_MODE` | every rule an alternative ([`Options::all_alternatives`](crate::Options::all_alternatives)) |
//! | `LIMIT_RESPONSE_HEADERS_ENABLED` | `--response-headers` |
//! | `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER` | their names (`RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`) |
//! | `LIMIT_POLICY_HEADER` (Tollgate's) | the header naming the rule that refused (off unless named) |
//! | `NEAR_LIMIT_RATIO` (0.8) | what the `near_limit` metrics count |
//! | `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` | unhealthy until a domain is loaded |
//! | `RESPONSE_DYNAMIC_METADATA` | answer with dynamic metadata: the request, and the `metadata` of the rules it passed |
//! | `BACKEND_TYPE` (`redis`) | `redis` only (`memcache` is refused) |
//! | `REDIS_URL`, `REDIS_SOCKET_TYPE`, `REDIS_AUTH`, `REDIS_TLS` | `--redis` (`host:port`, or a socket path; a password, or `user:password`; TLS) |
//! | `REDIS_TYPE` | `SINGLE`; `CLUSTER` (`REDIS_URL` = `host:port,…`, seed nodes); `SENTINEL` (`REDIS_URL` = `<master name>,host:port,…`, the Sentinels) |
//! | `CACHE_KEY_PREFIX` | `--prefix` |
//! | `LOG_LEVEL`, `LOG_FORMAT` | the log filter (when `RUST_LOG` is not set), JSON logs |
//! | `REDIS_TIMEOUT` | `--store-timeout`: the deadline of every Redis call (a duration, `50ms`, `1s`) |
//! | `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION` | `--health-check-store`: the health endpoints (gRPC, `/healthcheck`, `/healthz`) fail while the store does not answer |
//! | `DEBUG_HOST`, `DEBUG_PORT` (6070) | the debug listener (`/rlconfig`, `/metrics`), when either is set; the host defaults to 127.0.0.1 |
//! | `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` (`true` here, `false` upstream) | when a request is refused, only the descriptors over their limit add their hits (`true`), or every descriptor does (`false`) |
//! | `MAX_DESCRIPTORS` (Tollgate's) | `--max-descriptors`: the most descriptors one request may carry (1 000) |
//! | `GRPC_SERVER_USE_TLS`, `GRPC_SERVER_TLS_CERT`, `GRPC_SERVER_TLS_KEY` | TLS on the gRPC listener (RLS, RLQS, health); files replaced on disk are taken up without a restart ([`crate::tls`]) |
//! | `GRPC_CLIENT_TLS_CACERT` (or Envoy Gateway's `GRPC_SERVER_TLS_CA_CERT`), `GRPC_CLIENT_TLS_SAN` | client certificates required, chaining to that CA; and valid for that name |
//! | `REDIS_TLS_CLIENT_CERT`, `REDIS_TLS_CLIENT_KEY`, `REDIS_TLS_CACERT`, `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION` | with `REDIS_TLS`: the client certificate Redis asks for, the CA it is trusted by, and no name check |
//! | `GRPC_UDS` | refused: not supported (rather than served otherwise) |
//! | `PROMETHEUS_MAPPER_YAML` | accepted and without effect: the metrics already carry the names and labels Envoy Gateway's mapping (`ratelimit_service_rate_limit_over_limit{domain, key1, key2}`, …) gives the statsd stats |
//! | `LOCAL_CACHE_SIZE_IN_BYTES`, `EXPIRATION_JITTER_MAX_SECONDS`, `REDIS_PERSECOND*`, `REDIS_POOL_SIZE`, `REDIS_PIPELINE_*`, `USE_STATSD`, `STATSD_*`, `GRPC_MAX_CONNECTION_AGE*`, `EXTRA_TAGS` | accepted and without effect (logged at start): there is no local over-limit cache (each decision asks the store), keys expire exactly, one Redis holds every limit, and no statsd exporter |
//! | `TRACING_ENABLED`, `TRACING_SERVICE_NAME` (`RateLimit`), `TRACING_SERVICE_NAMESPACE`, `TRACING_SERVICE_INSTANCE_ID`, `TRACING_SAMPLING_RATE` (1), `TRACING_EXPORTER_PROTOCOL` (`http` only), `OTEL_EXPORTER_OTLP_ENDPOINT` | a span per decision ([`crate::service::DECISION_SPANS`]) over OTLP/HTTP |
//!
//! Command-line flags win over the environment.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

pub use self::sources::{RedisTls, TracingSettings};
use crate::config::LoadOptions;
use crate::service::HeaderNames;
use crate::tls::ServerTls;
use crate::xds::XdsSettings;

mod sources;

/// Where the configuration is, as the environment says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigLocation {
    /// The directory of configuration files.
    pub path: PathBuf,
    /// How it is read.
    pub options: LoadOptions,
    /// A directory to watch as well (the one holding the `RUNTIME_ROOT` link).
    pub watch_root: Option<PathBuf>,
}

/// envoyproxy/ratelimit's settings, from the environment.
#[derive(Debug, Clone, Default, PartialEq)]
#[allow(clippy::struct_excessive_bools)] // Each is one setting.
pub struct Settings {
    /// The configuration directory (`RUNTIME_*`), with `CONFIG_TYPE=FILE`.
    pub config: Option<ConfigLocation>,
    /// The xDS client's settings, with `CONFIG_TYPE=GRPC_XDS_SOTW`.
    pub xds: Option<XdsSettings>,
    /// TLS on the gRPC listener (`GRPC_SERVER_USE_TLS`).
    pub grpc_tls: Option<ServerTls>,
    /// The Redis client's certificates (`REDIS_TLS_*`).
    pub redis_tls: RedisTls,
    /// Spans over OTLP (`TRACING_ENABLED` and the rest).
    pub tracing: Option<TracingSettings>,
    /// `MERGE_DOMAIN_CONFIG`.
    pub merge_domains: bool,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`.
    pub force_start: bool,
    /// The HTTP listener (`HOST`, `PORT`), when either is set.
    pub http: Option<SocketAddr>,
    /// The gRPC listener (`GRPC_HOST`, `GRPC_PORT`), when either is set.
    pub grpc: Option<SocketAddr>,
    /// The metrics listener and path (`USE_PROMETHEUS`).
    pub prometheus: Option<(SocketAddr, String)>,
    /// `SHADOW_MODE`.
    pub shadow_mode: bool,
    /// `QUOTA_MODE`: every rule an alternative.
    pub all_alternatives: bool,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`.
    pub response_headers: bool,
    /// `LIMIT_*_HEADER`.
    pub header_names: HeaderNames,
    /// `NEAR_LIMIT_RATIO`.
    pub near_limit_ratio: Option<f32>,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`.
    pub healthy_with_config_only: bool,
    /// `RESPONSE_DYNAMIC_METADATA`.
    pub dynamic_metadata: bool,
    /// A Redis URL built from `REDIS_*`.
    pub redis: Option<String>,
    /// `CACHE_KEY_PREFIX`, when not empty.
    pub prefix: Option<String>,
    /// `LOG_LEVEL`, as a tracing filter.
    pub log_level: Option<String>,
    /// `LOG_FORMAT=json`.
    pub log_json: bool,
    /// `REDIS_TIMEOUT`.
    pub store_timeout: Option<Duration>,
    /// `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`.
    pub health_checks_store: bool,
    /// The debug listener (`DEBUG_HOST`, `DEBUG_PORT`), when either is set.
    pub debug: Option<SocketAddr>,
    /// `MAX_DESCRIPTORS`.
    pub max_descriptors: Option<usize>,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` (true unless set false).
    pub stop_increment_when_over: bool,
    /// Settings that are set but mean nothing here.
    pub ignored: Vec<String>,
}

/// Settings accepted without effect (see the module docs); a name ending in
/// `*` stands for every name it starts.
const IGNORED: [&str; 14] = [
    "PROMETHEUS_MAPPER_YAML",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "REDIS_PERSECOND*",
    "REDIS_POOL_SIZE",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_PIPELINE_*",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_STARTUP_*",
    "USE_STATSD",
    "STATSD_*",
    "USE_DOG_STATSD*",
    "GRPC_MAX_CONNECTION_AGE*",
    "EXTRA_TAGS",
];

impl Settings {
    /// The settings of this process's environment.
    ///
    /// # Errors
    ///
    /// As [`Settings::from_lookup`].
    pub fn from_env() -> Result<Self, SettingError> {
        let names: Vec<String> = std::env::vars_os()
            .filter_map(|(name, _)| name.into_string().ok())
            .collect();
        Self::from_lookup(|name| std::env::var(name).ok(), &names)
    }

    /// The settings `lookup` gives (`names`: every name set, to report
    /// those without effect).
    ///
    /// # Errors
    ///
    /// A value envoyproxy/ratelimit would refuse (a boolean that is not one,
    /// a port that is not a number), or a setting asking for what is not
    /// supported here (another config type or backend, Redis Sentinel or
    /// Cluster, gRPC TLS or a Unix socket): the message names the variable.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>, names: &[String]) -> Result<Self, SettingError> {
        let env = Env(&lookup);
        let mut settings = Self {
            merge_domains: env.flag("MERGE_DOMAIN_CONFIG")?,
            ..Self::default()
        };

        let from_files = settings.read_source(&env)?;
        let root = env
            .text("RUNTIME_ROOT")
            .unwrap_or_else(|| "/srv/runtime_data/current".to_owned());
        let subdirectory = env.text("RUNTIME_SUBDIRECTORY").unwrap_or_default();
        let app = env.text("RUNTIME_APPDIRECTORY").unwrap_or_else(|| "config".to_owned());
        let watch_root = env.flag_or("RUNTIME_WATCH_ROOT", true)?;
        let ignore_dot_files = env.flag("RUNTIME_IGNOREDOTFILES")?;
        let root = PathBuf::from(root);
        settings.config = from_files.then(|| ConfigLocation {
            path: root.join(subdirectory).join(app),
            options: LoadOptions {
                runtime_layout: true,
                ignore_dot_files,
                merge_domains: settings.merge_domains,
            },
            watch_root: watch_root.then(|| root.parent().map(PathBuf::from)).flatten(),
        });
        settings.force_start = env.flag("FORCE_START_WITHOUT_INITIAL_CONFIG")?;

        settings.http = env.listener("HOST", "PORT", 8080)?;
        if env.text("GRPC_UDS").is_some() {
            return Err(SettingError::Unsupported {
                name: "GRPC_UDS",
                reason: "a gRPC Unix socket is not supported; use GRPC_HOST and GRPC_PORT",
            });
        }
        settings.read_tls(&env)?;
        settings.read_tracing(&env)?;
        settings.grpc = env.listener("GRPC_HOST", "GRPC_PORT", 8081)?;
        if env.flag("USE_PROMETHEUS")? {
            let address = match env.text("PROMETHEUS_ADDR") {
                Some(address) => parse_address("PROMETHEUS_ADDR", &address, Some(IpAddr::V4(Ipv4Addr::UNSPECIFIED)))?,
                None => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9090),
            };
            let path = env.text("PROMETHEUS_PATH").unwrap_or_else(|| "/metrics".to_owned());
            settings.prometheus = Some((address, path));
        }

        settings.shadow_mode = env.flag("SHADOW_MODE")?;
        settings.all_alternatives = env.flag("QUOTA_MODE")?;
        settings.response_headers = env.flag("LIMIT_RESPONSE_HEADERS_ENABLED")?;
        let defaults = HeaderNames::default();
        settings.header_names = HeaderNames {
            limit: env.text("LIMIT_LIMIT_HEADER").unwrap_or(defaults.limit),
            remaining: env.text("LIMIT_REMAINING_HEADER").unwrap_or(defaults.remaining),
            reset: env.text("LIMIT_RESET_HEADER").unwrap_or(defaults.reset),
            policy: env.text("LIMIT_POLICY_HEADER"),
        };
        if let Some(ratio) = env.text("NEAR_LIMIT_RATIO") {
            let parsed: f32 = ratio
                .parse()
                .ok()
                .filter(|parsed: &f32| *parsed > 0.0 && *parsed <= 1.0)
                .ok_or_else(|| invalid("NEAR_LIMIT_RATIO", &ratio, "not a number above 0 and at most 1"))?;
            settings.near_limit_ratio = Some(parsed);
        }
        settings.healthy_with_config_only = env.flag("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")?;
        settings.dynamic_metadata = env.flag("RESPONSE_DYNAMIC_METADATA")?;
        settings.stop_increment_when_over = env.flag_or("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", true)?;

        settings.read_store(&env)?;
        settings.prefix = env.text("CACHE_KEY_PREFIX").filter(|prefix| !prefix.is_empty());

        settings.log_level = env
            .text("LOG_LEVEL")
            .map(|level| match level.to_ascii_lowercase().as_str() {
                "warning" => "warn".to_owned(),
                "fatal" | "panic" => "error".to_owned(),
                other => other.to_owned(),
            });
        settings.log_json = env
            .text("LOG_FORMAT")
            .is_some_and(|format| format.eq_ignore_ascii_case("json"));

        let mut ignored: Vec<String> = names
            .iter()
            .filter(|name| {
                IGNORED.iter().any(|pattern| match pattern.strip_suffix('*') {
                    Some(prefix) => name.starts_with(prefix),
                    None => name.as_str() == *pattern,
                })
            })
            .cloned()
            .collect();
        ignored.sort();
        settings.ignored = ignored;
        Ok(settings)
    }
}

impl Settings {
    /// The store's settings: `BACKEND_TYPE`, `REDIS_*`, `MAX_DESCRIPTORS`.
    fn read_store(&mut self, env: &Env<'_>) -> Result<(), SettingError> {
        let settings = self;
        if let Some(backend) = env.text("BACKEND_TYPE") {
            if !backend.eq_ignore_ascii_case("redis") {
                return Err(invalid("BACKEND_TYPE", &backend, "only redis is supported"));
            }
        }
        settings.redis = redis_url(env)?;
        if let Some(timeout) = env.text("REDIS_TIMEOUT") {
            let parsed = tollgate::duration::parse_duration(&timeout)
                .map_err(|error| invalid("REDIS_TIMEOUT", &timeout, error.to_string()))?;
            if parsed.is_zero() {
                return Err(invalid("REDIS_TIMEOUT", &timeout, "must be more than zero"));
            }
            settings.store_timeout = Some(parsed);
        }
        settings.health_checks_store = env.flag("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")?;
        settings.debug = env.listener("DEBUG_HOST", "DEBUG_PORT", 6070)?;
        if let Some(most) = env.text("MAX_DESCRIPTORS") {
            let parsed: usize = most
                .parse()
                .ok()
                .filter(|most| *most > 0)
                .ok_or_else(|| invalid("MAX_DESCRIPTORS", &most, "not a whole number of at least 1"))?;
            settings.max_descriptors = Some(parsed);
        }
        Ok(())
    }
}

/// Reads variables; empty is unset, as envconfig reads them.
struct Env<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Env<'_> {
    fn text(&self, name: &str) -> Option<String> {
        (self.0)(name).filter(|value| !value.is_empty())
    }

    fn flag(&self, name: &str) -> Result<bool, SettingError> {
        self.flag_or(name, false)
    }

    /// A boolean as Go's `strconv.ParseBool` reads it.
    fn flag_or(&self, name: &str, default: bool) -> Result<bool, SettingError> {
        match self.text(name).as_deref() {
            None => Ok(default),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(other) => Err(invalid(name, other, "not a boolean (true or false)")),
        }
    }

    /// `host` and `port` variables, when either is set.
    fn listener(&self, host: &str, port: &str, default_port: u16) -> Result<Option<SocketAddr>, SettingError> {
        let (host_value, port_value) = (self.text(host), self.text(port));
        if host_value.is_none() && port_value.is_none() {
            return Ok(None);
        }
        let ip = match host_value {
            Some(value) => parse_ip(host, &value)?,
            None => IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        let port_number = match port_value {
            Some(value) => value.parse().map_err(|_| invalid(port, &value, "not a port number"))?,
            None => default_port,
        };
        Ok(Some(SocketAddr::new(ip, port_number)))
    }
}

fn parse_ip(name: &str, value: &str) -> Result<IpAddr, SettingError> {
    if value == "localhost" {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    value
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| invalid(name, value, "not an IP address"))
}

/// `host:port`, where an empty host is `empty_host` (Go: every interface).
fn parse_address(name: &str, value: &str, empty_host: Option<IpAddr>) -> Result<SocketAddr, SettingError> {
    let (host, port) = value
        .rsplit_once(':')
        .ok_or_else(|| invalid(name, value, "expected host:port"))?;
    let port: u16 = port.parse().map_err(|_| invalid(name, value, "not a port number"))?;
    let ip = match (host, empty_host) {
        ("", Some(ip)) => ip,
        _ => parse_ip(name, host)?,
    };
    Ok(SocketAddr::new(ip, port))
}

/// A Redis URL from `REDIS_URL` (`host:port` or a socket path),
/// `REDIS_SOCKET_TYPE`, `REDIS_AUTH` (`password` or `user:password`),
/// `REDIS_TLS` and `REDIS_TYPE`.
fn redis_url(env: &Env<'_>) -> Result<Option<String>, SettingError> {
    let Some(address) = env.text("REDIS_URL") else {
        return Ok(None);
    };
    let kind = env.text("REDIS_TYPE").unwrap_or_else(|| "single".to_owned());
    let kind = match kind.to_ascii_lowercase().as_str() {
        "single" => Kind::Single,
        "cluster" => Kind::Cluster,
        "sentinel" => Kind::Sentinel,
        _ => return Err(invalid("REDIS_TYPE", &kind, "expected SINGLE, CLUSTER or SENTINEL")),
    };
    if address.contains("://") {
        return Ok(Some(address));
    }
    let (user, password) = match env.text("REDIS_AUTH") {
        Some(auth) => match auth.split_once(':') {
            Some((user, password)) => (Some(user.to_owned()), Some(password.to_owned())),
            None => (None, Some(auth)),
        },
        None => (None, None),
    };
    let socket = env.text("REDIS_SOCKET_TYPE").unwrap_or_default();
    if address.starts_with('/') || (socket.eq_ignore_ascii_case("unix") && !address.contains(':')) {
        let mut query = Vec::new();
        if let Some(user) = &user {
            query.push(format!("user={}", encode(user)));
        }
        if let Some(password) = &password {
            query.push(format!("pass={}", encode(password)));
        }
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        };
        return Ok(Some(format!("redis+unix://{address}{query}")));
    }
    let tls = env.flag("REDIS_TLS")?;
    let credentials = match (user, password) {
        (Some(user), Some(password)) => format!("{}:{}@", encode(&user), encode(&password)),
        (None, Some(password)) => format!(":{}@", encode(&password)),
        _ => String::new(),
    };
    let scheme = if tls { "rediss" } else { "redis" };
    match kind {
        Kind::Single => Ok(Some(format!("{scheme}://{credentials}{address}"))),
        Kind::Cluster => Ok(Some(format!("{scheme}+cluster://{credentials}{address}"))),
        Kind::Sentinel => {
            if tls {
                return Err(SettingError::Unsupported {
                    name: "REDIS_TLS",
                    reason: "TLS to Sentinels is not supported",
                });
            }
            match address.split_once(',') {
                Some((master, sentinels)) if !master.is_empty() && !sentinels.is_empty() => Ok(Some(format!(
                    "redis+sentinel://{credentials}{sentinels}/{}",
                    encode(master)
                ))),
                _ => Err(invalid(
                    "REDIS_URL",
                    &address,
                    "with REDIS_TYPE=SENTINEL, expected <master name>,host:port[,host:port…]",
                )),
            }
        }
    }
}

/// A setting that cannot be used; each names the variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    /// A value that cannot be used (a boolean that is not one, a port that
    /// is not a number, an unknown kind).
    #[error("{name}={value}: {expected}")]
    Invalid {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
        /// What it should be.
        expected: String,
    },
    /// A setting asking for what is not supported here.
    #[error("{name}: {reason}")]
    Unsupported {
        /// The variable.
        name: &'static str,
        /// What is not supported, and what to use instead.
        reason: &'static str,
    },
    /// One variable of a pair set without the other.
    #[error("{0} and {1} go together")]
    Pair(&'static str, &'static str),
    /// A variable that needs others.
    #[error("{name}: needs {needs}")]
    Needs {
        /// The variable set.
        name: &'static str,
        /// What it needs.
        needs: &'static str,
    },
}

/// `name`'s `value` cannot be used: it should be `expected`.
fn invalid(name: &str, value: &str, expected: impl Into<String>) -> SettingError {
    SettingError::Invalid {
        name: name.to_owned(),
        value: value.to_owned(),
        expected: expected.into(),
    }
}

/// `REDIS_TYPE`: what `REDIS_URL` names.
enum Kind {
    Single,
    Cluster,
    Sentinel,
}

/// Percent-encodes all but URL's unreserved characters.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests;
