//! `tollgate serve`: rate limiting as a service beside Envoy, Istio or a
//! gateway.
//!
//! It speaks Envoy's rate limit gRPC protocol
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) and the
//! same request as JSON over HTTP, reads envoyproxy/ratelimit's configuration
//! files unchanged (plus an optional `algorithm` block per limit), reloads them
//! when they change, and exports Prometheus metrics. Limits live in the
//! embedded memory store or, with several replicas, in Redis.
//!
//! [`Server::run`] takes bound listeners and a shutdown future, so tests start
//! it on port 0 and stop it when they are done.
//!
//! One deliberate difference from envoyproxy/ratelimit: the descriptors of a
//! request are decided all-or-nothing, so a request that is over any limit
//! consumes from none (see [`service`]).

pub mod config;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod service;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

pub use config::{Config, ConfigError};
pub use service::{Options, Service};
pub use tollgate::AnyStore;

/// What the last look at the configuration files found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// The configuration given at start is in force.
    Initial,
    /// A changed configuration was loaded and is in force (`n`-th reload).
    Loaded(u64),
    /// A changed configuration was refused; the previous one stays.
    Failed(String),
}

/// A rate limit server, ready to run.
pub struct Server {
    service: Arc<Service>,
    config_path: Option<PathBuf>,
    reloads: watch::Sender<Reload>,
}

impl Server {
    /// A server with `config` in force, read from `config_path` (watched for
    /// changes while running), deciding in `store`.
    pub fn new(config: Config, config_path: Option<PathBuf>, store: AnyStore, options: Options) -> Self {
        let (reloads, _) = watch::channel(Reload::Initial);
        Self {
            service: Arc::new(Service::new(config, store, options)),
            config_path,
            reloads,
        }
    }

    /// The service both front ends share.
    pub fn service(&self) -> Arc<Service> {
        Arc::clone(&self.service)
    }

    /// Follows configuration reloads.
    pub fn reloads(&self) -> watch::Receiver<Reload> {
        self.reloads.subscribe()
    }

    /// Serves HTTP on `http` and gRPC on `grpc` until `shutdown` completes,
    /// then lets in-flight calls finish.
    ///
    /// # Errors
    ///
    /// When a listener fails, or the configuration path cannot be watched.
    pub async fn run(
        self,
        http: TcpListener,
        grpc: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop.send(true);
        });
        let _watcher = match &self.config_path {
            Some(path) => Some(watch_config(path, Arc::clone(&self.service), self.reloads.clone())?),
            None => None,
        };
        let wait = |mut stopped: watch::Receiver<bool>| async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        let http_server =
            axum::serve(http, http::router(Arc::clone(&self.service))).with_graceful_shutdown(wait(stopped.clone()));
        let grpc_server = tonic::transport::Server::builder()
            .add_service(grpc::Grpc::server(Arc::clone(&self.service)))
            .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(grpc), wait(stopped));
        let (http_result, grpc_result) = tokio::join!(async { http_server.await }, async {
            grpc_server.await.map_err(std::io::Error::other)
        });
        http_result.and(grpc_result)
    }
}

/// Watches the configuration file or directory and reloads it when it
/// changes; a configuration that cannot be used is reported and the running
/// one stays in force.
fn watch_config(
    path: &Path,
    service: Arc<Service>,
    reloads: watch::Sender<Reload>,
) -> std::io::Result<notify::RecommendedWatcher> {
    let (changed, mut changes) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|event| !event.kind.is_access()) {
            let _ = changed.send(());
        }
    })
    .map_err(std::io::Error::other)?;
    // Editors replace files rather than write them: watch the directory.
    let directory = if path.is_dir() {
        path
    } else {
        path.parent().unwrap_or(Path::new("."))
    };
    watcher
        .watch(directory, RecursiveMode::NonRecursive)
        .map_err(std::io::Error::other)?;
    let path = path.to_owned();
    tokio::spawn(async move {
        let mut generation = 0;
        while changes.recv().await.is_some() {
            // A save is often several events: let them settle, then read once.
            tokio::time::sleep(Duration::from_millis(50)).await;
            while changes.try_recv().is_ok() {}
            match Config::load(&path) {
                Ok(config) => {
                    generation += 1;
                    service.replace_config(config);
                    service.metrics().config_loaded(true);
                    tracing::info!(path = %path.display(), generation, "configuration reloaded");
                    let _ = reloads.send(Reload::Loaded(generation));
                }
                Err(error) => {
                    service.metrics().config_loaded(false);
                    tracing::error!(%error, "configuration refused; the previous one stays in force");
                    let _ = reloads.send(Reload::Failed(error.to_string()));
                }
            }
        }
    });
    Ok(watcher)
}
