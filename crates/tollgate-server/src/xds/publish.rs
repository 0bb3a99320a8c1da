//! The other side of the stream: `serve --publish-xds` answers ADS for
//! `RateLimitConfig` with its own configuration, so that one Tollgate
//! holding the files configures a fleet of rate limit services (Tollgate,
//! or envoyproxy/ratelimit with `CONFIG_TYPE=GRPC_XDS_SOTW`) as a
//! gateway's controller would. It serves on the gRPC listener, with its
//! TLS. Each stream is sent the whole state when it opens and again after
//! every reload; the version is the count of configurations loaded. A NACK
//! is logged. What a resource cannot carry (an `algorithm` block is sent as
//! its unit and requests per unit) is logged once per version.

use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use futures_util::{Stream, StreamExt as _};
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::config::resource::TYPE_URL;
use crate::Service;

/// The ADS server publishing a service's configuration.
pub struct Publisher {
    service: Arc<Service>,
}

impl Publisher {
    /// A tonic service publishing `service`'s configuration.
    pub fn server(service: Arc<Service>) -> AggregatedDiscoveryServiceServer<Self> {
        AggregatedDiscoveryServiceServer::new(Self { service })
    }
}

/// The configuration in force as a response, versioned `version`.
fn snapshot(service: &Service, version: u64, nonce: u64) -> DiscoveryResponse {
    let config = service.config();
    let mut resources = Vec::with_capacity(config.domains.len());
    for domain in config.domains.values() {
        let (resource, notes) = domain.to_resource();
        for note in notes {
            tracing::warn!(version, %note, "xds publish: not expressible in RateLimitConfig");
        }
        resources.push(Any {
            type_url: TYPE_URL.to_owned(),
            value: resource.encode_to_vec(),
        });
    }
    DiscoveryResponse {
        version_info: version.to_string(),
        resources,
        type_url: TYPE_URL.to_owned(),
        nonce: nonce.to_string(),
        ..DiscoveryResponse::default()
    }
}

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, tonic::Status>> + Send>>;
type DeltaResponses = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Publisher {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = DeltaResponses;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Responses>, tonic::Status> {
        let mut requests = request.into_inner();
        let (responses, outgoing) = mpsc::channel(4);
        let service = Arc::clone(&self.service);
        let mut changes = service.config_changes();
        tokio::spawn(async move {
            let node = match requests.next().await {
                Some(Ok(first)) if first.type_url == TYPE_URL => first.node.map(|node| node.id).unwrap_or_default(),
                Some(Ok(first)) => {
                    tracing::warn!(type_url = %first.type_url, "xds publish: only RateLimitConfig is served");
                    return;
                }
                _ => return,
            };
            tracing::info!(%node, "xds publish: a client subscribed");
            let mut nonce = 0;
            changes.mark_changed();
            loop {
                tokio::select! {
                    changed = changes.changed() => {
                        if changed.is_err() { return }
                        // Version 1 is the configuration loaded at start.
                        let version = *changes.borrow_and_update() + 1;
                        nonce += 1;
                        if responses.send(Ok(snapshot(&service, version, nonce))).await.is_err() { return }
                    }
                    request = requests.next() => match request {
                        Some(Ok(request)) => {
                            if let Some(error) = request.error_detail {
                                tracing::error!(%node, nonce = %request.response_nonce, error = %error.message, "xds publish: the client refused a version");
                            }
                        }
                        _ => return,
                    },
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(ReceiverStream::new(outgoing))))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<DeltaResponses>, tonic::Status> {
        Err(tonic::Status::unimplemented("state of the world only (GRPC_XDS_SOTW)"))
    }
}
