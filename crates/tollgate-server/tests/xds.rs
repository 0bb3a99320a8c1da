//! Limits from a control plane over xDS, and TLS both ways: the server's
//! xDS client against a control plane written for the tests, and Envoy's
//! side played by a tonic client with (or without) a certificate.

mod common;

use std::path::Path;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate::{AnyStore, MemoryStore};
use tollgate_server::config::resource::{RateLimitConfig, RateLimitDescriptor as Node, RateLimitPolicy, TYPE_URL};
use tollgate_server::tls::{Acceptor, ClientTls, ServerTls};
use tollgate_server::xds::{XdsSettings, XdsStatus};
use tollgate_server::{Config, Options, Server};

use common::certs::{self, Authority, Leaf};
use common::control_plane::{any, ControlPlane, Snapshot};
use common::rls::{OK, OVER_LIMIT};

/// `RateLimitUnit.HOUR`.
const HOUR: i32 = 3;

/// A domain `gateway` limiting each `user` to `per_hour` requests an hour.
fn users(name: &str, per_hour: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: name.to_owned(),
        domain: "gateway".to_owned(),
        descriptors: vec![Node {
            key: "user".to_owned(),
            rate_limit: Some(RateLimitPolicy {
                unit: HOUR,
                requests_per_unit: per_hour,
                ..RateLimitPolicy::default()
            }),
            ..Node::default()
        }],
    }
}

/// A server taking its limits from `xds`, serving gRPC (over TLS with
/// `tls`) until dropped.
struct Running {
    grpc: std::net::SocketAddr,
    service: std::sync::Arc<tollgate_server::service::Service>,
    status: watch::Receiver<XdsStatus>,
    server: common::OnPort0,
}

async fn start(xds: XdsSettings, tls: Option<ServerTls>) -> Running {
    start_with(xds, tls, Options::default(), true).await
}

async fn start_with(xds: XdsSettings, tls: Option<ServerTls>, options: Options, wait: bool) -> Running {
    let store = AnyStore::Memory(MemoryStore::new());
    let mut server = Server::new(Config::default(), None, store, options).xds(xds, wait);
    if let Some(tls) = tls {
        server = server.grpc_tls(Acceptor::new(tls).unwrap());
    }
    let status = server.xds_status().unwrap();
    let service = server.service();
    let running = common::on_port_0(server).await;
    Running {
        grpc: running.grpc,
        service,
        status,
        server: running,
    }
}

impl Running {
    /// Waits until the configuration in force has `version`.
    async fn wait_for_version(&mut self, version: &str) {
        let waited = tokio::time::timeout(
            Duration::from_secs(10),
            self.status
                .wait_for(|status| status.version.as_deref() == Some(version)),
        )
        .await
        .map(|_| ());
        assert!(
            waited.is_ok(),
            "version {version} not applied: {:?}",
            *self.status.borrow()
        );
    }

    async fn rlconfig(&self) -> String {
        self.text("/rlconfig").await
    }

    async fn metrics(&self) -> String {
        self.text("/metrics").await
    }

    async fn text(&self, path: &str) -> String {
        self.server.text(path).await
    }
}

/// Envoy's side: a gRPC client of the rate limit service, over plain text
/// or TLS with an optional client certificate.
async fn envoy(
    address: std::net::SocketAddr,
    tls: Option<(&Authority, Option<&Leaf>, &str)>,
) -> Result<RateLimitServiceClient<tonic::transport::Channel>, tonic::transport::Error> {
    let endpoint = match tls {
        None => tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap(),
        Some((authority, leaf, name)) => {
            let mut config = tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(
                    std::fs::read(authority.ca()).unwrap(),
                ))
                .domain_name(name);
            if let Some(leaf) = leaf {
                config = config.identity(tonic::transport::Identity::from_pem(
                    std::fs::read(&leaf.cert).unwrap(),
                    std::fs::read(&leaf.key).unwrap(),
                ));
            }
            tonic::transport::Endpoint::from_shared(format!("https://{address}"))
                .unwrap()
                .tls_config(config)
                .unwrap()
        }
    };
    let channel = endpoint.connect().await?;
    Ok(RateLimitServiceClient::new(channel))
}

/// The code of one request for `user`.
async fn decide(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    user: &str,
) -> Result<i32, tonic::Status> {
    let request = RateLimitRequest {
        domain: "gateway".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".to_owned(),
                value: user.to_owned(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 1,
    };
    client
        .should_rate_limit(request)
        .await
        .map(|response| response.into_inner().overall_code)
}

/// How many requests for `user` are admitted before the first refusal (at most 50).
async fn admitted(client: &mut RateLimitServiceClient<tonic::transport::Channel>, user: &str) -> u32 {
    for count in 0..50 {
        match decide(client, user).await.unwrap() {
            OK => {}
            OVER_LIMIT => return count,
            other => panic!("code {other}"),
        }
    }
    50
}

fn quick(server: String) -> XdsSettings {
    XdsSettings {
        server,
        node_id: "tollgate-test".to_owned(),
        node_metadata: vec![("zone".to_owned(), "a".to_owned())],
        connect_retry: Duration::from_millis(50),
        backoff_initial: Duration::from_millis(50),
        backoff_max: Duration::from_millis(200),
        ..XdsSettings::default()
    }
}

/// Waits until the control plane has seen a request answering `nonce`.
async fn answer_to(
    plane: &ControlPlane,
    nonce: &str,
) -> envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest {
    for _ in 0..500 {
        if let Some(answer) = plane.seen().into_iter().find(|seen| seen.response_nonce == nonce) {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no answer to nonce {nonce}: {:?}", plane.seen());
}

/// The whole path as Envoy Gateway wires it: limits from the controller over
/// mutual TLS, the service answering Envoy over mutual TLS; versions
/// applied and ACKed, bad ones NACKed while the last good one stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_come_from_a_control_plane_over_mutual_tls() {
    let authority = Authority::new();
    let (plane_leaf, client_leaf) = (
        authority.leaf("controller", &["envoy-gateway"]),
        authority.leaf("xds-client", &[]),
    );
    let (service_leaf, envoy_leaf) = (
        authority.leaf("service", &["envoy-ratelimit"]),
        authority.leaf("envoy", &[]),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plane = ControlPlane::start(
        listener,
        Snapshot::of("1", &[users("gateway-users", 2)]),
        Some((&authority, &plane_leaf)),
    );
    let mut xds = quick(format!("127.0.0.1:{}", plane.address.port()));
    xds.tls = Some(ClientTls {
        cert: Some(client_leaf.cert.clone()),
        key: Some(client_leaf.key.clone()),
        ca: Some(authority.ca()),
        server_name: Some("envoy-gateway".to_owned()),
    });
    let tls = ServerTls {
        cert: service_leaf.cert.clone(),
        key: service_leaf.key.clone(),
        client_ca: Some(authority.ca()),
        client_san: None,
    };
    let mut server = start(xds, Some(tls)).await;
    server.wait_for_version("1").await;

    // The first request: the type URL and the node.
    let first = plane.seen().into_iter().next().unwrap();
    assert_eq!(first.type_url, TYPE_URL);
    let node = first.node.unwrap();
    assert_eq!(node.id, "tollgate-test");
    assert!(node.metadata.unwrap().fields.contains_key("zone"));
    // Version 1 is ACKed and enforced.
    let ack = answer_to(&plane, "1").await;
    assert_eq!((ack.version_info.as_str(), ack.error_detail), ("1", None));
    let mut client = envoy(server.grpc, Some((&authority, Some(&envoy_leaf), "envoy-ratelimit")))
        .await
        .unwrap();
    assert_eq!(admitted(&mut client, "alice").await, 2);
    assert!(
        server.rlconfig().await.starts_with("# config: xds (server 127.0.0.1:"),
        "{}",
        server.rlconfig().await
    );

    // Version 2 raises the limit, without a restart.
    plane.serve(Snapshot::of("2", &[users("gateway-users", 5)]));
    server.wait_for_version("2").await;
    assert_eq!(answer_to(&plane, "2").await.version_info, "2");
    assert_eq!(admitted(&mut client, "bob").await, 5);

    assert!(server.service.overview().last_refused_config.is_none());
    refused_versions_are_nacked(&plane).await;
    assert_eq!(server.status.borrow().version.as_deref(), Some("2"));
    // The overview keeps the last NACK: when, and why.
    let last = server.service.overview().last_refused_config.expect("the last NACK");
    assert!(
        last.text.contains("xds version 6") && last.text.contains("not a RateLimitConfig"),
        "{}",
        last.text
    );
    assert_eq!(
        admitted(&mut client, "carol").await,
        5,
        "the last good version stays in force"
    );
    let metrics = server.metrics().await;
    assert!(
        metrics.contains("tollgate_config_info{source=\"xds\",version=\"2\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("tollgate_xds_connected 1"), "{metrics}");
    assert!(metrics.contains("tollgate_config_errors_total 4"), "{metrics}");

    // Envoy without a client certificate, or without TLS, is refused.
    let refused = match envoy(server.grpc, Some((&authority, None, "envoy-ratelimit"))).await {
        Err(_) => true,
        Ok(mut client) => decide(&mut client, "dave").await.is_err(),
    };
    assert!(refused, "a client without a certificate was served");
    let plain = match envoy(server.grpc, None).await {
        Err(_) => true,
        Ok(mut client) => decide(&mut client, "dave").await.is_err(),
    };
    assert!(plain, "a client without TLS was served");
    plane.stop().await;
}

/// Refused versions: a unit it cannot take, two resources of one domain, a
/// resource of another type, bytes that do not decode. Each is NACKed with
/// the version in force (2), naming what is wrong.
async fn refused_versions_are_nacked(plane: &ControlPlane) {
    let mut no_unit = users("gateway-users", 1);
    no_unit.descriptors[0].rate_limit.as_mut().unwrap().unit = 0;
    let mut other_type = any(&users("x", 1));
    "type.googleapis.com/envoy.config.cluster.v3.Cluster".clone_into(&mut other_type.type_url);
    let mut garbage = any(&users("x", 1));
    garbage.value = vec![0xff, 0xff, 0xff];
    let refused = [
        (Snapshot::of("3", &[no_unit]), "xds:gateway-users: descriptor user: "),
        (
            Snapshot::of("4", &[users("a", 1), users("b", 1)]),
            "duplicate domain \"gateway\"",
        ),
        (
            Snapshot {
                version: "5".to_owned(),
                resources: vec![other_type],
                type_url: String::new(),
            },
            "resources[0]: type URL",
        ),
        (
            Snapshot {
                version: "6".to_owned(),
                resources: vec![garbage],
                type_url: String::new(),
            },
            "resources[0]: not a RateLimitConfig",
        ),
    ];
    for (nonce, (snapshot, expected)) in (3..).zip(refused) {
        plane.serve(snapshot);
        let nack = answer_to(plane, &nonce.to_string()).await;
        assert_eq!(nack.version_info, "2", "a NACK names the version in force");
        let detail = nack.error_detail.expect("a NACK");
        assert!(
            detail.message.contains(expected),
            "{expected} not in {}",
            detail.message
        );
        if nonce == 3 {
            assert!(
                detail.message.contains("invalid rate limit unit \"UNKNOWN\""),
                "{}",
                detail.message
            );
        }
    }
}

/// A controller that goes away and comes back with a new version: the last
/// good configuration answers meanwhile, and the new one is taken once the
/// client has reconnected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_control_plane_is_followed() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let plane = ControlPlane::start(listener, Snapshot::of("1", &[users("users", 3)]), None);
    let mut server = start(quick(address.to_string()), None).await;
    server.wait_for_version("1").await;
    let mut client = envoy(server.grpc, None).await.unwrap();
    assert_eq!(admitted(&mut client, "u1").await, 3);

    plane.stop().await;
    server.status.wait_for(|status| !status.connected).await.unwrap();
    // Decisions go on with version 1 while the controller is away.
    assert_eq!(admitted(&mut client, "u2").await, 3);
    assert!(server.metrics().await.contains("tollgate_xds_connected 0"));

    let listener = TcpListener::bind(address).await.unwrap();
    let plane = ControlPlane::start(listener, Snapshot::of("7", &[users("users", 4)]), None);
    server.wait_for_version("7").await;
    assert_eq!(admitted(&mut client, "u3").await, 4);
    assert_eq!(
        plane.seen()[0].version_info,
        "1",
        "the reconnect names the version in force"
    );
    plane.stop().await;
}

/// The service's certificate replaced on disk is used for new connections
/// once the watcher saw it, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_taken_up() {
    let authority = Authority::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plane = ControlPlane::start(listener, Snapshot::of("1", &[users("users", 3)]), None);
    let service = authority.leaf("service", &["before.test"]);
    let tls = ServerTls {
        cert: service.cert.clone(),
        key: service.key.clone(),
        client_ca: None,
        client_san: None,
    };
    let mut server = start(quick(plane.address.to_string()), Some(tls)).await;
    server.wait_for_version("1").await;
    assert!(envoy(server.grpc, Some((&authority, None, "before.test")))
        .await
        .is_ok());
    assert!(envoy(server.grpc, Some((&authority, None, "after.test")))
        .await
        .is_err());

    let rotated = authority.leaf("rotated", &["after.test"]);
    rotate(&rotated.cert, &service.cert);
    rotate(&rotated.key, &service.key);
    // The file watcher reads them again: a new connection is served with
    // them once it has (never a restart).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut client = loop {
        match envoy(server.grpc, Some((&authority, None, "after.test"))).await {
            Ok(client) => break client,
            Err(error) => assert!(std::time::Instant::now() < deadline, "not taken up: {error:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(decide(&mut client, "x").await.unwrap(), OK);
    plane.stop().await;
}

fn rotate(from: &Path, to: &Path) {
    certs::write(to, &std::fs::read_to_string(from).unwrap());
}

/// With a client name, only a client certificate valid for it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_must_carry_the_name_asked_for() {
    let authority = Authority::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plane = ControlPlane::start(listener, Snapshot::of("1", &[users("users", 3)]), None);
    let service = authority.leaf("service", &[]);
    let (right, wrong) = (
        authority.leaf("right", &["envoy.gateway.test"]),
        authority.leaf("wrong", &[]),
    );
    let tls = ServerTls {
        cert: service.cert.clone(),
        key: service.key.clone(),
        client_ca: Some(authority.ca()),
        client_san: Some("envoy.gateway.test".to_owned()),
    };
    let mut server = start(quick(plane.address.to_string()), Some(tls)).await;
    server.wait_for_version("1").await;
    let mut client = envoy(server.grpc, Some((&authority, Some(&right), "localhost")))
        .await
        .unwrap();
    assert_eq!(decide(&mut client, "x").await.unwrap(), OK);
    let refused = match envoy(server.grpc, Some((&authority, Some(&wrong), "localhost"))).await {
        Err(_) => true,
        Ok(mut client) => decide(&mut client, "x").await.is_err(),
    };
    assert!(refused, "a client certificate without the name was served");
    plane.stop().await;
}

/// As upstream with xDS, `FORCE_START_WITHOUT_INITIAL_CONFIG` answering at
/// once, and `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: unhealthy until a
/// version holding a domain is in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_waits_for_a_domain_from_the_control_plane() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plane = ControlPlane::start(listener, Snapshot::of("1", &[]), None);
    let options = Options {
        healthy_with_config_only: true,
        ..Options::default()
    };
    let mut server = start_with(quick(plane.address.to_string()), None, options, false).await;
    let health = |server: &Running| {
        let url = format!("{}/healthcheck", server.server.http);
        async move { reqwest::get(url).await.unwrap().status().as_u16() }
    };
    server.wait_for_version("1").await;
    assert_eq!(health(&server).await, 500, "version 1 holds no domain");
    plane.serve(Snapshot::of("2", &[users("users", 3)]));
    server.wait_for_version("2").await;
    assert_eq!(health(&server).await, 200);
    plane.stop().await;
}
