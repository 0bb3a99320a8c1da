//! Budget alerts through the real server: each threshold a descriptor's
//! use crosses is one alert, delivered to the webhook with its id as
//! `Idempotency-Key`, retried until the webhook takes it; through two
//! replicas on one Redis (module and Lua) and on the memory store.

mod common;
use tollgate_testkit::redis_server;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use common::{call, config, on_port_0, OnPort0};
use redis_server::RedisServer;
use serde_json::{json, Value};
use tollgate::{AnyStore, MemoryStore, RedisStore};
use tollgate_server::{Options, Server};

/// A tenant's requests a day, alerting at 50, 80 and 100 %.
const CONFIG: &str = "
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 1000, alerts: [50, 80, 100]}
";

/// What the webhook was sent: each POST's `Idempotency-Key` and body, and
/// whether it was taken.
#[derive(Default)]
struct Received {
    posts: Mutex<Vec<(String, Value, bool)>>,
    /// POSTs still to refuse with 503.
    refuse: AtomicUsize,
    /// Refuse every POST (503) for this long after the first.
    outage: Option<Duration>,
    /// When the first POST came.
    first: Mutex<Option<Instant>>,
}

async fn receive(State(received): State<Arc<Received>>, headers: HeaderMap, Json(body): Json<Value>) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let first = *received.first.lock().unwrap().get_or_insert_with(Instant::now);
    let in_outage = received.outage.is_some_and(|outage| first.elapsed() < outage);
    let refused = in_outage
        || received
            .refuse
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1))
            .is_ok();
    received.posts.lock().unwrap().push((key, body, !refused));
    if refused {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::NO_CONTENT
    }
}

/// A webhook on port 0 that refuses its first `refuse` POSTs; its URL.
async fn webhook(refuse: usize) -> (String, Arc<Received>) {
    serve_webhook(Received {
        refuse: AtomicUsize::new(refuse),
        ..Received::default()
    })
    .await
}

/// A webhook on port 0 that answers 503 for `outage` from its first POST.
async fn webhook_down_for(outage: Duration) -> (String, Arc<Received>) {
    serve_webhook(Received {
        outage: Some(outage),
        ..Received::default()
    })
    .await
}

async fn serve_webhook(received: Received) -> (String, Arc<Received>) {
    let received = Arc::new(received);
    let router = Router::new()
        .route("/alerts", post(receive))
        .with_state(Arc::clone(&received));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/alerts", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    (url, received)
}

/// TLS connections on a TCP listener, handshaken one at a time.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, address)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(stream) = self.acceptor.accept(stream).await {
                return (stream, address);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// The webhook over TLS, with a certificate for 127.0.0.1 that a test CA
/// signed: its `https://` URL, what it received, and the CA.
async fn https_webhook() -> (String, Arc<Received>, common::certs::Authority) {
    let authority = common::certs::Authority::new();
    let leaf = authority.leaf("webhook", &[]);
    let tls = tollgate_server::tls::ServerTls {
        cert: leaf.cert,
        key: leaf.key,
        client_ca: None,
        client_san: None,
    };
    let mut config = tls.server_config().unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let received = Arc::new(Received::default());
    let router = Router::new()
        .route("/alerts", post(receive))
        .with_state(Arc::clone(&received));
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}/alerts", tcp.local_addr().unwrap());
    let listener = TlsListener {
        tcp,
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
    };
    tokio::spawn(async move { axum::serve(listener, router).await });
    (url, received, authority)
}

async fn serve(store: AnyStore, webhook: &str) -> OnPort0 {
    serve_trusting(store, webhook, Vec::new()).await
}

/// A replica alerting to `webhook`, trusting `roots` beside the public ones.
async fn serve_trusting(
    store: AnyStore,
    webhook: &str,
    roots: Vec<rustls::pki_types::CertificateDer<'static>>,
) -> OnPort0 {
    let options = Options {
        alert_webhook: Some(webhook.to_owned()),
        alert_webhook_roots: roots,
        ..Options::default()
    };
    on_port_0(Server::new(config(CONFIG), None, store, options)).await
}

/// Eight clients spend more than tenant `tenant`'s 1 000 a day, 1 to 3
/// hits at a time, through `replicas` in turn.
async fn spend(replicas: &[&OnPort0], tenant: &str) {
    let mut clients = Vec::new();
    for client in 0..8 {
        let url = format!("{}/json", replicas[client % replicas.len()].http);
        let tenant = tenant.to_owned();
        clients.push(tokio::spawn(async move {
            for i in 0..80 {
                let body = json!({
                    "domain": "llm",
                    "descriptors": [{"entries": [{"key": "tenant", "value": tenant}], "hits_addend": 1 + (client + i) % 3}],
                });
                call(reqwest::Method::POST, &url, None, Some(body)).await;
            }
        }));
    }
    for client in clients {
        client.await.unwrap();
    }
}

/// The alerts the webhook took, by id, once three distinct ones have come
/// (waiting at most 30 s for the deliveries).
async fn taken(received: &Received) -> BTreeMap<String, Value> {
    // A 10 s outage is retried with back-off (0.2 s doubling): 12.6 s.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let taken: BTreeMap<String, Value> = received
            .posts
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, _, taken)| *taken)
            .map(|(key, body, _)| (key.clone(), body.clone()))
            .collect();
        if taken.len() >= 3 || Instant::now() > deadline {
            return taken;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Each alert: its id is its key, and it names the crossing.
fn check_alerts(taken: &BTreeMap<String, Value>, tenant: &str, received: &Received) {
    let mut thresholds: Vec<u64> = taken
        .values()
        .map(|alert| alert["threshold"].as_u64().unwrap())
        .collect();
    thresholds.sort_unstable();
    assert_eq!(thresholds, [50, 80, 100], "{taken:#?}");
    for (key, alert) in taken {
        assert_eq!(alert["id"], json!(key));
        assert_eq!(alert["domain"], "llm");
        assert_eq!(alert["descriptor"], json!([{"key": "tenant", "value": tenant}]));
        assert_eq!(alert["limit"], 1000);
        let threshold = alert["threshold"].as_u64().unwrap();
        assert!(alert["used"].as_u64().unwrap() >= threshold * 10, "{alert}");
        for field in ["window_start", "resets_at", "at"] {
            assert!(
                alert[field].as_str().is_some_and(|at| at.ends_with('Z')),
                "{field}: {alert}"
            );
        }
    }
    // Every POST, refused or taken, was one of the three crossings.
    for (key, _, _) in received.posts.lock().unwrap().iter() {
        assert!(
            taken.contains_key(key),
            "{key} was sent but is none of {:?}",
            taken.keys()
        );
    }
}

/// How long the webhook answers 503 in the Redis test.
const OUTAGE: Duration = Duration::from_secs(10);

#[test]
fn two_replicas_on_one_redis_deliver_each_crossing_once_through_a_failing_webhook() {
    let server = RedisServer::start_with_module(&[]);
    let runtime = tollgate_testkit::runtime();
    runtime.block_on(async {
        for engine in ["module", "lua"] {
            let (url, received) = webhook_down_for(OUTAGE).await;
            let store = || async {
                let redis = RedisStore::builder(format!("{}?engine={engine}", server.url()))
                    .prefix(format!("alerts-{engine}"))
                    .alert_outbox(1_000)
                    .connect()
                    .await
                    .unwrap();
                AnyStore::Redis(redis)
            };
            let (one, two) = (serve(store().await, &url).await, serve(store().await, &url).await);
            let tenant = format!("acme-{engine}");
            spend(&[&one, &two], &tenant).await;
            let taken = taken(&received).await;
            check_alerts(&taken, &tenant, &received);
            // Refused for 10 s, then delivered, with the same ids.
            let posts = received.posts.lock().unwrap().clone();
            assert!(posts.iter().any(|(_, _, taken)| !taken), "nothing was refused");
            let first = received.first.lock().unwrap().unwrap();
            assert!(first.elapsed() >= OUTAGE);
        }
    });
}

#[test]
fn the_memory_store_delivers_each_crossing_once() {
    let runtime = tollgate_testkit::runtime();
    runtime.block_on(async {
        let (url, received) = webhook(2).await;
        let one = serve(AnyStore::Memory(MemoryStore::new()), &url).await;
        // A value long enough that its subject is kept under a hash: the
        // alert still names it (its label carries it).
        let tenant = format!("acme-{}", "x".repeat(300));
        spend(&[&one], &tenant).await;
        let taken = taken(&received).await;
        check_alerts(&taken, &tenant, &received);
        assert!(received.posts.lock().unwrap().len() >= 5);
    });
}

#[test]
fn an_https_webhook_signed_by_a_private_ca_is_delivered_to() {
    let runtime = tollgate_testkit::runtime();
    runtime.block_on(async {
        let (url, received, authority) = https_webhook().await;
        let roots = tollgate_server::tls::ca_certificates(&authority.ca()).unwrap();
        let one = serve_trusting(AnyStore::Memory(MemoryStore::new()), &url, roots).await;
        spend(&[&one], "acme").await;
        let taken = taken(&received).await;
        check_alerts(&taken, "acme", &received);

        // Without the CA, the webhook's certificate is not trusted: each
        // attempt fails its handshake, and the webhook sees no POST.
        let (untrusted_url, untrusted, _authority) = https_webhook().await;
        let two = serve(AnyStore::Memory(MemoryStore::new()), &untrusted_url).await;
        spend(&[&two], "beta").await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let metrics = two.text("/metrics").await;
            if metrics.contains("tollgate_alert_deliveries_total{result=\"failed\"}") {
                break;
            }
            assert!(Instant::now() < deadline, "no delivery was attempted: {metrics}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(untrusted.posts.lock().unwrap().is_empty());
    });
}
