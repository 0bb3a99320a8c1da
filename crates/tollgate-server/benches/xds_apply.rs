//! Limits over xDS under load, and TLS's cost on a decision
//! (`cargo bench -p tollgate-server --bench xds_apply`).
//!
//! A server on the memory store takes its limits from a control plane (the
//! tests' own, in the same process, its versions encoded before the load
//! starts) and answers `CLIENTS` gRPC clients sending
//! `RATE` requests a second in all, at a steady pace (tokio's timer, to the
//! millisecond), as Envoys do; a request sent while the server stalls
//! counts the stall. It reports:
//! - the time to apply a configuration of `DESCRIPTORS` descriptors, from the
//!   control plane sending it until the server has it in force (decode,
//!   read, check, swap), over `APPLIES` applies, and the reading alone
//!   ([`Config::from_resources`]);
//! - decision latency (p50, p99, max) before any apply, and while the
//!   applies happen (every request that started during one);
//! - the same load over plain text and over TLS with client certificates:
//!   throughput and latency.

#![recursion_limit = "256"]

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use hdrhistogram::Histogram;
use tokio::net::TcpListener;
use tollgate::{AnyStore, MemoryStore};
use tollgate_server::config::resource::{RateLimitConfig, RateLimitDescriptor as Node, RateLimitPolicy};
use tollgate_server::tls::{Acceptor, ServerTls};
use tollgate_server::xds::XdsSettings;
use tollgate_server::{Config, Options, Server};

use common::certs::Authority;
use common::control_plane::{ControlPlane, Snapshot};

const DESCRIPTORS: usize = 10_000;
const APPLIES: usize = 20;
const CLIENTS: usize = 8;
const RATE: u64 = 4_000;

/// One domain of `DESCRIPTORS` tenants, `limit` requests an hour each.
fn tenants(limit: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: "bench".to_owned(),
        domain: "bench".to_owned(),
        descriptors: (0..DESCRIPTORS)
            .map(|index| Node {
                key: "tenant".to_owned(),
                value: format!("t{index}"),
                rate_limit: Some(RateLimitPolicy {
                    unit: 3,
                    requests_per_unit: limit,
                    ..RateLimitPolicy::default()
                }),
                ..Node::default()
            })
            .collect(),
    }
}

/// Latencies recorded by the clients, with the instant each request started.
type Samples = Arc<Mutex<Vec<(Instant, Duration)>>>;

/// `CLIENTS` loops of requests against `channel` until `stop`.
fn load(
    channel: &tonic::transport::Channel,
    stop: &Arc<AtomicBool>,
    samples: &Samples,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..CLIENTS)
        .map(|client_index| {
            let mut client = RateLimitServiceClient::new(channel.clone());
            let (stop, samples) = (Arc::clone(stop), Arc::clone(samples));
            tokio::spawn(async move {
                let mut count = 0_usize;
                let mut ticks = tokio::time::interval(Duration::from_micros(1_000_000 * CLIENTS as u64 / RATE));
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                while !stop.load(Ordering::Relaxed) {
                    ticks.tick().await;
                    count += 1;
                    let request = RateLimitRequest {
                        domain: "bench".to_owned(),
                        descriptors: vec![RateLimitDescriptor {
                            entries: vec![Entry {
                                key: "tenant".to_owned(),
                                value: format!("t{}", (client_index * 7919 + count) % DESCRIPTORS),
                            }],
                            ..RateLimitDescriptor::default()
                        }],
                        hits_addend: 1,
                    };
                    let started = Instant::now();
                    let answer = client.should_rate_limit(request).await;
                    let took = started.elapsed();
                    assert!(answer.is_ok(), "{answer:?}");
                    samples.lock().unwrap().push((started, took));
                }
            })
        })
        .collect()
}

fn summary(latencies: impl Iterator<Item = Duration>) -> String {
    let mut histogram = Histogram::<u64>::new(3).unwrap();
    for latency in latencies {
        histogram.record(latency.as_micros() as u64).unwrap();
    }
    format!(
        "{} requests, p50 {} µs, p99 {} µs, p99.9 {} µs, max {} µs",
        histogram.len(),
        histogram.value_at_quantile(0.5),
        histogram.value_at_quantile(0.99),
        histogram.value_at_quantile(0.999),
        histogram.max()
    )
}

/// A server on port 0 taking its limits from `plane`, with `tls` on gRPC.
async fn server(
    plane: &ControlPlane,
    tls: Option<ServerTls>,
) -> (
    std::net::SocketAddr,
    tokio::sync::watch::Receiver<tollgate_server::xds::XdsStatus>,
) {
    let xds = XdsSettings {
        server: plane.address.to_string(),
        connect_retry: Duration::from_millis(50),
        backoff_initial: Duration::from_millis(50),
        max_message_bytes: Some(64 << 20),
        ..XdsSettings::default()
    };
    let mut server = Server::new(
        Config::default(),
        None,
        AnyStore::Memory(MemoryStore::new()),
        Options::default(),
    )
    .xds(xds, true);
    if let Some(tls) = tls {
        server = server.grpc_tls(Acceptor::new(tls).unwrap());
    }
    let status = server.xds_status().unwrap();
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = grpc.local_addr().unwrap();
    tokio::spawn(server.run(http, grpc, std::future::pending()));
    (address, status)
}

/// A control plane on port 0, serving `snapshot`.
async fn control_plane(snapshot: Snapshot) -> ControlPlane {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    ControlPlane::start(listener, snapshot, None)
}

async fn applies(
    plane: &ControlPlane,
    status: &mut tokio::sync::watch::Receiver<tollgate_server::xds::XdsStatus>,
) -> Vec<(Instant, Duration)> {
    // Made before any is sent (each version's limits differ from the
    // last's): encoding them is the control plane's work, not the server's.
    let snapshots: Vec<Snapshot> = (0..APPLIES)
        .map(|index| Snapshot::of(&(index + 2).to_string(), &[tenants(1_000_000 + index as u32)]))
        .collect();
    let mut windows = Vec::new();
    for snapshot in snapshots {
        let version = snapshot.version.clone();
        let sent = Instant::now();
        plane.serve(snapshot);
        status
            .wait_for(|status| status.version.as_deref() == Some(version.as_str()))
            .await
            .unwrap();
        windows.push((sent, sent.elapsed()));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    windows
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        reading();
        applies_under_load().await;
        tls_against_plain_text().await;
    });
}

/// The reading alone.
fn reading() {
    let resource = tenants(1_000_000);
    let mut reads = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let config = Config::from_resources(std::slice::from_ref(&resource), false).unwrap();
        reads.push(started.elapsed());
        assert_eq!(config.domains["bench"].descriptors.len(), DESCRIPTORS);
    }
    reads.sort();
    println!(
        "read {DESCRIPTORS} descriptors (Config::from_resources): median {:?}, max {:?}",
        reads[2], reads[4]
    );
}

/// Applies under load, plain text.
async fn applies_under_load() {
    let plane = control_plane(Snapshot::of("1", &[tenants(1_000_000)])).await;
    let (address, mut status) = server(&plane, None).await;
    status
        .wait_for(|status| status.version.as_deref() == Some("1"))
        .await
        .unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (stop, samples): (Arc<AtomicBool>, Samples) = (Arc::default(), Arc::default());
    let clients = load(&channel, &stop, &samples);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before_end = Instant::now();
    let windows = applies(&plane, &mut status).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    let samples = samples.lock().unwrap().clone();
    let mut apply_times: Vec<Duration> = windows.iter().map(|(_, took)| *took).collect();
    apply_times.sort();
    println!(
        "apply {DESCRIPTORS} descriptors over xDS under load ({APPLIES} applies): median {:?}, p90 {:?}, max {:?}",
        apply_times[APPLIES / 2],
        apply_times[APPLIES * 9 / 10],
        apply_times[APPLIES - 1]
    );
    let first = samples.first().map_or(before_end, |(at, _)| *at);
    let warm = first + Duration::from_secs(1);
    println!(
        "decisions before the applies: {}",
        summary(
            samples
                .iter()
                .filter(|(at, _)| *at >= warm && *at < before_end)
                .map(|(_, took)| *took)
        )
    );
    println!(
        "decisions during the applies: {}",
        summary(
            samples
                .iter()
                .filter(|(at, _)| windows.iter().any(|(sent, took)| *at >= *sent && *at <= *sent + *took))
                .map(|(_, took)| *took)
        )
    );
    plane.stop().await;
}

/// Plain text against TLS with client certificates, same load.
async fn tls_against_plain_text() {
    let authority = Authority::new();
    let (service_leaf, client_leaf) = (authority.leaf("service", &[]), authority.leaf("client", &[]));
    for tls in [false, true] {
        let plane = control_plane(Snapshot::of("1", &[tenants(1_000_000)])).await;
        let server_tls = tls.then(|| ServerTls {
            cert: service_leaf.cert.clone(),
            key: service_leaf.key.clone(),
            client_ca: Some(authority.ca()),
            client_san: None,
        });
        let (address, mut status) = server(&plane, server_tls).await;
        status
            .wait_for(|status| status.version.as_deref() == Some("1"))
            .await
            .unwrap();
        let endpoint = if tls {
            let config = tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(
                    std::fs::read(authority.ca()).unwrap(),
                ))
                .identity(tonic::transport::Identity::from_pem(
                    std::fs::read(&client_leaf.cert).unwrap(),
                    std::fs::read(&client_leaf.key).unwrap(),
                ))
                .domain_name("localhost");
            tonic::transport::Endpoint::from_shared(format!("https://{address}"))
                .unwrap()
                .tls_config(config)
                .unwrap()
        } else {
            tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap()
        };
        let channel = endpoint.connect().await.unwrap();
        let (stop, samples): (Arc<AtomicBool>, Samples) = (Arc::default(), Arc::default());
        let clients = load(&channel, &stop, &samples);
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples.lock().unwrap().clear();
        let measured = Instant::now();
        tokio::time::sleep(Duration::from_secs(4)).await;
        stop.store(true, Ordering::Relaxed);
        let elapsed = measured.elapsed();
        for client in clients {
            client.await.unwrap();
        }
        let samples = samples.lock().unwrap().clone();
        println!(
            "{}: {:.0} decisions/s offered, {}",
            if tls {
                "TLS with client certificates"
            } else {
                "plain text"
            },
            samples.len() as f64 / elapsed.as_secs_f64(),
            summary(samples.iter().map(|(_, took)| *took))
        );
        plane.stop().await;
    }
}
