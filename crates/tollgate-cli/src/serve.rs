//! `tollgate serve`: Envoy's rate limit service and an HTTP JSON API over
//! envoyproxy/ratelimit's configuration files.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tollgate::OnStoreError;
use tollgate_server::http::AdminToken;
use tollgate_server::quota::{Blanket, QuotaSettings};
use tollgate_server::service::HeaderNames;
use tollgate_server::settings::Settings;
use tollgate_server::xds::XdsSettings;
use tollgate_server::{Config, LoadOptions, Options, Server};

use crate::arg;
use crate::UsageError;

mod alerts;
mod stores;
mod telemetry;

use self::alerts::{alert_webhook, alert_webhook_roots};
use self::stores::{any_store, Connection};

/// Arguments of `tollgate serve`.
///
/// envoyproxy/ratelimit's environment settings are honoured where they mean
/// something here (see `tollgate_server::settings`); a flag wins over them.
#[derive(Debug, clap::Args)]
#[allow(clippy::struct_excessive_bools)] // Each is one command-line switch.
pub struct Args {
    /// A configuration file, or a directory of `*.yaml` files (one domain
    /// each), in envoyproxy/ratelimit's format; reloaded when they change.
    /// Default: envoyproxy/ratelimit's runtime directory,
    /// `$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY`
    /// (`/srv/runtime_data/current/config`), every file under it.
    #[arg(long, conflicts_with = "xds")]
    config: Option<PathBuf>,
    /// Take the limits from this xDS control plane (`host:port`) instead of
    /// files: `RateLimitConfig` resources over ADS, state of the world, as
    /// Envoy Gateway serves them (or `CONFIG_TYPE=GRPC_XDS_SOTW` with
    /// `CONFIG_GRPC_XDS_SERVER_URL`; TLS and the rest from
    /// `CONFIG_GRPC_XDS_*`).
    #[arg(long, value_name = "SERVER")]
    xds: Option<String>,
    /// Also answer ADS on the gRPC listener (with its TLS) with this
    /// server's own limits as `RateLimitConfig` resources, so that it
    /// configures other rate limit services (`--xds` here, or
    /// envoyproxy/ratelimit with `CONFIG_TYPE=GRPC_XDS_SOTW`) as a gateway's
    /// controller does; each reload is a new version.
    #[arg(long)]
    publish_xds: bool,
    /// With --xds: the node id the control plane knows this service by
    /// (or `CONFIG_GRPC_XDS_NODE_ID`). [default: default]
    #[arg(long, value_name = "ID")]
    xds_node: Option<String>,
    /// A Redis URL (`redis://`, `rediss://`, `redis+cluster://`, `redis+sentinel://`) to share limits between
    /// replicas; without it (or `REDIS_URL`), the embedded memory store.
    #[arg(long)]
    redis: Option<String>,
    /// With --redis (this region's) and --region: the home Redis of global
    /// limits (`scope: global` in a rule's `rate_limit`), shared by every
    /// region (or `GLOBAL_REDIS_URL`). Each region takes its share of a
    /// global limit from it in blocks and decides on that share at home in
    /// the region; the regions together never admit more than the limit.
    #[arg(long, value_name = "URL")]
    global_redis: Option<String>,
    /// This region's name, with --global-redis (or `REGION`).
    #[arg(long, value_name = "NAME")]
    region: Option<String>,
    /// With --global-redis and `--on-store-error local`: the fraction of a
    /// global limit a region admits per window on its own while home
    /// cannot be reached and its share is spent. [default: 0.1]
    #[arg(long, value_name = "FRACTION", default_value_t = 0.1)]
    global_fraction: f64,
    /// The prefix of every Redis key (or `CACHE_KEY_PREFIX`).
    #[arg(long)]
    prefix: Option<String>,
    /// Where to answer HTTP (`/json`, `/v1/check`, `/metrics`, `/healthz`,
    /// `/healthcheck`, `/v1/config`); or `HOST` and `PORT`.
    /// [default: 127.0.0.1:8080]
    #[arg(long)]
    http: Option<SocketAddr>,
    /// Where to answer Envoy's gRPC rate limit protocol and gRPC health; or
    /// `GRPC_HOST` and `GRPC_PORT`. [default: 127.0.0.1:8081]
    #[arg(long)]
    grpc: Option<SocketAddr>,
    /// With --redis: what a decision is when Redis fails: `error` (answer
    /// UNAVAILABLE / 503), `open` (admit), `closed` (deny), `local` (an
    /// in-process store enforces each limit until Redis answers again).
    /// With any but `error`, serve also starts while Redis is unreachable
    /// and moves to it once it answers; with `error` it does not start.
    #[arg(long, value_name = "POLICY", default_value = "error", value_parser = arg::on_store_error)]
    on_store_error: OnStoreError,
    /// With --redis: the deadline of every Redis call (or `REDIS_TIMEOUT`);
    /// after consecutive faults a circuit breaker skips Redis for a
    /// back-off, then probes it. [default: 100ms]
    #[arg(long, value_name = "DURATION", value_parser = arg::duration)]
    store_timeout: Option<Duration>,
    /// The health endpoints (gRPC health, `/healthcheck`, `/healthz`) fail
    /// while the store does not answer, checked every second (or
    /// `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`).
    #[arg(long)]
    health_check_store: bool,
    /// The most descriptors one request may carry; more is refused as
    /// INVALID_ARGUMENT / 400 (or `MAX_DESCRIPTORS`). [default: 1000]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_descriptors: Option<u64>,
    /// With --redis: denials remembered (one per subject and rule set) and answered
    /// without calling Redis until their retry_after has passed; 0 turns
    /// the deny cache off.
    #[arg(long, value_name = "ENTRIES", default_value_t = 100_000)]
    deny_cache: usize,
    /// The quota service (RLQS): how often each limit is split among the
    /// Envoys and assignments sent, in whole seconds (Envoy reads no less).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = arg::duration)]
    rlqs_interval: Duration,
    /// The quota service: how long an assignment lives, in whole seconds,
    /// at least the interval: how long an Envoy keeps its last rate once
    /// no server answers, before its `expired_assignment_behavior`.
    #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = arg::duration)]
    rlqs_ttl: Duration,
    /// The quota service: a bucket without requests for this long is
    /// abandoned (the Envoy forgets it until its next request).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = arg::duration)]
    rlqs_abandon_after: Duration,
    /// The quota service: what a bucket matching no rule is assigned,
    /// `allow` (all) or `deny` (all).
    #[arg(long, value_name = "ACTION", default_value = "allow", value_parser = ["allow", "deny"])]
    rlqs_unmatched: String,
    /// Decide and count, but always answer an overall OK (or `SHADOW_MODE`).
    #[arg(long)]
    shadow_mode: bool,
    /// Add the limit, remaining and reset headers to every answer (or
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`; names from `LIMIT_LIMIT_HEADER`,
    /// `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
    #[arg(long)]
    response_headers: bool,
    /// With --response-headers, also name the rule that refused a request
    /// in this header (`x-ratelimit-policy`, say; or `LIMIT_POLICY_HEADER`).
    #[arg(long, value_name = "NAME")]
    policy_header: Option<String>,
    /// Log one line for this share (0 to 1) of refused descriptors: the
    /// domain, the descriptor, the rule, its limit and when to retry.
    #[arg(long, value_name = "RATE", value_parser = arg::refusal_rate)]
    log_refusals: Option<u32>,
    /// Opens the overrides API (`/v1/overrides`) to requests carrying the
    /// token in this file as `Authorization: Bearer` (or the token in
    /// `TOLLGATE_ADMIN_TOKEN`); without a token the API is off.
    #[arg(long, value_name = "PATH")]
    admin_token_file: Option<PathBuf>,
    /// Opens what reads (`/v1/usage`, the override list) to requests
    /// carrying the token in this file (or in `TOLLGATE_READ_TOKEN`); it
    /// changes nothing.
    #[arg(long, value_name = "PATH")]
    read_token_file: Option<PathBuf>,
    /// POST each alert (a rule's `alerts` threshold crossed) to this URL as
    /// JSON, with an `Idempotency-Key`, until it answers 2xx (or
    /// `TOLLGATE_ALERT_WEBHOOK`); on Redis, alerts wait in the store's
    /// outbox meanwhile.
    #[arg(long, value_name = "URL", value_parser = arg::webhook_url)]
    alert_webhook: Option<String>,
    /// Trust an `https://` alert webhook whose certificate chains to a CA
    /// in this PEM file (a private CA), beside the public roots (or
    /// `TOLLGATE_ALERT_WEBHOOK_CA`).
    #[arg(long, value_name = "PATH")]
    alert_webhook_ca: Option<PathBuf>,
    /// How long an alert a replica was given may wait undelivered (the
    /// replica stopped, or cannot reach the webhook) before another replica
    /// on the same Redis takes it over.
    #[arg(long, value_name = "DURATION", value_parser = arg::duration, default_value = "30s")]
    alert_take_over: Duration,
    /// Only validate the configuration, then exit (0 when it is valid).
    #[arg(long)]
    check_config: bool,
    /// Log as JSON lines instead of text (or `LOG_FORMAT=json`).
    #[arg(long)]
    log_json: bool,
}

/// Runs the server until SIGINT or SIGTERM.
///
/// # Errors
///
/// An invalid configuration or environment setting (exit code 2), a store
/// that cannot be reached, an address that cannot be bound.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let settings = Settings::from_env().map_err(|error| UsageError(error.to_string()))?;
    if let Some(xds) = xds_settings(args, &settings) {
        if args.check_config {
            return Err(UsageError("--check-config reads files; the limits come from xDS here".to_owned()).into());
        }
        let _telemetry = telemetry::init(&settings, args.log_json || settings.log_json)?;
        return serve(args, &settings, Source::Xds(xds));
    }
    let (config_path, load_options, watch_root) = match (&args.config, &settings.config) {
        (Some(path), _) => (
            path.clone(),
            LoadOptions {
                merge_domains: settings.merge_domains,
                ..LoadOptions::default()
            },
            None,
        ),
        (None, Some(location)) => (location.path.clone(), location.options, location.watch_root.clone()),
        (None, None) => return Err(UsageError("--config is required".to_owned()).into()),
    };
    let loaded = Config::load_with(&config_path, load_options);
    if args.check_config {
        let config = loaded.map_err(|error| UsageError(error.to_string()))?;
        let domains: Vec<&str> = config.domains.keys().map(String::as_str).collect();
        println!("ok: {} domain(s): {}", domains.len(), domains.join(", "));
        return Ok(());
    }
    let _telemetry = telemetry::init(&settings, args.log_json || settings.log_json)?;
    let (config, initial_config_failed) = match loaded {
        Ok(config) => (config, false),
        Err(error) if settings.force_start => {
            tracing::error!(%error, "no configuration loaded; starting without limits (FORCE_START_WITHOUT_INITIAL_CONFIG)");
            (Config::default(), true)
        }
        Err(error) => return Err(UsageError(error.to_string()).into()),
    };
    let files = Files {
        config,
        path: config_path,
        options: load_options,
        watch_root,
        initial_failed: initial_config_failed,
    };
    serve(args, &settings, Source::Files(files))
}

/// Where the limits come from.
enum Source {
    Files(Files),
    Xds(XdsSettings),
}

/// The configuration files, as read at start.
struct Files {
    config: Config,
    path: PathBuf,
    options: LoadOptions,
    watch_root: Option<PathBuf>,
    initial_failed: bool,
}

/// The xDS client's settings, when the limits come from a control plane:
/// `--xds`, else `CONFIG_TYPE=GRPC_XDS_SOTW` (unless `--config` is given).
fn xds_settings(args: &Args, settings: &Settings) -> Option<XdsSettings> {
    let mut xds = match (&args.xds, &settings.xds) {
        (Some(server), from_env) => XdsSettings {
            server: server.clone(),
            ..from_env.clone().unwrap_or_default()
        },
        (None, Some(from_env)) if args.config.is_none() => from_env.clone(),
        _ => return None,
    };
    xds.merge_domains = settings.merge_domains;
    if let Some(node) = &args.xds_node {
        xds.node_id.clone_from(node);
    }
    Some(xds)
}

/// Starts the server on `source`'s limits and runs it until a signal.
fn serve(args: &Args, settings: &Settings, source: Source) -> anyhow::Result<()> {
    let redis = args.redis.clone().or_else(|| settings.redis.clone());
    let prefix = args
        .prefix
        .clone()
        .or_else(|| settings.prefix.clone())
        .unwrap_or_else(|| tollgate::DEFAULT_PREFIX.to_owned());
    let loopback = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let http_address = args.http.or(settings.http).unwrap_or_else(|| loopback(8080));
    let grpc_address = args.grpc.or(settings.grpc).unwrap_or_else(|| loopback(8081));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let webhook = alert_webhook(args)?;
        let connection = Connection::of(args, settings, &prefix, webhook.is_some());
        let store = any_store(args, redis.as_deref(), &connection).await?;
        let http = TcpListener::bind(http_address)
            .await
            .with_context(|| format!("cannot listen on {http_address}"))?;
        let grpc = TcpListener::bind(grpc_address)
            .await
            .with_context(|| format!("cannot listen on {grpc_address}"))?;
        let options = Options {
            alert_webhook: webhook,
            alert_webhook_roots: alert_webhook_roots(args)?,
            ..options(args, settings)
        };
        let rlqs = rlqs(args)?;
        let (mut server, config_text, domains) = match source {
            Source::Files(files) => {
                let domains = files.config.domains.len();
                let text = files.path.display().to_string();
                let mut server =
                    Server::new(files.config, Some(files.path), store, options).load_options(files.options);
                if let Some(root) = files.watch_root.filter(|root| root.is_dir()) {
                    server = server.also_watch(root);
                }
                if files.initial_failed {
                    server = server.initial_config_failed();
                }
                (server, text, domains)
            }
            Source::Xds(xds) => {
                let text = format!("xds {} (node {})", xds.server, xds.node_id);
                let server = Server::new(Config::default(), None, store, options).xds(xds, !settings.force_start);
                (server, text, 0)
            }
        };
        server = server.rlqs(rlqs);
        if let Some(token) = token(args.admin_token_file.as_deref(), "--admin-token-file", ADMIN_TOKEN_ENV)? {
            server = server.admin_token(token);
        }
        if let Some(token) = token(args.read_token_file.as_deref(), "--read-token-file", READ_TOKEN_ENV)? {
            server = server.read_token(token);
        }
        if args.publish_xds {
            server = server.publish_xds();
        }
        if let Some(tls) = &settings.grpc_tls {
            let acceptor = tollgate_server::tls::Acceptor::new(tls.clone())
                .map_err(|error| UsageError(format!("GRPC_SERVER_USE_TLS: {error}")))?;
            server = server.grpc_tls(acceptor);
        }
        let mut debug_address = None;
        if let Some(address) = settings.debug {
            let listener = TcpListener::bind(address)
                .await
                .with_context(|| format!("cannot listen on {address} (DEBUG_HOST, DEBUG_PORT)"))?;
            debug_address = Some(listener.local_addr()?);
            server = server.debug_on(listener);
        }
        let mut metrics_address = None;
        if let Some((address, path)) = &settings.prometheus {
            let listener = TcpListener::bind(address)
                .await
                .with_context(|| format!("cannot listen on {address}"))?;
            metrics_address = Some(listener.local_addr()?);
            server = server.metrics_on(listener, path.clone());
        }
        tracing::info!(
            http = %http.local_addr()?,
            grpc = %grpc.local_addr()?,
            metrics = %metrics_address.map(|address| address.to_string()).unwrap_or_default(),
            debug = %debug_address.map(|address| address.to_string()).unwrap_or_default(),
            config = %config_text,
            grpc_tls = settings.grpc_tls.is_some(),
            store = if redis.is_some() { "redis" } else { "memory" },
            domains,
            "tollgate serve is ready"
        );
        if !settings.ignored.is_empty() {
            tracing::info!(settings = %settings.ignored.join(", "), "envoyproxy/ratelimit settings without effect here");
        }
        server.run(http, grpc, shutdown_signal()).await?;
        tracing::info!("stopped");
        Ok(())
    })
}

/// The environment variable holding the admin token.
pub const ADMIN_TOKEN_ENV: &str = "TOLLGATE_ADMIN_TOKEN";

/// The environment variable holding the read-only token.
pub const READ_TOKEN_ENV: &str = "TOLLGATE_READ_TOKEN";

/// A token: the one in `file` (the option `flag`), else in the environment
/// variable `env`.
fn token(file: Option<&std::path::Path>, flag: &str, env: &str) -> anyhow::Result<Option<AdminToken>> {
    let text = match file {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("{flag}: cannot read {}", path.display()))?;
            if text.trim().is_empty() {
                return Err(UsageError(format!("{flag}: {} is empty", path.display())).into());
            }
            text
        }
        None => std::env::var(env).unwrap_or_default(),
    };
    Ok(AdminToken::new(&text))
}

/// The quota service's (RLQS) settings, from the flags.
fn rlqs(args: &Args) -> Result<QuotaSettings, UsageError> {
    let unmatched = if args.rlqs_unmatched == "deny" {
        Blanket::DenyAll
    } else {
        Blanket::AllowAll
    };
    QuotaSettings::new(args.rlqs_interval, args.rlqs_ttl, args.rlqs_abandon_after, unmatched)
        .map_err(|error| UsageError(error.to_string()))
}

/// The service's switches: flags, else envoyproxy/ratelimit's settings.
fn options(args: &Args, settings: &Settings) -> Options {
    Options {
        shadow_mode: args.shadow_mode || settings.shadow_mode,
        all_alternatives: settings.all_alternatives,
        response_headers: args.response_headers || settings.response_headers,
        header_names: HeaderNames {
            policy: args
                .policy_header
                .clone()
                .or_else(|| settings.header_names.policy.clone()),
            ..settings.header_names.clone()
        },
        near_limit_ratio: settings.near_limit_ratio.unwrap_or(0.8),
        healthy_with_config_only: settings.healthy_with_config_only,
        dynamic_metadata: settings.dynamic_metadata,
        max_descriptors: args
            .max_descriptors
            .and_then(|most| usize::try_from(most).ok())
            .or(settings.max_descriptors)
            .unwrap_or(tollgate_server::service::DEFAULT_MAX_DESCRIPTORS),
        health_checks_store: args.health_check_store || settings.health_checks_store,
        stop_increment_when_over: settings.stop_increment_when_over,
        log_refusals: args.log_refusals.unwrap_or(0),
        // Set by `run` from --alert-webhook(-ca) or their variables, once read.
        alert_webhook: None,
        alert_webhook_roots: Vec::new(),
        alert_take_over: args.alert_take_over,
        // Kept only where a token opens /v1/top.
        track_top: args.admin_token_file.is_some()
            || args.read_token_file.is_some()
            || [ADMIN_TOKEN_ENV, READ_TOKEN_ENV]
                .iter()
                .any(|env| std::env::var(env).is_ok_and(|token| !token.trim().is_empty())),
    }
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM; in-flight calls then finish.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let Ok(mut terminate) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
            let _ = interrupt.await;
            return;
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
    tracing::info!("shutting down");
}
