//! The gRPC listener over TLS under a flood of connections that never
//! start a handshake: the handshakes in progress stay bounded (the oldest
//! dropped for the newest), and a client that does handshake is served.

mod common;

use std::time::{Duration, Instant};

use common::certs::Authority;
use common::{config, on_port_0};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate::{AnyStore, MemoryStore};
use tollgate_server::tls::{Acceptor, ServerTls};
use tollgate_server::{Options, Server, MOST_HANDSHAKES};

const CONFIG: &str = "
domain: gateway
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 5}
";

/// Connections that never send a byte.
const FLOOD: usize = 5_000;

/// The value of the metric line starting with `name` (0 when absent).
fn metric(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse::<f64>().ok())
        .map_or(0, |value| value as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unfinished_handshakes_is_bounded_and_others_are_served() {
    // The flood's sockets, both ends in this process, and the rest.
    rlimit::increase_nofile_limit(3 * FLOOD as u64).unwrap();
    let (soft, _) = rlimit::Resource::NOFILE.get().unwrap();
    assert!(
        soft >= 2 * FLOOD as u64,
        "the open-file limit is {soft}: raise it (ulimit -n) to run this test"
    );
    let authority = Authority::new();
    let leaf = authority.leaf("server", &[]);
    let tls = ServerTls {
        cert: leaf.cert,
        key: leaf.key,
        client_ca: None,
        client_san: None,
    };
    let server = Server::new(
        config(CONFIG),
        None,
        AnyStore::Memory(MemoryStore::new()),
        Options::default(),
    )
    .grpc_tls(Acceptor::new(tls).unwrap());
    let server = on_port_0(server).await;

    let mut flood = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        flood.push(tokio::net::TcpStream::connect(server.grpc).await.unwrap());
    }
    // Every one accepted: all but the newest MOST_HANDSHAKES dropped.
    let deadline = Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let metrics = server.text("/metrics").await;
        let evicted = metric(&metrics, "tollgate_grpc_tls_handshakes_evicted_total");
        if evicted >= (FLOOD - MOST_HANDSHAKES) as u64 {
            break metrics;
        }
        assert!(
            Instant::now() < deadline,
            "the flood was not taken in: {evicted} evicted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let in_progress = metric(&metrics, "tollgate_grpc_tls_handshakes ");
    assert!(
        in_progress <= MOST_HANDSHAKES as u64,
        "{in_progress} handshakes in progress"
    );

    // A client that handshakes is served while the flood holds on.
    let config = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(
            std::fs::read(authority.ca()).unwrap(),
        ))
        .domain_name("localhost");
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", server.grpc))
        .unwrap()
        .tls_config(config)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = RateLimitServiceClient::new(channel);
    let request = RateLimitRequest {
        domain: "gateway".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".to_owned(),
                value: "alice".to_owned(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 1,
    };
    let answer = client.should_rate_limit(request).await.unwrap().into_inner();
    assert_eq!(answer.overall_code, 1, "OK");
    assert_eq!(flood.len(), FLOOD);
    drop(flood);
    server.stop().await;
}
