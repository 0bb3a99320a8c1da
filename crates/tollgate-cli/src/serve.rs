//! `tollgate serve`: Envoy's rate limit service and an HTTP JSON API over
//! envoyproxy/ratelimit's configuration files.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tollgate::{AnyStore, MemoryStore, OnStoreError, ResilientStore};
use tollgate_server::settings::Settings;
use tollgate_server::{Config, LoadOptions, Options, Server};

use crate::bench::{parse_duration, parse_on_store_error};
use crate::store::{connect_redis, StoreUrl};
use crate::UsageError;

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
    #[arg(long)]
    config: Option<PathBuf>,
    /// A Redis URL (`redis://`, `rediss://`, `redis+cluster://`, `redis+sentinel://`) to share limits between
    /// replicas; without it (or `REDIS_URL`), the embedded memory store.
    #[arg(long)]
    redis: Option<String>,
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
    #[arg(long, value_name = "POLICY", default_value = "error", value_parser = parse_on_store_error)]
    on_store_error: OnStoreError,
    /// With --redis: the deadline of every Redis call; after consecutive
    /// faults a circuit breaker skips Redis for a back-off, then probes it.
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = parse_duration)]
    store_timeout: Duration,
    /// With --redis: denials remembered (one per subject and rule set) and answered
    /// without calling Redis until their retry_after has passed; 0 turns
    /// the deny cache off.
    #[arg(long, value_name = "ENTRIES", default_value_t = 100_000)]
    deny_cache: usize,
    /// Decide and count, but always answer an overall OK (or `SHADOW_MODE`).
    #[arg(long)]
    shadow_mode: bool,
    /// Add the limit, remaining and reset headers to every answer (or
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`; names from `LIMIT_LIMIT_HEADER`,
    /// `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
    #[arg(long)]
    response_headers: bool,
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
    let settings = Settings::from_env().map_err(UsageError)?;
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
    init_logs(args, &settings);
    let config = match loaded {
        Ok(config) => config,
        Err(error) if settings.force_start => {
            tracing::error!(%error, "no configuration loaded; starting without limits (FORCE_START_WITHOUT_INITIAL_CONFIG)");
            Config::default()
        }
        Err(error) => return Err(UsageError(error.to_string()).into()),
    };
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
        let store = match &redis {
            None => AnyStore::Memory(MemoryStore::new()),
            Some(url) => match StoreUrl::parse(url)? {
                StoreUrl::Redis(url) => AnyStore::Resilient(
                    ResilientStore::builder(connect_redis(&url, &prefix).await?)
                        .on_error(args.on_store_error)
                        .timeout(args.store_timeout)
                        .deny_cache(args.deny_cache)
                        .build(),
                ),
                StoreUrl::Memory => AnyStore::Memory(MemoryStore::new()),
            },
        };
        let http = TcpListener::bind(http_address)
            .await
            .with_context(|| format!("cannot listen on {http_address}"))?;
        let grpc = TcpListener::bind(grpc_address)
            .await
            .with_context(|| format!("cannot listen on {grpc_address}"))?;
        let options = Options {
            shadow_mode: args.shadow_mode || settings.shadow_mode,
            quota_mode: settings.quota_mode,
            response_headers: args.response_headers || settings.response_headers,
            header_names: settings.header_names.clone(),
            near_limit_ratio: settings.near_limit_ratio.unwrap_or(0.8),
            healthy_with_config_only: settings.healthy_with_config_only,
            dynamic_metadata: settings.dynamic_metadata,
        };
        let domains = config.domains.len();
        let mut server = Server::new(config, Some(config_path.clone()), store, options).load_options(load_options);
        if let Some(root) = watch_root.filter(|root| root.is_dir()) {
            server = server.also_watch(root);
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
            config = %config_path.display(),
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

/// Logs to stderr: `RUST_LOG`, else `LOG_LEVEL`, else info; as JSON with
/// `--log-json` or `LOG_FORMAT=json`.
fn init_logs(args: &Args, settings: &Settings) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .ok()
        .or_else(|| {
            settings
                .log_level
                .as_deref()
                .and_then(|level| tracing_subscriber::EnvFilter::try_new(level).ok())
        })
        .unwrap_or_else(|| "info".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if args.log_json || settings.log_json {
        logs.json().init();
    } else {
        logs.init();
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
