//! An xDS control plane for the tests: one ADS stream per client (the
//! loop `serve --publish-xds` runs), state of the world for
//! `RateLimitConfig` resources, over TLS with
//! client certificates when given them. It records every request (to see
//! ACKs and NACKs) and sends the snapshot anew whenever the test changes it.

use std::sync::{Arc, Mutex};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use prost::Message as _;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tollgate_server::config::resource::{RateLimitConfig, TYPE_URL};
use tollgate_server::xds::publish::{state_of_the_world, Responses};

use super::certs::{Authority, Leaf};

/// What the control plane serves.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub version: String,
    pub resources: Vec<Any>,
    /// The response's type URL (empty: `TYPE_URL`).
    pub type_url: String,
}

impl Snapshot {
    pub fn of(version: &str, configs: &[RateLimitConfig]) -> Self {
        Self {
            version: version.to_owned(),
            resources: configs.iter().map(any).collect(),
            type_url: String::new(),
        }
    }
}

pub fn any(config: &RateLimitConfig) -> Any {
    Any {
        type_url: TYPE_URL.to_owned(),
        value: config.encode_to_vec(),
    }
}

#[derive(Clone)]
struct Ads {
    snapshot: watch::Receiver<Snapshot>,
    seen: Arc<Mutex<Vec<DiscoveryRequest>>>,
}

type DeltaResponses =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<DeltaDiscoveryResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = DeltaResponses;

    /// The stream `serve --publish-xds` runs, answering with the snapshot
    /// and recording every request.
    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Responses>, tonic::Status> {
        let (first, seen) = (Arc::clone(&self.seen), Arc::clone(&self.seen));
        let respond = |current: Snapshot, nonce: u64| DiscoveryResponse {
            version_info: current.version,
            resources: current.resources,
            type_url: if current.type_url.is_empty() {
                TYPE_URL.to_owned()
            } else {
                current.type_url
            },
            nonce: nonce.to_string(),
            ..DiscoveryResponse::default()
        };
        Ok(tonic::Response::new(state_of_the_world(
            request.into_inner(),
            self.snapshot.clone(),
            move |request| {
                first.lock().unwrap().push(request);
                true
            },
            respond,
            move |request| seen.lock().unwrap().push(request),
        )))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<DeltaResponses>, tonic::Status> {
        Err(tonic::Status::unimplemented("state of the world only"))
    }
}

/// A control plane running until dropped (or [`ControlPlane::stop`]).
pub struct ControlPlane {
    pub address: std::net::SocketAddr,
    snapshot: watch::Sender<Snapshot>,
    seen: Arc<Mutex<Vec<DiscoveryRequest>>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ControlPlane {
    /// Serves `snapshot` on `listener`; with `tls`, over TLS with client
    /// certificates of `tls.0`'s CA required.
    pub fn start(listener: TcpListener, snapshot: Snapshot, tls: Option<(&Authority, &Leaf)>) -> Self {
        let address = listener.local_addr().unwrap();
        let (sender, receiver) = watch::channel(snapshot);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let ads = Ads {
            snapshot: receiver,
            seen: Arc::clone(&seen),
        };
        let mut builder = tonic::transport::Server::builder();
        if let Some((authority, leaf)) = tls {
            let identity = tonic::transport::Identity::from_pem(
                std::fs::read(&leaf.cert).unwrap(),
                std::fs::read(&leaf.key).unwrap(),
            );
            let ca = tonic::transport::Certificate::from_pem(std::fs::read(authority.ca()).unwrap());
            builder = builder
                .tls_config(
                    tonic::transport::ServerTlsConfig::new()
                        .identity(identity)
                        .client_ca_root(ca),
                )
                .unwrap();
        }
        let (stop, stopped) = oneshot::channel::<()>();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let router = builder.add_service(AggregatedDiscoveryServiceServer::new(ads));
        let task = tokio::spawn(async move {
            let _ = router
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
        });
        Self {
            address,
            snapshot: sender,
            seen,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn serve(&self, snapshot: Snapshot) {
        self.snapshot.send_replace(snapshot);
    }

    /// Every request received so far.
    pub fn seen(&self) -> Vec<DiscoveryRequest> {
        self.seen.lock().unwrap().clone()
    }

    /// Stops serving, and closes every stream.
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let task = self.task.take().unwrap();
        task.abort();
        let _ = task.await;
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// A `RateLimitConfig` written as YAML (as Envoy Gateway's translator
/// fixtures hold it: the message's fields by name), read field by field
/// here rather than through the server's reader.
pub fn resource_from_yaml(text: &str) -> RateLimitConfig {
    use serde_yaml_ng::Value;
    use tollgate_server::config::resource::{RateLimitDescriptor, RateLimitPolicy, RateLimitReplace};
    fn text_of(value: &Value, field: &str) -> String {
        match &value[field] {
            Value::String(text) => text.clone(),
            Value::Null => String::new(),
            other => serde_yaml_ng::to_string(other).unwrap().trim().to_owned(),
        }
    }
    fn flag(value: &Value, field: &str) -> bool {
        value[field].as_bool().unwrap_or(false)
    }
    fn unit(name: &str) -> i32 {
        match name.to_ascii_uppercase().as_str() {
            "SECOND" => 1,
            "MINUTE" => 2,
            "HOUR" => 3,
            "DAY" => 4,
            "MONTH" => 5,
            "YEAR" => 6,
            "WEEK" => 7,
            _ => 0,
        }
    }
    fn descriptors(value: &Value) -> Vec<RateLimitDescriptor> {
        value
            .as_sequence()
            .map(|items| {
                items
                    .iter()
                    .map(|item| RateLimitDescriptor {
                        key: text_of(item, "key"),
                        value: text_of(item, "value"),
                        rate_limit: item["rate_limit"].as_mapping().map(|_| {
                            let policy = &item["rate_limit"];
                            RateLimitPolicy {
                                unit: unit(&text_of(policy, "unit")),
                                requests_per_unit: policy["requests_per_unit"].as_u64().unwrap_or(0) as u32,
                                unlimited: flag(policy, "unlimited"),
                                name: text_of(policy, "name"),
                                replaces: policy["replaces"]
                                    .as_sequence()
                                    .map(|replaces| {
                                        replaces
                                            .iter()
                                            .map(|replace| RateLimitReplace {
                                                name: text_of(replace, "name"),
                                            })
                                            .collect()
                                    })
                                    .unwrap_or_default(),
                            }
                        }),
                        descriptors: descriptors(&item["descriptors"]),
                        shadow_mode: flag(item, "shadow_mode"),
                        detailed_metric: flag(item, "detailed_metric"),
                        quota_mode: flag(item, "quota_mode"),
                        metadata: None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
    let root: Value = serde_yaml_ng::from_str(text).unwrap();
    RateLimitConfig {
        name: text_of(&root, "name"),
        domain: text_of(&root, "domain"),
        descriptors: descriptors(&root["descriptors"]),
    }
}
