//! `tollgate serve`: Envoy's rate limit service and an HTTP JSON API over
//! envoyproxy/ratelimit's configuration files.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tollgate::{AnyStore, MemoryStore, OnStoreError, ResilientStore};
use tollgate_server::{Config, Options, Server};

use crate::bench::{parse_duration, parse_on_store_error};
use crate::store::{connect_redis, StoreUrl};
use crate::UsageError;

/// Arguments of `tollgate serve`.
#[derive(Debug, clap::Args)]
#[allow(clippy::struct_excessive_bools)] // Each is one command-line switch.
pub struct Args {
    /// A configuration file, or a directory of `*.yaml` files (one domain
    /// each), in envoyproxy/ratelimit's format; reloaded when they change.
    #[arg(long)]
    config: PathBuf,
    /// A Redis URL (`redis://`, `rediss://`) to share limits between
    /// replicas; without it, the embedded memory store.
    #[arg(long)]
    redis: Option<String>,
    /// The prefix of every Redis key.
    #[arg(long, default_value = tollgate::DEFAULT_PREFIX)]
    prefix: String,
    /// Where to answer HTTP (`/json`, `/v1/check`, `/metrics`, `/healthz`, `/v1/config`).
    #[arg(long, default_value = "127.0.0.1:8080")]
    http: SocketAddr,
    /// Where to answer Envoy's gRPC rate limit protocol.
    #[arg(long, default_value = "127.0.0.1:8081")]
    grpc: SocketAddr,
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
    /// Decide and count, but always answer OK.
    #[arg(long)]
    shadow_mode: bool,
    /// Add RateLimit-Policy, RateLimit and Retry-After headers to every answer.
    #[arg(long)]
    response_headers: bool,
    /// Only validate the configuration, then exit (0 when it is valid).
    #[arg(long)]
    check_config: bool,
    /// Log as JSON lines instead of text.
    #[arg(long)]
    log_json: bool,
}

/// Runs the server until SIGINT or SIGTERM.
///
/// # Errors
///
/// An invalid configuration (exit code 2), a store that cannot be reached, an
/// address that cannot be bound.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let config = Config::load(&args.config).map_err(|error| UsageError(error.to_string()))?;
    if args.check_config {
        let domains: Vec<&str> = config.domains.keys().map(String::as_str).collect();
        println!("ok: {} domain(s): {}", domains.len(), domains.join(", "));
        return Ok(());
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if args.log_json {
        logs.json().init();
    } else {
        logs.init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let store = match &args.redis {
            None => AnyStore::Memory(MemoryStore::new()),
            Some(url) => match StoreUrl::parse(url)? {
                StoreUrl::Redis(url) => AnyStore::Resilient(
                    ResilientStore::builder(connect_redis(&url, &args.prefix).await?)
                        .on_error(args.on_store_error)
                        .timeout(args.store_timeout)
                        .deny_cache(args.deny_cache)
                        .build(),
                ),
                StoreUrl::Memory => AnyStore::Memory(MemoryStore::new()),
            },
        };
        let http = TcpListener::bind(args.http)
            .await
            .with_context(|| format!("cannot listen on {}", args.http))?;
        let grpc = TcpListener::bind(args.grpc)
            .await
            .with_context(|| format!("cannot listen on {}", args.grpc))?;
        tracing::info!(
            http = %http.local_addr()?,
            grpc = %grpc.local_addr()?,
            store = if args.redis.is_some() { "redis" } else { "memory" },
            domains = config.domains.len(),
            "tollgate serve is ready"
        );
        let options = Options {
            shadow_mode: args.shadow_mode,
            response_headers: args.response_headers,
        };
        let server = Server::new(config, Some(args.config.clone()), store, options);
        server.run(http, grpc, shutdown_signal()).await?;
        tracing::info!("stopped");
        Ok(())
    })
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
