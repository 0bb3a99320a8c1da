//! `tollgate serve`: rate limiting as a service beside Envoy, Istio or a
//! gateway.
//!
//! It speaks Envoy's rate limit gRPC protocol
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, with
//! envoyproxy/ratelimit's wire conventions) and the same request as JSON over
//! HTTP, reads envoyproxy/ratelimit's configuration files unchanged (plus an
//! optional `algorithm` block per limit), reloads them when they change,
//! answers `grpc.health.v1.Health`, and exports Prometheus metrics (also
//! under envoyproxy/ratelimit's stat names). [`settings`] reads
//! envoyproxy/ratelimit's environment. Limits live in the embedded memory
//! store or, with several replicas, in Redis.
//!
//! [`Server::run`] takes bound listeners and a shutdown future, so tests start
//! it on port 0 and stop it when they are done.
//!
//! It counts as envoyproxy/ratelimit does (a descriptor that goes over still
//! adds its hits: a token report is usage that happened; see [`service`]),
//! and offers what a gateway cannot: take an estimate, then settle the
//! actual ([`service::estimates`]).

// The store futures nest deeply (a resilient store over Redis, in `AnyStore`,
// in the gRPC and HTTP handlers): the compiler needs more room to lay them out.
#![recursion_limit = "256"]

pub mod config;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod overrides;
mod protobuf_json;
pub mod quota;
mod reload;
pub mod rlqs;
pub mod service;
pub mod settings;
pub mod tls;
pub mod top;
pub mod unit;
pub mod xds;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt as _;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

pub use config::{Config, ConfigError, LoadOptions};
pub use reload::Reload;
use reload::{watch_config, Watching};
pub use service::{HeaderNames, Options, Service};
pub use tollgate::AnyStore;

/// A rate limit server, ready to run.
pub struct Server {
    service: Arc<Service>,
    quotas: Arc<quota::Quotas>,
    config_path: Option<PathBuf>,
    load_options: LoadOptions,
    also_watch: Vec<PathBuf>,
    metrics: Option<(TcpListener, String)>,
    debug: Option<TcpListener>,
    initial_config_failed: bool,
    reloads: watch::Sender<Reload>,
    xds: Option<xds::Xds>,
    wait_for_xds: bool,
    grpc_tls: Option<Arc<tls::Acceptor>>,
    publish_xds: bool,
    access: http::Access,
}

impl Server {
    /// A server with `config` in force, read from `config_path` (watched for
    /// changes while running), deciding in `store`.
    pub fn new(config: Config, config_path: Option<PathBuf>, store: AnyStore, options: Options) -> Self {
        let (reloads, _) = watch::channel(Reload::Initial);
        let service = Arc::new(Service::new(config, store, options));
        let quotas = Arc::new(quota::Quotas::new(
            Arc::clone(&service),
            quota::QuotaSettings::default(),
        ));
        Self {
            quotas,
            service,
            config_path,
            load_options: LoadOptions::default(),
            also_watch: Vec::new(),
            metrics: None,
            debug: None,
            initial_config_failed: false,
            reloads,
            xds: None,
            wait_for_xds: false,
            grpc_tls: None,
            publish_xds: false,
            access: http::Access::default(),
        }
    }

    /// Opens the routes behind a token (`/v1/overrides`, `/v1/usage`)
    /// to requests carrying `token` (`Authorization: Bearer`); without a
    /// token they are off.
    #[must_use]
    pub fn admin_token(mut self, token: http::AdminToken) -> Self {
        self.access.admin = Some(token);
        self
    }

    /// Opens the routes that read (`/v1/usage`, the override list) to
    /// requests carrying `token` as well; it changes nothing.
    #[must_use]
    pub fn read_token(mut self, token: http::AdminToken) -> Self {
        self.access.read = Some(token);
        self
    }

    /// Runs the quota service (RLQS) with `settings` rather than the
    /// defaults.
    #[must_use]
    pub fn rlqs(mut self, settings: quota::QuotaSettings) -> Self {
        self.quotas = Arc::new(quota::Quotas::new(Arc::clone(&self.service), settings));
        self
    }

    /// Also answers ADS on the gRPC listener with this server's own
    /// configuration as `RateLimitConfig` resources ([`xds::publish`]).
    #[must_use]
    pub fn publish_xds(mut self) -> Self {
        self.publish_xds = true;
        self
    }

    /// Takes the configuration from a control plane over xDS instead of
    /// files (envoyproxy/ratelimit's `CONFIG_TYPE=GRPC_XDS_SOTW`). With
    /// `wait_for_first`, nothing is answered until its first response has
    /// been applied or refused (as upstream without
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`); otherwise the server answers
    /// at once with the configuration it was made with.
    #[must_use]
    pub fn xds(mut self, settings: xds::XdsSettings, wait_for_first: bool) -> Self {
        self.xds = Some(xds::Xds::new(settings, Arc::clone(&self.service)));
        self.wait_for_xds = wait_for_first;
        self
    }

    /// Follows the xDS client, when there is one.
    pub fn xds_status(&self) -> Option<watch::Receiver<xds::XdsStatus>> {
        self.xds.as_ref().map(xds::Xds::status)
    }

    /// Serves gRPC over TLS, accepted by `acceptor` (`GRPC_SERVER_USE_TLS`).
    #[must_use]
    pub fn grpc_tls(mut self, acceptor: tls::Acceptor) -> Self {
        self.grpc_tls = Some(Arc::new(acceptor));
        self
    }

    /// The configuration read at start could not be used (the server starts
    /// without it, as with `FORCE_START_WITHOUT_INITIAL_CONFIG`): counted as
    /// a load error rather than a success.
    #[must_use]
    pub fn initial_config_failed(mut self) -> Self {
        self.initial_config_failed = true;
        self
    }

    /// Also serves envoyproxy/ratelimit's debug listener on `listener`
    /// (`DEBUG_HOST`, `DEBUG_PORT`): `/rlconfig` and `/metrics`.
    #[must_use]
    pub fn debug_on(mut self, listener: TcpListener) -> Self {
        self.debug = Some(listener);
        self
    }

    /// Reloads the configuration as `options` say (layout, merging).
    #[must_use]
    pub fn load_options(mut self, options: LoadOptions) -> Self {
        self.load_options = options;
        self
    }

    /// Also reloads when `path` changes: the directory holding a symbolic
    /// link swapped to replace the configuration (envoyproxy/ratelimit's
    /// `RUNTIME_ROOT`, with `RUNTIME_WATCH_ROOT`).
    #[must_use]
    pub fn also_watch(mut self, path: PathBuf) -> Self {
        self.also_watch.push(path);
        self
    }

    /// Also serves the metrics on `listener`, at `path`
    /// (envoyproxy/ratelimit's `USE_PROMETHEUS`, `PROMETHEUS_ADDR`,
    /// `PROMETHEUS_PATH`).
    #[must_use]
    pub fn metrics_on(mut self, listener: TcpListener, path: String) -> Self {
        self.metrics = Some((listener, path));
        self
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
    /// then reports itself unhealthy and lets in-flight calls finish.
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
        if let Some(path) = &self.config_path {
            self.service.metrics().initial_config(!self.initial_config_failed);
            self.service.set_config_source(format!("file {}", path.display()));
            self.service.metrics().config_source("file", "", true);
        }
        let (stop, stopped) = watch::channel(false);
        let xds_status = self.xds.map(|xds| {
            let status = xds.status();
            tokio::spawn(xds.run(stopped.clone()));
            status
        });
        if let Some(path) = &self.config_path {
            let watching = Watching {
                path: path.clone(),
                options: self.load_options,
                also: self.also_watch.clone(),
            };
            watch_config(
                watching,
                Arc::clone(&self.service),
                self.reloads.clone(),
                stopped.clone(),
            )?;
        }
        // Spawned once the fallible set-up is done.
        let service = Arc::clone(&self.service);
        tokio::spawn(async move {
            shutdown.await;
            // As envoyproxy/ratelimit on SIGTERM: unhealthy, then stop.
            service.stopping();
            let _ = stop.send(true);
        });
        if let Some(mut status) = xds_status.filter(|_| self.wait_for_xds) {
            // A signal meanwhile stops the wait (and the server at once).
            tracing::info!("xds: waiting for the first configuration");
            let mut stopping = stopped.clone();
            tokio::select! {
                _ = status.wait_for(|status| status.responses > 0) => {}
                _ = stopping.wait_for(|stop| *stop) => {}
            }
        }
        // A replica that restarts enforces the overrides in the store from
        // its first answer.
        self.service.load_overrides(Duration::from_secs(2)).await;
        spawn_followers(&self.service, &stopped);
        tokio::spawn(Arc::clone(&self.quotas).run(stopped.clone()));
        let (health, health_service) = tonic_health::server::health_reporter();
        tokio::spawn(follow_health(health, self.service.health()));
        if self.service.options().health_checks_store {
            tokio::spawn(check_store(Arc::clone(&self.service), stopped.clone()));
        }
        let wait = |mut stopped: watch::Receiver<bool>| async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        let metrics_server = self.metrics.map(|(listener, path)| {
            let router = http::metrics_router(Arc::clone(&self.service), &path);
            axum::serve(no_delay(listener), router).with_graceful_shutdown(wait(stopped.clone()))
        });
        let debug_server = self.debug.map(|listener| {
            let router = http::debug_router(Arc::clone(&self.service), Arc::clone(&self.quotas));
            axum::serve(no_delay(listener), router).with_graceful_shutdown(wait(stopped.clone()))
        });
        let router = http::router(Arc::clone(&self.service), Arc::clone(&self.quotas), self.access);
        let http_server = axum::serve(no_delay(http), router).with_graceful_shutdown(wait(stopped.clone()));
        // Accepted sockets answer at once (TCP_NODELAY): with Nagle's
        // algorithm, a small answer waits for the client's delayed ACK, up to
        // 40 ms on Linux, twice Envoy's 20 ms deadline.
        let grpc_router = tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(grpc::Grpc::server(Arc::clone(&self.service)))
            .add_service(rlqs::Rlqs::server(Arc::clone(&self.quotas)))
            .add_optional_service(
                self.publish_xds
                    .then(|| xds::publish::Publisher::server(Arc::clone(&self.service))),
            );
        let grpc_server: std::pin::Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>> =
            if let Some(acceptor) = self.grpc_tls {
                let incoming = tls_incoming(grpc, acceptor, Arc::clone(&self.service), stopped.clone());
                Box::pin(grpc_router.serve_with_incoming_shutdown(incoming, wait(stopped)))
            } else {
                let incoming = tonic::transport::server::TcpIncoming::from(grpc).with_nodelay(Some(true));
                Box::pin(grpc_router.serve_with_incoming_shutdown(incoming, wait(stopped)))
            };
        let (http_result, grpc_result, metrics_result, debug_result) = tokio::join!(
            async { http_server.await },
            async { grpc_server.await.map_err(std::io::Error::other) },
            async {
                match metrics_server {
                    Some(server) => server.await,
                    None => Ok(()),
                }
            },
            async {
                match debug_server {
                    Some(server) => server.await,
                    None => Ok(()),
                }
            }
        );
        // Every front end has stopped: what leased rules hold goes back.
        self.service.close_leases().await;
        http_result.and(grpc_result).and(metrics_result).and(debug_result)
    }
}

/// `listener`, its accepted sockets set to `TCP_NODELAY` (see [`Server::run`]).
fn no_delay(listener: TcpListener) -> impl axum::serve::Listener<Addr = std::net::SocketAddr> {
    listener.tap_io(|socket| {
        if let Err(error) = socket.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY on an accepted socket");
        }
    })
}

/// TLS handshakes in progress at most on the gRPC listener: past it, the
/// oldest unfinished one is dropped for the newest connection. A flood of
/// connections that never finish a handshake then holds a bounded number of
/// tasks, and a client that does finish one quickly still gets through.
pub const MOST_HANDSHAKES: usize = 512;

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The handshakes in progress, oldest first, each with the handle that
/// stops it.
#[derive(Default)]
struct Handshakes {
    next: u64,
    running: std::collections::BTreeMap<u64, tokio::task::AbortHandle>,
}

/// Removes a handshake from those in progress however its task ends
/// (finished, failed, timed out, or aborted to make room).
struct Finished {
    handshakes: Arc<std::sync::Mutex<Handshakes>>,
    id: u64,
    service: Arc<Service>,
}

impl Drop for Finished {
    fn drop(&mut self) {
        let mut handshakes = self
            .handshakes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        handshakes.running.remove(&self.id);
        self.service.metrics().tls().in_progress(handshakes.running.len());
    }
}

/// The connections `listener` accepts, once their TLS handshake (each in a
/// task of its own, so a slow client delays no other; at most
/// [`MOST_HANDSHAKES`] at once, the oldest dropped past it) has succeeded;
/// a failed handshake (no client certificate, an untrusted one) is logged
/// and the connection dropped.
fn tls_incoming(
    listener: TcpListener,
    acceptor: Arc<tls::Acceptor>,
    service: Arc<Service>,
    mut stopped: watch::Receiver<bool>,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>> {
    let (accepted, incoming) = mpsc::channel(64);
    let handshakes = Arc::new(std::sync::Mutex::new(Handshakes::default()));
    tokio::spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "gRPC: accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                },
                changed = stopped.changed() => if changed.is_err() || *stopped.borrow() { return } else { continue },
            };
            let _ = stream.set_nodelay(true);
            let (acceptor, accepted) = (Arc::clone(&acceptor), accepted.clone());
            // Registered before the task can run, so that its end always
            // finds it to remove.
            let mut running = handshakes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if running.running.len() >= MOST_HANDSHAKES {
                if let Some((_, oldest)) = running.running.pop_first() {
                    oldest.abort();
                    service.metrics().tls().evicted();
                }
            }
            let id = running.next;
            running.next += 1;
            let finished = Finished {
                handshakes: Arc::clone(&handshakes),
                id,
                service: Arc::clone(&service),
            };
            let task = tokio::spawn(async move {
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
                // Done: no longer one to drop for room while it is handed on.
                drop(finished);
                match handshake {
                    Ok(Ok(stream)) => {
                        let _ = accepted.send(Ok(stream)).await;
                    }
                    Ok(Err(error)) => tracing::warn!(%peer, %error, "gRPC TLS: connection refused"),
                    Err(_) => tracing::warn!(%peer, "gRPC TLS: handshake timed out"),
                }
            });
            running.running.insert(id, task.abort_handle());
            service.metrics().tls().in_progress(running.running.len());
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(incoming)
}

/// The names `grpc.health.v1.Health` answers for: the server (""),
/// envoyproxy/ratelimit's "ratelimit", and the rate limit service's and
/// the quota service's own names.
const HEALTH_NAMES: [&str; 4] = [
    "",
    "ratelimit",
    "envoy.service.ratelimit.v3.RateLimitService",
    "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
];

/// Keeps the gRPC health statuses in step with the service's health.
/// The service's loops that follow the store until `stopped`: what it
/// keeps across a restart, the overrides, and the heaviest descriptors
/// published for the other replicas.
fn spawn_followers(service: &Arc<Service>, stopped: &watch::Receiver<bool>) {
    let (checking, following, publishing) = (Arc::clone(service), Arc::clone(service), Arc::clone(service));
    let stops = (stopped.clone(), stopped.clone(), stopped.clone());
    tokio::spawn(async move { checking.follow_persistence(stops.0).await });
    tokio::spawn(async move { following.follow_overrides(stops.1).await });
    tokio::spawn(async move { publishing.publish_top(stops.2).await });
    let (delivering, stop) = (Arc::clone(service), stopped.clone());
    tokio::spawn(async move { delivering.deliver_alerts(stop).await });
}

async fn follow_health(reporter: tonic_health::server::HealthReporter, mut healthy: watch::Receiver<bool>) {
    loop {
        let status = if *healthy.borrow_and_update() {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        for name in HEALTH_NAMES {
            reporter.set_service_status(name, status).await;
        }
        if healthy.changed().await.is_err() {
            return;
        }
    }
}

/// How often the store's health is checked, with
/// [`Options::health_checks_store`].
const STORE_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Checks the store every [`STORE_CHECK_INTERVAL`] until the server stops,
/// and keeps the service's health in step.
async fn check_store(service: Arc<Service>, mut stopped: watch::Receiver<bool>) {
    use tollgate::Store as _;
    let mut ticks = tokio::time::interval(STORE_CHECK_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut was_reachable = true;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
        let reachable = match service.store().ping().await {
            Ok(()) => true,
            Err(error) => {
                if was_reachable {
                    tracing::warn!(%error, "the store does not answer: unhealthy until it does");
                }
                false
            }
        };
        if reachable && !was_reachable {
            tracing::info!("the store answers again: healthy");
        }
        was_reachable = reachable;
        service.store_reachable(reachable);
    }
}
