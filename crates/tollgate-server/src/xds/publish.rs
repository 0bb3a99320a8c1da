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
use tokio::sync::{mpsc, watch};
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

/// The responses of one ADS stream.
pub type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, tonic::Status>> + Send>>;
type DeltaResponses = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, tonic::Status>> + Send>>;

/// One ADS stream, state of the world, as every server of it runs it:
/// waits for the client's first request, which `first` reads (false: end
/// the stream); then sends `respond(value, nonce)` for the value `changes`
/// holds and again whenever it changes, and hands every later request (an
/// ACK, or a NACK with its error) to `seen`, until either side ends. Shared
/// by `serve --publish-xds` and the tests' control plane.
pub fn state_of_the_world<T, First, Respond, Seen>(
    mut requests: tonic::Streaming<DiscoveryRequest>,
    mut changes: watch::Receiver<T>,
    first: First,
    mut respond: Respond,
    mut seen: Seen,
) -> Responses
where
    T: Clone + Send + Sync + 'static,
    First: FnOnce(DiscoveryRequest) -> bool + Send + 'static,
    Respond: FnMut(T, u64) -> DiscoveryResponse + Send + 'static,
    Seen: FnMut(DiscoveryRequest) + Send + 'static,
{
    let (responses, outgoing) = mpsc::channel(4);
    tokio::spawn(async move {
        let Some(Ok(request)) = requests.next().await else {
            return;
        };
        if !first(request) {
            return;
        }
        let mut nonce = 0;
        changes.mark_changed();
        loop {
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() { return }
                    let value = changes.borrow_and_update().clone();
                    nonce += 1;
                    if responses.send(Ok(respond(value, nonce))).await.is_err() { return }
                }
                request = requests.next() => match request {
                    Some(Ok(request)) => seen(request),
                    _ => return,
                },
            }
        }
    });
    Box::pin(ReceiverStream::new(outgoing))
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Publisher {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = DeltaResponses;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Responses>, tonic::Status> {
        let service = Arc::clone(&self.service);
        let node = Arc::new(std::sync::OnceLock::new());
        let first = {
            let node = Arc::clone(&node);
            move |first: DiscoveryRequest| {
                if first.type_url != TYPE_URL {
                    tracing::warn!(type_url = %first.type_url, "xds publish: only RateLimitConfig is served");
                    return false;
                }
                let id = first.node.map(|node| node.id).unwrap_or_default();
                tracing::info!(node = %id, "xds publish: a client subscribed");
                node.get_or_init(|| id);
                true
            }
        };
        // Version 1 is the configuration loaded at start.
        let respond = move |loaded: u64, nonce: u64| snapshot(&service, loaded + 1, nonce);
        let seen = move |request: DiscoveryRequest| {
            if let Some(error) = request.error_detail {
                let node = node.get().map_or("", String::as_str);
                tracing::error!(%node, nonce = %request.response_nonce, error = %error.message, "xds publish: the client refused a version");
            }
        };
        let changes = self.service.config_changes();
        Ok(tonic::Response::new(state_of_the_world(
            request.into_inner(),
            changes,
            first,
            respond,
            seen,
        )))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<DeltaResponses>, tonic::Status> {
        Err(tonic::Status::unimplemented("state of the world only (GRPC_XDS_SOTW)"))
    }
}
