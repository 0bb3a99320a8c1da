//! What overrides cost (`cargo bench -p tollgate-server --bench overrides`):
//!
//! 1. a decision in a domain holding 100 000 overrides, for a tenant
//!    without one and for a tenant with one, against the same decision in
//!    a domain without overrides (memory store, one descriptor; criterion
//!    rows `decide/none`, `decide/100k_overrides_tenant_without`,
//!    `decide/100k_overrides_tenant_with`, then the three interleaved in
//!    rounds, their medians and ratios on an `interleaved:` line);
//! 2. the time from a `PUT /v1/overrides` answered by one replica until the
//!    other replica on the same redis-server enforces it: 100 changes, each
//!    a new limit, the second replica asked over HTTP in a loop; p50, p99,
//!    max printed (`propagation:` lines).

// The service's futures nest deeply (as in the server crate itself).
#![recursion_limit = "256"]

use tollgate_testkit::redis_server;

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::Criterion;
use serde_json::{json, Value};
use tollgate::{AnyStore, MemoryStore, RedisStore};
use tollgate_server::config::Domain;
use tollgate_server::http::AdminToken;
use tollgate_server::overrides::{Entry, OverrideRequest};
use tollgate_server::service::{CheckRequest, Descriptor, Options, Service};
use tollgate_server::{Config, Server};

/// Two domains alike but in name (of one length): overrides go to `bench`,
/// `plain` has none, and one service decides both.
const RULES: &str = "descriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n";

const OVERRIDES: usize = 100_000;

fn config() -> Config {
    let mut config = Config::default();
    for name in ["bench", "plain"] {
        let text = format!("domain: {name}\n{RULES}");
        let domain = Domain::parse(&text, Path::new("bench.yaml")).expect("the bench's config");
        config.add(domain).expect("two domains");
    }
    config
}

/// A tenant's name, all of one length: the memory store keeps short keys
/// inline, and every row must have keys of one length.
fn tenant(index: usize) -> String {
    format!("x{index:011}")
}

fn request(domain: &str, tenant: &str) -> CheckRequest {
    CheckRequest {
        domain: domain.to_owned(),
        descriptors: vec![Descriptor::entries(vec![("tenant".to_owned(), tenant.to_owned())])],
        cost: None,
    }
}

fn set(tenant: &str, requests: u64) -> OverrideRequest {
    OverrideRequest {
        domain: "bench".to_owned(),
        descriptor: vec![Entry {
            key: "tenant".to_owned(),
            value: tenant.to_owned(),
        }],
        rate_limit: Some(json!({"unit": "second", "requests_per_unit": requests})),
        algorithm: None,
        expires_at: None,
        ttl: None,
        reason: None,
    }
}

fn decide(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let service = Service::new(config(), AnyStore::Memory(MemoryStore::new()), Options::default());
    let started = Instant::now();
    runtime.block_on(async {
        for index in 0..OVERRIDES {
            service
                .set_override(set(&tenant(index), 2_000_000_000))
                .await
                .expect("set");
        }
    });
    println!("set {OVERRIDES} overrides one by one in {:?}", started.elapsed());
    let mut group = c.benchmark_group("decide");
    let none = request("plain", &tenant(OVERRIDES + 1));
    let without = request("bench", &tenant(OVERRIDES + 1));
    let with = request("bench", &tenant(4242));
    for (name, request) in [
        ("none", &none),
        ("100k_overrides_tenant_without", &without),
        ("100k_overrides_tenant_with", &with),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| runtime.block_on(service.should_rate_limit(request)).expect("decided"));
        });
    }
    group.finish();
    // The same three, interleaved: rounds of 10 000 decisions of each in
    // turn, so that the host's drift falls on all three alike; the median
    // of each, and the median of the ratios within a round.
    let mut rounds: [Vec<f64>; 3] = Default::default();
    let cases = [&none, &without, &with];
    for _ in 0..60 {
        for (index, request) in cases.iter().enumerate() {
            let started = Instant::now();
            for _ in 0..10_000 {
                runtime.block_on(service.should_rate_limit(request)).expect("decided");
            }
            rounds[index].push(started.elapsed().as_secs_f64() * 1e9 / 10_000.0);
        }
    }
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let ratio = |of: usize| {
        median(
            rounds[of]
                .iter()
                .zip(&rounds[0])
                .map(|(row, none)| row / none)
                .collect(),
        )
    };
    println!(
        "interleaved: none {:.0} ns, 100k overrides tenant without {:.0} ns ({:.3}x), tenant with {:.0} ns ({:.3}x)",
        median(rounds[0].clone()),
        median(rounds[1].clone()),
        ratio(1),
        median(rounds[2].clone()),
        ratio(2),
    );
}

async fn call(client: &reqwest::Client, request: reqwest::RequestBuilder) -> Value {
    let _ = client;
    request.send().await.expect("answered").json().await.expect("JSON")
}

/// Two replicas on one redis-server: the delay from each `PUT` answered by
/// one to the first decision of the other under the new limit.
fn propagation() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let redis = redis_server::RedisServer::start();
    runtime.block_on(async {
        let mut replicas = Vec::new();
        let mut stops = Vec::new();
        for _ in 0..2 {
            let store = RedisStore::connect(&redis.url()).await.expect("redis");
            let server = Server::new(config(), None, AnyStore::Redis(store), Options::default())
                .admin_token(AdminToken::new("bench-token").expect("a token"));
            let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            replicas.push(format!("http://{}", http.local_addr().expect("address")));
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            stops.push(stop);
            tokio::spawn(server.run(http, grpc, async {
                let _ = stopped.await;
            }));
        }
        let client = reqwest::Client::new();
        let mut delays = Vec::new();
        for change in 0..100_u64 {
            let limit = 1_000 + change;
            let body = json!({
                "domain": "bench",
                "descriptor": [{"key": "tenant", "value": "acme"}],
                "rate_limit": {"unit": "second", "requests_per_unit": limit},
            });
            let put = client
                .put(format!("{}/v1/overrides", replicas[0]))
                .bearer_auth("bench-token")
                .json(&body);
            let answer = call(&client, put).await;
            assert!(answer.get("override").is_some(), "{answer}");
            let answered = Instant::now();
            let peek = json!({"domain": "bench", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}], "cost": 0});
            loop {
                let check = client.post(format!("{}/v1/check", replicas[1])).json(&peek);
                let decision = call(&client, check).await;
                if decision["limit"].as_u64() == Some(limit) {
                    delays.push(answered.elapsed());
                    break;
                }
                assert!(answered.elapsed() < Duration::from_secs(10), "never applied: {decision}");
            }
            // Changes a little apart, as an operator makes them.
            tokio::time::sleep(Duration::from_millis(fastrand::u64(0..50))).await;
        }
        delays.sort();
        let at = |share: f64| delays[((delays.len() as f64 * share).ceil() as usize).min(delays.len()) - 1];
        println!(
            "propagation: {} changes, p50 {:?}, p99 {:?}, max {:?} (PUT answered by one replica until the other decides by it; each replica refreshes every {:?})",
            delays.len(),
            at(0.50),
            at(0.99),
            delays[delays.len() - 1],
            tollgate_server::overrides::REFRESH,
        );
        for stop in stops {
            let _ = stop.send(());
        }
    });
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    decide(&mut criterion);
    criterion.final_summary();
    propagation();
}
