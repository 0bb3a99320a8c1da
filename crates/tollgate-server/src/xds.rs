//! Limits from a control plane over xDS (envoyproxy/ratelimit's
//! `CONFIG_TYPE=GRPC_XDS_SOTW`), as Envoy Gateway and Envoy AI Gateway
//! configure their rate limit service.
//!
//! One aggregated (ADS) stream, state of the world, for
//! `ratelimit.config.ratelimit.v3.RateLimitConfig` resources. Each response
//! is the whole configuration: its resources are read through the same
//! reader and checks as files ([`Config::from_resources`]) and either put in
//! force at once, whole, and ACKed with its version, or refused: NACKed
//! with an `error_detail` naming the resource and the descriptor, the
//! previous configuration staying in force. A lost stream, or a control
//! plane that restarts, keeps the last good configuration in force while
//! the client reconnects with a jittered exponential back-off; the new
//! stream's first response is again the whole state.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use envoy_types::pb::google::rpc::Status;
use prost::Message as _;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use crate::config::resource::{RateLimitConfig, TYPE_URL};
use crate::config::Config;
use crate::tls::ClientTls;
use crate::Service;

/// Where and how to reach the control plane (envoyproxy/ratelimit's
/// `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*` settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsSettings {
    /// `host:port`, or a URL (`CONFIG_GRPC_XDS_SERVER_URL`, `localhost:18000`).
    pub server: String,
    /// The node id the control plane keys its snapshots by
    /// (`CONFIG_GRPC_XDS_NODE_ID`, `default`).
    pub node_id: String,
    /// Node metadata, string values (`CONFIG_GRPC_XDS_NODE_METADATA`, `k=v,k2=v2`).
    pub node_metadata: Vec<(String, String)>,
    /// TLS towards the control plane (`CONFIG_GRPC_XDS_SERVER_USE_TLS` and its files).
    pub tls: Option<ClientTls>,
    /// Headers sent with the stream (`CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`, `k:v,k2:v2`).
    pub headers: Vec<(String, String)>,
    /// Between attempts to connect (`CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`, 3 s).
    pub connect_retry: Duration,
    /// The first wait after a lost stream (`XDS_CLIENT_BACKOFF_INITIAL_INTERVAL`, 10 s).
    pub backoff_initial: Duration,
    /// The longest (`XDS_CLIENT_BACKOFF_MAX_INTERVAL`, 60 s).
    pub backoff_max: Duration,
    /// The largest response accepted (`XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`; tonic's 4 MiB).
    pub max_message_bytes: Option<usize>,
    /// Resources of one domain are merged (`MERGE_DOMAIN_CONFIG`).
    pub merge_domains: bool,
}

impl Default for XdsSettings {
    fn default() -> Self {
        Self {
            server: "localhost:18000".to_owned(),
            node_id: "default".to_owned(),
            node_metadata: Vec::new(),
            tls: None,
            headers: Vec::new(),
            connect_retry: Duration::from_secs(3),
            backoff_initial: Duration::from_secs(10),
            backoff_max: Duration::from_secs(60),
            max_message_bytes: None,
            merge_domains: false,
        }
    }
}

/// What the client knows, for `/rlconfig`, metrics and start-up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XdsStatus {
    /// A stream is open.
    pub connected: bool,
    /// The version in force, once one was applied.
    pub version: Option<String>,
    /// Responses handled (applied or refused): start-up waits for the first.
    pub responses: u64,
    /// Why the last refused version was refused.
    pub last_error: Option<String>,
}

/// The xDS client of one server.
pub struct Xds {
    settings: XdsSettings,
    service: Arc<Service>,
    status: watch::Sender<XdsStatus>,
}

impl Xds {
    /// A client putting what `settings`' control plane sends in force in `service`.
    pub fn new(settings: XdsSettings, service: Arc<Service>) -> Self {
        Self {
            settings,
            service,
            status: watch::channel(XdsStatus::default()).0,
        }
    }

    /// Follows the client's status.
    pub fn status(&self) -> watch::Receiver<XdsStatus> {
        self.status.subscribe()
    }

    /// Where the configuration comes from, as `/rlconfig` says it.
    fn describe(&self, status: &XdsStatus) -> String {
        format!(
            "xds (server {}, node {}, version {}{})",
            self.settings.server,
            self.settings.node_id,
            status.version.as_deref().unwrap_or("none"),
            if status.connected { "" } else { ", disconnected" }
        )
    }

    fn update(&self, change: impl FnOnce(&mut XdsStatus)) {
        self.status.send_modify(change);
        let status = self.status.borrow().clone();
        self.service.set_config_source(self.describe(&status));
        self.service
            .metrics()
            .config_source("xds", status.version.as_deref().unwrap_or(""), status.connected);
    }

    /// Runs until `stopped` turns true: connects, follows the stream, and
    /// reconnects whenever it is lost.
    pub async fn run(self, mut stopped: watch::Receiver<bool>) {
        self.update(|_| {});
        let mut backoff = self.settings.backoff_initial;
        loop {
            let channel = tokio::select! {
                channel = self.connect() => channel,
                _ = stopped.wait_for(|stop| *stop) => return,
            };
            let received = tokio::select! {
                received = self.follow(channel) => received,
                _ = stopped.wait_for(|stop| *stop) => return,
            };
            self.update(|status| status.connected = false);
            if received {
                backoff = self.settings.backoff_initial;
            }
            let wait = jittered(backoff);
            tracing::info!(wait = ?wait, "xds: reconnecting after a back-off; the last good configuration stays in force");
            backoff = (backoff * 2).min(self.settings.backoff_max.max(self.settings.backoff_initial));
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = stopped.wait_for(|stop| *stop) => return,
            }
        }
    }

    /// A channel to the control plane, retried every `connect_retry` until it connects.
    async fn connect(&self) -> Channel {
        loop {
            match self.try_connect().await {
                Ok(channel) => return channel,
                Err(error) => {
                    tracing::warn!(server = %self.settings.server, %error, "xds: cannot connect to the control plane");
                    tokio::time::sleep(jittered(self.settings.connect_retry)).await;
                }
            }
        }
    }

    async fn try_connect(&self) -> Result<Channel, XdsError> {
        let tls = self.settings.tls.as_ref();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = if self.settings.server.contains("://") {
            self.settings.server.clone()
        } else {
            format!("{scheme}://{}", self.settings.server)
        };
        let mut endpoint = Endpoint::from_shared(url)
            .map_err(XdsError::Url)?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30));
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls.tonic_config()?).map_err(XdsError::TlsConfig)?;
        }
        endpoint
            .connect()
            .await
            .map_err(|error| XdsError::Connect(one_line(&error)))
    }

    /// Follows one stream until it ends; true when a response came.
    async fn follow(&self, channel: Channel) -> bool {
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        if let Some(most) = self.settings.max_message_bytes {
            client = client.max_decoding_message_size(most);
        }
        let (requests, outgoing) = mpsc::channel(4);
        let last_version = self.status.borrow().version.clone().unwrap_or_default();
        let first = DiscoveryRequest {
            version_info: last_version,
            node: Some(self.node()),
            type_url: TYPE_URL.to_owned(),
            ..DiscoveryRequest::default()
        };
        if requests.send(first).await.is_err() {
            return false;
        }
        let mut request = tonic::Request::new(ReceiverStream::new(outgoing));
        for (name, value) in &self.settings.headers {
            let name = tonic::metadata::MetadataKey::from_bytes(name.as_bytes());
            let value = tonic::metadata::MetadataValue::try_from(value.as_str());
            if let (Ok(name), Ok(value)) = (name, value) {
                request.metadata_mut().insert(name, value);
            }
        }
        let mut responses = match client.stream_aggregated_resources(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                tracing::warn!(%status, "xds: the control plane refused the stream");
                return false;
            }
        };
        tracing::info!(server = %self.settings.server, node = %self.settings.node_id, "xds: connected");
        self.update(|status| status.connected = true);
        let mut received = false;
        loop {
            match responses.message().await {
                Ok(Some(response)) => {
                    received = true;
                    let answer = self.handle(response).await;
                    if requests.send(answer).await.is_err() {
                        return received;
                    }
                }
                Ok(None) => {
                    tracing::warn!("xds: the control plane closed the stream");
                    return received;
                }
                Err(status) => {
                    tracing::warn!(%status, "xds: the stream failed");
                    return received;
                }
            }
        }
    }

    /// Applies or refuses one response; the ACK or NACK to send.
    async fn handle(&self, response: DiscoveryResponse) -> DiscoveryRequest {
        let mut answer = DiscoveryRequest {
            type_url: TYPE_URL.to_owned(),
            response_nonce: response.nonce.clone(),
            ..DiscoveryRequest::default()
        };
        let version = response.version_info.clone();
        // Reading a large configuration takes tens of milliseconds of CPU:
        // on a thread of its own, at the lowest priority, so that no
        // decision waits behind it.
        let merge = self.settings.merge_domains;
        let outcome = in_background(move || read(&response, merge))
            .await
            .unwrap_or(Err(ResponseError::Unread));
        match outcome {
            Ok(config) => {
                let domains = config.domains.len();
                let previous = self.service.replace_config(config);
                drop(in_background(move || drop(previous)));
                self.service.metrics().config_loaded(true);
                tracing::info!(%version, domains, "xds: configuration applied");
                self.service.config_applied(&format!("xds version {version}"));
                self.update(|status| {
                    status.version = Some(version.clone());
                    status.responses += 1;
                    status.last_error = None;
                });
                answer.version_info = version;
            }
            Err(error) => {
                let message = error.to_string();
                self.service.metrics().config_loaded(false);
                tracing::error!(%version, error = %message, "xds: configuration refused; the previous one stays in force");
                self.service
                    .config_refused(&format!("xds version {version}: {message}"));
                self.update(|status| {
                    status.responses += 1;
                    status.last_error = Some(message.clone());
                });
                // A NACK carries the version in force, not the refused one.
                answer.version_info = self.status.borrow().version.clone().unwrap_or_default();
                answer.error_detail = Some(Status {
                    code: tonic::Code::InvalidArgument as i32,
                    message,
                    details: Vec::new(),
                });
            }
        }
        answer
    }

    fn node(&self) -> Node {
        let fields = self
            .settings
            .node_metadata
            .iter()
            .map(|(name, value)| {
                let value = Value {
                    kind: Some(Kind::StringValue(value.clone())),
                };
                (name.clone(), value)
            })
            .collect();
        Node {
            id: self.settings.node_id.clone(),
            metadata: Some(Struct { fields }),
            user_agent_name: "tollgate".to_owned(),
            ..Node::default()
        }
    }
}

/// The configuration a response holds.
///
/// # Errors
///
/// A response of another type, a resource that is not a
/// `RateLimitConfig` or does not decode, or one the reader refuses: the
/// message names the resource (by its place, and its name once decoded).
pub fn read(response: &DiscoveryResponse, merge_domains: bool) -> Result<Config, ResponseError> {
    if response.type_url != TYPE_URL {
        return Err(ResponseError::TypeUrl(response.type_url.clone()));
    }
    let mut resources = Vec::with_capacity(response.resources.len());
    for (index, any) in response.resources.iter().enumerate() {
        if any.type_url != TYPE_URL {
            return Err(ResponseError::ResourceTypeUrl {
                index,
                type_url: any.type_url.clone(),
            });
        }
        let resource =
            RateLimitConfig::decode(any.value.as_slice()).map_err(|source| ResponseError::Decode { index, source })?;
        resources.push(resource);
    }
    Ok(Config::from_resources(&resources, merge_domains)?)
}

/// Why the control plane cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    /// `CONFIG_GRPC_XDS_SERVER_URL` is not a URL.
    #[error("CONFIG_GRPC_XDS_SERVER_URL: {0}")]
    Url(tonic::transport::Error),
    /// The client's TLS files cannot be used.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// tonic refused the TLS configuration.
    #[error("the xDS client's TLS: {0}")]
    TlsConfig(tonic::transport::Error),
    /// The connection failed (with its causes, on one line).
    #[error("{0}")]
    Connect(String),
}

/// Why a response is refused (NACKed), naming the resource at fault.
#[derive(Debug, thiserror::Error)]
pub enum ResponseError {
    /// The response is not of rate limit configurations.
    #[error("type URL \"{0}\", expected \"{TYPE_URL}\"")]
    TypeUrl(String),
    /// A resource is not a rate limit configuration.
    #[error("resources[{index}]: type URL \"{type_url}\", expected \"{TYPE_URL}\"")]
    ResourceTypeUrl {
        /// Its place in the response.
        index: usize,
        /// Its type URL.
        type_url: String,
    },
    /// A resource does not decode.
    #[error("resources[{index}]: not a RateLimitConfig: {source}")]
    Decode {
        /// Its place in the response.
        index: usize,
        /// Why.
        source: prost::DecodeError,
    },
    /// The thread reading them stopped without an answer.
    #[error("reading the resources failed")]
    Unread,
    /// The configurations do not make a valid configuration.
    #[error(transparent)]
    Config(#[from] crate::ConfigError),
}

/// Runs `work` on a thread of the lowest scheduling priority (SCHED_IDLE:
/// it takes only the CPU time nothing else wants); its result, or `None`
/// when it panicked or no thread could be started.
fn in_background<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> tokio::sync::oneshot::Receiver<T> {
    let (done, result) = tokio::sync::oneshot::channel();
    let started = std::thread::Builder::new().name("xds-read".to_owned()).spawn(move || {
        let idle = thread_priority::ThreadSchedulePolicy::Normal(thread_priority::NormalThreadSchedulePolicy::Idle);
        if let Err(error) = thread_priority::set_thread_priority_and_policy(
            thread_priority::thread_native_id(),
            thread_priority::ThreadPriority::Min,
            idle,
        ) {
            tracing::debug!(?error, "xds: the reading thread keeps its priority");
        }
        let _ = done.send(work());
    });
    if let Err(error) = started {
        tracing::error!(%error, "xds: no thread to read the configuration on");
    }
    result
}

/// `wait`, give or take half of it.
fn jittered(wait: Duration) -> Duration {
    wait.mul_f64(0.5 + fastrand::f64())
}

fn one_line(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

pub mod publish;
